"""Pallas ``gradient``: a graph's backward nodes run the kernels' backward passes.

The symbolic ``backward`` pass turns each forward node into a ``gradient[of=cmd]``
node (see :mod:`fnnc.ops.autodiff`), so a compiled training graph never calls a
forward backend's ``custom_vjp``. This backend of ``gradient`` closes that gap: for a
node whose ``of`` command has a Pallas kernel (:data:`KERNELS`) it reads the same
tensors as the reference (the command's ``backward_uses``) and calls that kernel
module's ``backward``; it supports exactly what the forward kernel supports.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import Any

import jax.numpy as jnp
import numpy as np

from fnnc.ops.autodiff import gradient as _command
from fnnc.ops.command import Command, Spec
from fnnc.ops.pallas import (
    fused_elementwise,
    gemm,
    layer_norm,
    rms_norm,
    scaled_dot_product_attention,
    softmax_crossentropy,
)

KERNELS: dict[str, ModuleType] = {
    "fused_elementwise": fused_elementwise,
    "gemm": gemm,
    "layer_norm": layer_norm,
    "rms_norm": rms_norm,
    "scaled_dot_product_attention": scaled_dot_product_attention,
    "softmax_crossentropy": softmax_crossentropy,
}
"""Forward commands whose backward has a kernel, with the module holding it."""

gradient_reference = _command.definition.forward
"""The command's reference forward (the ``"xla"`` backend), which the kernels match."""


def _specs(pairs: Any) -> tuple[Spec, ...]:
    return tuple(Spec(tuple(shape), np.dtype(dtype)) for shape, dtype in pairs)


def supports(cmd: Command, specs: Sequence[Spec]) -> str | None:
    """``None`` when ``cmd``'s forward command has a kernel backward for these inputs."""
    of = cmd.param("of")
    module = KERNELS.get(of.name)
    if module is None:
        return f"{of.name} has no Pallas backward kernel (those that do: {sorted(KERNELS)})"
    return module.supports(of, _specs(cmd.param("in_specs")))


def gradient(*inputs, of, in_specs, out_specs, grad_mask, wants):
    """The kernel backend: same signature and results as the reference."""
    uses = of.definition.backward_uses
    ins_spec, outs_spec = _specs(in_specs), _specs(out_specs)
    values = iter(inputs)
    grads = tuple(next(values) if m else None for m in grad_mask)
    ins = tuple(next(values) if uses.input_used(i) else s for i, s in enumerate(ins_spec))
    outs = tuple(next(values) if i in uses.outputs else s for i, s in enumerate(outs_spec))
    result = KERNELS[of.name].backward(grads, ins, outs, tuple(wants), **of.kwargs)
    picked = []
    for i in wants:
        g, spec = result[i], ins_spec[i]
        picked.append(jnp.zeros(spec.shape, spec.dtype) if g is None else g.astype(spec.dtype))
    return picked[0] if len(picked) == 1 else tuple(picked)
