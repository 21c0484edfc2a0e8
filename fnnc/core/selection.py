"""The selection rule: which backend runs one node (NNC's ``CPU_REF`` / ``GPU_CUDNN`` ...).

Eager calls, ``compile`` and the dynamic graph all choose through :func:`select_backend`,
among the backends :mod:`fnnc.core.backends` registers. The choice, for one node, goes:

1. a backend forced for this command (``config.backend_per_command``; for a gradient
   node also the one forced for the command it differentiates): used if it supports the
   input, else :class:`~fnnc.errors.BackendError` says why;
2. the backend forced for every command (``config.backend`` / ``FNNC_BACKEND``) where
   the command has it and it supports the input; elsewhere the choice goes on below;
3. the autotune table's winner for (command, shapes, dtypes, platform), if it compiles
   on this platform and supports the input;
4. the measured default for (device kind, command, shape class) shipped with the package
   (:mod:`fnnc.core.measured`), if it compiles here and supports the input;
5. the highest-priority backend that compiles on this platform and supports the input;
   fnnc's kernels register priority 0, so a priority alone never makes an unmeasured
   kernel the default, except where a rule decides: flash attention (wins by
   construction, its ``wins``) and CPU convolution's ``"mixed"`` (priority 20, from a
   size measured on CPUs, each product in the formulation its measured rules pick).
   A :class:`Backend` a user registers has priority 1 unless given 0;
6. the reference.

A backend that only *interprets* on a platform (Pallas on CPU) is never chosen there
unless forced, so CPU programs never pay for interpret mode by accident (not even
through an autotune table written on another platform).

:mod:`fnnc.core.dispatch` re-exports every name here.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Sequence
from typing import Any

from fnnc import config
from fnnc.core import backends, measured
from fnnc.core.backends import (
    _BACKENDS,
    REFERENCE,
    TABLE,
    Backend,
    _backends_of,
    _bump,
    support_reason,
    table_key,
)
from fnnc.core.command import Command, Spec, lookup, spec_text
from fnnc.core.opdef import registry
from fnnc.core.platforms import platform_name
from fnnc.errors import BackendError, CommandError

_PRECISION: contextvars.ContextVar[str | None] = contextvars.ContextVar("precision", default=None)
_PLATFORM: contextvars.ContextVar[str | None] = contextvars.ContextVar("platform", default=None)


def selection_precision() -> str:
    """The matmul precision the backend choice underway is made for: the ``precision``
    given to :func:`select_backend` (``compile(matmul_precision=...)``'s) while a
    backend's ``wins`` rule runs, else :attr:`fnnc.config.Config.matmul_precision`. A
    ``wins`` rule that depends on the precision (flash attention's) reads it here, so
    a program compiled at another precision than the configured one is judged at its own.
    """
    given = _PRECISION.get()
    return config.matmul_precision_name(given or config.get().matmul_precision)


@contextlib.contextmanager
def precision_scope(precision: str | None) -> Iterator[None]:
    """Inside, :func:`select_backend` calls that name no precision choose for
    ``precision`` (a program's ``compile(matmul_precision=...)``): the nodes of loop and
    branch bodies, chosen while the program is traced, see the program's precision.
    :func:`fnnc.core.dispatch.matmul_precision_scope` enters it."""
    token = _PRECISION.set(precision)
    try:
        yield
    finally:
        _PRECISION.reset(token)


@contextlib.contextmanager
def platform_scope(platform: str | None) -> Iterator[None]:
    """Inside, :func:`select_backend` calls that name no platform choose for
    ``platform`` (a program's ``compile(platform=...)``): the nodes of loop and branch
    bodies, chosen while the program is traced, get the backends and autotune winners
    of the platform its top-level nodes were chosen for, not JAX's default backend's."""
    token = _PLATFORM.set(platform)
    try:
        yield
    finally:
        _PLATFORM.reset(token)


def platform_in_scope() -> str | None:
    """The platform :func:`platform_scope` set (``None`` outside one)."""
    return _PLATFORM.get()


def why_not(backend: Backend, cmd: Command, specs: Sequence[Spec], platform: str) -> str | None:
    """Why ``backend`` cannot run ``cmd`` on these inputs here; ``None`` if it can."""
    if platform not in backend.platforms + backend.interpret_platforms:
        return f"backend {backend.name!r} does not run on {platform}"
    return support_reason(backend, cmd, specs)


def _forced(cmd: Command, cfg: config.Config) -> str:
    forced = cfg.backend_per_command.get(cmd.name, "")
    node = lookup(cmd.name).backward_node
    if not forced and node is not None:
        of, _ = node.forward_of(cmd)
        by_forward = cfg.backend_per_command.get(of.name, "")
        if by_forward in _backends_of(cmd.name, backends._generation):
            forced = by_forward
    return forced


_checked = (-1, -1)  # the (generation, config serial) whose forced names were checked


def _check_forcing(cfg: config.Config) -> None:
    """:func:`fnnc.config.check_forcing` against the registries as they are now."""
    global _checked
    names = {REFERENCE, *(name for per in _BACKENDS.values() for name in per)}
    config.check_forcing(cfg, registry(), names)
    _checked = (backends._generation, cfg.serial)


def select_backend(
    cmd: Command,
    specs: Sequence[Spec],
    platform: str | None = None,
    precision: str | None = None,
) -> str:
    """The backend name a node running ``cmd`` on ``specs`` gets (see module doc) on
    ``platform`` (``"cpu"``, ``"gpu"`` or ``"tpu"``, any case; JAX's ``"cuda"`` and
    ``"rocm"`` are ``"gpu"``; default: the program's while one is traced
    (:func:`platform_scope`), else JAX's default backend) for a program whose
    float32 dots run at the matmul ``precision`` (``compile(matmul_precision=...)``'s;
    default :attr:`fnnc.config.Config.matmul_precision`): the autotune table's winners
    are looked up under it. An unknown platform or precision name is a
    :class:`~fnnc.errors.ConfigError`; ``cmd`` that is no command (a name such as
    ``"gemm"``) a :class:`~fnnc.errors.CommandError`."""
    if not isinstance(cmd, Command):  # "gemm" was an AttributeError on .name
        raise CommandError(
            f"select_backend: expected a Command with its hyper-parameters bound (e.g. "
            f"fnnc.ops.gemm(transpose_b=True)), got {type(cmd).__name__} {cmd!r:.60}"
        )
    platform = platform_name(platform or _PLATFORM.get(), "select_backend")
    precision = precision or _PRECISION.get()  # a program's, while it is traced
    available = _backends_of(cmd.name, backends._generation)
    cfg = config.get()
    if (cfg.backend or cfg.backend_per_command) and _checked != (backends._generation, cfg.serial):
        _check_forcing(cfg)
    forced = _forced(cmd, cfg)
    if forced:
        if forced not in available:
            raise BackendError(
                f"{cmd}: backend {forced!r} was forced but this command has only "
                f"{list(available)}.{config.close_matches(forced, available)} Remove the "
                "override or pick one of those."
            )
        reason = why_not(available[forced], cmd, specs, platform)
        if reason is not None:
            raise BackendError(
                f"{cmd}: forced backend {forced!r} cannot run inputs "
                f"{[spec_text(s) for s in specs]} on {platform}: {reason}"
            )
        return forced
    preferred = available.get(cfg.backend)
    if preferred is not None and why_not(preferred, cmd, specs, platform) is None:
        return cfg.backend
    tuned = TABLE.get(table_key(cmd, specs, platform, precision)) if len(TABLE) else None
    for name in (tuned, _measured(cmd, specs, platform)):
        chosen = available.get(name) if name else None
        if (
            chosen is not None
            and platform in chosen.platforms
            and support_reason(chosen, cmd, specs) is None
        ):
            return chosen.name
    best, best_priority = REFERENCE, 0
    token = _PRECISION.set(precision)
    try:
        for name, backend in available.items():
            priority = _priority(cmd, specs, name, backend)
            eligible = platform in backend.platforms and priority > best_priority
            if eligible and support_reason(backend, cmd, specs) is None:
                best, best_priority = name, priority
    finally:
        _PRECISION.reset(token)
    return best


def _priority(cmd: Command, specs: Sequence[Spec], name: str, backend: Backend) -> int:
    """A backend's priority on these inputs (0 where its ``wins`` says no); for a
    gradient node, that of the differentiated command's backend of the same name on the
    forward's inputs (gradient backends are shared by every command)."""
    node = lookup(cmd.name).backward_node
    if node is not None:
        cmd, specs = node.forward_of(cmd)
        like = _BACKENDS.get(cmd.name, {}).get(name)
        if like is None:
            return 0
        backend = like
    if backend.wins is not None and not backend.wins(cmd, specs):
        return 0
    return backend.priority


def _measured(cmd: Command, specs: Sequence[Spec], platform: str) -> str | None:
    """The shipped measured default; a gradient node looks up the command it differentiates."""
    node = lookup(cmd.name).backward_node
    if node is not None:
        cmd, specs = node.forward_of(cmd)
    return measured.lookup(cmd.name, specs, platform)


def use_measured_defaults(devices: Any = None) -> None:
    """Replaces the measured defaults in force (``{device kind: {command: {shape class:
    backend}}}``; ``None``: the file shipped with fnnc) and moves :func:`state`, so
    cached programs choose again."""
    measured.use(devices)
    _bump()
