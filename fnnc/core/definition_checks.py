"""The checks :func:`fnnc.core.command.defcommand` makes of its own arguments.

A command's attributes are facts the passes act on (:class:`~fnnc.core.opdef.Attributes`):
``elementwise="no"`` or ``idempotent="x"`` were kept and read as true, so ``fuse`` put
the command in chains and ``fold`` replaced ``f(x, x)`` by ``x``; ``uses=(0,)`` or
``min_inputs="1"`` failed later with Python's bare errors. Each is now a
:class:`~fnnc.errors.CommandError` when the command is defined, naming it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from fnnc.core.opdef import Uses
from fnnc.core.params import is_count
from fnnc.errors import CommandError

FLAGS = ("random", "has_effects", "differentiable", "elementwise")
"""Attributes that are plain flags (``True`` / ``False``)."""

PREDICATES = ("commutative", "idempotent", "batch_statistics")
"""Attributes that are a flag or a predicate ``f(cmd) -> bool`` of the command value."""


def check_definition(
    name: str, family: Any, shape: Any, uses: Any, min_inputs: Any, attributes: dict[str, Any]
) -> None:
    """Raises :class:`CommandError` for an argument of ``defcommand`` the command named
    ``name`` could not use as meant."""
    where = f"defcommand of {name!r}"
    problems = []
    if not isinstance(family, str) or not family:
        problems.append(f"family must be a non-empty string (NNC's family name), got {family!r}")
    if not callable(shape):
        problems.append(f"shape must be the shape rule, a function, got {type(shape).__name__}")
    if not isinstance(uses, Uses):
        problems.append(f"uses must be a fnnc.ops.Uses (e.g. Uses(inputs=(0,))), got {uses!r}")
    if min_inputs is not None and not is_count(min_inputs, 0):
        problems.append(f"min_inputs must be an int >= 0 or None, got {min_inputs!r}")
    for key, value in attributes.items():
        if isinstance(value, (bool, np.bool_)):
            continue
        if key in PREDICATES and isinstance(value, Callable):
            continue
        kind = "True or False" + (" or a function of the command" if key in PREDICATES else "")
        problems.append(f"{key} must be {kind}, got {value!r}; the passes act on it")
    if problems:
        raise CommandError(f"{where}: {'; '.join(problems)}")
