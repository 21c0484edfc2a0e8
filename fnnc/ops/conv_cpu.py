"""CPU backends of ``convolution``: per product, the formulation XLA:CPU runs fastest.

XLA:CPU hands a plain 2-D float32 convolution to YNNPACK, which is quick for the forward
of thin layers but up to 1.5x slower than XLA's Eigen convolution on wider ones, and
whose weight gradient (a convolution with the whole feature map as its window) is 3-4x
slower than the same sums split over the batch or run by Eigen. The formulations in
:mod:`fnnc.ops._conv_forms` compute the same products in ways XLA runs faster; these
backends, compiled on CPU only, choose among them:

``"mixed"`` (the default on CPU: 2-D ungrouped float32/float64 convolutions with at
least :data:`MIN_ROWS` output positions over the batch)
    per product, the formulation measured fastest for the shape. Rules, with ms for
    batch 64, 14x14x32 -> 64, 3x3 SAME (XLA's -> mixed, torch; 2-core x86,
    ``benchmarks/cpu_vs_torch.py``; C = input channels, O = output channels):

    ===============  ==============================================  ===================
    product          rule                                            ms
    ===============  ==============================================  ===================
    (1x1 kernels)    ``gemm`` for all three: a GEMM over the         weight gradient
                     (strided) input itself                          8.0 -> 3.9, 0.9 (1)
    forward          ``dilated`` if C >= 32, else XLA's (YNNPACK)    4.9 -> 3.0, 2.5
    data gradient    ``gemm`` (col2im) if strided, ``dilated`` if    5.0 -> 3.6, 2.6
                     C and O >= 32, else XLA's
    weight gradient  ``chunked`` if 8 <= C < 32 on maps of >= 1024   15.4 -> 4.8, 2.3
                     output cells, else ``dilated``
    ===============  ==============================================  ===================

    (1) The ResNet projection 32x32x16 -> 32, 1x1 stride 2, on one core shared with
    other work (``taskset -c 0``, torch with one thread): only the ratios hold.

    The rules depend on the thread count: on one core XLA's own forward and data
    gradient (YNNPACK) beat ``dilated`` at every stride-1 shape measured (batch 64:
    14x14x32 -> 64 forward 4.8 vs 5.6 ms, 16x16x32 -> 32 2.5 vs 3.9, 8x8x64 -> 64 2.5
    vs 2.6), while on two threads ``dilated`` (Eigen, which uses both) wins as the
    table says. :meth:`fnnc.models.Model.autotune` measures on the machine at hand.

``"dilated"``, ``"chunked"``, ``"im2col"`` (priority 0)
    one formulation for every product (``chunked``: XLA's forward and data gradient,
    chunked weight gradient; ``im2col``: the three GEMMs). Never chosen by default:
    :func:`fnnc.ops.autotune.autotune` (or :func:`fnnc.graph.autotune.autotune_graph`)
    picks one where it times faster, or ``config.override(backend_per_command=...)``
    forces it.

All are exact in math (the same products, summed in another order) for every stride,
dilation, padding and group count; half types are declined (their partial sums would
round differently from the reference). Each ``backward`` follows NNC's convention plus
``wants`` (the inputs whose gradients the graph needs); a graph's
``gradient[of=convolution]`` node runs it when this backend is chosen for the node
(see :mod:`fnnc.core.dispatch`).

A compiled program can instead keep every convolution away from YNNPACK: its XLA:CPU
library set (:mod:`fnnc.graph.cpu_libraries`, per program, chosen by
:func:`fnnc.graph.autotune.autotune_graph` or forced with
``config.override(cpu_libraries="ynn-dot")``) then runs XLA's own convolutions on
Eigen. Measured on the shape above (batch 64, 14x14x32 -> 64), XLA's forward / data /
weight gradient take 2.7 / 2.7 / 4.3 ms that way instead of 5.3 / 5.2 / 8.1, close to
``dilated``'s 3.1 / 2.9 / 4.2, so the ``mixed`` rules hold under every set.

>>> import jax, jax.numpy as jnp
>>> from fnnc import ops
>>> cmd = ops.convolution(padding="SAME")
>>> specs = [jax.ShapeDtypeStruct((64, 14, 14, 32), jnp.float32),
...          jax.ShapeDtypeStruct((64, 3, 3, 32), jnp.float32)]
>>> ops.select_backend(cmd, specs, "cpu")
'mixed'
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from fnnc.ops import Backend, register_backend
from fnnc.ops import _conv_forms as forms
from fnnc.ops._rules import leading_sum, to_shape
from fnnc.ops.conv import _conv_geometry

PLATFORMS = ("cpu",)
DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
MIXED, DILATED, CHUNKED, IM2COL = "mixed", "dilated", "chunked", "im2col"
PRIORITY = {MIXED: 20, DILATED: 0, CHUNKED: 0, IM2COL: 0}
"""Without autotuning the highest wins where several support the input; 0 never wins."""

WIDE = 32
"""``mixed``: channel count from which the ``dilated`` forward / data gradient win."""

CHUNKED_CHANNELS = (8, 32)
"""``mixed``: input channels (low inclusive, high exclusive) whose weight gradient is
``chunked`` on maps of at least :data:`CHUNKED_CELLS` output cells."""

CHUNKED_CELLS = 1024

MIN_ROWS = 4096
"""``mixed`` is offered from this many output positions over the batch (batch 64 of
8x8 maps): below it XLA's own convolutions are as fast and compile sooner (the digits
demo's 8x8 and 4x4 maps at batch 32 trained 7% slower with ``mixed``)."""

