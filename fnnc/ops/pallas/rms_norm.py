"""Pallas ``rms_norm``: one kernel for ``(y, inv_std)``, one for the backward.

The kernels live in :mod:`fnnc.ops.pallas._rownorm` (shared with ``layer_norm``,
without the mean): rows of the trailing normalised axes, walked in power-of-two lane
blocks, statistics in float32. The backward kernel reads only ``x``, ``scale`` and
``inv_std`` and also writes per-program partial sums of the scale gradient.

Supported: float32/bfloat16/float16; ``axes`` the trailing axes; any normalised size
(a ragged last lane block is masked).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fnnc.core.command import Command, Spec
from fnnc.ops.norm import rms_norm as _command
from fnnc.ops.pallas import _rownorm

rms_norm_reference = _command.definition.forward
"""The command's reference forward (the ``"xla"`` backend), which the kernel matches."""


def supports(cmd: Command, specs: Sequence[Spec]) -> str | None:
    """``None`` when the kernels run these inputs, else the reason."""
    return _rownorm.support_reason("rms_norm", specs, cmd.param("axes"))


def _norm(params: Sequence[Any], epsilon: float) -> _rownorm.Norm:
    return _rownorm.Norm(False, float(epsilon), len(params) > 0)


def rms_norm(
    x: Any, scale: Any = None, *, axes: Sequence[int] = (-1,), epsilon=1e-6
) -> tuple[Any, Any]:
    """The kernel backend: same signature and results as the reference."""
    params = [] if scale is None else [scale]
    y, inv_std = _rownorm.run(_norm(params, epsilon), x, params, axes)
    return y, inv_std


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
    _, inv_std = outputs
    return _rownorm.grad(_norm(params, epsilon), grads, x, params, (inv_std,), axes)
