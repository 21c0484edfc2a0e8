"""A layer's parameter as a value other layers take: NNC's ``ccv_cnnp_model_parameters``
used as a model input ("use linear model's parameter as the input for more
computation").

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

from typing import Any

from fnnc.core.ir import Symbol
from fnnc.models.layer import BuildContext, Layer, ModelError, ModelIO


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
