"""Configuration, read once from the environment, overridable in a ``with`` block.

``FNNC_CHECKS`` (default ``1``): verify graphs after building and after each pass;
``numerics`` also turns on the numerics check (:attr:`Config.numerics`).
``FNNC_DEBUG`` (default ``0``): print graphs between passes when ``>= 1``.
``FNNC_BACKEND`` (default empty): force one backend name for every command that
supports it, e.g. ``pallas``; ``xla`` forces the reference everywhere.
``FNNC_CPU_LIBRARIES`` (default empty): force one XLA:CPU library set for every compiled
program (:mod:`fnnc.graph.cpu_libraries`), e.g. ``eigen``.

Example:
    >>> from fnnc import config
    >>> with config.override(checks=False):
    ...     config.get().checks
    False
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
from collections.abc import Iterator, Mapping

_serials = itertools.count()


@dataclasses.dataclass(frozen=True, slots=True)
class Config:
    """The settings in force. Read them with :func:`get`.

    ``numerics``: compiled programs, ``interpret``, the dynamic graph and ``Model.fit``
    report the first node whose output holds a NaN or an infinity, with its inputs'
    statistics (:class:`fnnc.errors.NumericsError`). Off by default: it adds one
    finiteness reduction per node output inside compiled programs.

    ``cpu_libraries``: the XLA:CPU library set every compiled CPU program uses (a name
    in :data:`fnnc.graph.cpu_libraries.LIBRARY_SETS`); empty: the autotune table's
    choice per program, else XLA's defaults.

    ``serial`` identifies the settings compiled code depends on (``backend``,
    ``backend_per_command``, ``numerics``, ``cpu_libraries``): an :func:`override` that
    changes them gets a new one, leaving the block restores the old one, so caches of
    backend choices and of compiled programs key on it cheaply.
    """

    checks: bool = True
    numerics: bool = False
    debug: int = 0
    backend: str = ""
    backend_per_command: Mapping[str, str] = dataclasses.field(default_factory=dict)
    cpu_libraries: str = ""
    serial: int = dataclasses.field(
        default_factory=lambda: next(_serials), init=False, compare=False, repr=False
    )


def _from_env() -> Config:
    return Config(
        checks=os.environ.get("FNNC_CHECKS", "1") not in ("0", "false", "False", ""),
        numerics="numerics" in os.environ.get("FNNC_CHECKS", "").split(","),
        debug=int(os.environ.get("FNNC_DEBUG", "0") or 0),
        backend=os.environ.get("FNNC_BACKEND", ""),
        cpu_libraries=os.environ.get("FNNC_CPU_LIBRARIES", ""),
    )


_current: Config = _from_env()


def get() -> Config:
    """Returns the configuration in force."""
    return _current


@contextlib.contextmanager
def override(**changes: object) -> Iterator[Config]:
    """Temporarily replaces some settings; restores them on exit.

    Args:
        **changes: fields of :class:`Config` to change, e.g. ``checks=False`` or
            ``backend_per_command={"layer_norm": "pallas"}``.
    """
    global _current
    previous = _current
    _current = dataclasses.replace(previous, **changes)  # type: ignore[arg-type]
    if not changes.keys() & {"backend", "backend_per_command", "numerics", "cpu_libraries"}:
        object.__setattr__(_current, "serial", previous.serial)
    try:
        yield _current
    finally:
        _current = previous
