"""Parameters as values other layers take: a free-standing :class:`Parameter` (NNC's
shared tensor), and a layer's parameter as a model value, NNC's
``ccv_cnnp_model_parameters`` used as a model input ("use linear model's parameter as
the input for more computation").

``layer.parameter(i)`` (:meth:`fnnc.models.Layer.parameter`) is a model value holding
parameter ``i`` of ``layer`` (a :class:`~fnnc.models.Dense`'s or
:class:`~fnnc.models.Conv`'s 0 is its weight, 1 its bias): the same tensor the layer
computes with, so the gradient of a loss reaching it through both adds up, and no new
parameter is made. It follows the layer's first application in the model graph (the
layer sizes its parameters when applied), so apply the layer first.

>>> import numpy as np
>>> from fnnc import ops
>>> from fnnc.models import CommandLayer, Dense, Input, Model
>>> x = Input()
>>> linear = Dense(1, name="linear")
>>> y = CommandLayer(ops.gemm())(linear(x), linear.parameter(0))   # (x w + b) w
>>> model = Model([x], [y])
>>> model.compile([np.ones((2, 1), np.float32)])
>>> model.set_parameters({"t-linear-0-0": np.float32([[2.0]]), "t-linear-0-1": np.float32([1.0])})
[]
>>> np.asarray(model.evaluate([np.float32([[1.0], [2.0]])])).ravel().tolist()
[6.0, 10.0]
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np

from fnnc.core.dtypes import is_floating
from fnnc.core.ir import Symbol
from fnnc.models.layer import (
    BuildContext,
    Layer,
    ModelError,
    ModelIO,
    constant_init,
    shape_of,
)


class Parameter(Layer):
    """A free-standing trainable tensor (NNC's shared tensor), called with no inputs.

    ``init`` is its first value: a real number (Python or NumPy: every element), an
    array (NumPy, JAX, or nested lists) of the parameter's shape or broadcasting to it,
    or an initializer ``init(key, shape, dtype) -> array`` (an error raised inside one
    names the parameter's id). The value is cast to float32.

    >>> import numpy as np
    >>> from fnnc.models import Parameter
    >>> w = Parameter((1,), init=1.0, name="w")()
    >>> b = Parameter((3,), init=np.array([1.0, 2.0, 3.0]), name="b")()
    """

    owns_parameters = True

    def __init__(self, shape: Sequence[int], *, init: float | Any = 0.0, **kw: Any):
        super().__init__(**kw)
        example = "Parameter((4,)) or Parameter(()) for a scalar"
        self.shape = shape_of(self, "shape", shape, example, sizes=False)  # sizes: at build
        self.init = init if callable(init) else constant_init(self._value(init))

    def _value(self, init: Any) -> Any:
        """``init`` given as a value, checked: a real number or an array of reals (bfloat16
        included) whose shape broadcasts to the parameter's and that float32 holds (a
        finite 1e300 is no inf); else a ModelError naming the layer."""
        if isinstance(init, numbers.Real):
            return self._finite(init)
        value = np.asarray(init) if isinstance(init, (list, tuple, np.ndarray)) else init
        dtype = np.dtype(getattr(value, "dtype", object))
        real = dtype == np.bool_ or is_floating(dtype) or np.issubdtype(dtype, np.integer)
        if not hasattr(value, "shape") or not real:
            raise ModelError(
                f"layer {self.describe()}: init={init!r:.80} ({type(init).__name__}) is neither "
                "a value nor an initializer; pass a number (init=0.5), an array of the "
                f"parameter's shape {list(self.shape)}, or a function init(key, shape, dtype) "
                "-> array, e.g. lambda key, shape, dtype: jax.random.normal(key, shape, dtype)"
            )
        try:
            fits = np.broadcast_shapes(np.shape(value), self.shape) == self.shape
        except (ValueError, TypeError):
            fits = False
        if not fits:
            raise ModelError(
                f"layer {self.describe()}: init is an array of shape {list(np.shape(value))}, "
                f"which does not broadcast to the parameter's shape {list(self.shape)}; "
                "pass an array of that shape or a number"
            )
        return self._finite(value)

    def _finite(self, value: Any) -> Any:
        """``value``, unless a finite entry of it is beyond float32's range, which the
        parameter would hold as inf: a ModelError naming the layer."""
        with np.errstate(over="ignore"):
            try:
                wide = np.asarray(value, np.float64)
            except OverflowError:  # an int beyond any float (10**400): NumPy's bare error
                raise ModelError(
                    f"layer {self.describe()}: init holds an int beyond float64's range; pass "
                    "values float32, the parameter's type, holds"
                ) from None
            lost = np.isfinite(wide) & np.isinf(wide.astype(np.float32))
        if np.any(lost):
            raise ModelError(
                f"layer {self.describe()}: init holds {wide[lost].flat[0]:g}, beyond float32's "
                f"range (+-{np.finfo(np.float32).max:.4g}), the parameter's type, which would "
                "hold it as inf; pass values float32 holds"
            )
        return value

    def build(self, ctx: BuildContext) -> Symbol:
        return ctx.param(self, 0, self.shape, self.init)


class ParameterOf(Layer):
    """The value of parameter ``index`` of ``owner`` (see the module doc); called on an
    output of ``owner``, which orders it after the owner's build."""

    def __init__(self, owner: Layer, index: int):
        super().__init__(name=f"{owner.name or owner.describe()}.parameter({index})")
        self.owner, self.index = owner, index

    def build(self, ctx: BuildContext, after: Symbol) -> Symbol:
        key = (id(self.owner), False, self.index)
        pid = ctx._pids.get(key)
        if pid is None or pid not in ctx.symbols:
            have = sorted(i for (layer, internal, i) in ctx._pids if layer == id(self.owner))
            raise ModelError(
                f"layer {self.owner.describe()} has no parameter {self.index} (it has "
                f"{have or 'none'}); a Dense or Conv has 0 (weight) and 1 (bias)"
            )
        return ctx.symbols[pid]


def parameter_of(owner: Layer, index: int) -> ModelIO:
    """:meth:`fnnc.models.Layer.parameter`."""
    if not isinstance(index, int) or isinstance(index, bool) or index < 0:
        raise ModelError(
            f"layer {owner.describe()}.parameter: index={index!r}; pass the parameter's "
            "number (0: a Dense's weight, 1: its bias)"
        )
    applied: Any = getattr(owner, "_applied", None)
    if applied is None:
        raise ModelError(
            f"layer {owner.describe()}.parameter({index}): the layer was not applied yet; "
            "call it on its inputs first (it sizes its parameters from them)"
        )
    return ParameterOf(owner, index)(applied)
