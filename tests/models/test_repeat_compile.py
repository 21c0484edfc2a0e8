"""Issue 28's must-hold: a 48-block ``Repeat`` transformer compiles in at most 1.5x the
time of a 4-block one. The time is measured by ``benchmarks/repeat_compile.py --check``
(it reports the unrolled models too); these tests check its cause and the flag.

The cause, deterministically: the graph of 48 blocks has exactly as many nodes as the
graph of 4, and its compiled training step as many lines of HLO. (A timed test here
failed CI at 1.69 on a busy machine, where single timings swing by 2x.)
"""

from __future__ import annotations

import numpy as np

from benchmarks.repeat_compile import compiled, main, transformer
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


def test_48_blocks_compile_to_a_program_the_size_of_4s():
    """Why compile time does not grow with depth, checked deterministically: the compiled
    training steps of 4 and 48 blocks (``Model.compile`` + the first ``fit``) have the
    same number of lines of StableHLO, and of optimised HLO within 2% (XLA's fusion
    choices move a few lines; 48 unrolled blocks would be about 12x). The time ratio itself
    (issue 28: at most 1.5) is measured by ``benchmarks/repeat_compile.py --check``, not
    here: timed assertions fail on busy CI machines (one did at 1.69 while quiet runs
    measure 1.0)."""
    sizes = []
    for depth in (4, 48):
        program = compiled(lambda d=depth: tiny(d), X)[1].engine._last_fit.program
        sizes.append(
            (len(program.lowered_text().splitlines()), len(program.compiled_text().splitlines()))
        )
    (lowered4, compiled4), (lowered48, compiled48) = sizes
    assert lowered48 == lowered4, f"StableHLO lines of 4 blocks vs 48: {sizes}"
    # XLA's fusion choices move a few lines (CI: 3917 vs 3910); unrolled would be ~12x
    assert abs(compiled48 - compiled4) <= 0.02 * compiled4, f"HLO lines, 4 vs 48: {sizes}"


def test_check_flag_fails_when_the_ratio_is_over(monkeypatch, capsys):
    """``--check`` exits 1 above the limit and 0 within it (timings stubbed: the flag's
    logic, not the machine, is under test here)."""
    import benchmarks.repeat_compile as bench

    for r48, code in ((2.0, 1), (1.2, 0)):
        fake = {"repeat-4": 1.0, "repeat-48": r48, "unrolled-4": 1.1}
        monkeypatch.setattr(bench, "measure", lambda makers, x, runs, f=fake: f)
        assert main(["--check", "--no-unrolled-48"]) == code
        assert ("FAIL" in capsys.readouterr().out) == (code == 1)
