"""SwiGLU, RotaryEmbedding and MoE against closed forms written in plain JAX/NumPy;
the MoE's gradient through fnnc's NNC-convention backward equals jax.grad of a dense
oracle; on 4 virtual CPU devices with the experts sharded it equals one device."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fnnc.errors import ModelError
from fnnc.models import Input, Model, MoE, RotaryEmbedding, SwiGLU, model_function
from tests.helpers import assert_close, rand, subprocess_env


def _model(layer, x):
    inp = Input()
    m = Model(inp, layer(inp), name="m")
    m.compile(x)
    return m


def test_swiglu_is_the_llama_mlp():
    x = rand((4, 6))
    m = _model(SwiGLU(10, name="mlp"), x)
    p = m.parameters()
    assert sorted(p) == ["t-m-0-mlp-0-0", "t-m-0-mlp-0-1", "t-m-0-mlp-0-2"]
    g, u, d = (np.asarray(p[f"t-m-0-mlp-0-{i}"], np.float64) for i in range(3))
    a = x @ g.T
    want = (a / (1 + np.exp(-a)) * (x @ u.T)) @ d.T
    assert_close(m.evaluate(x), want, 1e-5, 1e-5)


def test_rotary_embedding_rotates_pairs_by_position():
    x = rand((2, 5, 3, 8))
    got = np.asarray(_model(RotaryEmbedding(offset=2), x).evaluate(x))
    theta = 10000.0 ** (-np.arange(4) * 2 / 8)
    ang = np.arange(2, 7)[:, None] * theta  # [T, D/2]
    c, s = np.cos(ang)[None, :, None], np.sin(ang)[None, :, None]
    lo, hi = x[..., :4], x[..., 4:]
    want = np.concatenate([lo * c - hi * s, hi * c + lo * s], axis=-1)
    assert_close(got, want, 1e-5, 1e-5)
    # q·k of rotated vectors depends on the positions' difference only
    q = np.broadcast_to(x[:1, :1], (1, 5, 3, 8)).copy()
    rq = np.asarray(_model(RotaryEmbedding(), q).evaluate(q))
    dots = np.einsum("bthd,bshd->ts", rq[..., :1, :], rq[..., :1, :])
    assert_close(dots[0, 1], dots[3, 4], 1e-5, 1e-5)


def test_rotary_embedding_rejects_odd_heads():
    with pytest.raises(ModelError, match="even D"):
        _model(RotaryEmbedding(), rand((1, 2, 1, 3)))


def test_rotary_embedding_refuses_integer_input():
    """Its cos/sin tables in int32 would be 1s and 0s: every position past the first
    came out zero without a word."""
    x = np.arange(12, dtype=np.int32).reshape(1, 3, 1, 4)
    with pytest.raises(ModelError, match=r"RotaryEmbedding.*floating-point input, got int32"):
        _model(RotaryEmbedding(), x)


def moe_oracle(x, p, k, scale=1.0, normalize=True):
    """A dense MoE: every token through its top-k experts, by plain JAX gathers."""
    router, route, wg, wu, wd = (p[i] for i in range(5))
    logits = x @ router.T
    prob = jnp.sqrt(jax.nn.softplus(logits.astype(jnp.float32)))  # fnnc routes in float32
    chosen = jax.lax.top_k(jax.lax.stop_gradient(prob + route[None]), k)[1]  # [T, k]
    sel = jnp.take_along_axis(prob, chosen, axis=1)
    if normalize:
        sel = sel / jnp.maximum(sel.sum(1, keepdims=True), 6.103515625e-5)
    w = sel * scale
    gate = jnp.einsum("td,tkhd->tkh", x, wg[chosen])
    up = jnp.einsum("td,tkhd->tkh", x, wu[chosen])
    y = jnp.einsum("tkh,tkdh->tkd", jax.nn.silu(gate) * up, wd[chosen])
    return jnp.einsum("tkd,tk->td", y, w.astype(x.dtype))


def test_moe_matches_dense_oracle_and_its_gradient():
    x = rand((2, 5, 6))
    m = _model(MoE(4, 8, k=2, weight_scale=1.5, name="moe"), x)
    ids = [f"t-m-0-moe-0-{i}" for i in range(5)]
    params = {i: jnp.asarray(v) for i, v in m.parameters().items()}
    params[ids[1]] = jnp.asarray(rand((4,), seed=3))  # a routing bias that changes choices
    flat = x.reshape(10, 6)
    want = moe_oracle(flat, [params[i] for i in ids], 2, 1.5).reshape(2, 5, 6)
    fn = model_function(m, [jax.ShapeDtypeStruct(x.shape, np.float32)])
    ct = rand((2, 5, 6), seed=9)
    got, g = jax.jit(jax.value_and_grad(lambda p: jnp.sum(fn([x], p)[0][0] * ct)))(params)
    assert_close(got, jnp.sum(want * ct), 1e-5, 1e-5)
    gw = jax.jit(jax.grad(lambda q: jnp.sum(moe_oracle(flat, q, 2, 1.5).reshape(2, 5, 6) * ct)))(
        [params[i] for i in ids]
    )
    for i, w in zip(ids, gw):
        assert_close(g[i], w, 1e-4, 1e-5, what=i)
    assert not np.asarray(g[ids[1]]).any()  # the routing bias chooses, and has no gradient


def test_moe_top1_router_trains_without_normalize():
    """NNC's renormalised top-1 weight is p / p = 1: the router's gradient was exactly
    zero and 5 SGD steps left it where it was. normalize=False weights by p."""
    x, target = rand((6, 5)), rand((6, 5), seed=1)
    ids = [f"t-m-0-moe-0-{i}" for i in range(5)]
    moved = {}
    for normalize in (True, False):
        inp = Input()
        m = Model(inp, MoE(4, 8, k=1, normalize=normalize, name="moe")(inp), name="m")
        m.compile(x, loss="mse", minimizer=optax.sgd(0.1))
        params = {i: jnp.asarray(v) for i, v in m.parameters().items()}
        fn = model_function(m, [jax.ShapeDtypeStruct(x.shape, np.float32)])
        g = jax.grad(lambda p: jnp.sum((fn([x], p)[0][0] - target) ** 2))(params)
        gw = jax.grad(lambda q: jnp.sum((moe_oracle(x, q, 1, normalize=normalize) - target) ** 2))(
            [params[i] for i in ids]
        )
        for i, w in zip(ids, gw):
            assert_close(g[i], w, 1e-4, 1e-6, what=f"normalize={normalize} {i}")
        for _ in range(5):
            m.fit(x, target)
        moved[normalize] = np.abs(np.asarray(m.parameters()[ids[0]]) - params[ids[0]]).max()
    assert moved[True] == 0  # the documented cost of NNC's formula at k=1
    assert moved[False] > 1e-3, moved


def test_moe_reports_expert_load():
    x = rand((7, 4))
    inp = Input()
    y, load = MoE(3, 5, k=2, return_load=True)(inp)
    m = Model(inp, [y, load])
    m.compile(x)
    _, got = m.evaluate(x)
    p = [jnp.asarray(v) for _, v in sorted(m.parameters().items())]
    prob = jnp.sqrt(jax.nn.softplus(x @ p[0].T))
    chosen = np.asarray(jax.lax.top_k(prob, 2)[1])
    assert_close(got, np.bincount(chosen.ravel(), minlength=3).astype(np.float32), 0, 0)


def test_moe_in_bfloat16_matches_the_oracle_and_its_gradient():
    x = rand((12, 6)).astype(jnp.bfloat16)
    m = _model(MoE(4, 8, k=2, name="moe"), np.asarray(x))
    ids = [f"t-m-0-moe-0-{i}" for i in range(5)]
    params = {i: jnp.asarray(v) for i, v in m.parameters().items()}
    assert params[ids[2]].dtype == jnp.bfloat16
    fn = model_function(m, [jax.ShapeDtypeStruct(x.shape, x.dtype)])
    ct = jnp.asarray(rand((12, 6), seed=4), jnp.bfloat16)

    def total(y):
        return jnp.sum((y * ct).astype(jnp.float32))

    got, g = jax.value_and_grad(lambda p: total(fn([x], p)[0][0]))(params)
    want, gw = jax.value_and_grad(lambda q: total(moe_oracle(x, q, 2)))([params[i] for i in ids])
    assert_close(got, want, 1e-2, 1e-2)
    for i, w in zip(ids, gw):
        assert_close(g[i], w, 2e-2, 2e-2, what=i)


def _moe_temp_bytes(tokens):
    inp = Input()
    m = Model(inp, MoE(4, 8, k=2, name="moe")(inp), name="m")
    m.compile(np.zeros((2, 4), np.float32))
    spec = jax.ShapeDtypeStruct((tokens, 4), np.float32)
    fn = model_function(m, [spec])
    params = {i: jnp.asarray(v) for i, v in m.parameters().items()}
    lowered = jax.jit(lambda p, x: fn([x], p)[0][0]).lower(params, spec)
    return lowered.compile().memory_analysis().temp_size_in_bytes


def test_moe_combine_memory_is_linear_in_tokens():
    """The rows went back to their tokens through a one-hot [tokens, tokens * k] GEMM:
    at 16k tokens 2 GB of temporaries and 19 GFLOP for 0.1 GFLOP of expert work."""
    small, large = _moe_temp_bytes(512), _moe_temp_bytes(2048)
    assert large < 6 * small, (small, large)  # 4x the tokens: 4x (one-hot: ~14x)
    assert large < 2048 * 2 * 4 * 64, large  # a [2048, 4096] float32 one-hot is 32 MiB


SCRIPT = textwrap.dedent(
    """
    import json, jax, numpy as np, jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from fnnc import config, ops
    from fnnc.models import Input, Model, MoE, model_function
    assert jax.device_count() == 4, jax.devices()
    x = np.random.default_rng(0).normal(size=(16, 6)).astype(np.float32)
    inp = Input()
    m = Model(inp, MoE(8, 12, k=2, name="moe")(inp), name="m")
    m.compile(x)
    fn = model_function(m, [jax.ShapeDtypeStruct(x.shape, np.float32)])
    params = fn.initial_parameters(m)
    def loss(p, x):
        return jnp.sum(fn([x], p)[0][0] ** 2)
    step = jax.jit(jax.value_and_grad(loss))
    want_loss, want_grads = step(params, x)
    mesh = Mesh(np.array(jax.devices()), ("expert",))
    sharded = {k: jax.device_put(v, NamedSharding(mesh, P("expert") if v.ndim == 3 else P()))
               for k, v in params.items()}
    got_loss, got_grads = step(sharded, jax.device_put(x, NamedSharding(mesh, P())))
    bank = sharded["t-m-0-moe-0-2"]
    out = {"experts_per_device": [s.data.shape[0] for s in bank.addressable_shards],
           "loss": [float(want_loss), float(got_loss)],
           "grad_err": max(float(np.abs(np.asarray(got_grads[k]) - np.asarray(want_grads[k])).max())
                           for k in params)}
    same = []
    for ranks in (4, 8, 6):  # one rank per device; two per device; 3 devices of 2 ranks
        xs = [np.arange(2 * 24, dtype=np.float32).reshape(2, 24) + 100 * r for r in range(ranks)]
        xs = [x[:, : 24 // ranks * ranks] for x in xs]
        want = ops.comm_all_to_all(axis=1)(*xs)
        with config.override(backend_per_command={"comm_all_to_all": "shard_map"}):
            got = ops.comm_all_to_all(axis=1)(*xs)
        same.append(all(np.array_equal(a, b) for a, b in zip(want, got)))
    out["all_to_all_equal"] = all(same)
    print(json.dumps(out))
    """
)


def test_moe_with_experts_sharded_on_4_devices_equals_one_device():
    env = subprocess_env(XLA_FLAGS="--xla_force_host_platform_device_count=4")
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["experts_per_device"] == [2, 2, 2, 2]
    want, got = out["loss"]
    assert abs(want - got) <= 1e-5 * abs(want), out
    assert out["grad_err"] < 1e-5, out
    assert out["all_to_all_equal"], out
