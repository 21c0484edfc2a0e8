"""Tensor-parallel and 2-D (data x model) training of a small transformer equals one
device: ``Model.compile(mesh=..., parameter_sharding="megatron" | rules)``.

The device count is fixed when JAX starts, so the 4-device checks run in one subprocess
(``XLA_FLAGS=--xla_force_host_platform_device_count=4``): a model=4 mesh, a 2x2 mesh,
2x2 with FSDP on the data axis, and 2x2 with a user rule, each against 1-device
training; each device's shard of each split parameter (and of its momentum) has the
expected fraction; evaluate and backward/apply_gradients agree too.
"""

from __future__ import annotations

import textwrap

import jax
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

from fnnc.errors import FnncError, GraphError, ModelError
from tests.helpers import run_on_cpu_devices

COMMON = textwrap.dedent(
    """
    import numpy as np, optax
    from fnnc.models import (Add, Dense, Embedding, Input, LayerNorm, Model,
                             MultiHeadAttention, ReLU)

    V, T, D = 16, 4, 8

    def make():
        tok = Input(name="tokens")
        h = Embedding(V, D, name="embed")(tok)
        h = Add()(h, MultiHeadAttention(4, name="attn")(LayerNorm(name="ln1")(h)))
        m = Dense(4 * D, name="mlp1")(LayerNorm(name="ln2")(h))
        h = Add()(h, Dense(D, name="mlp2")(ReLU()(m)))
        return Model([tok], [Dense(V, name="logits")(h)], name="tiny")

    rng = np.random.default_rng(0)
    XS = rng.integers(0, V, size=(8, T)).astype(np.int32)
    YS = rng.integers(0, V, size=(8, T)).astype(np.int32)

    def trained(steps=3, mesh=None, rules=None):
        m = make()
        m.compile([XS], loss="softmax_crossentropy", minimizer=optax.sgd(0.1, momentum=0.9),
                  mesh=mesh, parameter_sharding=rules)
        return m, [float(m.fit([XS], [YS])) for _ in range(steps)]
    """
)

SCRIPT = COMMON + textwrap.dedent(
    """
    import jax
    from jax.sharding import PartitionSpec as P
    from fnnc.graph import ShardingRules
    assert jax.device_count() == 4, jax.devices()

    MEGATRON = {  # parameter id suffix -> layout
        "embed-0-0": P("model"), "attn-0-0": P("model"), "attn-0-1": P("model"),
        "attn-0-2": P("model"), "attn-0-4": P("model"), "attn-0-5": P("model"),
        "attn-0-6": P("model"), "attn-0-3": P(None, "model"), "attn-0-7": P(),
        "mlp1-0-0": P("model"), "mlp1-0-1": P("model"), "mlp2-0-0": P(None, "model"),
        "mlp2-0-1": P(), "logits-0-0": P(), "logits-0-1": P(), "ln1-0-0": P(),
    }
    FSDP = {"embed-0-0": P("model", "data"), "mlp1-0-0": P("model", "data"),
            "mlp2-0-0": P("data", "model"), "mlp2-0-1": P("data"), "logits-0-0": P("data"),
            "ln1-0-0": P("data"), "attn-0-3": P("data", "model")}
    RULE = {**MEGATRON, "embed-0-0": P(None, "model")}

    def check_layout(m, mesh, expected):
        m.engine._sync_live()
        for pid, v in m.engine.values.items():
            want = next(s for k, s in expected.items() if pid.endswith(k)) if any(
                pid.endswith(k) for k in expected) else None
            if want is None:
                continue
            assert v.sharding.spec == want, (pid, v.sharding.spec, want)
            split = [np.prod([mesh.shape[a] for a in ((e,) if isinstance(e, str) else e or ())])
                     for e in (*want, *[None] * (v.ndim - len(want)))]
            shard = tuple(n // s for n, s in zip(v.shape, split))
            assert all(s.data.shape == shard for s in v.addressable_shards), (pid, shard)
            momentum = [a for a in jax.tree.leaves(m.engine.store.all_states(pid)) if a.ndim]
            assert [a.sharding.spec for a in momentum] == [want], (pid, momentum)

    ref, ref_losses = trained()
    want = ref.parameters()
    cases = [((1, 4), "megatron", MEGATRON), ((2, 2), "tensor_parallel", MEGATRON),
             ((2, 2), ShardingRules(fsdp=True), FSDP), ((2, 2), {"embed": P(None, "model")}, RULE)]
    for shape, rules, expected in cases:
        mesh = jax.make_mesh(shape, ("data", "model"))
        m, losses = trained(3, mesh, rules)
        np.testing.assert_allclose(losses, ref_losses, rtol=1e-5, err_msg=str((shape, rules)))
        for k, v in m.parameters().items():
            np.testing.assert_allclose(v, want[k], rtol=1e-5, atol=1e-5, err_msg=k)
        check_layout(m, mesh, expected)
        if rules == "tensor_parallel":
            got = m.evaluate([XS])
            np.testing.assert_allclose(got, ref.evaluate([XS]), rtol=1e-5, atol=1e-5)

    # the fit step pins activations and meets in all-reduces over the model axis
    fit = next(p for key, p in m.engine._programs.items() if key[0] == "fit")
    assert "sharding_constraint" in fit.program.graph.__str__()
    assert "all-reduce" in fit.program.compiled_text()

    # evaluate / backward / apply_gradients on a 2x2 mesh equals one device
    def stepped(mesh=None):
        m = make()
        m.compile([XS], loss="softmax_crossentropy", minimizer=optax.sgd(0.1, momentum=0.9),
                  mesh=mesh, parameter_sharding="megatron" if mesh is not None else None)
        out = m.evaluate([XS], is_test=False, requires_grad=True)
        m.backward([np.ones_like(np.asarray(out))])
        m.apply_gradients()
        return m
    one, two = stepped(), stepped(jax.make_mesh((2, 2), ("data", "model")))
    for k, v in two.parameters().items():
        np.testing.assert_allclose(v, one.parameters()[k], rtol=1e-5, atol=1e-6, err_msg=k)
    check_layout(two, two.engine.parallel.mesh, MEGATRON)
    print("OK")
    """
)


