"""What to do about labels that do not fit a loss's scores, for the loss family's shape
errors (:mod:`fnnc.ops.loss`): a target missing a size-1 axis (Keras's ``y`` of ``[N]``
for an output ``[N, 1]``), or scores whose classes are not the last axis (PyTorch's
``[N, C, H, W]``). Each returns the sentence to append, or nothing."""

from __future__ import annotations

from fnnc.core.ir import unit_axes_apart


def class_axis_hint(x, shape) -> str:
    """For labels that fit scores whose classes sit on another axis than the last
    (PyTorch's ``[N, C, H, W]`` against ``[N, H, W]`` labels): say to move them last."""
    dims, shape = tuple(x.shape), tuple(shape)
    fits = [
        k
        for k in range(len(dims) - 1)
        if dims[:k] + dims[k + 1 :] == shape
        or (dims[:k] + dims[k + 1 :] == shape[:-1] and shape[-1] in (1, dims[k]))
    ]
    if not fits:
        return ""
    k = fits[0]
    perm = [n for n in range(len(dims)) if n != k] + [k]
    return (
        f"; the classes are the last axis of the scores: if they are on axis {k} "
        f"(PyTorch's NCHW), which these labels would fit, move them last, e.g. "
        f"fnnc.ops.transpose(perm={perm}) or jnp.moveaxis(scores, {k}, -1)"
    )


def reshape_hint(given, want) -> str:
    """What to do when ``given`` holds ``want``'s values but for axes of size 1 (a target
    ``y`` of ``[N]`` for an output ``[N, 1]``, Keras's habit): reshape it. Else nothing."""
    if not unit_axes_apart(given, want):
        return ""
    want = tuple(want)
    rows = ", ".join(["-1", *(str(n) for n in want[1:])])
    return (
        f"; the second holds the same values but for axes of size 1: reshape it to "
        f"{list(want)} (a target y of any batch: y.reshape({rows}))"
    )
