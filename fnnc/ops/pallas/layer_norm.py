"""Pallas ``layer_norm``: one kernel for ``(y, mean, inv_std)``, one for the backward.

The kernels live in :mod:`fnnc.ops.pallas._rownorm` (shared with ``rms_norm``): rows
of the trailing normalised axes, walked in power-of-two lane blocks, statistics in
float32. The backward kernel reads only ``x``, ``scale``, ``mean`` and ``inv_std``
(the command's ``backward_uses``) and also writes per-program partial sums of the
scale and bias gradients.

Supported: float32/bfloat16/float16; ``axes`` the trailing axes (the default ``(-1,)``
included); any normalised size (a ragged last lane block is masked).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fnnc.core.command import Command, Spec
from fnnc.ops.norm import layer_norm as _command
from fnnc.ops.pallas import _rownorm

layer_norm_reference = _command.definition.forward
"""The command's reference forward (the ``"xla"`` backend), which the kernel matches."""


def supports(cmd: Command, specs: Sequence[Spec]) -> str | None:
    """``None`` when the kernels run these inputs, else the reason."""
    return _rownorm.support_reason("layer_norm", specs, cmd.param("axes"))


def _norm(params: Sequence[Any], epsilon: float) -> _rownorm.Norm:
    return _rownorm.Norm(True, float(epsilon), len(params) > 0, len(params) > 1)


def layer_norm(
    x: Any, scale: Any = None, bias: Any = None, *, axes: Sequence[int] = (-1,), epsilon=1e-5
) -> tuple[Any, Any, Any]:
    """The kernel backend: same signature and results as the reference."""
    params = [p for p in (scale, bias) if p is not None]
    y, mean, inv_std = _rownorm.run(_norm(params, epsilon), x, params, axes)
    return y, mean, inv_std


def backward(
    grads: Sequence[Any],
    inputs: Sequence[Any],
    outputs: Sequence[Any],
    wants: Sequence[int],
    *,
    axes: Sequence[int],
    epsilon: float,
) -> tuple[Any, ...]:
    """The command's backward (NNC convention) as a kernel."""
    x, *params = inputs
    _, mean, inv_std = outputs
    return _rownorm.grad(_norm(params, epsilon), grads, x, params, (mean, inv_std), axes)
