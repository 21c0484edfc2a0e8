"""Dispatch: which backend runs a command (NNC's ``CPU_REF`` / ``GPU_CUDNN`` ...), in one place.

This module owns everything backend choice depends on: the backends registered per
command, the autotune table, and the selection rule. Eager calls, ``compile`` and the
dynamic graph all choose through :func:`select_backend`, and every cache of a choice
keys on :func:`state` (a generation bumped by each registration and table write, plus
the configuration in force), so no cache can disagree with the registry.

Every command has the ``"xla"`` backend: its reference forward, which XLA compiles on
any platform. Faster backends (Pallas kernels, CPU variants) are registered with
:func:`register_backend` and declare where they run and what they support. A backend
may carry its own ``backward`` (NNC's convention plus the wanted input positions);
a graph's ``gradient[of=cmd]`` node then has a backend of the same name, synthesized
here, so backward nodes choose by the same rules as forwards and no second list of
kernels exists. The choice, for one node, goes:

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
   a backend registers a priority above 0 only where it wins by construction (flash
   attention), so a priority alone never makes an unmeasured kernel the default;
6. the reference.

A backend that only *interprets* on a platform (Pallas on CPU) is never chosen there
unless forced, so CPU programs never pay for interpret mode by accident (not even
through an autotune table written on another platform).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import inspect
import operator
from collections.abc import Callable, Iterator, MutableMapping, Sequence
from typing import Any

import jax
import numpy as np

from fnnc import config
from fnnc.core import measured
from fnnc.core.command import Command, Spec, lookup, output_specs, spec_text
from fnnc.core.evaluate import disagreement, part_of, results_agree
from fnnc.core.ir import Graph
from fnnc.core.keys import key_bits
from fnnc.core.opdef import registry
from fnnc.core.platforms import PLATFORMS as PLATFORMS
from fnnc.core.platforms import platform_name
from fnnc.errors import BackendError, CommandError, DTypeError, FnncError

REFERENCE = "xla"


def _always(cmd: Command, specs: Sequence[Spec]) -> str | None:
    return None


@dataclasses.dataclass(frozen=True)
class Backend:
    """One way to run a command.

    Attributes:
        name: e.g. ``"pallas"``.
        forward: same signature as the reference forward.
        platforms: platforms where it runs compiled (``"cpu"``, ``"gpu"``, ``"tpu"``).
        supports: ``supports(cmd, input_specs) -> None`` if supported, else the reason.
        priority: among eligible compiled backends, the highest wins without autotune.
        interpret_platforms: platforms where it runs only in interpret mode (slow;
            chosen there only when forced).
        backward: optional ``backward(grads, inputs, outputs, wants, **params)`` in
            NNC's convention, returning one gradient per forward input (``None`` for
            those not in ``wants``). Gradient nodes of this command can then run it.
        wins: optional ``wins(cmd, input_specs) -> bool``: where ``priority`` holds
            (``None``: everywhere). A kernel that wins by construction on some inputs
            only (flash attention: where its products run on tensor cores) says so
            here; elsewhere it is the default only where measured faster.
    """

    name: str
    forward: Callable[..., Any]
    platforms: tuple[str, ...]
    supports: Callable[[Command, Sequence[Spec]], str | None] = _always
    priority: int = 1
    interpret_platforms: tuple[str, ...] = ("cpu",)
    backward: Callable[..., Any] | None = None
    wins: Callable[[Command, Sequence[Spec]], bool] | None = None


_BACKENDS: dict[str, dict[str, Backend]] = {}
_generation = 0


def _bump() -> None:
    global _generation
    _generation += 1


def state() -> tuple[int, int]:
    """A hashable token of everything backend choice depends on.

    It changes when a backend is registered or removed, when the autotune table is
    written, and inside a :func:`fnnc.config.override` block; caches of compiled code
    key on it.
    """
    return _generation, config.get().serial


class AutotuneTable(MutableMapping[str, str]):
    """The autotune table: ``key(cmd, specs, platform) -> backend name``.

    A dict whose every write moves :func:`state`, so cached programs see new winners.
    """

    def __init__(self) -> None:
        self._data: dict[str, str] = {}

    def __getitem__(self, key: str) -> str:
        return self._data[key]

    def __setitem__(self, key: str, value: str) -> None:
        if self._data.get(key) != value:
            self._data[key] = value
            _bump()

    def __delitem__(self, key: str) -> None:
        del self._data[key]
        _bump()

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return f"AutotuneTable({self._data!r})"


TABLE = AutotuneTable()


def table_key(cmd: Command, specs: Sequence[Spec], platform: str) -> str:
    """The autotune table key of one (command, input specs, platform)."""
    shapes = ";".join("none" if s is None else f"{s.dtype.name}{list(s.shape)}" for s in specs)
    return f"{cmd.name}|{cmd.params!r}|{shapes}|{platform}"


def register_backend(command: str, backend: Backend) -> None:
    """Adds ``backend`` to the backends of the command named ``command``.

    Example:
        >>> import jax.numpy as jnp
        >>> from fnnc import ops
        >>> fast = ops.Backend("mine", lambda x: jnp.maximum(x, 0), ("cpu",), priority=5)
        >>> ops.register_backend("relu", fast)
        >>> ops.select_backend(ops.relu(), [jax.ShapeDtypeStruct((2,), jnp.float32)], "cpu")
        'mine'
        >>> ops.unregister_backend("relu", "mine")
    """
    lookup(command)
    if backend.name == REFERENCE:
        raise BackendError(f"{command}: {REFERENCE!r} is the reference backend's name")
    _BACKENDS.setdefault(command, {})[backend.name] = backend
    _bump()


def unregister_backend(command: str, name: str) -> None:
    """Removes a backend added by :func:`register_backend` (the reference stays)."""
    if _BACKENDS.get(command, {}).pop(name, None) is not None:
        _bump()


def backends_of(command: str) -> dict[str, Backend]:
    """All backends of a command by name, the reference first.

    For a command that differentiates another (``gradient``), one backend per name under
    which some command registered a ``backward``.
    """
    return _backends_of(command, _generation)


@functools.lru_cache(maxsize=1024)
def _backends_of(command: str, generation: int) -> dict[str, Backend]:
    opdef = lookup(command)
    ref = Backend(REFERENCE, opdef.forward, PLATFORMS, priority=0)
    if opdef.backward_node is None:
        return {REFERENCE: ref, **_BACKENDS.get(command, {})}
    out = {REFERENCE: ref}
    for per_name in _BACKENDS.values():
        for name, b in per_name.items():
            if b.backward is not None and name not in out:
                out[name] = _gradient_backend(opdef.backward_node, name, b)
    return out


def _gradient_backend(node: Any, name: str, like: Backend) -> Backend:
    """The backend ``name`` of a gradient command: the forward's backend's ``backward``."""

    def supports(cmd: Command, specs: Sequence[Spec]) -> str | None:
        of, of_specs = node.forward_of(cmd)
        b = _BACKENDS.get(of.name, {}).get(name)
        if b is None or b.backward is None:
            return f"{of.name} has no {name!r} backward (only the reference differentiates it)"
        return b.supports(of, of_specs)

    def forward(*inputs: Any, of: Command, **params: Any) -> Any:
        rule = _BACKENDS[of.name][name].backward
        return node.run(rule, *inputs, of=of, **params)

    return Backend(name, forward, like.platforms, supports, like.priority, like.interpret_platforms)


def why_not(backend: Backend, cmd: Command, specs: Sequence[Spec], platform: str) -> str | None:
    """Why ``backend`` cannot run ``cmd`` on these inputs here; ``None`` if it can."""
    if platform not in backend.platforms + backend.interpret_platforms:
        return f"backend {backend.name!r} does not run on {platform}"
    return backend.supports(cmd, specs)


def _forced(cmd: Command, cfg: config.Config) -> str:
    forced = cfg.backend_per_command.get(cmd.name, "")
    node = lookup(cmd.name).backward_node
    if not forced and node is not None:
        of, _ = node.forward_of(cmd)
        by_forward = cfg.backend_per_command.get(of.name, "")
        if by_forward in _backends_of(cmd.name, _generation):
            forced = by_forward
    return forced


_checked = (-1, -1)  # the (generation, config serial) whose forced names were checked


def _check_forcing(cfg: config.Config) -> None:
    """:func:`fnnc.config.check_forcing` against the registries as they are now."""
    global _checked
    names = {REFERENCE, *(name for per in _BACKENDS.values() for name in per)}
    config.check_forcing(cfg, registry(), names)
    _checked = (_generation, cfg.serial)


def select_backend(cmd: Command, specs: Sequence[Spec], platform: str | None = None) -> str:
    """The backend name a node running ``cmd`` on ``specs`` gets (see module doc) on
    ``platform`` (``"cpu"``, ``"gpu"`` or ``"tpu"``, any case; JAX's ``"cuda"`` and
    ``"rocm"`` are ``"gpu"``; default: JAX's default backend). An unknown platform name
    is a :class:`~fnnc.errors.ConfigError`."""
    platform = platform_name(platform, "select_backend")
    available = _backends_of(cmd.name, _generation)
    cfg = config.get()
    if (cfg.backend or cfg.backend_per_command) and _checked != (_generation, cfg.serial):
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
    tuned = TABLE.get(table_key(cmd, specs, platform)) if len(TABLE) else None
    for name in (tuned, _measured(cmd, specs, platform)):
        chosen = available.get(name) if name else None
        if (
            chosen is not None
            and platform in chosen.platforms
            and chosen.supports(cmd, specs) is None
        ):
            return chosen.name
    best, best_priority = REFERENCE, 0
    for name, backend in available.items():
        priority = _priority(cmd, specs, name, backend)
        eligible = platform in backend.platforms and priority > best_priority
        if eligible and backend.supports(cmd, specs) is None:
            best, best_priority = name, priority
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


def forward_of(cmd: Command, backend: str = REFERENCE) -> Callable[..., Any]:
    """The plain (unjitted) forward of ``cmd`` on one backend, hyper-parameters bound."""
    return functools.partial(_backends_of(cmd.name, _generation)[backend].forward, **cmd.kwargs)


def matmul_precision_scope(precision: str | None = None) -> contextlib.AbstractContextManager:
    """The context fnnc traces commands under: float32 dots and convolutions at
    ``precision`` (a name in :data:`fnnc.config.MATMUL_PRECISIONS`; default: the
    configured policy, :attr:`fnnc.config.Config.matmul_precision`).

    It sets ``jax.default_matmul_precision`` while a forward is traced, so every dot and
    convolution the forward emits (Pallas kernels' in-kernel dots included) carries the
    precision; ``"default"`` leaves JAX's own setting in force.
    """
    name = config.matmul_precision_name(precision or config.get().matmul_precision)
    value = config.MATMUL_PRECISIONS[name]
    return contextlib.nullcontext() if value is None else jax.default_matmul_precision(value)


_REFERENCE_ONLY = contextvars.ContextVar("fnnc_reference_only", default=False)


@contextlib.contextmanager
def reference_only() -> Iterator[None]:
    """Inside, the nodes of sub-graphs (loop and branch bodies, ``call``) run their
    reference forwards instead of the backends :func:`select_backend` would pick: what
    :func:`fnnc.graph.interpret`, the oracle, runs under."""
    token = _REFERENCE_ONLY.set(True)
    try:
        yield
    finally:
        _REFERENCE_ONLY.reset(token)


def references_only() -> bool:
    """Whether :func:`reference_only` is in force."""
    return _REFERENCE_ONLY.get()


def compiled_forward(cmd: Command, backend: str = REFERENCE) -> Callable[..., Any]:
    """A jitted forward of ``cmd`` on one backend, traced under the matmul precision in
    force, cached per command value, state and precision. A command holding sub-graphs
    also keys on the configuration in force and :func:`reference_only` (its nodes'
    backends are chosen when it is traced)."""
    cfg = config.get()
    nested = _holds_graph(cmd)
    return _compiled(
        cmd,
        backend,
        _generation,
        cfg.matmul_precision,
        _REFERENCE_ONLY.get() if nested else False,
        cfg.serial if nested else 0,
    )


@functools.lru_cache(maxsize=4096)
def _holds_graph(cmd: Command) -> bool:
    def holds(value: Any) -> bool:  # a Graph, in a tuple, or in a command (a gradient's)
        if isinstance(value, tuple):
            return any(holds(v) for v in value)
        if isinstance(value, Command):
            return any(holds(v) for _, v in value.params)
        return isinstance(value, Graph)

    return any(holds(v) for _, v in cmd.params)


@functools.lru_cache(maxsize=4096)
def _compiled(
    cmd: Command, backend: str, generation: int, precision: str, references: bool, serial: int
) -> Callable[..., Any]:
    forward = forward_of(cmd, backend)

    def run(*args: Any, **kwargs: Any) -> Any:
        token = _REFERENCE_ONLY.set(references)  # as keyed, whenever jit traces
        try:
            with matmul_precision_scope(precision):
                result = forward(*args, **kwargs)
        finally:
            _REFERENCE_ONLY.reset(token)
        _check_result(cmd, backend, args, result)  # while tracing: free at run time
        return result

    return jax.jit(run)


def _check_result(cmd: Command, backend: str, args: Sequence[Any], result: Any) -> None:
    """A :class:`CommandError` unless ``result`` is as many arrays, of the shapes and
    dtypes, as ``cmd``'s shape rule gives for ``args``."""
    specs = [None if a is None else Spec(tuple(a.shape), a.dtype) for a in args]
    try:
        want = output_specs(cmd, specs)
    except FnncError:  # inputs its rule refuses (a body replayed in float64): no judge
        return
    outs = result if isinstance(result, tuple) else (result,)
    # With x64 on, fnnc replays float32 programs in float64 (finite differences, pass
    # checks), where rules that pin an output dtype (primitive, optax_update) say float32
    # and the forward computes float64: there only the kind of dtype is compared.
    same = operator.eq if not jax.config.jax_enable_x64 else lambda a, b: a.kind == b.kind
    if results_agree(outs, want, same):
        return
    judge = f"for inputs {[spec_text(s) for s in specs]} the rule gives"
    raise CommandError(
        f"{cmd}: its {part_of(cmd)} ({backend!r} backend) returned "
        f"{disagreement(cmd, outs, [spec_text(w) for w in want], judge)}"
    )


def as_arrays(values: Sequence[Any], where: str) -> tuple[Any, ...]:
    """``values`` with lists and Python numbers made the arrays NumPy makes of them; a
    :class:`DTypeError` naming ``where`` for what makes none. ``None`` (an optional
    input left out) stays ``None``."""
    out = []
    for i, a in enumerate(values):
        if a is not None and not (hasattr(a, "shape") and hasattr(a, "dtype")):
            try:
                a = jax.numpy.asarray(a)
            except TypeError:
                raise DTypeError(
                    f"{where}: input {i} is a {type(a).__name__}, expected an array"
                ) from None
        out.append(a)
    return tuple(out)


def as_specs(arrays: Sequence[Any], where: str) -> tuple[Spec | None, ...]:
    """The specs of ``arrays`` (:func:`as_arrays` of them); ``None`` stays ``None``."""
    return tuple(
        None if a is None else Spec(tuple(a.shape), a.dtype) for a in as_arrays(arrays, where)
    )


def _left_out(cmd: Command, arrays: Sequence[Any]) -> tuple[Any, ...]:
    """``arrays`` without trailing ``None``s; a :class:`CommandError` for a ``None`` in
    the place of a required input (only inputs whose default is ``None`` may be left out).
    """
    if not any(a is None for a in arrays):
        return tuple(arrays)
    opdef = lookup(cmd.name)
    optional = range(opdef.num_required, opdef.num_required + opdef.num_optional)
    for i, a in enumerate(arrays):
        if a is None and i not in optional:
            raise CommandError(
                f"{cmd}: input {i} is None, but it is required "
                f"(signature {opdef.name}{inspect.signature(opdef.forward)}); only optional "
                "inputs (those with a default of None) may be passed as None"
            )
    arrays = tuple(arrays)
    while arrays and arrays[-1] is None:
        arrays = arrays[:-1]
    return arrays


_PLAIN = np.dtype(np.float32)


def checked_inputs(
    cmd: Command, arrays: Sequence[Any]
) -> tuple[tuple[Any, ...], tuple[Spec | None, ...], tuple[Spec, ...]]:
    """``(arrays, their specs, the output specs)`` of a call of ``cmd`` on ``arrays``,
    checked as an eager call checks them: trailing ``None`` s dropped (a ``None`` in a
    required place is a :class:`CommandError`), typed PRNG keys as their ``uint32``
    data, lists and numbers as arrays, and the shape rule run (a
    :class:`~fnnc.errors.ShapeError`, :class:`DTypeError` or :class:`CommandError` for
    inputs the command does not take)."""
    arrays = _left_out(cmd, arrays)
    if any(not isinstance(getattr(a, "dtype", _PLAIN), np.dtype) for a in arrays):
        arrays = tuple(map(key_bits, arrays))  # a typed PRNG key: its uint32 data
    arrays = as_arrays(arrays, str(cmd))  # a list runs as the array NumPy makes of it
    specs = as_specs(arrays, str(cmd))
    return arrays, specs, output_specs(cmd, specs)


def run_eager(cmd: Command, arrays: Sequence[Any]) -> Any:
    """Runs ``cmd`` on concrete arrays: checked by the shape rule, then compiled once.

    ``None`` leaves out an optional input: ``sdpa(q, k, v, None)`` is ``sdpa(q, k, v)``
    (trailing ``None``s are dropped), and ``sdpa(q, k, v, None, w)`` gives the command
    ``mask=None``. Such a call, with an input left out before a given one, runs the
    reference backend: other backends take their inputs by position.
    """
    arrays, specs, outs = checked_inputs(cmd, arrays)
    gap = any(s is None for s in specs)
    backend = REFERENCE if gap else select_backend(cmd, specs)
    result = compiled_forward(cmd, backend)(*arrays)
    if len(outs) == 1 and isinstance(result, tuple):
        return result[0]
    return result
