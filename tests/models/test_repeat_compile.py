"""Issue 28's must-hold: a 48-block ``Repeat`` transformer compiles in at most 1.5x the
time of a 4-block one (``benchmarks/repeat_compile.py`` reports the unrolled models too).

"Compile" is ``Model.compile`` + the first ``fit`` of a fresh model with fnnc's program
and scan-body caches cleared (:func:`benchmarks.repeat_compile.compile_seconds`). On a
shared CI machine single timings swing by 2x, so the test takes the fastest of a few
interleaved runs of each depth (more rounds while the machine is busy), and also checks
the cause deterministically: the graph of 48 blocks has exactly as many nodes as the
graph of 4, and its compiled step as many lines of HLO.
"""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.repeat_compile import LIMIT, compile_seconds, compiled, main, transformer
from fnnc.models import BuildContext

X = np.random.default_rng(0).normal(size=(1, 4, 8)).astype(np.float32)


def tiny(depth: int):
    return transformer(depth, repeat=True, width=8, heads=2)


def test_graph_does_not_grow_with_depth():
    """One build of each model (no compile): same nodes and parameter count."""
    sizes = []
    for depth in (4, 48):
        ctx = BuildContext(training=True)
        tiny(depth).build(ctx, ctx.b.input(X.shape, X.dtype, name="x"), nested=False)
        sizes.append((len(ctx.b.build([]).nodes), len(ctx.params)))
    assert sizes[0] == sizes[1]


@pytest.mark.slow
def test_48_blocks_compile_within_limit_of_4():
    """The fastest of interleaved timings per depth; a busy CI machine (the other xdist
    worker compiling beside this one) swung single timings from 0.7 s to 1.5 s, so up
    to six rounds are taken until the fastest timings settle within the limit. The
    cause is checked deterministically too: the compiled training steps of 4 and 48
    blocks have the same number of lines of StableHLO and of optimised HLO."""
    sizes = []
    for depth in (4, 48):  # warm-up: JAX's one-time costs (the initialisers per shape)
        program = compiled(lambda d=depth: tiny(d), X)[1].engine._last_fit.program
        sizes.append(
            (len(program.lowered_text().splitlines()), len(program.compiled_text().splitlines()))
        )
    assert sizes[0] == sizes[1], f"program lines of 4 blocks vs 48: {sizes}"
    times: dict[int, list[float]] = {4: [], 48: []}
    for rounds in range(1, 7):
        for depth in times:
            times[depth].append(compile_seconds(lambda d=depth: tiny(d), X))
        ratio = min(times[48]) / min(times[4])
        if rounds >= 2 and ratio <= LIMIT:
            break
    assert ratio <= LIMIT, f"repeat-48 / repeat-4 compile time {ratio:.2f} > {LIMIT}: {times}"


def test_check_flag_fails_when_the_ratio_is_over(monkeypatch, capsys):
    """``--check`` exits 1 above the limit and 0 within it (timings stubbed: the flag's
    logic, not the machine, is under test here)."""
    import benchmarks.repeat_compile as bench

    for r48, code in ((2.0, 1), (1.2, 0)):
        fake = {"repeat-4": 1.0, "repeat-48": r48, "unrolled-4": 1.1}
        monkeypatch.setattr(bench, "measure", lambda makers, x, runs, f=fake: f)
        assert main(["--check", "--no-unrolled-48"]) == code
        assert ("FAIL" in capsys.readouterr().out) == (code == 1)
