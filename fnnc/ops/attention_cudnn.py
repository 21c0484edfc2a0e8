"""cuDNN's fused attention as the ``"cudnn"`` backend of ``scaled_dot_product_attention``.

It runs ``jax.nn.dot_product_attention(..., implementation="cudnn")`` (cuDNN's flash
attention: the ``[B, H, S, T]`` scores are never materialised) on GPU only, with
priority 0: it is the default only where the measured defaults
(:mod:`fnnc.core.measured`, written by ``python -m fnnc.ops.measure_defaults``, which
times it against the reference and the Pallas kernel) or the autotune table say it
wins. Forcing it elsewhere raises :class:`~fnnc.errors.BackendError`.

The command's semantics (:mod:`fnnc.ops.attention`) are kept exactly; what cuDNN
cannot give is declined by :func:`supports`, so selection falls back:

- dtypes bfloat16 and float16 only (cuDNN's flash attention has no float32);
- head size ``D == Dv``, a multiple of 8, at most 128 (256 on Hopper and later);
- ``is_causal`` only with ``S == T``: cuDNN aligns its causal mask top-left, the command
  bottom-right (query ``i`` sees keys ``j <= i + T - S``), and they agree only there;
- a mask only with even ``S`` and ``T`` (jax's rule for cuDNN biases in training). A
  bool mask becomes cuDNN's additive bias, broadcast to ``[B|1, H|1, S, T]``; a query
  that sees no key gets zeros, as in the command (its output and gradient rows are
  zeroed here, since cuDNN would spread it over every key). A float mask is cuDNN's
  bias and gets its gradient; a float mask of ``-inf`` over a whole row is not detected;
- no fused output projection (``weights``, ``bias``: NNC's unify head);
- on a GPU, anything jax's own cuDNN checks refuse (no cuDNN, its version, the compute
  capability): the forward and backward are traced once per input shape to ask.

The backward (NNC's convention, :data:`fnnc.core.dispatch.Backend.backward`) is
``jax.vjp`` of the same cuDNN call: it runs cuDNN's backward kernel after recomputing
the forward's softmax statistics (the graph's ``gradient`` node gets ``O`` but not
cuDNN's residual). The forward asks for that residual too, so its custom call is the
one the backward recomputes and XLA may merge the two.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fnnc.core.command import Command, Spec
from fnnc.core.dispatch import Backend, register_backend
from fnnc.core.measured import device_kind
from fnnc.ops.attention import scaled_dot_product_attention as _command

COMMAND = _command.definition.name
NAME = "cudnn"
PLATFORMS = ("gpu",)
PRIORITY = 0
"""Never the default by priority: only where measured faster (see the module doc)."""

IMPLEMENTATION = "cudnn"
"""What ``jax.nn.dot_product_attention`` is asked for. Only the tests change it (to
``"xla"``, jax's reference of the same call) to check this adaptor on a CPU."""

DTYPES = (np.dtype(jnp.bfloat16), np.dtype(np.float16))


def _max_head_size() -> int:
    """256 on Hopper and later, 128 before (jax's ``check_is_flash_attention``)."""
    if device_kind("gpu") is None:
        return 128
    capability = getattr(jax.devices("gpu")[0], "compute_capability", "0.0")
    return 256 if tuple(int(x) for x in str(capability).split(".")[:2]) >= (9, 0) else 128


def supports(cmd: Command, specs: Sequence[Spec]) -> str | None:
    """``None`` when cuDNN runs these inputs with the command's semantics, else why not."""
    q, k, v, *rest = specs
    mask = rest[0] if rest else None
    if any(s is not None for s in rest[1:]):
        return f"{NAME}: the fused output projection (weights, bias) runs in the reference only"
    if np.dtype(q.dtype) not in DTYPES:
        return f"{NAME}: dtype {np.dtype(q.dtype).name} is not bfloat16 or float16"
    (_, s, _, d), t, dv = q.shape, k.shape[1], v.shape[3]
    if d != dv:
        return f"{NAME}: head size D {d} differs from the value head size Dv {dv}"
    top = _max_head_size()
    if d % 8 or d > top:
        return f"{NAME}: head size {d} is not a multiple of 8 up to {top}"
    if s == 0 or t == 0:
        return f"{NAME}: query length S {s} or key length T {t} is 0"
    if cmd.param("is_causal") and s != t:
        return (
            f"{NAME}: causal attention with S {s} != T {t}: cuDNN aligns the causal mask "
            "top-left, the command bottom-right"
        )
    if mask is not None and (s % 2 or t % 2):
        return f"{NAME}: a mask needs even lengths, got S {s} and T {t}"
    if device_kind("gpu") is not None:
        return _jax_declines(tuple(specs), cmd.param("scale"), cmd.param("is_causal"))
    return None


@functools.lru_cache(maxsize=256)
def _jax_declines(specs: tuple[Spec, ...], scale: Any, is_causal: bool) -> str | None:
    """What jax's cuDNN checks say about the forward and backward of these inputs."""
    q, k, v, *rest = specs
    mask = rest[0] if rest else None

    def loss(q: Any, k: Any, v: Any) -> Any:
        m = None if mask is None else jnp.zeros(mask.shape, mask.dtype)
        return jnp.sum(_attention(q, k, v, m, scale, is_causal).astype(jnp.float32))

    try:
        jax.eval_shape(jax.grad(loss, argnums=(0, 1, 2)), q, k, v)
    except (ValueError, NotImplementedError, RuntimeError, TypeError) as e:
        return f"{NAME}: jax declines: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
    return None


def _mask4(mask: Any, s: int, t: int) -> Any:
    """The mask as ``[B|1, H|1, S, T]``: cuDNN's bias spans both sequence axes."""
    mask = jnp.reshape(mask, (1,) * (4 - mask.ndim) + tuple(mask.shape))
    return jnp.broadcast_to(mask, (*mask.shape[:2], s, t))


def _attention(q: Any, k: Any, v: Any, mask: Any, scale: Any, is_causal: bool) -> Any:
    s, t = q.shape[1], k.shape[1]
    scale = 1 / math.sqrt(q.shape[3]) if scale is None else scale
    bias = keep = None
    if mask is not None and mask.dtype == jnp.bool_:
        keep = _mask4(mask, s, t)
    elif mask is not None:
        bias = _mask4(mask, s, t)
    o, _ = jax.nn.dot_product_attention(
        q,
        k,
        v,
        bias=bias,
        mask=keep,
        scale=float(scale),
        is_causal=is_causal,
        implementation=IMPLEMENTATION,
        return_residual=True,
    )
    if keep is None:
        return o
    # A query that sees no key gets zeros, as in the command, not cuDNN's mean of v.
    if is_causal:  # S == T here (supports)
        keep = keep & jnp.tril(jnp.ones((1, 1, s, t), jnp.bool_))
    seen = jnp.transpose(jnp.any(keep, axis=-1), (0, 2, 1))[..., None]  # [B|1, S, H|1, 1]
    return jnp.where(seen, o, jnp.zeros((), o.dtype))


def scaled_dot_product_attention(q, k, v, mask=None, *, scale=None, is_causal=False):
    """The cuDNN backend: same signature and results as the reference."""
    return _attention(q, k, v, mask, scale, is_causal)


def backward(grads, inputs, outputs, wants, *, scale, is_causal) -> tuple[Any, ...]:
    """The command's backward (NNC convention): ``jax.vjp`` of the cuDNN call."""
    (go,), (q, k, v, *mask) = grads, inputs
    m = mask[0] if mask else None
    float_mask = m is not None and m.dtype != jnp.bool_ and 3 in wants
    go = jnp.zeros(outputs[0].shape, q.dtype) if go is None else go.astype(q.dtype)
    if float_mask:
        _, vjp = jax.vjp(lambda *a: _attention(*a, scale, is_causal), q, k, v, m)
        return vjp(go)
    _, vjp = jax.vjp(lambda q, k, v: _attention(q, k, v, m, scale, is_causal), q, k, v)
    return (*vjp(go), None)[: len(inputs)]


BACKEND = Backend(
    NAME, scaled_dot_product_attention, PLATFORMS, supports, PRIORITY, (), backward=backward
)


def register() -> None:
    """Registers :data:`BACKEND` for ``scaled_dot_product_attention`` (done at import)."""
    register_backend(COMMAND, BACKEND)


register()
