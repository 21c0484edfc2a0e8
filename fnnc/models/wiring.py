"""How a cnnp model's parts are given and connected: its inputs and outputs (one
:class:`ModelIO` or a list), :func:`fnnc.models.Sequential`'s layers, and the order
its layers run in. A wrong kind of part is a :class:`ModelError` naming what it is
and what was expected.

>>> from fnnc.models import Dense, Input
>>> x = Input()
>>> y = Dense(2)(Dense(3)(x))
>>> [io.layer.name is not None for io in topological([x], [y], "m")]
[True, True]
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from fnnc.models.layer import Layer, ModelError, ModelIO
from fnnc.models.parameter_of import ParameterOf


def listed(value: Any, kind: type, where: str, what: str, expected: str) -> list[Any]:
    """``value``, one ``kind`` or an iterable of them, as a list; anything else in it
    is a :class:`ModelError` naming ``what`` it is (``what[i]`` in a list) and
    ``expected``."""
    single = isinstance(value, (kind, str, bytes)) or not isinstance(value, Iterable)
    items = [value] if single else list(value)
    for i, item in enumerate(items):
        if not isinstance(item, kind):
            raise ModelError(
                f"{where}: {what if single else f'{what}[{i}]'} is {item!r:.40} "
                f"({type(item).__name__}); expected {expected}"
            )
    return items


def ios(value: Any, what: str, where: str) -> list[ModelIO]:
    """A model's ``inputs`` or ``outputs`` (one ModelIO or a list) as a list of ModelIOs."""
    expected = (
        "an Input() or a layer's output (or a list of them): x = Input(); Model(x, Dense(3)(x))"
    )
    return listed(value, ModelIO, f"model {where}", what, expected)


def layers_of(value: Any, where: str) -> list[Layer]:
    """:func:`Sequential`'s layers (one layer or a list) as a list of layers."""
    expected = (
        "a layer such as Dense(3) or ReLU(), or a list of them: "
        "Sequential([Dense(8), ReLU(), Dense(1)])"
    )
    return listed(value, Layer, where, "layers", expected)


def topological(inputs: list[ModelIO], outputs: list[ModelIO], where: str) -> list[ModelIO]:
    """Every non-input ModelIO reachable from ``outputs``, dependencies first."""
    known = {id(i) for i in inputs}
    order: list[ModelIO] = []
    seen: set[int] = set()
    users: dict[int, ModelIO] = {}  # a value -> the first one found reading it
    stack: list[tuple[ModelIO, bool]] = [(o, False) for o in reversed(outputs)]
    while stack:
        io, expanded = stack.pop()
        if id(io) in known or (id(io) in seen and not expanded):
            continue
        if io.layer is None:
            raise ModelError(
                f"model {where}: an output depends on an Input() that is not among "
                f"the model's inputs{_through_parameter(io, users)}"
            )
        if expanded:
            order.append(io)
            continue
        seen.add(id(io))
        stack.append((io, True))
        stack.extend((a, False) for a in reversed(io.args) if id(a) not in seen)
        for a in io.args:
            users.setdefault(id(a), io)
    return order


def _through_parameter(io: ModelIO, users: dict[int, ModelIO]) -> str:
    """Why ``io``, a foreign Input, was reached, where a ``layer.parameter(i)`` of a layer
    applied inside another model led to it (it follows that model's own inputs)."""
    user = users.get(id(io))
    while user is not None and not isinstance(user.layer, ParameterOf):
        user = users.get(id(user))
    if user is None:
        return ""
    layer = user.layer
    return (
        f": {layer.owner.describe()}.parameter({layer.index}) follows that layer's "
        "application, which is inside another model (on that model's own inputs); use "
        "the parameter inside that model, or apply the layer in this one"
    )
