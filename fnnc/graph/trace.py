"""trace: a JAX function, or a Flax module call, as a :class:`~fnnc.graph.Graph`.

``trace(fn, *example_args)`` runs ``jax.make_jaxpr`` over the example pytrees and
replays the jaxpr into a :class:`~fnnc.graph.GraphBuilder`:

* every leaf of ``example_args`` becomes a graph input, named by its pytree path under
  the parameter's name (``x``, ``p.params.Dense_0.kernel``, ``m.layers[0].kernel``;
  a trailing ``.value`` of a Flax NNX variable is dropped);
* arrays the function closes over (jaxpr consts) and jaxpr literals become
  ``constant`` nodes; equal literals share one node;
* each equation goes through :data:`~fnnc.graph.trace_rules.TRACE_RULES`, which maps
  known primitives to fnnc commands; any other primitive becomes one generic
  ``primitive`` node (:mod:`fnnc.ops.primitive`), so tracing never fails on a valid
  JAX program;
* a mapped command keeps the primitive's derivative: ``max`` / ``min`` (``jnp.maximum``,
  ``jnp.minimum``, ``jnp.clip``) become ``max[ties=split]`` / ``min[ties=split]``,
  which split a tie's gradient half and half as ``jax.grad`` does (NNC's own rule,
  the commands' default, gives it whole to both operands);
* patterns of several commands that are one NNC command (RoPE's rotate-half, SiLU,
  SwiGLU, logsumexp) are then rewritten into it (:mod:`fnnc.graph.trace_idioms`);
* the outputs are flattened and ``graph.out_tree`` keeps their structure, so
  ``interpret`` and ``compile`` return what ``fn`` returns; ``graph.in_paths`` keeps
  the arguments' key paths, so pytree arguments of another structure (a renamed dict
  key) raise :class:`~fnnc.errors.GraphInputError` instead of feeding the wrong input.

Nested calls, and why:

* ``jit`` is **inlined**: a jit boundary carries no meaning for
  values, and inlining lets passes see (and fuse, differentiate, rematerialise) the
  commands inside, which is where Flax and ``jax.nn`` put most of their work.
* ``custom_jvp_call`` / ``custom_vjp_call`` stay **one generic node** unless the
  wrapped function is one fnnc knows (``jax.nn.relu`` -> ``relu``; JAX's own, defined
  in the ``jax`` package, never a user's function of the same name): binding the
  original primitive keeps JAX's custom derivative, which inlining would lose.
* ``cond``, ``while`` and ``scan`` stay **one generic node** holding the original
  jaxprs: fnnc's ``While`` / ``CaseOf`` sub-graphs follow NNC's semantics, not JAX's,
  and the generic node is exact by construction (its backward is ``jax.vjp``).
* Values that are not plain arrays (PRNG key arrays) cannot be graph tensors: the
  equations that produce them are held back and folded, together with their first
  array-valued consumer, into one generic ``closed_call`` node.
* A PRNG key among the arguments (``jax.random.key``, or the ``RngKey`` of an
  ``nnx.Rngs`` stream in a module argument: ``trace(f, module, x)``) becomes a graph
  input holding its key data (uint32 ``[2]`` for threefry), re-wrapped inside, so each
  call draws from the key it is given; ``interpret`` and ``compile`` take the key
  itself (or its data). Streams advanced inside ``f`` (Dropout's count) are not
  outputs: the graph, like ``f`` on a copy of the module, leaves the module as it is.

A Flax NNX module passed as ``fn`` is split (``nnx.split``) and merged inside the
trace, so its state becomes constants (its Rngs keys included: every call of the graph
draws the same Dropout mask) and updates it makes while running (BatchNorm
statistics) stay out of the module. Pass a module as an *argument* instead to make
its parameters graph inputs.

>>> import jax
>>> import jax.numpy as jnp
>>> from fnnc.graph import interpret, trace
>>> graph = trace(lambda x, w: jax.nn.relu(x @ w), jnp.ones((2, 3)), jnp.ones((3, 4)))
>>> print(graph)
graph(%0:f32[2,3] x, %1:f32[3,4] w) {
  %2:f32[2,4] = gemm(%0, %1)
  %3:f32[2,4] = relu(%2)
  return %3
}
>>> interpret(graph, jnp.ones((2, 3)), jnp.ones((3, 4)))[0]
Array([3., 3., 3., 3.], dtype=float32)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.extend as jex
import numpy as np

from fnnc.core.command import make_command, output_specs
from fnnc.core.ir import Graph, Symbol, TensorSymbol
from fnnc.errors import FnncError, TraceError
from fnnc.graph._io import leaf_paths
from fnnc.graph._trace_args import (
    _input_names,
    _key_data_arguments,
    _needs_static,
    _path_name,
    _split_module,
    _static_hint,
)
from fnnc.graph.builder import GraphBuilder
from fnnc.graph.trace_idioms import rewrite_idioms
from fnnc.graph.trace_rules import PASS_THROUGH, TRACE_RULES
from fnnc.ops import lookup
from fnnc.ops.constant import Literal
from fnnc.ops.primitive import bind, primitive_command


def trace(fn: Callable[..., Any], *example_args: Any, idioms: bool = True) -> Graph:
    """The graph of ``fn`` called on arrays shaped like ``example_args``.

    Args:
        fn: a JAX-traceable function, a Flax NNX module, or any callable object.
        *example_args: pytrees of arrays (or ``jax.ShapeDtypeStruct``); only shapes
            and dtypes are used. Each leaf becomes one graph input, in
            ``jax.tree.leaves`` order.
        idioms: rewrite multi-step idioms into their commands (RoPE's rotate-half,
            ``x * sigmoid(x)``, SwiGLU, logsumexp; :mod:`fnnc.graph.trace_idioms`).
            Pattern functions (:mod:`fnnc.graph.pattern_functions`) turn it off, so a
            pattern is the graph its function literally computes.

    Returns:
        The graph; call ``interpret(graph, *args)`` or ``compile(graph)(*args)`` with
        arguments shaped like ``example_args``.

    Raises:
        TraceError: an argument leaf is not an array, or ``fn`` needs an argument as a
            Python value (a shape, ``jit``'s ``static_argnums``, a Python ``if``): every
            leaf is traced, so bind such arguments with ``functools.partial``.
    """
    if not callable(fn):
        raise TraceError(f"trace: expected a function or module, got {type(fn).__name__}")
    names = _input_names(fn, example_args)
    paths = leaf_paths(jax.tree.structure(tuple(example_args)))
    call, state = _split_module(fn)
    frozen = jax.tree_util.tree_flatten_with_path(state)[0] if state is not None else []
    call, example_args = _key_data_arguments(call, example_args, len(frozen) > 0)
    traced_args = example_args if state is None else (state, *example_args)
    try:
        closed, out_shape = jax.make_jaxpr(call, return_shape=True)(*traced_args)
    except (TypeError, ValueError) as e:
        if not _needs_static(e):
            raise
        raise TraceError(_static_hint(e, names, example_args)) from e
    tracer = _Tracer()
    args: list[Any] = []
    invars = closed.jaxpr.invars
    for name, var in zip(names, invars[len(frozen) :]):
        if not _is_array(var.aval):
            raise TraceError(
                f"trace: argument {name} is a {var.aval} value, which cannot be a graph "
                "input; pass arrays (raw key data from jax.random.key_data) or close over it"
            )
        args.append(tracer.b.input(var.aval.shape, var.aval.dtype, name=name))
    consts = [
        tracer.constant(value, var.aval, _path_name("", path))
        for (path, value), var in zip(frozen, invars)
    ]
    outs = tracer.run(closed.jaxpr, closed.consts, consts + args)
    outs = [tracer.resolve(o, f"output {i}") for i, o in enumerate(outs)]
    graph = tracer.b.build(outs, out_tree=jax.tree.structure(out_shape))
    graph = dataclasses.replace(graph, in_paths=paths)
    return rewrite_idioms(graph) if idioms else graph


def _is_array(aval: Any) -> bool:
    dtype = getattr(aval, "dtype", None)
    return (
        hasattr(aval, "shape")
        and dtype is not None
        and not jax.dtypes.issubdtype(dtype, jax.dtypes.extended)
    )


# -- values that cannot be graph tensors -------------------------------------------------


@dataclasses.dataclass(eq=False)
class _Held:
    """An equation held back because it reads or makes non-array values (PRNG keys)."""

    eqn: Any
    inputs: tuple[Any, ...]  # Symbol | _Pending per equation input


@dataclasses.dataclass(frozen=True, eq=False)
class _Pending:
    """Result ``index`` of a held equation, or a concrete non-array ``value``."""

    held: _Held | None
    index: int = 0
    value: Any = None


# -- the replay --------------------------------------------------------------------------


class _Tracer:
    """Replays jaxpr equations into a :class:`GraphBuilder`; the context rules get."""

    def __init__(self) -> None:
        self.b = GraphBuilder()
        self._literals: dict[Literal, TensorSymbol] = {}
        self._consts: dict[int, Any] = {}
        self._values: dict[int, Literal] = {}
        self._scope: list[str] = []
        self.name = ""

    # values ---------------------------------------------------------------------------
    def constant(self, value: Any, aval: Any = None, name: str = "") -> Any:
        """A constant node for ``value`` (deduplicated); non-arrays stay pending."""
        if aval is not None and not _is_array(aval):
            return _Pending(None, value=value)
        dtype = aval.dtype if aval is not None else None
        where = f"trace: captured constant {name!r}" if name else "trace: a captured constant"
        lit = Literal.of(value, dtype, where=where)
        if lit.size == 1 and not name:
            if lit not in self._literals:
                self._literals[lit] = self.b.constant(lit)
                self._values[self._literals[lit].id] = lit
            return self._literals[lit]
        sym = self.b.constant(lit, name=name)
        self._values[sym.id] = lit
        return sym

    def value(self, sym: Symbol) -> np.ndarray | None:
        """The value of ``sym`` if it is a constant, else ``None``."""
        lit = self._values.get(sym.id)
        return None if lit is None else lit.numpy()

    # commands -------------------------------------------------------------------------
    def has(self, *names: str) -> bool:
        """Whether every named command is registered (families may be absent)."""
        try:
            for n in names:
                lookup(n)
        except FnncError:
            return False
        return True

    def fits(self, name: str, inputs: Sequence[Any], want: Any, **params: Any) -> bool:
        """Whether command ``name(**params)`` maps ``inputs`` (symbols or specs) to ``want``."""
        if not self.has(name):
            return False
        try:
            specs = [jax.ShapeDtypeStruct(s.shape, s.dtype) for s in inputs]
            (spec,) = output_specs(make_command(name, params), specs)
        except (FnncError, ValueError):
            return False
        return tuple(spec.shape) == tuple(want.shape) and spec.dtype == np.dtype(want.dtype)

    def exec(self, name: str, *inputs: Symbol, **params: Any) -> Any:
        """Adds a node running command ``name(**params)``, named by the JAX scope."""
        return self.b.exec(make_command(name, params), *inputs, name=self.name)

    def reshape(self, x: Symbol, shape: Sequence[int]) -> Symbol:
        shape = tuple(int(n) for n in shape)
        return x if x.shape == shape else self.exec("reshape", x, shape=shape)

    def transpose(self, x: Symbol, perm: Sequence[int]) -> Symbol:
        perm = tuple(int(p) for p in perm)
        return x if perm == tuple(range(len(perm))) else self.exec("transpose", x, perm=perm)

    # jaxprs ---------------------------------------------------------------------------
    def inline(self, closed: Any, args: Sequence[Any]) -> list[Any]:
        """Replays a closed jaxpr on ``args`` (symbols or pending values)."""
        return self.run(closed.jaxpr, closed.consts, args)

    def run(self, jaxpr: Any, consts: Sequence[Any], args: Sequence[Any]) -> list[Any]:
        env: dict[Any, Any] = {}
        for var, value in zip(jaxpr.constvars, consts):
            key = id(value)
            if key not in self._consts:
                self._consts[key] = (value, self.constant(value, var.aval))
            env[var] = self._consts[key][1]
        env.update(zip(jaxpr.invars, args))
        for eqn in jaxpr.eqns:
            ins = [self._read(env, v) for v in eqn.invars]
            outs = self._equation(eqn, ins)
            env.update(zip(eqn.outvars, outs))
        return [self._read(env, v) for v in jaxpr.outvars]

    def _read(self, env: dict[Any, Any], atom: Any) -> Any:
        if isinstance(atom, jex.core.Literal):
            return self.constant(atom.val, atom.aval)
        return env[atom]

    def _equation(self, eqn: Any, ins: list[Any]) -> list[Any]:
        name = eqn.primitive.name
        scope = str(eqn.source_info.name_stack)
        self._scope.append(scope)
        self.name = "/".join(s for s in self._scope if s)
        try:
            held = any(isinstance(x, _Pending) for x in ins) or not all(
                _is_array(v.aval) for v in eqn.outvars
            )
            if held and name not in PASS_THROUGH:
                return self._hold(eqn, ins)
            rule = TRACE_RULES.get(name)
            outs = rule(self, eqn, ins) if rule is not None else None
            if outs is None:
                return self._generic(eqn, ins)
            if name not in PASS_THROUGH:
                self._check(eqn, outs)
            return list(outs)
        finally:
            self._scope.pop()
            self.name = "/".join(s for s in self._scope if s)

    def _generic(self, eqn: Any, ins: Sequence[Symbol]) -> list[Symbol]:
        avals = [v.aval for v in eqn.outvars]
        return self._node(eqn.primitive, eqn.params, avals, eqn.effects, ins)

    def _node(self, prim: Any, params: Any, avals: Any, effects: Any, ins: Sequence[Symbol]):
        cmd = primitive_command(
            prim, params, [(a.shape, a.dtype) for a in avals], effects=bool(effects)
        )
        out = self.b.exec(cmd, *ins, name=self.name)
        return list(out) if isinstance(out, tuple) else [out]

    def _check(self, eqn: Any, outs: Sequence[Any]) -> None:
        for sym, var in zip(outs, eqn.outvars, strict=True):
            want = (tuple(var.aval.shape), jax.dtypes.canonicalize_dtype(var.aval.dtype))
            if (sym.shape, np.dtype(sym.dtype)) != want:
                raise TraceError(
                    f"trace: the rule for {eqn.primitive.name} produced {sym.dtype}"
                    f"{list(sym.shape)}, but JAX's equation gives {want[1]}{list(want[0])}: "
                    f"a bug in fnnc.graph.trace_rules\n  equation: {eqn}"
                )

    # non-array values -------------------------------------------------------------------
    def _hold(self, eqn: Any, ins: list[Any]) -> list[Any]:
        held = _Held(eqn, tuple(ins))
        pending = [_Pending(held, i) for i in range(len(eqn.outvars))]
        if all(_is_array(v.aval) for v in eqn.outvars):
            return self._materialize(pending, eqn.effects)
        return pending

    def resolve(self, value: Any, where: str) -> Symbol:
        """A graph symbol for ``value``; held array values become a generic node."""
        if not isinstance(value, _Pending):
            return value
        aval = value.held.eqn.outvars[value.index].aval if value.held else None
        if aval is None or not _is_array(aval):
            raise TraceError(
                f"trace: {where} is a {aval or type(value.value).__name__} value, "
                "not an array; return jax.random.key_data(key) instead"
            )
        return self._materialize([value], value.held.eqn.effects)[0]

    def _materialize(self, pending: list[_Pending], effects: Any) -> list[Symbol]:
        """One ``closed_call`` node computing ``pending`` from the symbols they read."""
        symbols: dict[int, Symbol] = {}

        def collect(x: Any) -> None:
            if isinstance(x, _Pending):
                for y in x.held.inputs if x.held else ():
                    collect(y)
            else:
                symbols.setdefault(x.id, x)

        for p in pending:
            collect(p)
        leaves = list(symbols.values())

        def region(*arrays: Any) -> list[Any]:
            env = {s.id: a for s, a in zip(leaves, arrays)}
            memo: dict[int, tuple[Any, ...]] = {}

            def value(x: Any) -> Any:
                if not isinstance(x, _Pending):
                    return env[x.id]
                if x.held is None:
                    return x.value
                held = x.held
                if id(held) not in memo:
                    args = [value(y) for y in held.inputs]
                    memo[id(held)] = bind(held.eqn.primitive, held.eqn.params, args)
                return memo[id(held)][x.index]

            return [value(p) for p in pending]

        closed = jax.make_jaxpr(region)(*[s.spec for s in leaves])
        return self._node(
            jex.core.primitives.closed_call_p,
            {"call_jaxpr": closed},
            closed.out_avals,
            closed.effects or effects,
            leaves,
        )
