"""The ``"cudnn"`` backend of scaled_dot_product_attention, on a CPU: where it is
registered, what it declines, how it is chosen and timed, and its adaptor (masks,
causal alignment, rows that see nothing, the NNC-convention backward) checked against
the command's reference with jax's ``"xla"`` implementation of the same call standing
in for cuDNN. The compiled cuDNN call is checked in ``tests/ops/pallas/test_gpu.py``."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fnnc import config, ops
from fnnc.core import dispatch, measured
from fnnc.core.dispatch import as_specs, why_not
from fnnc.errors import BackendError
from fnnc.ops import attention_cudnn, measure_defaults
from fnnc.ops.autodiff import gradient_command
from tests.helpers import assert_close, rand

SDPA = "scaled_dot_product_attention"
BF16 = jnp.bfloat16
spec = jax.ShapeDtypeStruct


def _qkv(b=2, s=8, h=4, d=16, t=None, hk=None, dtype=BF16):
    t, hk = t or s, hk or h
    return [spec((b, s, h, d), dtype), spec((b, t, hk, d), dtype), spec((b, t, hk, d), dtype)]


def test_registered_for_gpu_only_with_priority_0_and_a_backward():
    backend = ops.backends_of(SDPA)["cudnn"]
    assert backend.platforms == ("gpu",) and backend.interpret_platforms == ()
    assert backend.priority == 0 and backend.backward is attention_cudnn.backward
    assert ops.backends_of("gradient")["cudnn"].platforms == ("gpu",)
    assert why_not(backend, ops.scaled_dot_product_attention(), _qkv(), "cpu") is not None


@pytest.mark.parametrize(
    "cmd, specs, reason",
    [
        (dict(), _qkv(), None),
        (dict(is_causal=True), _qkv(hk=2), None),  # grouped-query attention
        (dict(), [*_qkv(), spec((2, 1, 8, 8), jnp.bool_)], None),
        (dict(), [*_qkv(), spec((8, 8), BF16)], None),
        (dict(), _qkv(dtype=jnp.float32), "not bfloat16 or float16"),
        (dict(), _qkv(d=12), "multiple of 8"),
        (dict(), _qkv(d=512), "multiple of 8 up to"),
        (dict(), [*_qkv()[:2], spec((2, 8, 4, 32), BF16)], "differs from the value head"),
        (dict(is_causal=True), _qkv(s=4, t=8), "top-left"),
        (dict(), [*_qkv(s=7), spec((7, 7), jnp.bool_)], "even lengths"),
        (dict(), [*_qkv(), None, spec((64, 64), BF16)], "output projection"),
    ],
)
def test_supports_declines_what_cudnn_cannot_run(cmd, specs, reason):
    why = attention_cudnn.supports(ops.scaled_dot_product_attention(**cmd), specs)
    assert why is None if reason is None else reason in why


@pytest.fixture
def restore_defaults():
    yield
    dispatch.use_measured_defaults(None)


def test_chosen_on_gpu_only_where_measured(monkeypatch, restore_defaults, clean_table):
    monkeypatch.setattr(measured, "device_kind", lambda platform: "Some GPU")
    cmd, qkv = ops.scaled_dot_product_attention(is_causal=True), _qkv()
    assert ops.select_backend(cmd, qkv, "gpu") == "pallas"  # flash attention by construction
    dispatch.use_measured_defaults({"Some GPU": {SDPA: {"*": "cudnn"}}})
    assert ops.select_backend(cmd, qkv, "gpu") == "cudnn"
    # cuDNN declines float32, and at full float32 precision flash attention has no
    # priority either (its products would run without tensor cores)
    assert ops.select_backend(cmd, _qkv(dtype=jnp.float32), "gpu") == "xla"
    assert ops.select_backend(cmd, qkv, "cpu") == "xla"
    grad = gradient_command(cmd, tuple(qkv), (qkv[0],), (True,), (0, 1, 2))
    assert ops.select_backend(grad, [qkv[0], *qkv, qkv[0]], "gpu") == "cudnn"  # dO, q, k, v, O
    with (
        config.override(backend_per_command={SDPA: "cudnn"}),
        pytest.raises(BackendError, match="does not run on cpu"),
    ):
        ops.select_backend(cmd, qkv, "cpu")


def test_measure_defaults_times_it_against_the_reference_in_bfloat16():
    for dtype, timed in ((jnp.bfloat16, True), (jnp.float32, False)):
        cases = measure_defaults.cases(measure_defaults.SIZES["large"], dtype, specs_only=True)
        (cmd, args, _), *_ = [c for c in cases if c[0].name == SDPA]
        backend = ops.backends_of(SDPA)["cudnn"]
        assert (why_not(backend, cmd, as_specs(args, SDPA), "gpu") is None) == timed


def _inputs(dtype, mask, s=8, t=8, hk=2):
    q = rand((2, s, 4, 16), seed=0).astype(dtype)
    k, v = (rand((2, t, hk, 16), seed=i).astype(dtype) for i in (1, 2))
    return [q, k, v] if mask is None else [q, k, v, mask]


def _bool_mask():
    keep = np.random.default_rng(3).random((2, 1, 8, 8)) < 0.6
    keep[0, 0, 2] = False  # a query that sees no key: zeros, as in the command
    return jnp.asarray(keep)


@pytest.mark.parametrize(
    "params, mask, dtype",
    [
        (dict(is_causal=True), None, jnp.float32),
        (dict(scale=0.3), "bool", jnp.float32),
        (dict(), "float", jnp.float32),
        (dict(is_causal=True), "bool", BF16),
    ],
)
def test_adaptor_matches_the_reference_forward_and_backward(monkeypatch, params, mask, dtype):
    monkeypatch.setattr(attention_cudnn, "IMPLEMENTATION", "xla")
    m = {None: None, "bool": _bool_mask(), "float": rand((8, 8), seed=4).astype(dtype)}[mask]
    args = _inputs(dtype, m)
    cmd = ops.scaled_dot_product_attention(**params)
    ref = ops.backends_of(SDPA)["xla"].forward(*args, **params)
    out = jax.jit(lambda *a: attention_cudnn.scaled_dot_product_attention(*a, **params))(*args)
    tol = 2e-2 if dtype == BF16 else 2e-5
    assert_close(out, ref, rtol=tol, atol=tol)
    go = rand(ref.shape, seed=5).astype(dtype)
    full = dict(scale=None, is_causal=False) | params
    wants = tuple(range(len(args)))
    want = cmd.definition.backward((go,), args, (ref,), **full)
    got = attention_cudnn.backward((go,), args, (ref,), wants, **full)
    assert len(got) == len(args)
    for g, w in zip(got, want):
        if w is None or (mask == "bool" and g is None):
            assert g is None
        else:
            assert_close(g, w, rtol=5 * tol, atol=5 * tol)
