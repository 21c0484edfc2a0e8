"""Model.compile(passes=): user passes on the forward graph (before backward) or on the
training graph (after it), against the same rewrite applied by hand."""

from __future__ import annotations

import numpy as np
import optax
import pytest

from fnnc import ops
from fnnc.graph import Graph, Pat, Rule, rewrite_pass
from fnnc.models import Dense, Input, Model
from fnnc.models.layer import ModelError
from fnnc.models.layers import CommandLayer

LEAKY = ops.leaky_relu(negative_slope=0.1)
relu_to_leaky = rewrite_pass(
    Rule(Pat.op("relu", Pat.var("x")), lambda m: m.exec(LEAKY, m["x"])), name="relu_to_leaky"
)


def _mlp(act: CommandLayer) -> Model:
    x = Input()
    return Model(x, Dense(3, name="fc2")(act(Dense(8, name="fc1")(x))), name="mlp")


def _data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.standard_normal((16, 5)).astype(np.float32), rng.standard_normal((16, 3)).astype(
        np.float32
    )


def _train(model: Model, start: dict | None, steps: int = 4, **compile_kw) -> dict:
    x, y = _data()
    model.compile(x, loss="mse", minimizer=optax.sgd(0.1), **compile_kw)
    if start is not None:
        model.set_parameters(start)
    for _ in range(steps):
        model.fit(x, y)
    return model.parameters()


def test_forward_passes_train_as_the_rewrite_by_hand() -> None:
    x, _ = _data()
    rewritten = _mlp(CommandLayer(ops.relu()))
    rewritten.compile(x, loss="mse", minimizer=optax.sgd(0.1), passes=[relu_to_leaky])
    start = rewritten.parameters()
    by_pass = _train(rewritten, start)
    by_hand = _train(_mlp(CommandLayer(LEAKY)), start)
    plain = _train(_mlp(CommandLayer(ops.relu())), start)
    assert by_pass.keys() == by_hand.keys()
    for pid in by_hand:
        np.testing.assert_allclose(by_pass[pid], by_hand[pid], rtol=1e-6, atol=1e-7)
    # the rewrite mattered: relu's training ends elsewhere (x has negative pre-activations)
    assert any(not np.allclose(plain[p], by_hand[p], atol=1e-5) for p in plain)
    evaluated = rewritten.evaluate(x)
    expected = _mlp(CommandLayer(LEAKY))
    expected.compile(x, loss="mse", minimizer=optax.sgd(0.1))
    expected.set_parameters(rewritten.parameters())
    np.testing.assert_allclose(evaluated, expected.evaluate(x), rtol=1e-6)


def test_training_passes_see_the_step_after_backward() -> None:
    seen: list[Graph] = []

    def spy(graph: Graph) -> Graph:
        seen.append(graph)
        return graph

    start = _train(_mlp(CommandLayer(ops.relu())), None, steps=0)
    with_spy = _train(_mlp(CommandLayer(ops.relu())), start, passes={"training": [spy]})
    without = _train(_mlp(CommandLayer(ops.relu())), start)
    assert seen and any(n.cmd.name == "optax_update" for n in seen[0].nodes)
    assert any(n.cmd.name == "gradient" for n in seen[0].nodes)
    for pid in without:
        np.testing.assert_allclose(with_spy[pid], without[pid], rtol=1e-6)


def test_a_pass_that_changes_the_outputs_is_refused() -> None:
    def drops_an_output(graph: Graph) -> Graph:
        import dataclasses

        return dataclasses.replace(graph, outputs=graph.outputs[:0])

    x, y = _data()
    model = _mlp(CommandLayer(ops.relu()))
    model.compile(x, loss="mse", minimizer=optax.sgd(0.1), passes=[drops_an_output])
    with pytest.raises(ModelError, match=r"drops_an_output.*changed the graph's inputs or outputs"):
        model.fit(x, y)
    with pytest.raises(ModelError, match="unknown stage"):
        model.compile(x, passes={"backward": [drops_an_output]})


def test_passes_by_name_as_compile_takes_them() -> None:
    """Model.compile(passes=["cse"]) runs the built-in pass, as fnnc.graph.compile does;
    a pass that is neither a name nor a function is a ModelError naming the stage."""
    from fnnc.graph.passes import cse, dce
    from fnnc.models.model_passes import ModelPasses

    assert ModelPasses.of(["cse"]).forward == (cse,)
    assert (
        ModelPasses.of({"training": "dce"}).training == ModelPasses.of({"training": [dce]}).training
    )
    x, _ = _data()
    start = _mlp(CommandLayer(ops.relu()))
    start.compile(x, loss="mse", minimizer=optax.sgd(0.1))
    named = _train(_mlp(CommandLayer(ops.relu())), start.parameters(), 2, passes=["cse"])
    plain = _train(_mlp(CommandLayer(ops.relu())), start.parameters(), 2)
    for pid in plain:
        np.testing.assert_allclose(named[pid], plain[pid], rtol=1e-6, atol=1e-7)
    model = _mlp(CommandLayer(ops.relu()))
    with pytest.raises(ModelError, match=r"the forward passes: unknown pass 'csee'"):
        model.compile(x, passes=["csee"])
    with pytest.raises(ModelError, match=r"the training passes: passes are functions"):
        model.compile(x, passes={"training": [3]})


def test_remat_budget_as_a_training_pass_counts_the_steps_donation() -> None:
    """remat(budget_bytes=) in passes={"training": ...} gets fit's donated inputs, so it
    plans the step Model.memory_plan() reports (parameters and Adam's state updated in
    place), not one holding old and new copies at once."""
    import functools

    from fnnc.errors import GraphError
    from fnnc.graph import memory_plan, remat
    from fnnc.models import ReLU

    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((8, 16)).astype(np.float32), (np.arange(8) % 3).astype(np.int32)

    def model(**compile_kw):
        h = inp = Input()
        for i in range(3):
            h = ReLU()(Dense(64, name=f"d{i}")(h))
        m = Model(inp, Dense(3, name="out")(h))
        m.compile(x, loss="softmax_crossentropy", minimizer=optax.adam(0.01), **compile_kw)
        return m

    plain = model()
    plan = plain.memory_plan([x], [y])
    undonated = memory_plan(plan.graph).peak_bytes
    assert plan.peak_bytes < undonated  # donation matters for this step
    budget = plan.peak_bytes  # met without recomputing, once donation is counted
    budgeted = model(passes={"training": [functools.partial(remat, budget_bytes=budget)]})
    start = plain.parameters()
    budgeted.set_parameters(start)
    for m in (plain, budgeted):
        for _ in range(2):
            m.fit(x, y)
    assert budgeted.memory_plan().peak_bytes <= budget
    for pid, value in plain.parameters().items():
        np.testing.assert_allclose(budgeted.parameters()[pid], value, rtol=1e-6, atol=1e-7)
    too_small = model(passes={"training": [functools.partial(remat, budget_bytes=1000)]})
    with pytest.raises(GraphError, match=f"without remat {plan.peak_bytes:,}"):
        too_small.fit(x, y)