def test_tensor_parallel_and_2d_training_match_one_device():
    run_on_cpu_devices(SCRIPT)


REPEAT_SCRIPT = textwrap.dedent(
    r"""
    import re
    import jax, numpy as np, optax
    from jax.sharding import PartitionSpec as P
    from fnnc.models import (Add, Dense, Embedding, Input, LayerNorm, Model,
                             MultiHeadAttention, Pipeline, ReLU, Repeat)
    assert jax.device_count() == 4, jax.devices()
    V, T, D, N = 16, 4, 8, 4

    def block():
        x = Input()
        h = Add()(x, MultiHeadAttention(4, name="attn")(LayerNorm(name="ln1")(x)))
        m = Dense(4 * D, name="mlp1")(LayerNorm(name="ln2")(h))
        return Model(x, Add()(h, Dense(D, name="mlp2")(ReLU()(m))), name="block")

    def trained(mesh=None, pipeline=None):
        tok = Input(name="tokens")
        h = Repeat(block, N, name="blocks", pipeline=pipeline)(Embedding(V, D, name="embed")(tok))
        m = Model([tok], [Dense(V, name="logits")(h)], name="tiny")
        m.compile([XS], loss="softmax_crossentropy", minimizer=optax.sgd(0.05, momentum=0.9),
                  mesh=mesh, parameter_sharding="megatron" if mesh is not None else None)
        return m, [float(m.fit([XS], [YS])) for _ in range(3)]

    rng = np.random.default_rng(0)
    XS = rng.integers(0, V, size=(8, T)).astype(np.int32)
    YS = rng.integers(0, V, size=(8, T)).astype(np.int32)
    SLICE = {  # stacked parameter id suffix -> the layout of each block's slice
        "attn-0-0": ("model",), "attn-0-1": ("model",), "attn-0-2": ("model",),
        "attn-0-4": ("model",), "attn-0-5": ("model",), "attn-0-6": ("model",),
        "attn-0-3": (None, "model"), "attn-0-7": (), "mlp1-0-0": ("model",),
        "mlp1-0-1": ("model",), "mlp2-0-0": (None, "model"), "mlp2-0-1": (), "ln1-0-0": (),
    }

    def check_layout(m, mesh, lead):
        m.engine._sync_live()
        checked, whole = 0, set()
        for pid, v in m.engine.values.items():
            hits = [s for k, s in SLICE.items() if pid.endswith(k) and "[0:4]" in pid]
            if not hits:
                continue
            want = P(lead, *hits[0]) if lead or hits[0] else P()
            assert v.sharding.spec == want, (pid, v.sharding.spec, want)
            split = [int(np.prod([mesh.shape[a] for a in ((e,) if e else ())]))
                     for e in (*want, *[None] * (v.ndim - len(want)))]
            shard = tuple(n // s for n, s in zip(v.shape, split))
            assert all(s.data.shape == shard for s in v.addressable_shards), (pid, shard)
            momentum = [a for a in jax.tree.leaves(m.engine.store.all_states(pid)) if a.ndim]
            assert [a.sharding.spec for a in momentum] == [want], (pid, momentum)
            checked += 1
            if "model" in hits[0]:
                whole |= {tuple(v.shape), tuple(v.shape[1:])}
        assert checked == len(SLICE), checked
        return whole

    ref, ref_losses = trained()
    assert ref_losses[-1] < ref_losses[0], ref_losses
    want = ref.parameters()
    meshes = [(None, (2, 2), ("data", "model"), None),
              (Pipeline(2, 2), (2, 1, 2), ("stage", "data", "model"), "stage")]
    for pipeline, shape, axes, lead in meshes:
        mesh = jax.make_mesh(shape, axes)
        m, losses = trained(mesh, pipeline)
        np.testing.assert_allclose(losses, ref_losses, rtol=1e-5, err_msg=str(shape))
        for k, v in m.parameters().items():
            np.testing.assert_allclose(v, want[k], rtol=1e-5, atol=1e-5, err_msg=k)
        whole = check_layout(m, mesh, lead)
        # Megatron's collectives: activations all-reduced inside the block loop, no
        # split weight (stacked or one block's) ever gathered whole
        fit = next(p for key, p in m.engine._programs.items() if key[0] == "fit")
        hlo = fit.program.compiled_text()
        loop = [ln for ln in hlo.splitlines() if " all-reduce(" in ln and "blocks-0" in ln]
        assert loop, "no all-reduce in the blocks' loop"
        gathered = re.findall(r"= \w+\[([\d,]*)\]\{[^}]*\} all-gather\(", hlo)
        shapes = {tuple(int(n) for n in g.split(",") if n) for g in gathered}
        assert not shapes & whole, (shapes & whole, shape)
    print("OK")
    """
)


