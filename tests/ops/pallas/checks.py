"""Shared checks of a Pallas kernel module against its reference (interpret mode on CPU)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fnnc import config, ops
from fnnc.core.command import Command
from fnnc.core.dispatch import as_specs
from fnnc.errors import BackendError
from fnnc.graph import GraphBuilder
from tests.helpers import assert_close

RTOL = ATOL = 1e-5


def _tuple(x: Any) -> tuple[Any, ...]:
    return x if isinstance(x, tuple) else (x,)


def cotangents(outs: Sequence[Any], seed: int = 3) -> tuple[Any, ...]:
    rng = np.random.default_rng(seed)
    return tuple(jnp.asarray(rng.uniform(-1, 1, o.shape).astype(o.dtype)) for o in outs)


def check_kernel(
    module: Any,
    cmd: Command,
    args: Sequence[Any],
    diff: Sequence[int],
    rtol: float = RTOL,
    atol: float = ATOL,
) -> None:
    """Forward, ``jax.vjp`` through the custom_vjp, and the NNC-convention backward."""
    kernel = getattr(module, cmd.name)
    reference = getattr(module, f"{cmd.name}_reference")
    assert module.supports(cmd, as_specs(args, "test")) is None
    args = [jnp.asarray(a) for a in args]
    kw = cmd.kwargs

    def pick(fn):
        def f(*xs):
            full = list(args)
            for i, x in zip(diff, xs):
                full[i] = x
            return _tuple(fn(*full, **kw))

        return f

    def forward_and_vjp(fn):
        # One jitted program per side: run eagerly, an interpret-mode kernel and its vjp
        # would compile every small op of the interpreter separately.
        @jax.jit
        def both(xs, cts):
            out, pull = jax.vjp(pick(fn), *xs)
            return out, pull(cts)

        return both

    xs = tuple(args[i] for i in diff)
    cts = cotangents(jax.eval_shape(pick(reference), *xs))
    want, want_grads = forward_and_vjp(reference)(xs, cts)
    got, got_grads = forward_and_vjp(kernel)(xs, cts)
    assert_close(got, want, rtol, atol, what=f"{cmd} forward")
    assert_close(got_grads, want_grads, rtol, atol, what=f"{cmd} vjp")
    check_backward(module, cmd, args, want, cts, diff, rtol, atol)


def check_backward(module, cmd, args, outs, cts, diff, rtol=RTOL, atol=ATOL) -> None:
    """``module.backward`` equals the command's backward, unused tensors given as specs."""
    uses = cmd.definition.backward_uses
    spec = lambda t: jax.ShapeDtypeStruct(t.shape, t.dtype)
    ins = tuple(a if uses.input_used(i) else spec(a) for i, a in enumerate(args))
    outs = tuple(o if i in uses.outputs else spec(o) for i, o in enumerate(outs))
    want = jax.jit(lambda c, i, o: cmd.definition.backward(c, i, o, **cmd.kwargs))(cts, ins, outs)
    got = jax.jit(lambda c, i, o: module.backward(c, i, o, tuple(diff), **cmd.kwargs))(
        cts, ins, outs
    )
    for i in diff:
        assert_close(got[i], want[i], rtol, atol, what=f"{cmd} backward input {i}")


def check_unsupported(cmd: Command, args: Sequence[Any], reason: str) -> None:
    """Declined inputs: quiet fallback when preferred, a BackendError naming why when forced."""
    specs = as_specs(args, "test")
    with config.override(backend="pallas"):
        assert ops.select_backend(cmd, specs, "cpu") == "xla"
        assert ops.select_backend(cmd, specs, "gpu") == "xla"
        got = cmd(*args)  # runs the reference, no error
    want = ops.backends_of(cmd.name)["xla"].forward(*args, **cmd.kwargs)
    assert_close(got, want)
    with (
        config.override(backend_per_command={cmd.name: "pallas"}),
        pytest.raises(BackendError, match=rf"{cmd.name}.*{reason}"),
    ):
        cmd(*args)


def check_forced_eager(cmd: Command, args: Sequence[Any]) -> None:
    """Forcing the kernel for an eager call gives the reference's values."""
    with config.override(backend_per_command={cmd.name: "pallas"}):
        got = cmd(*args)
    with config.override(backend_per_command={cmd.name: "xla"}):
        want = cmd(*args)
    assert_close(got, want, RTOL, ATOL, what=f"{cmd} forced")


def _fused(dtype):
    b = GraphBuilder()
    x, m, col, s = (
        b.input((3, 37), dtype),
        b.input((3, 37), np.bool_),
        b.input((3, 1), dtype),
        b.input((), dtype),
    )
    y = b.exec(ops.select(), m, b.exec(ops.mish(), x), b.exec(ops.ewprod(), x, col))
    body = b.build([b.exec(ops.ewsum(), b.exec(ops.sigmoid(), y), s)])
    return ops.fused_elementwise(body=body), [
        ((3, 37), dtype),
        ((3, 37), np.bool_),
        ((3, 1), dtype),
        ((), dtype),
    ]


def _gemm_gelu(dtype):
    b = GraphBuilder()
    x, w, bias = b.input((33, 65), dtype), b.input((47, 65), dtype), b.input((47,), dtype)
    y = b.exec(ops.gelu(approximate=True), b.exec(ops.gemm(transpose_b=True), x, w, bias))
    return ops.fused_elementwise(body=b.build([y])), [
        ((33, 65), dtype),
        ((47, 65), dtype),
        ((47,), dtype),
    ]


def _bias_gelu(dtype):
    """Exact GELU after a bias: its ``erf`` runs as fnnc's rule (Triton has none)."""
    b = GraphBuilder()
    x, bias = b.input((3, 37), dtype), b.input((37,), dtype)
    y = b.exec(ops.gelu(), b.exec(ops.add(), x, bias))
    return ops.fused_elementwise(body=b.build([y])), [((3, 37), dtype), ((37,), dtype)]


def small_cases(dtype):
    """One small case per kernel: ``{name: (command, [(shape, dtype), ...])}``.

    Sizes are ragged (1001 classes, 200 features, 67 queries over 45 keys, a 33 x 47 x 65
    product, 37 lanes), so every kernel's masked last blocks run and lower.
    """
    q, kv = ((1, 67, 4, 32), dtype), ((1, 45, 2, 32), dtype)
    return {
        "softmax_crossentropy": (
            ops.softmax_crossentropy(),
            [((3, 1001), dtype), ((3,), np.int32)],
        ),
        "layer_norm": (ops.layer_norm(), [((4, 3, 200), dtype), ((200,), dtype), ((200,), dtype)]),
        "rms_norm": (ops.rms_norm(), [((4, 3, 200), dtype), ((200,), dtype)]),
        "attention_causal_gqa": (ops.scaled_dot_product_attention(is_causal=True), [q, kv, kv]),
        "attention_float_mask": (
            ops.scaled_dot_product_attention(),
            [q, kv, kv, ((4, 67, 45), dtype)],
        ),
        "attention_bool_mask": (
            ops.scaled_dot_product_attention(),
            [q, kv, kv, ((1, 1, 67, 45), np.bool_)],
        ),
        "gemm_transposed": (
            ops.gemm(transpose_a=True, transpose_b=True),
            [((65, 33), dtype), ((47, 65), dtype), ((47,), dtype)],
        ),
        "fused_chain": _fused(dtype),
        "fused_gemm_epilogue": _gemm_gelu(dtype),
        "fused_bias_gelu_exact": _bias_gelu(dtype),
    }
