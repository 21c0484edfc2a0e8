"""benchmarks/trace_report.py reads back what lm_step's --keep-trace keeps: a real
profile of a small program on this machine, against Model.profile's own attribution."""

import numpy as np
import pytest

from benchmarks import _lm_fnnc, trace_report
from fnnc import ops
from fnnc.graph import GraphBuilder, compile
from fnnc.graph.profile import profile


def test_a_kept_profile_reads_back_kernel_by_kernel(tmp_path):
    b = GraphBuilder()
    x, w = b.input((64, 32), name="x"), b.input((48, 32), name="w")
    y = b.exec(ops.relu(), b.exec(ops.gemm(transpose_b=True), x, w, name="fc"), name="act")
    program = compile(b.build([y]))
    args = np.ones((64, 32), np.float32), np.ones((48, 32), np.float32)
    traces = tmp_path / "trace"
    report = profile(program, *args, runs=2, log_dir=str(traces))
    _lm_fnnc.keep_trace(str(traces), program.compiled_text(), str(tmp_path / "kept"), "tiny", 2)
    text = trace_report.main([str(tmp_path / "kept"), "tiny", "--hlo", report.nodes[0].ops[0]])
    head = text.splitlines()[0]
    assert head.endswith(f"{1e3 * report.seconds:.3f} ms a run"), (head, report.seconds)
    assert "fc/" in text and "by kind:" in text
    assert f"%{report.nodes[0].ops[0]}" in text  # the instruction --hlo asked for


def test_an_instruction_not_in_the_hlo_says_so():
    assert "no instruction 'nope'" in trace_report.show("HloModule m\n", "nope")
    with pytest.raises(FileNotFoundError):
        trace_report.load("/nonexistent", "fnnc")
