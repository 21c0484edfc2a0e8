"""Repeat: N blocks as one scan over stacked parameters, checked against the unrolled model.

The oracle is the unrolled model (the same block built ``n`` times in sequence, each a
fresh copy) fed the same parameters, and ``jax.grad`` of the model written in plain JAX.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fnnc.io import Checkpoints
from fnnc.models import (
    Activation,
    Add,
    BuildContext,
    Dense,
    Input,
    LayerNorm,
    Model,
    ModelError,
    ReLU,
    Repeat,
    Sequential,
    minimizers,
    stack_parameters,
    stacked_ids,
    unstack_parameters,
)
from fnnc.models.stacks import acts_elementwise

N, WIDTH = 3, 4
RNG = np.random.default_rng(0)
X = RNG.normal(size=(2, 3)).astype(np.float32)
Y = RNG.normal(size=(2, 2)).astype(np.float32)


def loss(ys, ts):
    return jnp.mean((ys[0] - ts[0]) ** 2)


def block() -> Model:
    """A pre-LN residual block: ``x + tanh(fc(ln(x)))``."""
    x = Input()
    h = Activation("tanh")(Dense(WIDTH, name="fc")(LayerNorm(name="ln")(x)))
    return Model(x, Add()(x, h), name="block")


def model(stack) -> Model:
    x = Input()
    y = Dense(2, name="head")(stack(Dense(WIDTH, name="inp")(x)))
    return Model(x, y)


def compiled(m: Model, minimizer=None) -> Model:
    m.compile(X, loss=loss, minimizer=minimizer or optax.adam(0.05))
    return m


def repeat_model(**kw) -> Model:
    return compiled(model(Repeat(block, N, name="blocks", **kw)))


def unrolled_model() -> Model:
    return compiled(model(Sequential([block() for _ in range(N)], name="blocks")))


def close(a, b) -> None:
    assert sorted(a) == sorted(b)
    for k in a:
        np.testing.assert_allclose(np.asarray(a[k]), np.asarray(b[k]), rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def pair():
    """A Repeat model and the unrolled one holding the same parameters."""
    rep, unr = repeat_model(), unrolled_model()
    unr.set_parameters(unstack_parameters(rep.parameters(), rep))
    return rep, unr


def test_ids_are_the_unrolled_models_ids(pair):
    rep, unr = pair
    blocks = stacked_ids(rep)
    assert blocks["t-blocks-0-block-[0:3]-fc-0-0"] == tuple(
        f"t-blocks-0-block-{i}-fc-0-0" for i in range(N)
    )
    assert rep.parameters()["t-blocks-0-block-[0:3]-fc-0-0"].shape == (N, WIDTH, WIDTH)
    assert sorted(unstack_parameters(rep.parameters(), rep)) == sorted(unr.parameters())
    with pytest.raises(ModelError, match=r"the parameters first, then the model"):
        stack_parameters(rep, rep.parameters())  # the arguments swapped


def test_unnamed_blocks_number_in_the_enclosing_level():
    """Unnamed copies take numbers of the parent level, so do the layers after them."""

    def mlp():
        return Sequential([Dense(WIDTH), ReLU(), Dense(WIDTH)])

    def whole(stack):
        x = Input()
        return compiled(Model(x, Dense(2)(stack(Dense(WIDTH)(x)))))

    rep = whole(Repeat(mlp, N))
    unr = whole(Sequential([mlp() for _ in range(N)]))
    assert sorted(unstack_parameters(rep.parameters(), rep)) == sorted(unr.parameters())
    assert stacked_ids(rep)["t-[1:7:2]-0"] == ("t-1-0", "t-3-0", "t-5-0")
    assert "t-7-0" in rep.parameters()  # the head after the stack


def test_forward_equals_unrolled(pair):
    rep, unr = pair
    graph, _ = rep.forward_graph([X])
    assert [n.cmd.name for n in graph.nodes].count("scan") == 1  # one loop, not N blocks
    np.testing.assert_allclose(rep.evaluate(X), unr.evaluate(X), rtol=1e-5, atol=1e-6)


def oracle_loss(params: dict, x, t):
    """The model in plain JAX, on per-block (unrolled) parameter ids."""

    def dense(h, name):
        return h @ params[f"{name}-0"].T + params[f"{name}-1"][None]

    h = dense(x, "t-inp-0")
    for i in range(N):
        p = f"t-blocks-0-block-{i}"
        mu, var = h.mean(-1, keepdims=True), h.var(-1, keepdims=True)
        ln = (h - mu) / jnp.sqrt(var + 1e-5) * params[f"{p}-ln-0-0"][None] + params[f"{p}-ln-0-1"][
            None
        ]
        h = h + jnp.tanh(dense(ln, f"{p}-fc-0"))
    return loss([dense(h, "t-head-0")], [t])


def test_gradients_match_jax_grad():
    """One SGD step moves each stacked slice by -lr * d loss / d (its block's weight)."""
    rep = compiled(model(Repeat(block, N, name="blocks")), optax.sgd(1.0))
    before = unstack_parameters(rep.parameters(), rep)
    want = jax.grad(oracle_loss)({k: jnp.asarray(v) for k, v in before.items()}, X, Y)
    rep.fit(X, Y)
    after = unstack_parameters(rep.parameters(), rep)
    close({k: before[k] - after[k] for k in before}, want)


def test_fit_steps_equal_unrolled(pair):
    rep, unr = pair
    for _ in range(3):
        a, b = rep.fit(X, Y), unr.fit(X, Y)
        np.testing.assert_allclose(float(a), float(b), rtol=1e-5)
    close(unstack_parameters(rep.parameters(), rep), unr.parameters())


PER_TENSOR = {
    "lamb": lambda: minimizers.lamb(0.05),
    "optax.lamb": lambda: optax.lamb(0.05),
    "adafactor": lambda: optax.adafactor(0.05, min_dim_size_to_factor=2),
    "adam+global clip": lambda: optax.chain(optax.clip_by_global_norm(1e-2), optax.adam(0.05)),
}


@pytest.mark.parametrize("name", PER_TENSOR)
def test_per_tensor_rules_update_each_block_as_the_unrolled_model(name, tmp_path):
    """A stacked parameter is updated as its n blocks are in the unrolled model: LAMB's
    trust ratio and Adafactor's factored moments per block, not over the stack, while a
    global-norm clip still sees every block of every parameter (a tight clip, so it
    acts). The optimizer state then checkpoints into the unrolled model per block."""
    rep = compiled(model(Repeat(block, N, name="blocks")), PER_TENSOR[name]())
    unr = compiled(
        model(Sequential([block() for _ in range(N)], name="blocks")), PER_TENSOR[name]()
    )
    unr.set_parameters(unstack_parameters(rep.parameters(), rep))
    for _ in range(3):
        np.testing.assert_allclose(float(rep.fit(X, Y)), float(unr.fit(X, Y)), rtol=1e-5)
    close(unstack_parameters(rep.parameters(), rep), unr.parameters())
    with Checkpoints(tmp_path / "ckpt") as ckpt:
        ckpt.save(3, rep)
        ckpt.restore_into(unr)
    np.testing.assert_allclose(float(rep.fit(X, Y)), float(unr.fit(X, Y)), rtol=1e-5)
    close(unstack_parameters(rep.parameters(), rep), unr.parameters())


def test_only_rules_that_are_not_elementwise_see_stacks_as_blocks():
    """Elementwise rules update a stack whole (bit-identical to per block, no slicing);
    a rule reading more than one element at a time gets the blocks."""
    specs = (("w", (3, 4, 4), "float32"), ("b", (4,), "float32"))
    whole = [optax.sgd(0.1), optax.adam(0.1), minimizers.adam(0.1), minimizers.rmsprop(0.1)]
    whole.append(optax.MultiSteps(optax.adam(0.1), 2).gradient_transformation())
    assert all(acts_elementwise(t, specs) for t in whole)
    assert not any(acts_elementwise(t(), specs) for t in PER_TENSOR.values())
    assert not acts_elementwise(optax.clip_by_block_rms(1.0), specs)


def test_checkpointed_blocks_give_the_same_numbers():
    plain, ckpt = repeat_model(), repeat_model(checkpoint=True)
    ckpt.set_parameters(plain.parameters())
    for _ in range(2):
        np.testing.assert_allclose(float(plain.fit(X, Y)), float(ckpt.fit(X, Y)), rtol=1e-5)
    close(plain.parameters(), ckpt.parameters())


def test_files_round_trip_both_ways(tmp_path):
    rep, unr = repeat_model(), unrolled_model()
    rep.write(tmp_path / "rep.sqlite")
    assert unr.read(tmp_path / "rep.sqlite") == []
    close(unr.parameters(), unstack_parameters(rep.parameters(), rep))

    theirs = {k: v + 1.0 for k, v in unr.parameters().items()}
    unr.set_parameters(theirs)
    unr.write(tmp_path / "unr.sqlite")
    assert rep.read(tmp_path / "unr.sqlite") == []
    close(unstack_parameters(rep.parameters(), rep), theirs)


def test_stack_parameters_inverts_unstack():
    rep = repeat_model()
    per_block = unstack_parameters(rep.parameters(), rep)
    close(stack_parameters(per_block, rep), rep.parameters())
    per_block.pop("t-blocks-0-block-1-fc-0-0")
    with pytest.raises(ModelError, match=r"t-blocks-0-block-1-fc-0-0"):
        stack_parameters(per_block, rep)
    kept = stack_parameters(per_block, rep, strict=False)["t-blocks-0-block-[0:3]-fc-0-0"]
    close({"w": kept}, {"w": rep.parameters()["t-blocks-0-block-[0:3]-fc-0-0"]})


def test_a_block_that_changes_shape_is_refused():
    with pytest.raises(ModelError, match=r"Repeat\('wide'\).*takes float32\[2, 3\].*\[2, 5\]"):
        x = Input()
        compiled(Model(x, Repeat(lambda: Dense(5), 2, name="wide")(x)))


@pytest.mark.parametrize("n", [0, 2.0, True])
def test_bad_counts_are_refused(n):
    with pytest.raises(ModelError, match="n must be an int >= 1"):
        Repeat(block, n)


def scan_saves(layer: Repeat) -> int:
    """How many tensors one block keeps for the backward (its scan node's forward body
    returns the next carry, then those), from a training-mode build (no compile)."""
    ctx = BuildContext(training=True)
    x = Input()
    Model(x, layer(x)).build(ctx, ctx.b.input((2, WIDTH), np.float32, name="x"), nested=False)
    (node,) = [n for n in ctx.b.build([]).nodes if n.cmd.name == "scan"]
    return len(node.cmd.param("forward").outputs) - 1


def test_checkpointing_keeps_only_each_blocks_input():
    def checkpointed_block():
        b = block()
        b.set_gradient_checkpointing()
        return b

    assert scan_saves(Repeat(block, N)) > 1
    assert scan_saves(Repeat(block, N, checkpoint=True)) == 1
    assert scan_saves(Repeat(checkpointed_block, N)) == 1


def test_nested_repeats_are_refused():
    with pytest.raises(ModelError, match="repeats do not nest"):
        scan_saves(Repeat(lambda: Repeat(block, 2, name="inner"), 2, name="outer"))


def test_mixed_precision_runs_the_blocks_in_bfloat16():
    """``precision="bfloat16"`` computes the dense layers around the stack and the
    blocks inside the scan in bfloat16: the loss is the float32 one to bf16's precision
    (tests/models/test_precision.py checks the loop's body types and training)."""
    rep = repeat_model()
    low = model(Repeat(block, N, name="blocks"))
    low.compile(X, loss=loss, minimizer=optax.sgd(0.0), precision="bfloat16")
    low.set_parameters(rep.parameters())
    want = float(loss([rep.evaluate(X)], [Y]))
    np.testing.assert_allclose(float(low.fit(X, Y)), want, rtol=3e-2)


def test_training_checkpoints_resume_across_repeat_and_unrolled(tmp_path):
    """Checkpoints keep per-block ids (parameters and Adam state): a run saved by either
    model resumes in the other and takes the step the saving model would have taken."""
    rep, unr = repeat_model(), unrolled_model()
    for source, target, path in ((rep, unr, tmp_path / "a"), (unr, rep, tmp_path / "b")):
        source.fit(X, Y)
        source.fit(X, Y)
        with Checkpoints(path) as ckpt:
            ckpt.save(2, source)
            assert not any("[" in name for name in ckpt.restore(2).state)
            ckpt.restore_into(target)
        a, b = float(source.fit(X, Y)), float(target.fit(X, Y))
        np.testing.assert_allclose(a, b, rtol=1e-5)
        close(unstack_parameters(rep.parameters(), rep), unr.parameters())
