"""Backends of a command and how one is chosen (NNC's ``CPU_REF`` / ``GPU_CUDNN``...).

Every command has the ``"xla"`` backend: its reference forward, which XLA compiles on
any platform. Faster backends (Pallas kernels) are registered with
:func:`register_backend` and declare where they run and what they support. The choice,
for one node, goes:

1. a backend forced for this command (``config.backend_per_command``): used if it
   supports the input, else :class:`~fnnc.errors.BackendError` says why;
2. the backend forced for every command (``config.backend`` / ``FNNC_BACKEND``) where
   the command has it and it supports the input; elsewhere the choice goes on below
   (a graph's ``gradient`` nodes of commands without kernels, a ragged shape);
3. the autotune table's winner for (command, shapes, dtypes, platform), if it compiles
   on this platform and supports the input;
4. the highest-priority backend that compiles on this platform and supports the input;
5. the reference.

A backend that only *interprets* on a platform (Pallas on CPU) is never chosen there
unless forced, so CPU programs never pay for interpret mode by accident (not even
through an autotune table written on another platform).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax

from fnnc import config
from fnnc.errors import BackendError, DTypeError
from fnnc.ops.command import Command, Spec, lookup, output_specs

REFERENCE = "xla"


def _always(cmd: Command, specs: Sequence[Spec]) -> str | None:
    return None


@dataclasses.dataclass(frozen=True)
class Backend:
    """One way to run a command.

    Attributes:
        name: e.g. ``"pallas"``.
        forward: same signature as the reference forward.
        platforms: platforms where it runs compiled (``"gpu"``, ``"tpu"``).
        supports: ``supports(cmd, input_specs) -> None`` if supported, else the reason.
        priority: among eligible compiled backends, the highest wins without autotune.
        interpret_platforms: platforms where it runs only in interpret mode (slow;
            chosen there only when forced).
    """

    name: str
    forward: Callable[..., Any]
    platforms: tuple[str, ...]
    supports: Callable[[Command, Sequence[Spec]], str | None] = _always
    priority: int = 1
    interpret_platforms: tuple[str, ...] = ("cpu",)


_BACKENDS: dict[str, dict[str, Backend]] = {}


def register_backend(command: str, backend: Backend) -> None:
    """Adds ``backend`` to the backends of the command named ``command``."""
    lookup(command)
    _BACKENDS.setdefault(command, {})[backend.name] = backend
    backends_of.cache_clear()


def unregister_backend(command: str, name: str) -> None:
    """Removes a backend added by :func:`register_backend` (the reference stays)."""
    _BACKENDS.get(command, {}).pop(name, None)
    compiled_forward.cache_clear()
    backends_of.cache_clear()


@functools.cache
def backends_of(command: str) -> dict[str, Backend]:
    """All backends of a command by name, the reference first (do not mutate the result)."""
    opdef = lookup(command)
    ref = Backend(REFERENCE, opdef.forward, ("cpu", "gpu", "tpu"), priority=0)
    return {REFERENCE: ref, **_BACKENDS.get(command, {})}


def why_not(backend: Backend, cmd: Command, specs: Sequence[Spec], platform: str) -> str | None:
    """Why ``backend`` cannot run ``cmd`` on these inputs here; ``None`` if it can."""
    if platform not in backend.platforms + backend.interpret_platforms:
        return f"backend {backend.name!r} does not run on {platform}"
    return backend.supports(cmd, specs)


def select_backend(cmd: Command, specs: Sequence[Spec], platform: str | None = None) -> str:
    """The backend name a node running ``cmd`` on ``specs`` gets (see module doc)."""
    from fnnc.ops import autotune

    platform = platform or jax.default_backend()
    available = backends_of(cmd.name)
    cfg = config.get()
    forced = cfg.backend_per_command.get(cmd.name, "")
    preferred = available.get(cfg.backend) if not forced else None
    if preferred is not None and why_not(preferred, cmd, specs, platform) is None:
        return cfg.backend
    if forced:
        if forced not in available:
            raise BackendError(
                f"{cmd}: backend {forced!r} was forced but this command has only "
                f"{list(available)}; remove the override or pick one of those"
            )
        reason = why_not(available[forced], cmd, specs, platform)
        if reason is not None:
            raise BackendError(
                f"{cmd}: forced backend {forced!r} cannot run inputs "
                f"{[_spec_str(s) for s in specs]} on {platform}: {reason}"
            )
        return forced
    tuned = autotune.TABLE.get(autotune.key(cmd, specs, platform)) if autotune.TABLE else None
    chosen = available.get(tuned) if tuned else None
    if chosen is not None and platform in chosen.platforms and chosen.supports(cmd, specs) is None:
        return tuned
    best, best_priority = REFERENCE, 0
    for name, backend in available.items():
        eligible = platform in backend.platforms and backend.priority > best_priority
        if eligible and backend.supports(cmd, specs) is None:
            best, best_priority = name, backend.priority
    return best


@functools.cache
def compiled_forward(cmd: Command, backend: str = REFERENCE) -> Callable[..., Any]:
    """A jitted forward of ``cmd`` on one backend, cached per command value."""
    fn = backends_of(cmd.name)[backend].forward
    return jax.jit(functools.partial(fn, **cmd.kwargs))


def _spec_str(s: Spec) -> str:
    return f"{s.dtype.name}{list(s.shape)}"


def as_specs(arrays: Sequence[Any], where: str) -> tuple[Spec, ...]:
    specs = []
    for i, a in enumerate(arrays):
        if not hasattr(a, "shape") or not hasattr(a, "dtype"):
            try:
                a = jax.numpy.asarray(a)
            except TypeError:
                raise DTypeError(
                    f"{where}: input {i} is a {type(a).__name__}, expected an array"
                ) from None
        specs.append(Spec(tuple(a.shape), a.dtype))
    return tuple(specs)


def run_eager(cmd: Command, arrays: Sequence[Any]) -> Any:
    """Runs ``cmd`` on concrete arrays: checked by the shape rule, then compiled once."""
    specs = as_specs(arrays, str(cmd))
    outs = output_specs(cmd, specs)
    backend = select_backend(cmd, specs)
    result = compiled_forward(cmd, backend)(*arrays)
    if len(outs) == 1 and isinstance(result, tuple):
        return result[0]
    return result