def test_repeat_stacks_split_by_role_train_as_one_device():
    """A Repeat of attention + MLP blocks on a 2x2 (data x model) mesh, and pipelined on
    a (stage, data, model) mesh: stacked weights laid out ``P(None | "stage", *role)``,
    training equal to one device, Megatron's all-reduces inside the loop."""
    run_on_cpu_devices(REPEAT_SCRIPT)


def _mlp():
    from fnnc.models import Dense, Input, Model, ReLU

    x = Input()
    return Model(x, Dense(3, name="fc2")(ReLU()(Dense(8, name="fc1")(x))))


XS = np.random.default_rng(1).normal(size=(4, 6)).astype(np.float32)
YS = np.random.default_rng(2).normal(size=(4, 3)).astype(np.float32)


def test_one_by_one_mesh_trains_as_one_device_with_the_layouts():
    def trained(mesh=None):
        m = _mlp()
        m.compile(XS, loss="mse", minimizer=optax.sgd(0.1, momentum=0.9), mesh=mesh,
                  parameter_sharding="megatron" if mesh is not None else None)  # fmt: skip
        return m, [float(m.fit(XS, YS)) for _ in range(2)]

    ref, ref_losses = trained()
    m, losses = trained(jax.make_mesh((1, 1), ("data", "model")))
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-6)
    for k, v in m.parameters().items():
        np.testing.assert_allclose(v, ref.parameters()[k], rtol=1e-6, atol=1e-7, err_msg=k)
    specs = {k: v.sharding.spec for k, v in m.engine.values.items()}
    assert specs == {"t-fc1-0-0": P("model"), "t-fc1-0-1": P("model"),
                     "t-fc2-0-0": P(None, "model"), "t-fc2-0-1": P()}  # fmt: skip


def test_bad_meshes_and_rules_say_what_to_change():
    args = dict(loss="mse", minimizer=optax.sgd(0.1))
    one_axis = jax.make_mesh((1,), ("data",))
    with pytest.raises(GraphError, match=r"compile: .*t-fc1-0-0 \[8, 6\] .*axis 'model'"):
        _mlp().compile(XS, mesh=one_axis, parameter_sharding="megatron", **args)
    two = jax.make_mesh((1, 1), ("batch", "model"))
    with pytest.raises(ModelError, match=r"no axis 'data'.*jax\.make_mesh\(\(n, m\)"):
        _mlp().compile(XS, mesh=two, parameter_sharding="megatron", **args)
    with pytest.raises(ModelError, match="parameter_sharding='zero'"):
        _mlp().compile(XS, mesh=two, parameter_sharding="zero", **args)
    with pytest.raises(FnncError, match=r"fc1.*3 axes"):
        _mlp().compile(XS, mesh=jax.make_mesh((1, 1), ("data", "model")),
                       parameter_sharding={"fc1": P(None, None, "model")}, **args)  # fmt: skip
