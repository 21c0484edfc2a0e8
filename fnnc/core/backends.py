"""The backends of each command, the autotune table, and the state token they move.

Every command has the ``"xla"`` backend (:data:`REFERENCE`): its reference forward, which
XLA compiles on any platform. Faster backends (Pallas kernels, CPU variants) are
registered with :func:`register_backend` and declare where they run and what they
support. A backend may carry its own ``backward`` (NNC's convention plus the wanted input
positions); a graph's ``gradient[of=cmd]`` node then has a backend of the same name,
synthesized here, so backward nodes choose by the same rules as forwards and no second
list of kernels exists.

Each registration and each write to the autotune table (:data:`TABLE`) moves
:func:`state`, which every cache of a backend choice keys on. The rule that chooses among
these backends is :mod:`fnnc.core.selection`; :mod:`fnnc.core.dispatch` re-exports every
name here.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from collections.abc import Callable, Iterator, MutableMapping, Sequence
from typing import Any

import jax
import numpy as np

from fnnc import config
from fnnc.core import measured
from fnnc.core.command import Command, Spec, lookup, spec_text
from fnnc.core.ir import Graph
from fnnc.core.platforms import PLATFORMS, platform_name
from fnnc.errors import BackendError, ConfigError

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


def table_key(
    cmd: Command, specs: Sequence[Spec], platform: str, precision: str | None = None
) -> str:
    """The autotune table key of one (command, input specs, platform), and of where a
    winner was measured (:func:`measured_where`): the platform's device kind, the JAX
    version and the matmul precision (``precision``, default the one in force). A winner
    timed on another GPU kind, under another JAX (whose XLA fuses differently) or
    another precision does not apply here.

    Hyper-parameters are written as their ``repr``, except those whose ``repr`` says
    too little or differs between processes (:func:`stable_param`): a sub-graph
    (``fused_elementwise``'s ``body``, a loop's) is a digest of its whole wiring, a
    function its module and qualified name. So two chains fused on the same shapes get
    keys of their own, and a saved table applies to the same graph built again.
    """
    shapes = ";".join("none" if s is None else f"{s.dtype.name}{list(s.shape)}" for s in specs)
    where = measured_where(platform, precision)
    return f"{cmd.name}|{stable_param(cmd.params)!r}|{shapes}|{platform}|{where}"


def measured_where(platform: str, precision: str | None = None) -> str:
    """What a timing on ``platform`` depends on beyond the command and its inputs:
    ``"<device kind>|jax <version>|<matmul precision>"`` (``jax.devices(platform)[0]
    .device_kind``, ``"none"`` where this process has no such device; the precision is
    ``precision`` (a name of :data:`fnnc.config.MATMUL_PRECISIONS`; what a program
    compiled with ``compile(matmul_precision=...)`` runs under), default
    :attr:`fnnc.config.Config.matmul_precision`, which autotune times under)."""
    kind = measured.device_kind(platform) or "none"
    if precision is None:
        precision = config.get().matmul_precision
    else:
        precision = config.matmul_precision_name(precision, "measured_where: precision")
    return f"{kind}|jax {jax.__version__}|{precision}"


class _Text:
    """A value whose ``repr`` is the given text (a stand-in inside a key's ``repr``)."""

    __slots__ = ("text",)

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text


def stable_param(value: Any) -> Any:
    """``value`` (a hyper-parameter, or a tuple of them) with every part whose ``repr``
    is lossy or holds a memory address replaced by one that is neither: a
    :class:`~fnnc.core.ir.Graph` (``<Graph: 1 inputs, 2 nodes, 1 outputs>`` for every
    such graph) by ``graph:<digest of its symbols, nodes and wiring>``, a command by
    its name and stable parameters, a function by ``module.qualname``, a
    ``functools.partial`` by its function, arguments and keywords (each made stable in
    turn: ``partial(f, a=1)`` and ``partial(f, a=2)`` compute different things), and a
    constant's value (:class:`fnnc.ops.Literal`, held as bytes) by its dtype, shape and
    the sha256 of its bytes (its printed form, ``<float32[3]>``, is the same for every
    value). Other values are kept, so their ``repr`` (and keys saved before) stay as
    they were."""
    if isinstance(value, tuple):
        return tuple(stable_param(v) for v in value)
    if isinstance(value, Command):
        return _Text(f"Command(name={value.name!r}, params={stable_param(value.params)!r})")
    if isinstance(value, Graph):
        return _Text(f"graph:{_graph_digest(value)}")
    if _is_literal(value):
        digest = hashlib.sha256(value.data).hexdigest()[:24]
        return _Text(f"<{np.dtype(value.dtype).name}{list(value.shape)} sha256:{digest}>")
    if isinstance(value, functools.partial):
        args = stable_param(tuple(value.args))
        keywords = stable_param(tuple(sorted(value.keywords.items())))
        return _Text(f"partial({stable_param(value.func)!r}, {args!r}, {keywords!r})")
    if callable(value) and not isinstance(value, type):
        name = getattr(value, "__qualname__", type(value).__qualname__)
        return _Text(f"<{getattr(value, '__module__', '?')}.{name}>")
    return value


def _is_literal(value: Any) -> bool:
    """Whether ``value`` is a constant's value, :class:`fnnc.ops.Literal` (its bytes,
    shape and dtype); known by its fields, as the core does not import the ops."""
    return (
        isinstance(getattr(value, "data", None), bytes)
        and isinstance(getattr(value, "shape", None), tuple)
        and isinstance(getattr(value, "dtype", None), np.dtype)
    )


@functools.lru_cache(maxsize=1024)  # equal graphs have one digest; keys are made often
def _graph_digest(graph: Graph) -> str:
    """A digest of what ``graph`` computes: its symbols' types and views, its nodes'
    commands (parameters included, sub-graphs digested in turn) and wiring, its inputs
    and outputs; names are left out (they change nothing computed)."""
    h = hashlib.sha256()
    for sym in graph.symbols:
        view = (sym.root, sym.base, sym.stride) if sym.is_alias else ()
        h.update(f"{tuple(sym.shape)}{np.dtype(sym.dtype).name}{view}\n".encode())
    for node in graph.nodes:
        h.update(f"{stable_param(node.cmd)!r}{node.inputs}{node.outputs}\n".encode())
    h.update(f"{graph.inputs}{graph.outputs}".encode())
    return h.hexdigest()[:24]


def register_backend(command: str, backend: Backend) -> None:
    """Adds ``backend`` to the backends of the command named ``command``.

    Example:
        >>> import jax
        >>> import jax.numpy as jnp
        >>> from fnnc import ops
        >>> fast = ops.Backend("mine", lambda x: jnp.maximum(x, 0), ("cpu",), priority=5)
        >>> ops.register_backend("relu", fast)
        >>> ops.select_backend(ops.relu(), [jax.ShapeDtypeStruct((2,), jnp.float32)], "cpu")
        'mine'
        >>> ops.unregister_backend("relu", "mine")
    """
    lookup(command)
    backend = _checked(command, backend)
    if backend.name == REFERENCE:
        raise BackendError(f"{command}: {REFERENCE!r} is the reference backend's name")
    _BACKENDS.setdefault(command, {})[backend.name] = backend
    _bump()


def _checked(command: str, backend: Any) -> Backend:
    """``backend`` with its platform names spelt as fnnc spells them (``"CPU"``,
    ``"cuda"`` -> ``"cpu"``, ``"gpu"``; one name alone is a tuple of it), or a
    :class:`BackendError` for a field selection would trip over later (a misspelt
    platform was never chosen, a string priority failed the first eager call)."""
    if not isinstance(backend, Backend):
        raise BackendError(
            f"register_backend({command!r}, ...): expected a fnnc.ops.Backend(name, forward, "
            f"platforms, ...), got {type(backend).__name__}"
        )
    where = f"register_backend({command!r}, Backend({backend.name!r}, ...))"
    if not isinstance(backend.name, str) or not backend.name:
        raise BackendError(f"{where}: name must be a non-empty string, got {backend.name!r}")
    for field in ("forward", "supports", "backward", "wins"):
        value = getattr(backend, field)
        if not callable(value) and (value is not None or field in ("forward", "supports")):
            raise BackendError(f"{where}: {field} must be a function, got {type(value).__name__}")
    priority = backend.priority
    if isinstance(priority, (bool, np.bool_)) or not isinstance(priority, (int, np.integer)):
        raise BackendError(f"{where}: priority must be an int, got {priority!r}")
    fields = {
        f: _platforms(where, f, getattr(backend, f)) for f in ("platforms", "interpret_platforms")
    }
    if all(fields[f] == getattr(backend, f) for f in fields):
        return backend
    return dataclasses.replace(backend, **fields)


def _platforms(where: str, field: str, given: Any) -> tuple[str, ...]:
    """``given`` (a name or names) as a tuple of fnnc's platform names
    (:func:`~fnnc.core.platforms.platform_name`); the platform JAX runs on here is also
    taken as JAX names it (a plugin's own, as ``platform_name(None)`` gives it)."""
    names = (given,) if isinstance(given, str) else given
    if not isinstance(names, (tuple, list)):
        raise BackendError(f"{where}: {field} must be a tuple of platform names, got {given!r}")
    out = []
    for name in names:
        try:
            out.append(platform_name(name, where) if isinstance(name, str) else None)
        except ConfigError:  # only then ask JAX, which starts its backends
            here = platform_name(None, where)
            out.append(here if name.lower() == here else None)
        if out[-1] is None:
            raise BackendError(
                f"{where}: {field}={given!r}: {name!r} is no platform; fnnc's are "
                f"{list(PLATFORMS)} (JAX's 'cuda' and 'rocm' are 'gpu'), e.g. "
                "platforms=('cpu',)"
            )
    return tuple(out)


def support_reason(backend: Backend, cmd: Command, specs: Sequence[Spec]) -> str | None:
    """``backend.supports(cmd, specs)``: ``None`` where the backend runs these inputs,
    else the reason it does not. Anything else is a :class:`BackendError`: a predicate
    returning ``True``/``False`` reads the other way round (``False`` is a reason too),
    so such a backend was silently never chosen, while ``autotune`` timed it."""
    reason = backend.supports(cmd, specs)
    if reason is None or (isinstance(reason, str) and reason):
        return reason
    raise BackendError(
        f"backend {backend.name!r} of {cmd.name}: supports(cmd, specs) returned {reason!r} "
        f"for inputs {[spec_text(s) for s in specs]}; "
        "it must return None where the backend runs the inputs and a string saying why not "
        "elsewhere (not True/False: write `None if ok else 'why'`)"
    )


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