FORWARD = {"reference": forms.reference_forward, "dilated": forms.dilated_forward,
           "gemm": forms.gemm_forward}  # fmt: skip
DATA_GRAD = {"reference": forms.reference_data_grad, "dilated": forms.dilated_data_grad,
             "gemm": forms.gemm_data_grad}  # fmt: skip
WEIGHT_GRAD = {"reference": forms.reference_weight_grad, "dilated": forms.dilated_weight_grad,
               "chunked": forms.chunked_weight_grad, "gemm": forms.gemm_weight_grad}  # fmt: skip
"""The formulations by name (see :mod:`fnnc.ops._conv_forms`)."""


@dataclasses.dataclass(frozen=True)
class Plan:
    """Which formulation computes each product (keys of :data:`FORWARD` and kin)."""

    forward: str
    data_grad: str
    weight_grad: str


def mixed_plan(x: Any, w: Any, strides: Sequence[int], out: Sequence[int]) -> Plan:
    """The ``mixed`` backend's choice for ``x`` (NHWC), weight ``w`` and the geometry."""
    if all(k == 1 for k in w.shape[1:-1]):
        return Plan("gemm", "gemm", "gemm")  # 1x1: the patches are the (strided) input
    c, o = x.shape[-1], w.shape[0]
    forward = "dilated" if c >= WIDE else "reference"
    if max(strides) > 1:
        data_grad = "gemm"
    else:
        data_grad = "dilated" if min(c, o) >= WIDE else "reference"
    lo, hi = CHUNKED_CHANNELS
    chunk = lo <= c < hi and math.prod(out) >= CHUNKED_CELLS and x.shape[0] > forms.CHUNK
    return Plan(forward, data_grad, "chunked" if chunk else "dilated")


PLANS: dict[str, Callable[..., Plan]] = {
    MIXED: mixed_plan,
    DILATED: lambda *_: Plan("dilated", "dilated", "dilated"),
    CHUNKED: lambda *_: Plan("reference", "reference", "chunked"),
    IM2COL: lambda *_: Plan("gemm", "gemm", "gemm"),
}
"""Per backend: ``plan(x, w, strides, output sizes) -> Plan``."""


def _geometry(x: Any, w: Any, params: dict[str, Any]) -> tuple:
    """(strides, explicit pads, dilation, output sizes) as the reference computes them."""
    return _conv_geometry(
        "convolution", x, w, params["strides"], params["padding"], params["dilation"]
    )


def _dtype_reason(specs: Sequence[Any]) -> str | None:
    if specs[0].ndim != specs[1].ndim:
        return "one sample without a batch axis: the reference adds it"
    dtype = np.dtype(specs[0].dtype)
    if dtype not in DTYPES:
        return (
            f"dtype {dtype.name}: only float32 and float64 (partial sums of half types "
            "would round differently from the reference)"
        )
    return None


