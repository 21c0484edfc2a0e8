"""Patterns and replacements written as ordinary functions, traced (the torch.fx way).

``replace_pattern(graph, pattern, replacement)`` traces ``pattern`` (a JAX function,
which may call fnnc commands) into a :class:`~fnnc.graph.pattern.Pat`, and rewrites
every match with ``replacement`` traced on the matched symbols' shapes and inlined.
An fnnc command called inside either function becomes one node of that command
(``ops.swish()(x)`` is a ``swish`` node, not the JAX operations it runs).

>>> import jax
>>> import jax.numpy as jnp
>>> from fnnc import ops
>>> from fnnc.graph import replace_pattern, trace
>>> g = trace(lambda a: jnp.tanh(a * jax.nn.sigmoid(a)), jnp.ones(3))
>>> def pattern(x):
...     return x * jax.nn.sigmoid(x)
>>> def replacement(x):
...     return ops.swish()(x)
>>> print(replace_pattern(g, pattern, replacement))
graph(%0:f32[3] a) {
  %1:f32[3] = swish(%0)
  %2:f32[3] = tanh(%1)
  return %2
}

The pattern's arguments are its captures: a name used twice (``x`` above) must be the
same symbol. Traced constants match constants of the same value (scalars match any
shape), commands and hyper-parameters match exactly, and inputs of commutative commands
match in any order. A match whose result the replacement cannot give is skipped: in
``x * 2.0`` matched by ``mul(x[1, 3], constant[2, 3])`` the constant broadcasts ``x``,
and the replacement, traced on ``x``, returns ``[1, 3]`` where the node writes ``[2, 3]``.
A replacement that returns other shapes or dtypes than the pattern itself is an error.
Pattern functions are traced on ``example_args`` (default: one float32 ``[4, 4]`` array
per parameter); hyper-parameters that depend on shapes (a reshape's target) then come
from those examples.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jax.extend as jex
import numpy as np

from fnnc.core.command import CALL_HOOK, Command, output_specs
from fnnc.core.dispatch import REFERENCE, compiled_forward
from fnnc.core.evaluate import as_tuple
from fnnc.core.ir import Graph, Symbol
from fnnc.errors import FnncError, GraphError
from fnnc.graph.matching import Match
from fnnc.graph.pattern import Pat
from fnnc.graph.rules import Rule, graph_rewrite
from fnnc.graph.trace import trace
from fnnc.graph.trace_rules import TRACE_RULES

_command_p = jex.core.Primitive("fnnc_command")
_command_p.multiple_results = True


class _Held:
    """A command as a primitive parameter (JAX keeps weak references to parameters,
    which slotted commands do not allow)."""

    def __init__(self, cmd: Command):
        self.cmd = cmd

    def __hash__(self) -> int:
        return hash(self.cmd)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Held) and other.cmd == self.cmd


def _abstract(*avals: Any, cmd: _Held) -> list[Any]:
    specs = output_specs(cmd.cmd, [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in avals])
    return [jax.core.ShapedArray(tuple(s.shape), s.dtype) for s in specs]


_command_p.def_abstract_eval(_abstract)
_command_p.def_impl(lambda *xs, cmd: list(as_tuple(compiled_forward(cmd.cmd, REFERENCE)(*xs))))


def _trace_rule(tracer: Any, eqn: Any, ins: Sequence[Symbol]) -> list[Symbol]:
    out = tracer.b.exec(eqn.params["cmd"].cmd, *ins, name=tracer.name)
    return list(out) if isinstance(out, tuple) else [out]


def _as_node(cmd: Command, arrays: tuple[Any, ...]) -> Any:
    if not any(isinstance(a, jax.core.Tracer) for a in arrays):
        return NotImplemented
    outs = _command_p.bind(*arrays, cmd=_Held(cmd))
    return outs[0] if len(outs) == 1 else tuple(outs)


@contextlib.contextmanager
def commands_as_nodes() -> Iterator[None]:
    """Within the block, an fnnc command called on traced values traces to one node."""
    token = CALL_HOOK.set(_as_node)
    # the primitive exists only inside the block, so the trace rule does too
    TRACE_RULES[_command_p.name] = _trace_rule
    try:
        yield
    finally:
        CALL_HOOK.reset(token)
        if CALL_HOOK.get() is None:
            TRACE_RULES.pop(_command_p.name, None)


def trace_function(fn: Callable[..., Any], *example_args: Any, idioms: bool = False) -> Graph:
    """:func:`~fnnc.graph.trace` with fnnc commands kept as single nodes; the default
    examples are one float32 ``[4, 4]`` array per positional parameter.

    ``idioms=False`` (patterns) keeps literally what ``fn`` computes; a replacement is
    traced with ``idioms=True``, so ``jax.nn.silu`` becomes one ``swish`` node instead
    of ``x * sigmoid(x)`` again, which would match its own pattern forever."""
    if not example_args:
        n = len(inspect.signature(fn).parameters)
        example_args = tuple(jax.ShapeDtypeStruct((4, 4), np.float32) for _ in range(n))
    with commands_as_nodes():
        return trace(fn, *example_args, idioms=idioms)


def pattern_of(fn: Callable[..., Any], *example_args: Any) -> tuple[Pat, tuple[str, ...]]:
    """The pattern ``fn`` computes, and the capture names of its arguments in order.

    Raises:
        GraphError: ``fn`` has several outputs, returns an argument, leaves an argument
            unused, or makes views.
    """
    g = trace_function(fn, *example_args)
    where = f"pattern {getattr(fn, '__name__', fn)}"
    if len(g.outputs) != 1:
        raise GraphError(
            f"{where}: a pattern function returns one array, this one {len(g.outputs)}"
        )
    names = tuple(g.symbols[i].name for i in g.inputs)
    if g.outputs[0] in g.inputs:
        raise GraphError(f"{where}: it returns an argument unchanged; a pattern computes something")
    reads: dict[int, int] = {}
    for node in g.nodes:
        for s in node.inputs:
            reads[s] = reads.get(s, 0) + 1
    unused = [n for i, n in zip(g.inputs, names) if i not in reads]
    if unused:
        raise GraphError(f"{where}: arguments {unused} are not used; drop them")
    memo: dict[int, Pat] = {}

    def build(sid: int) -> Pat:
        if sid not in memo:
            memo[sid] = _pattern_at(g, sid, names, reads, build, where)
        return memo[sid]

    pat = build(g.outputs[0])
    if pat.kind != "op":
        raise GraphError(f"{where}: it returns a constant; a pattern computes from its arguments")
    return pat, names


def _pattern_at(
    g: Graph, sid: int, names: tuple[str, ...], reads: dict[int, int], build: Any, where: str
) -> Pat:
    if sid in g.inputs:
        return Pat.var(names[g.inputs.index(sid)])
    sym = g.symbols[sid]
    if sym.is_alias:
        raise GraphError(f"{where}: it makes a view ({g.label(sid)}); patterns match node outputs")
    node = g.nodes[g.producers[sid]]
    if node.cmd.name == "constant":
        value = node.cmd.param("value").numpy()
        if value.size == 1:
            return Pat.const(value.reshape(()).item())
        return Pat.const(value, shape=value.shape, dtype=value.dtype)
    # an interior result read twice must be one symbol: capture it under a private name
    name = f"%{sid}" if reads.get(sid, 0) > 1 else None
    index = node.outputs.index(sid) if len(node.outputs) > 1 else None
    inputs = [build(s) for s in node.inputs]
    return Pat.op(node.cmd.name, *inputs, name=name, index=index, **node.cmd.kwargs)


def traced_rule(
    pattern: Callable[..., Any],
    replacement: Callable[..., Any],
    *example_args: Any,
    name: str = "",
) -> Rule:
    """A :class:`~fnnc.graph.Rule` from two functions taking the same arguments.

    Args:
        pattern: computes what to find (traced once on ``example_args``).
        replacement: computes what to put there; traced on the shapes of each match
            (once per distinct shapes) and inlined.
        *example_args: arrays (or ``jax.ShapeDtypeStruct``) to trace ``pattern`` on.
        name: the rule's name; default ``"pattern -> replacement"``.
    """
    pat, names = pattern_of(pattern, *example_args)
    traced: dict[tuple[Any, ...], Graph] = {}
    label = name or f"{_name(pattern)} -> {_name(replacement)}"

    def replace(m: Match) -> Any:
        args = [m[n] for n in names]
        key = _specs(args)
        if key not in traced:
            traced[key] = trace_function(replacement, *_structs(args), idioms=True)
        got = _specs(traced[key].output_specs)
        if got == _specs(m.source.symbol(o) for o in m.root.outputs):
            return inline_match(m, traced[key], args)
        want = _pattern_specs(pattern, key)
        if want is not None and want != got:
            shown = ", ".join(f"{n}: {_show(s)}" for n, s in zip(names, key))
            raise GraphError(
                f"rule {label}: for arguments {shown} the replacement returns "
                f"{', '.join(map(_show, got))}, the pattern "
                f"{', '.join(map(_show, want))}; a replacement must return arrays of "
                "the pattern's shapes and dtypes"
            )
        # the pattern's own result would not fit either: a scalar constant of the pattern
        # matched a constant that broadcasts the arguments, so this match is skipped
        return None

    replace.__name__ = label
    return Rule(pat, replace, name=label)


_SpecKey = tuple[tuple[tuple[int, ...], np.dtype], ...]


def _specs(symbols: Any) -> _SpecKey:
    return tuple((tuple(s.shape), np.dtype(s.dtype)) for s in symbols)


def _structs(symbols: Sequence[Any]) -> list[jax.ShapeDtypeStruct]:
    return [jax.ShapeDtypeStruct(s.shape, s.dtype) for s in symbols]


def _show(spec: tuple[tuple[int, ...], np.dtype]) -> str:
    return f"{spec[1].name}{list(spec[0])}"


@functools.lru_cache(maxsize=256)
def _pattern_specs(pattern: Callable[..., Any], key: _SpecKey) -> _SpecKey | None:
    """What ``pattern`` returns for arguments of these specs; ``None`` when it does not
    trace on them (shape-dependent hyper-parameters taken from its examples)."""
    structs = [jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in key]
    try:
        return _specs(trace_function(pattern, *structs).output_specs)
    except (FnncError, TypeError, ValueError):
        return None


def inline_match(m: Match, graph: Graph, args: Sequence[Symbol]) -> Any:
    """Emits ``graph``'s nodes through ``m.exec`` with ``args`` as its inputs; returns
    its output symbol(s)."""
    return inline_graph(m.exec, graph, args)


def inline_graph(exec_: Callable[..., Any], graph: Graph, args: Sequence[Symbol]) -> Any:
    """Emits ``graph``'s nodes through ``exec_(cmd, *inputs)`` (``Match.exec``,
    ``Rewriter.exec``) with ``args`` as its inputs; returns its output symbol(s)."""
    env: dict[int, Symbol] = dict(zip(graph.inputs, args))
    for node in graph.nodes:
        if any(graph.symbols[o].is_alias for o in node.outputs):
            raise GraphError("inline: the traced function writes views; return whole arrays")
        outs = exec_(node.cmd, *(env[s] for s in node.inputs))
        env.update(zip(node.outputs, outs if isinstance(outs, tuple) else (outs,)))
    results = tuple(env[s] for s in graph.outputs)
    return results[0] if len(results) == 1 else results


def call_function(exec_: Callable[..., Any], fn: Callable[..., Any], args: Sequence[Symbol]) -> Any:
    """``fn`` (a JAX function, which may call fnnc commands) traced on the specs of
    ``args`` (cached per function and specs) and emitted through ``exec_``."""
    specs = tuple(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in args)
    return inline_graph(exec_, _traced(fn, specs), args)


@functools.lru_cache(maxsize=256)
def _traced(fn: Callable[..., Any], specs: tuple[Any, ...]) -> Graph:
    return trace_function(fn, *specs, idioms=True)


def replace_pattern(
    graph: Graph,
    pattern: Callable[..., Any],
    replacement: Callable[..., Any],
    *example_args: Any,
) -> Graph:
    """``graph`` with every match of ``pattern`` replaced (see the module doc); the
    same object when nothing matched."""
    return graph_rewrite(graph, [traced_rule(pattern, replacement, *example_args)])


def _name(fn: Any) -> str:
    return getattr(fn, "__name__", type(fn).__name__)
