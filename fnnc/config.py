"""Configuration, read once from the environment, overridable in a ``with`` block.

``FNNC_CHECKS`` (default ``1``): verify graphs after building and after each pass;
``numerics`` also turns on the numerics check (:attr:`Config.numerics`), as
``config.override(checks="numerics")`` does; ``0`` turns checks off. Any other value
is a :class:`~fnnc.errors.ConfigError`, as is a value of the wrong kind given to
:func:`override`.
``FNNC_DEBUG`` (default ``0``): when ``>= 1``, print each pass's time, node counts and
the diff of the graph listing it made (:func:`fnnc.graph.run_passes`).
``FNNC_BACKEND`` (default empty): force one backend name for every command that
supports it, e.g. ``pallas``; ``xla`` forces the reference everywhere. A name no
command registers (a typo) is a :class:`~fnnc.errors.ConfigError` when a backend is
next chosen, as is an unknown command name in ``backend_per_command``.
``FNNC_CPU_LIBRARIES`` (default empty): force one XLA:CPU library set for every compiled
program (:mod:`fnnc.graph.cpu_libraries`), e.g. ``eigen``; a name that is no library set
is an error naming the variable when a program is next compiled, on any platform.
``FNNC_MATMUL_PRECISION`` (default ``float32``): how float32 dots and convolutions run
(:data:`MATMUL_PRECISIONS`); ``tensorfloat32`` trades accuracy for speed on GPUs.

The float32 matmul policy is a decision, not an accident: by default fnnc computes
float32 dots and convolutions in full float32 on every platform, as NNC and PyTorch do,
instead of JAX's default, which runs them as TF32 (10-bit mantissa inputs, about 1e-3
relative error) on NVIDIA GPUs since Ampere. Every compiled program, eager call and
``interpret`` traces its commands under the policy in force (Pallas kernels' dots
included), and :attr:`fnnc.graph.Program.matmul_precision` reports it. Opt into TF32
with ``FNNC_MATMUL_PRECISION=tensorfloat32``, ``config.override(matmul_precision=...)``
or ``compile(graph, matmul_precision="tensorfloat32")``. Inputs in bfloat16 or float16
are unaffected (their dots already run at their own precision).

Example:
    >>> from fnnc import config
    >>> with config.override(checks=False):
    ...     config.get().checks
    False
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import itertools
import os
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Any, NamedTuple

from fnnc.errors import ConfigError

MATMUL_PRECISIONS: Mapping[str, str | None] = {
    "float32": "float32",
    "tensorfloat32": "tensorfloat32",
    "bfloat16": "bfloat16",
    "default": None,
    "highest": "float32",
    "high": "tensorfloat32",
}
"""fnnc's matmul precision names and the ``jax.default_matmul_precision`` value each
traces under: ``float32`` (full precision, fnnc's default), ``tensorfloat32`` (TF32 on
GPUs, 3-pass bfloat16 on TPUs), ``bfloat16`` (one bfloat16 pass, fastest), ``default``
(whatever JAX's own setting says; on recent NVIDIA GPUs that is TF32). ``highest`` and
``high`` are JAX's names for the first two."""

COMPILED_SETTINGS = frozenset(
    {"backend", "backend_per_command", "numerics", "cpu_libraries", "matmul_precision"}
)
"""The settings compiled code depends on: changing one gives a new :attr:`Config.serial`."""


def matmul_precision_name(value: str, where: str = "matmul_precision") -> str:
    """``value`` as one of fnnc's matmul precision names (JAX's aliases mapped).

    Raises:
        ConfigError: ``value`` is not a name in :data:`MATMUL_PRECISIONS`.
    """
    name = str(value).strip().lower()
    if name not in MATMUL_PRECISIONS:
        raise ConfigError(
            f"{where}: unknown matmul precision {value!r}; expected one of "
            f"{list(MATMUL_PRECISIONS)} (fnnc's default is 'float32')"
        )
    return {"highest": "float32", "high": "tensorfloat32"}.get(name, name)


def close_matches(name: str, known: Collection[str]) -> str:
    """`` Did you mean 'a', 'b'?`` for the names in ``known`` close to ``name``, or ``""``."""
    close = difflib.get_close_matches(name, list(known), n=3)
    return f" Did you mean {', '.join(map(repr, close))}?" if close else ""


def check_forcing(cfg: Config, commands: Collection[str], backends: Collection[str]) -> None:
    """Checks the names ``cfg`` forces against what is registered: every key of
    :attr:`Config.backend_per_command` must be a command in ``commands``, and
    :attr:`Config.backend` a backend name in ``backends`` (some command's). A value of
    ``backend_per_command`` is checked against its own command's backends when that
    command chooses (a :class:`~fnnc.errors.BackendError` there).

    The registries fill as modules import, so backend choice calls this (once per
    setting and registry state), not :func:`override`.

    Raises:
        ConfigError: a name nothing registers, with the close matches.
    """
    for command in cfg.backend_per_command:
        if command not in commands:
            raise ConfigError(
                f"backend_per_command: unknown command {command!r}."
                f"{close_matches(command, commands)} Known commands are listed by "
                "fnnc.ops.registry()."
            )
    if cfg.backend and cfg.backend not in backends:
        raise ConfigError(
            f"backend (FNNC_BACKEND or config.override(backend=...)): no command has a "
            f"backend {cfg.backend!r}.{close_matches(cfg.backend, backends)} Known backends: "
            f"{sorted(backends)}."
        )


class _Field(NamedTuple):
    """A setting :func:`override` takes: its kind, the values it accepts (for messages),
    how a value of that kind is normalised (``normalise(value, label)``, ``label``
    naming the setting in errors) and the environment variable that sets it."""

    kind: type
    accepted: str
    env: str = ""
    normalise: Callable[[Any, str], Any] | None = None


_FIELD_KINDS: Mapping[str, _Field] = {
    "checks": _Field(bool, "True, False or 'numerics' (checks and the numerics check)"),
    "numerics": _Field(bool, "True or False"),
    "debug": _Field(int, "an int level (0: off, >= 1: print each pass's changes)"),
    "backend": _Field(str, "a backend name (str), '' for the default choice", "FNNC_BACKEND"),
    "backend_per_command": _Field(
        Mapping,
        "a mapping of command name to backend name, e.g. {'convolution': 'im2col'}",
        normalise=lambda value, label: dict(value),
    ),
    "cpu_libraries": _Field(
        str, "a library set name (str), '' for the default choice", "FNNC_CPU_LIBRARIES"
    ),
    "matmul_precision": _Field(
        str,
        f"one of {list(MATMUL_PRECISIONS)}",
        "FNNC_MATMUL_PRECISION",
        matmul_precision_name,
    ),
}
"""Each setting :func:`override` takes, with its kind and the values it accepts."""


def _is_kind(value: object, kind: type) -> bool:
    """Whether ``value`` is of ``kind``; a bool is no int here, and a mapping's keys and
    values must be names."""
    if kind is Mapping:
        return isinstance(value, Mapping) and all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()
        )
    return isinstance(value, kind) and (kind is bool or not isinstance(value, bool))