def supports_mixed(cmd: Any, specs: Sequence[Any]) -> str | None:
    """``None`` for float32/float64, 2-D, ungrouped convolutions (the ones measured) with
    at least :data:`MIN_ROWS` output positions over the batch."""
    if specs[1].ndim != 4:
        return f"{specs[1].ndim - 2}-D convolution: the rules were measured on 2-D ones"
    if specs[0].ndim != 4:
        return "one sample without a batch axis: the reference adds it"
    if cmd.param("groups") != 1:
        return "grouped convolution: the rules were measured on ungrouped ones"
    x, w = specs[0], specs[1]
    *_, out = _geometry(x, w, cmd.kwargs)
    rows = x.shape[0] * math.prod(out)
    if rows < MIN_ROWS:
        return f"{rows} output positions over the batch < {MIN_ROWS}: XLA's own is as fast"
    return _dtype_reason(specs)


def supports_any(cmd: Any, specs: Sequence[Any]) -> str | None:
    """``None`` for float32/float64 inputs: the single-formulation backends are correct
    for every geometry (they are chosen only by autotuning or when forced)."""
    return _dtype_reason(specs)


def supports_chunked(cmd: Any, specs: Sequence[Any]) -> str | None:
    """As :func:`supports_any`, and a batch larger than one chunk (else the reference).
    The batch is read only once x is known to have one: an unbatched sample's axis 0 is
    spatial."""
    reason = _dtype_reason(specs)
    if reason is None and specs[0].shape[0] <= forms.CHUNK:
        return f"batch {specs[0].shape[0]} <= {forms.CHUNK}: one chunk is the reference itself"
    return reason


def _run_forward(name: str, x, w, bias, params) -> Any:
    s, pads, d, out = _geometry(x, w, params)
    plan = PLANS[name](x, w, s, out)
    y = FORWARD[plan.forward](x, w, s, pads, d, params["groups"])
    return y if bias is None else y + to_shape(bias, y.shape)


def _run_backward(name: str, grads, inputs, wants, params) -> tuple[Any, ...]:
    (g,), (x, w, *bias) = grads, inputs
    s, pads, d, out = _geometry(x, w, params)
    plan, groups, g = PLANS[name](x, w, s, out), params["groups"], g.astype(x.dtype)
    gx = DATA_GRAD[plan.data_grad](g, x, w, s, pads, d, groups) if 0 in wants else None
    gw = WEIGHT_GRAD[plan.weight_grad](g, x, w, s, pads, d, groups) if 1 in wants else None
    if not bias:
        return gx, gw
    return gx, gw, (leading_sum(g, range(g.ndim - 1)) if 2 in wants else None)


def backward_of(name: str) -> Callable[..., tuple[Any, ...]]:
    """The NNC-convention backward (``grads, inputs, outputs, wants, **params``) of one
    of :data:`BACKENDS`, also where ``Backend`` has no ``backward`` field."""

    def backward(grads, inputs, outputs, wants, **params):
        return _run_backward(name, grads, inputs, wants, params)

    return backward


def _make(name: str, supports: Callable[..., str | None]) -> Backend:
    def forward(x, w, bias=None, *, strides=1, padding=0, dilation=1, groups=1):
        params = dict(strides=strides, padding=padding, dilation=dilation, groups=groups)
        return _run_forward(name, x, w, bias, params)

    forward.__name__ = forward.__qualname__ = name
    forward.__doc__ = f"The ``{name}`` forward (same signature and result as the reference)."
    # ``backward`` is passed where this fnnc's Backend has the field.
    fields = {f.name for f in dataclasses.fields(Backend)}
    extra = {"backward": backward_of(name)} if "backward" in fields else {}
    return Backend(name, forward, PLATFORMS, supports, PRIORITY[name], (), **extra)


BACKENDS = (
    _make(MIXED, supports_mixed),
    _make(DILATED, supports_any),
    _make(CHUNKED, supports_chunked),
    _make(IM2COL, supports_any),
)
"""The backends this module registers for ``convolution`` at import, by priority."""

BY_NAME = {b.name: b for b in BACKENDS}
"""The same backends by name."""


def register() -> None:
    """Registers :data:`BACKENDS` for ``convolution`` (done once at import)."""
    for backend in BACKENDS:
        register_backend("convolution", backend)


register()
