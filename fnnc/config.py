"""Configuration, read once from the environment, overridable in a ``with`` block.

``FNNC_CHECKS`` (default ``1``): verify graphs after building and after each pass;
``numerics`` also turns on the numerics check (:attr:`Config.numerics`).
``FNNC_DEBUG`` (default ``0``): print graphs between passes when ``>= 1``.
``FNNC_BACKEND`` (default empty): force one backend name for every command that
supports it, e.g. ``pallas``; ``xla`` forces the reference everywhere. A name no
command registers (a typo) is a :class:`~fnnc.errors.ConfigError` when a backend is
next chosen, as is an unknown command name in ``backend_per_command``.
``FNNC_CPU_LIBRARIES`` (default empty): force one XLA:CPU library set for every compiled
program (:mod:`fnnc.graph.cpu_libraries`), e.g. ``eigen``.
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
from collections.abc import Collection, Iterator, Mapping

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


def _checked_types(changes: dict[str, object]) -> dict[str, object]:
    """``changes`` with the backend settings checked to be of the right kinds."""
    if "backend" in changes and not isinstance(changes["backend"], str):
        raise ConfigError(f"backend: expected a backend name (str), got {changes['backend']!r}")
    if "backend_per_command" in changes:
        per = changes["backend_per_command"]
        if not isinstance(per, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in per.items()
        ):
            raise ConfigError(
                f"backend_per_command: expected a mapping of command name to backend name, "
                f"e.g. {{'convolution': 'im2col'}}, got {per!r:.200}"
            )
        changes["backend_per_command"] = dict(per)
    return changes


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
    return Config(
        checks=os.environ.get("FNNC_CHECKS", "1") not in ("0", "false", "False", ""),
        numerics="numerics" in os.environ.get("FNNC_CHECKS", "").split(","),
        debug=int(os.environ.get("FNNC_DEBUG", "0") or 0),
        backend=os.environ.get("FNNC_BACKEND", ""),
        cpu_libraries=os.environ.get("FNNC_CPU_LIBRARIES", ""),
        matmul_precision=matmul_precision_name(
            os.environ.get("FNNC_MATMUL_PRECISION", "") or "float32", "FNNC_MATMUL_PRECISION"
        ),
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

    Raises:
        ConfigError: a setting of the wrong kind (``backend_per_command`` not a mapping
            of names). Forced command and backend names are checked when a backend is
            next chosen (:func:`check_forcing`).
    """
    global _current
    previous = _current
    changes = _checked_types(changes)
    if "matmul_precision" in changes:
        changes["matmul_precision"] = matmul_precision_name(str(changes["matmul_precision"]))
    _current = dataclasses.replace(previous, **changes)  # type: ignore[arg-type]
    if not changes.keys() & COMPILED_SETTINGS:
        object.__setattr__(_current, "serial", previous.serial)
    try:
        yield _current
    finally:
        _current = previous