def _validated(
    changes: dict[str, object], where: str = "config.override", env: bool = False
) -> dict[str, object]:
    """``changes`` checked against :data:`_FIELD_KINDS` and normalised: the one place a
    setting's type is checked, for :func:`override` and the environment (``env``:
    errors name the variable) alike.

    ``checks="numerics"`` (the spelling of ``FNNC_CHECKS=numerics``) becomes
    ``checks=True, numerics=True``; matmul precision aliases become fnnc's names.

    Raises:
        ConfigError: an unknown setting (with the close matches) or a value of the wrong
            kind, naming the setting, the value and what it accepts.
    """
    changes = dict(changes)
    for name, value in list(changes.items()):
        if name not in _FIELD_KINDS:
            raise ConfigError(
                f"{where}: unknown setting {name!r}.{close_matches(name, _FIELD_KINDS)} "
                f"Settings: {list(_FIELD_KINDS)}."
            )
        field = _FIELD_KINDS[name]
        if name == "checks" and isinstance(value, str) and value == "numerics":
            if changes.get("numerics", True) is not True:
                raise ConfigError(
                    f"{where}: checks='numerics' turns the numerics check on, but "
                    f"numerics={changes['numerics']!r} was also given; pass one of them"
                )
            changes["checks"], changes["numerics"] = True, True
            continue
        label = field.env if env and field.env else f"{where}: {name}"
        if not _is_kind(value, field.kind):
            raise ConfigError(f"{label}: expected {field.accepted}, got {value!r:.200}")
        if field.normalise is not None:
            changes[name] = field.normalise(value, label)
    return changes


