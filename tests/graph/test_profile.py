"""Per-node profiles: XLA's executed operations mapped back to fnnc nodes and commands.

Oracles: the graph's own nodes (names, commands, how many share a name), the HLO's
``op_name`` metadata of each attributed instruction, and physics (a 512^3 matmul
takes longer than a ReLU of 64 numbers: at 256^3 XNNPACK's gemm took 0.4 ms, within a
loaded machine's noise on the ReLU's time)."""

from __future__ import annotations

import re
import runpy
from pathlib import Path

import numpy as np
import pytest

from fnnc import ops
from fnnc.errors import GraphError
from fnnc.graph import GraphBuilder, compile, profile
from fnnc.graph.profile import NO_NODE, parse_hlo
from fnnc.models import minimizers

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_profile_times_each_node_of_a_program_and_keeps_donated_inputs():
    b = GraphBuilder()
    x, w = b.input((512, 512), name="x"), b.input((512, 512), name="w")
    big = b.exec(ops.gemm(transpose_b=True), x, w, name="big")
    small = b.exec(ops.relu(), b.input((64,), name="v"), name="small")
    program = compile(b.build([big, small]), donate=["x"])
    args = [np.ones((512, 512), np.float32), np.ones((512, 512), np.float32),
            -np.ones(64, np.float32)]  # fmt: skip
    report = profile(program, *args, runs=3)
    rows = {r.name: r for r in report.nodes}
    assert set(rows) <= {"big", "small", NO_NODE} and {"big", "small"} <= set(rows)
    assert (rows["big"].command, rows["small"].command) == ("gemm", "relu")
    assert rows["big"].seconds > rows["small"].seconds > 0
    assert report.seconds == pytest.approx(sum(r.seconds for r in report.nodes))
    assert report.commands["gemm"] == rows["big"].seconds
    np.testing.assert_array_equal(args[0], 1.0)  # copied for each run, never donated
    text = str(report).splitlines()
    assert text[0].startswith("profile: ") and text[0].endswith("mean of 3 runs")
    assert re.match(r"big +gemm +1 +[\d.]+ +[\d.]+", text[3])
    with pytest.raises(GraphError, match="runs must be a positive int"):
        profile(program, *args, runs=0)


def test_profile_of_the_digits_cnn_fit_step_names_every_node():
    digits = runpy.run_path(str(EXAMPLES / "digits.py"), run_name="digits")
    model = digits["make_model"]()
    rng = np.random.default_rng(0)
    x, y = rng.random((8, 8, 8, 1), np.float32), (np.arange(8) % 10).astype(np.int32)
    model.compile([x], loss="softmax_crossentropy", minimizer=minimizers.adam(1e-3))
    report = model.profile(x, y, runs=2)
    graph = model.engine._last_fit.program.graph
    hlo = parse_hlo(model.engine._last_fit.program.compiled_text())
    rows = {r.name: r for r in report.nodes}
    # every node of the step's graph has its row, with its command and count
    names = [n.name or n.cmd.name for n in graph.nodes]
    assert set(rows) - {NO_NODE} == set(names)
    for node in graph.nodes:
        row = rows[node.name or node.cmd.name]
        assert node.cmd.name in row.command.split("+")
        assert row.nodes == names.count(row.name)
    assert rows["digits-0-relu"].nodes == 3 and rows["digits-0-maxpool"].nodes == 2
    expected = {
        "digits-0-conv1-0": "convolution", "digits-0-conv2-0": "convolution",
        "digits-0-bn1-0": "batch_norm", "digits-0-fc1-0": "gemm", "digits-0-logits-0": "gemm",
        "loss": "softmax_crossentropy", "optimizer": "optax_update",
        "digits-0-conv1-0.backward": "gradient", "digits-0-conv2-0.backward": "gradient",
    }  # fmt: skip
    fused = {f for r in report.nodes if r.seconds > 0 for f in r.fused_with}
    for name, command in expected.items():
        assert rows[name].command == command
        # its own time, or (on a GPU, say) all of it inside a fusion another node roots
        assert (rows[name].seconds > 0 and rows[name].ops) or name in fused, rows[name]
    # each attributed instruction carries its node's scope in XLA's op_name metadata
    for row in report.nodes:
        for op in row.ops:
            if row.name != NO_NODE:
                assert f"/{row.name}/" in hlo.op_names[op] + "/", (row.name, op)
    assert sum(report.commands.values()) == pytest.approx(report.seconds)
    assert report.commands["convolution"] == pytest.approx(
        rows["digits-0-conv1-0"].seconds + rows["digits-0-conv2-0"].seconds
    )
    table = str(report)
    assert re.search(r"^digits-0-conv1-0 +convolution +1 +[\d.]+ +[\d.]+", table, re.M)
    assert re.search(r"^digits-0-relu +relu +3 ", table, re.M)
    assert re.search(r"^convolution +[\d.]+ +[\d.]+$", table, re.M)
    # the forward pass alone: no backward or optimizer time
    forward = model.profile(x, runs=2)
    timed = {r.name for r in forward.nodes if r.seconds > 0}
    assert "digits-0-conv1-0" in timed and not any(".backward" in n for n in timed)
    assert "optimizer" not in {r.name for r in forward.nodes}


def test_node_names_that_hlo_text_escapes_keep_their_time():
    """HLO text C-escapes op names (résumé is r\\303\\251sum\\303\\251); each node
    still gets its own operations' time, none goes to the no-node row."""
    b = GraphBuilder()
    x = b.input((64, 64), name="x")
    names = ["résumé", 'say "hi"', "back\\slash"]
    h = x
    for name in names:
        h = b.exec(ops.gemm(), h, x, name=name)
    report = profile(compile(b.build([h])), np.ones((64, 64), np.float32), runs=2)
    rows = {r.name: r for r in report.nodes}
    assert set(names) <= set(rows)
    assert all(rows[n].seconds > 0 and rows[n].command == "gemm" for n in names)
    line = '  %d = f32[2] dot(), metadata={op_name="jit(p)/r\\303\\251sum\\303\\251 \\"q\\""}'
    assert parse_hlo(line).op_names == {"d": 'jit(p)/résumé "q"'}


def test_a_model_profile_trains_runs_plus_two_steps_and_refuses_runs_0_before_any():
    """model.profile(x, y, runs=3) takes 5 steps (compile, warm-up, 3 timed): the
    parameters equal those of a twin model fit 5 times on the batch, and Adam's update
    count is 5; runs=0 is refused with the weights and the count untouched."""
    import optax

    from fnnc.models import Dense, Input, Model
    from fnnc.models.loggers import _update_count

    def make():
        x = Input()
        m = Model(x, Dense(2, name="fc")(x))
        m.compile(xs, loss="softmax_crossentropy", minimizer=optax.adam(1e-2))
        return m

    xs = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    ys = np.array([0, 1, 1, 0], np.int32)
    m, twin = make(), make()
    before = {k: np.asarray(v) for k, v in m.parameters().items()}
    with pytest.raises(GraphError, match=r"runs must be a positive int.*got 0"):
        m.profile(xs, ys, runs=0)
    assert _update_count(m) in (None, 0)  # no optimizer state yet, or no update in it
    assert all(np.array_equal(v, m.parameters()[k]) for k, v in before.items())
    m.profile(xs, ys, runs=3)
    for _ in range(5):
        twin.fit(xs, ys)
    assert _update_count(m) == 5
    for key, value in twin.parameters().items():
        np.testing.assert_array_equal(m.parameters()[key], value)


@pytest.mark.parametrize("named", [False, True])
def test_unnamed_command_layers_are_profiled_by_their_command(named):
    """ReLU, sigmoid, Add and Mul, unnamed, each get their own row named by the command
    (as summary labels them), not one 'commandlayer' row of all four; the parameter ids
    stay NNC's, where layers without parameters take no number."""
    import optax

    from fnnc.models import Activation, Add, Dense, Flatten, Input, Model, Mul, ReLU

    dense = [Dense(6, name="h1" if named else ""), Dense(6, name="h2" if named else ""),
             Dense(2, name="out" if named else "")]  # fmt: skip
    x = Input()
    h = Flatten()(x)
    a, b = ReLU()(dense[0](h)), Activation("sigmoid")(dense[1](h))
    model = Model(x, dense[2](Mul()(Add()(a, b), a)))
    xs = np.random.default_rng(0).standard_normal((4, 2, 3)).astype(np.float32)
    model.compile(xs, loss="softmax_crossentropy", minimizer=optax.sgd(0.1))
    levels = ["h1-0", "h2-0", "out-0"] if named else ["0", "1", "2"]
    assert sorted(model.parameters()) == sorted(f"t-{lv}-{i}" for lv in levels for i in (0, 1))
    rows = {r.name: r for r in model.profile(xs, runs=2).nodes}
    for command in ("relu", "sigmoid", "ewsum", "ewprod"):
        assert rows[command].command == command and rows[command].nodes == 1
    assert "commandlayer" not in rows and rows["flatten"].command == "reshape"
    table = model.summary(print_fn=lambda text: None)
    assert all(re.search(rf"^{c} ", table, re.M) for c in ("relu", "sigmoid", "ewsum", "ewprod"))