def _checks_from_env(raw: str) -> dict[str, object]:
    """The ``checks``/``numerics`` settings ``FNNC_CHECKS`` spells: comma-separated
    tokens among ``1``/``true``/``on``, ``0``/``false``/``off`` and ``numerics``."""
    on, off = ("1", "true", "on", "yes"), ("0", "false", "off", "no", "")
    tokens = [t.strip().lower() for t in raw.split(",")] if raw.strip() else [""]
    unknown = [t for t in tokens if t not in on + off + ("numerics",)]
    if unknown:
        raise ConfigError(
            f"FNNC_CHECKS={raw!r}: unknown value {unknown[0]!r}; expected comma-separated "
            f"values among {list(on) + [o for o in off if o]} and 'numerics' "
            "(e.g. FNNC_CHECKS=0 or FNNC_CHECKS=numerics)"
        )
    numerics = "numerics" in tokens
    return {"checks": not any(t in off for t in tokens), "numerics": numerics}


def _debug_from_env(raw: str) -> int:
    try:
        return int(raw or 0)
    except ValueError:
        raise ConfigError(
            f"FNNC_DEBUG={raw!r}: expected an int level (0: off, >= 1: print each pass's changes)"
        ) from None


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

    ``matmul_precision``: how float32 dots and convolutions run (a name in
    :data:`MATMUL_PRECISIONS`, default ``float32``: full precision on every platform).

    ``serial`` identifies the settings compiled code depends on
    (:data:`COMPILED_SETTINGS`): an :func:`override` that
    changes them gets a new one, leaving the block restores the old one, so caches of
    backend choices and of compiled programs key on it cheaply.
    """

    checks: bool = True
    numerics: bool = False
    debug: int = 0
    backend: str = ""
    backend_per_command: Mapping[str, str] = dataclasses.field(default_factory=dict)
    cpu_libraries: str = ""
    matmul_precision: str = "float32"
    serial: int = dataclasses.field(
        default_factory=lambda: next(_serials), init=False, compare=False, repr=False
    )


def _from_env() -> Config:
    env = os.environ.get
    settings = _checks_from_env(env("FNNC_CHECKS", "1"))
    settings["debug"] = _debug_from_env(env("FNNC_DEBUG", "0"))
    settings["backend"] = env("FNNC_BACKEND", "")
    settings["cpu_libraries"] = env("FNNC_CPU_LIBRARIES", "")
    settings["matmul_precision"] = env("FNNC_MATMUL_PRECISION", "") or "float32"
    return Config(**_validated(settings, "environment (FNNC_*)", env=True))  # type: ignore[arg-type]


_current: Config = _from_env()


def get() -> Config:
    """Returns the configuration in force."""
    return _current


@contextlib.contextmanager
def override(**changes: object) -> Iterator[Config]:
    """Temporarily replaces some settings; restores them on exit.

    Args:
        **changes: fields of :class:`Config` to change, e.g. ``checks=False`` or
            ``backend_per_command={"layer_norm": "pallas"}``. ``checks="numerics"``
            (``FNNC_CHECKS=numerics``'s spelling) means ``checks=True, numerics=True``.

    Raises:
        ConfigError: an unknown setting, or a value of the wrong kind (a bool setting
            given anything but ``True``/``False``, ``backend_per_command`` not a mapping
            of names), naming the setting, the value and what it accepts. Forced
            command and backend names are checked when a backend is next chosen
            (:func:`check_forcing`).
    """
    global _current
    previous = _current
    changes = _validated(changes)
    _current = dataclasses.replace(previous, **changes)  # type: ignore[arg-type]
    if not changes.keys() & COMPILED_SETTINGS:
        object.__setattr__(_current, "serial", previous.serial)
    try:
        yield _current
    finally:
        _current = previous
