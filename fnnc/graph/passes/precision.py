"""cast_precision: mixed precision by inserting ``datatype_conversion`` nodes.

The policy (NNC's half-precision training, Keras's ``mixed_float16``):

- graph inputs keep their types, so parameters (and an optimizer's state, which a
  later ``minimize`` adds) stay float32, and the outputs are converted back to the
  types they had, so callers see no change;
- every node that reads floating-point tensors computes in the low type (``bfloat16``
  or ``float16``): its float32 inputs are converted down where they are read;
- nodes in ``keep_float32`` (losses, softmax, reductions, normalisations' statistics:
  :data:`KEEP_FLOAT32`) compute in float32: low inputs are converted up;
- loops over blocks (``scan``, ``pipeline``: :data:`SUBGRAPH_RULES`) compute in the
  low type like any node: their inputs are converted at the loop's entry (a stack of
  float32 parameters once per step, not a slice per iteration: Flax's and MaxText's
  float32 ``param_dtype`` with a bfloat16 ``dtype``), the carry (the residual stream)
  is carried in the low type, and the block body is cast by this same policy (matmuls
  low, ``keep_float32`` commands float32), its forward and backward bodies derived
  again from the cast block; gradients the loop sums over iterations (loop-invariant
  inputs, a pipeline's microbatches) are summed in float32;
- other nodes holding sub-graphs (``while_loop``, ``case_of``, chains ``fuse`` has
  fused: no rule in :data:`SUBGRAPH_RULES` retypes their bodies) compute in the types
  they were built for, float32 in a float32 graph: their low inputs are converted up
  at the node, and their outputs are converted where a low node reads them, as for
  ``keep_float32`` (cast before ``fuse`` to compute fused chains low);
- a float32 input (a parameter) is converted down once per node that reads it, not
  once for all: the backward of each conversion brings its reader's gradient to
  float32, so a weight shared by several layers sums their gradients in float32 (one
  shared conversion summed 300 readers' gradients of 1.0 in bfloat16, to 256), as
  Flax's casts in each call do; XLA merges the identical forward conversions;
- nodes none of whose outputs is floating point (``compare``, ``argmax``, ``argmin``,
  ``argsort``, a conversion to an integer or bool type, ...) read their inputs at the
  types the graph gave them, as ``torch.autocast`` leaves comparisons alone: a float32
  ``x < 0.1`` compared in bfloat16 was False for x = 0.09999 (both round to 0.1); so
  are the inputs other commands only compare (:data:`COMPARED`: ``masked_fill``'s mask);
- identities (:data:`PASS_THROUGH`: ``stop_gradient``, ``optimization_barrier``) read
  each input in the type it has;
- nodes that only move data (:data:`FOLLOW`: reshape, transpose, slice, sort, ...) keep the
  type their input has, so a float32 loss is reshaped as float32, not rounded to the
  low type and converted back (a round trip that cost the reported loss its digits).
  Gathers are among them: an ``embedding`` reads its float32 table and its rows are
  converted where a computing node reads them, so its gradient is scattered into the
  table's float32 (a token seen thousands of times a batch sums its rows' gradients
  in float32, not bfloat16, whose 8 bits stop growing at 256 ulps), and the step
  never converts the whole table (32768 x 1024 in issue 24's LM) to read a batch of
  its rows, as ``torch.autocast`` leaves embeddings in float32.

The backward of ``datatype_conversion`` converts the gradient back, so
:func:`~fnnc.graph.passes.backward.backward` of the result gives float32 gradients
of float32 parameters. Input symbol ids are kept (outputs get new ones), so symbols of
the inputs still name the same inputs.

>>> import numpy as np
>>> from fnnc import ops
>>> from fnnc.graph import GraphBuilder, cast_precision, interpret
>>> b = GraphBuilder()
>>> x, w = b.input((2, 3), name="x"), b.input((4, 3), name="w")
>>> y = b.exec(ops.softmax(), b.exec(ops.gemm(transpose_b=True), x, w))
>>> low = cast_precision(b.build([y]), "bfloat16")
>>> [n.cmd.name for n in low.nodes]
['datatype_conversion', 'datatype_conversion', 'gemm', 'datatype_conversion', 'softmax']
>>> interpret(low, np.ones((2, 3), np.float32), np.ones((4, 3), np.float32)).dtype
dtype('float32')
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np

from fnnc import ops
from fnnc.core.command import Command, lookup
from fnnc.core.ir import Graph, TensorSymbol
from fnnc.errors import GraphError, UnknownCommandError
from fnnc.graph.builder import GraphBuilder
from fnnc.graph.passes._subgraphs import holds_subgraphs
from fnnc.graph.scan import scan_bodies

LOW = {"bfloat16": jnp.bfloat16, "float16": np.float16}

KEEP_FLOAT32 = frozenset(
    {
        "softmax", "log_softmax", "softmax_crossentropy", "categorical_crossentropy",
        "binary_crossentropy", "sigmoid_binary_crossentropy", "mse", "smooth_l1",
        "reduce_sum", "reduce_mean", "reduce_norm2", "reduce_max", "reduce_min",
        "reduce_logsumexp", "histogram",
        "batch_norm", "layer_norm", "group_norm", "rms_norm", "rmsnorm_gated",
        "optax_update",
    }
)  # fmt: skip
"""Commands that compute in float32 (names of registered commands: a test checks them;
``"rmsnorm"``, NNC's name, had stood here for ``rms_norm``, which ran in bfloat16;
``histogram``'s sums and bins, of a float32 0.4999 rounded to 0.5, had too)."""


FOLLOW = frozenset(
    {
        "reshape", "transpose", "format_transform", "slice", "pad", "broadcast_to",
        "data_transfer", "index_select", "embedding", "datatype_conversion",
        "sort", "partition", "unique_consecutive", "nms",
    }
)  # fmt: skip
"""Data movement: computes in its (first) input's type, whatever it is. A graph's own
``datatype_conversion`` reads its input as it is: rounding it to the low type first made
an explicit upcast of float16 data, or a conversion to float16, bfloat16-exact. Sorts
are data movement too (their values a permutation of the input, ``torch.autocast``
leaves them in theirs): rounding float32 values first made near-equal ones ties, whose
order (and a top-k's choice) then followed their positions, not their values. So is
``nms``, which sorts rows by score and keeps some (scores 0.3 and 0.3001, a tie in
bfloat16, came out in the wrong order)."""


PASS_THROUGH = frozenset({"stop_gradient", "optimization_barrier"})
"""Identities: each input keeps the type it has (a float32 loss behind a
``stop_gradient`` had been rounded to the low type and converted back)."""

COMPARED = {"fill_if_less_than": (1, 2), "masked_fill": (1,), "index_select": (1,)}
"""Inputs (by position) a command only compares, which are read at their graph types
as a comparison's are: ``fill_if_less_than``'s selector and threshold (``s < t`` in
bfloat16 was False for s = 0.09999, t = 0.1), ``masked_fill``'s mask (1.001 rounded to
1.0 matched ``eq=1``); and ``index_select``'s float positions, which pick the rows
(in bfloat16 position 257 read row 256, and 299 of 300 rows became 300: NaN)."""


def low_dtype(dtype: Any) -> Any:
    """The low type for ``"bfloat16"`` / ``"float16"`` (or those dtypes)."""
    name = np.dtype(dtype).name if not isinstance(dtype, str) else dtype
    if name not in LOW:
        raise GraphError(f"cast_precision: dtype {dtype!r}; expected one of {sorted(LOW)}")
    return LOW[name]


def cast_precision(
    graph: Graph,
    dtype: Any,
    *,
    keep_float32: Iterable[str] = KEEP_FLOAT32,
    float32_nodes: Iterable[int] = (),
) -> Graph:
    """``graph`` computing in ``dtype`` by the policy of :mod:`fnnc.graph.passes.precision`.

    Args:
        graph: any graph (without alias symbols).
        dtype: ``"bfloat16"`` or ``"float16"``.
        keep_float32: command names that compute in float32.
        float32_nodes: positions in ``graph.nodes`` of nodes that compute in float32
            whatever their command, as ``keep_float32``'s do: a model's loss, appended
            after its layers (a loss written as ``jnp`` code squares in float16 and
            overflows past 256, as Keras and ``torch.autocast`` keep losses in float32).

    Raises:
        GraphError: an unknown ``dtype``, a name in ``keep_float32`` that is no
            registered command (it would keep nothing in float32), a graph with alias
            symbols, or one that reads a loop's tape (a graph that already holds the
            loop's gradient).
    """
    low, keep = np.dtype(low_dtype(dtype)), _command_names(keep_float32)
    return _cast(graph, low, keep, wide=frozenset(_positions(float32_nodes, graph)))


def _positions(nodes: Iterable[int], graph: Graph) -> list[int]:
    """``float32_nodes`` checked: ints naming nodes of ``graph``."""
    out = []
    for k in nodes:
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
            raise GraphError(f"cast_precision: float32_nodes holds {k!r}; expected node positions")
        if not 0 <= k < len(graph.nodes):
            raise GraphError(
                f"cast_precision: float32_nodes holds {k}; the graph has {len(graph.nodes)} nodes"
            )
        out.append(int(k))
    return out


def _command_names(names: Iterable[str]) -> frozenset[str]:
    """``keep_float32`` checked: ``{"rmsnorm"}`` (NNC's name) or ``"softmax"`` (a string,
    its letters) had kept nothing in float32, silently."""
    if isinstance(names, str):
        raise GraphError(
            f"cast_precision: keep_float32={names!r}; expected a collection of command "
            f"names, e.g. {{{names!r}}} or KEEP_FLOAT32 | {{{names!r}}}"
        )
    names = frozenset(names)
    for name in sorted(names):
        try:
            lookup(name)
        except UnknownCommandError as e:
            raise GraphError(f"cast_precision: keep_float32 names {e}") from None
    return names


def _cast(
    graph: Graph,
    low: np.dtype,
    keep: frozenset[str],
    inputs: Sequence[Any] | None = None,
    outputs: Sequence[Any] | None = None,
    wide: frozenset[int] = frozenset(),
) -> Graph:
    """:func:`cast_precision` with the inputs retyped to ``inputs`` and the outputs
    converted to ``outputs`` (default: the types they have), as a loop body needs; the
    nodes at positions ``wide`` compute in float32."""
    b = GraphBuilder()
    # inputs keep their ids; new symbols follow and take the names, so the old symbols
    # (left unreferenced) drop theirs: backward(cast, "loss", ...) found two "loss"
    kept = frozenset(graph.inputs)
    b._symbols = [s if s.id in kept or not s.name else _unnamed(s) for s in graph.symbols]
    b._inputs = list(graph.inputs)
    for sid, dt in zip(graph.inputs, inputs or ()):
        b._symbols[sid] = dataclasses.replace(graph.symbols[sid], dtype=np.dtype(dt))
    now: dict[int, TensorSymbol] = {i: b._symbols[i] for i in graph.inputs}
    casts: dict[tuple[int, str], TensorSymbol] = {}
    graph_inputs = frozenset(graph.inputs)
    tapes: dict[int, str] = {}  # loop outputs a retyped loop no longer has -> the loop

    def read(sid: int, want: np.dtype) -> TensorSymbol:
        sym = now.get(sid)
        if sym is None and sid in tapes:
            raise GraphError(
                f"cast_precision: {graph.label(sid)} is part of the tape of loop node "
                f"{tapes[sid]!r}, which only the loop's gradient reads; cast the forward "
                "graph, then run backward on the result"
            )
        if sym is None:
            raise GraphError(
                f"cast_precision: {graph.label(sid)} is read before it is written (an "
                "alias or an unordered graph); run the pass on a plain SSA graph"
            )
        if not _floating(sym.dtype) or np.dtype(sym.dtype) == want:
            return sym
        convert = ops.datatype_conversion(dtype=want.name)
        if sid in graph_inputs and want.itemsize < np.dtype(sym.dtype).itemsize:
            return b.exec(convert, sym)  # an input narrowed: one conversion a reader
        key = (sid, want.name)
        if key not in casts:
            casts[key] = b.exec(convert, sym)
        return casts[key]

    def cast_body(body: Graph, ins: Sequence[Any], outs: Sequence[Any]) -> Graph:
        return _cast(body, low, keep, ins, outs)

    for position, node in enumerate(graph.nodes):
        float32 = node.cmd.name in keep or position in wide
        want = np.dtype(np.float32) if float32 else low
        if node.cmd.name in FOLLOW and node.inputs and node.inputs[0] in now:
            first = np.dtype(now[node.inputs[0]].dtype)
            want = first if _floating(first) else want
        rule = None if float32 else SUBGRAPH_RULES.get(node.cmd.name)
        exact = not any(_floating(graph.symbols[o].dtype) for o in node.outputs)
        if exact or (rule is None and holds_subgraphs(node.cmd)):
            # no floating-point result (a comparison, an argmax, a conversion to int):
            # rounding its inputs would change its answer; or bodies typed for the
            # inputs as built, and no rule to retype them
            ins = [read(s, np.dtype(graph.symbols[s].dtype)) for s in node.inputs]
        elif node.cmd.name in PASS_THROUGH:  # identities: each input as it is now
            ins = [read(s, np.dtype(now[s].dtype) if s in now else want) for s in node.inputs]
        else:
            compared = COMPARED.get(node.cmd.name, ())
            ins = [
                read(s, np.dtype(graph.symbols[s].dtype) if k in compared else want)
                for k, s in enumerate(node.inputs)
            ]
        cmd, kept = node.cmd, len(node.outputs)
        if rule is not None:
            cmd, kept = rule(node.cmd, [np.dtype(s.dtype) for s in ins], cast_body)
        outs = b.exec(cmd, *ins, name=node.name)
        outs = outs if isinstance(outs, tuple) else (outs,)
        for old, new in zip(node.outputs[:kept], outs):
            now[old] = new
        tapes.update((old, node.name or node.cmd.name) for old in node.outputs[kept:])
    results = []
    for k, sid in enumerate(graph.outputs):
        sym = now[sid] if sid in now else read(sid, low)  # read raises: tape or unwritten
        original = np.dtype(graph.symbols[sid].dtype if outputs is None else outputs[k])
        results.append(read(sid, original) if np.dtype(sym.dtype) != original else sym)
    return b.build(results, out_tree=graph.out_tree, in_paths=graph.in_paths)


BodyCast = Callable[[Graph, Sequence[Any], Sequence[Any]], Graph]
"""``cast(body, input dtypes, output dtypes)``: a sub-graph cast by the pass's policy."""

SubgraphRule = Callable[[Command, Sequence[np.dtype], BodyCast], tuple[Command, int]]
"""``rule(cmd, input dtypes, cast) -> (cmd', kept)``: the command for inputs of those
types, with its sub-graphs cast; its first ``kept`` outputs stand for the old ones."""


def _retype_loop(cmd: Command, dtypes: Sequence[np.dtype], cast: BodyCast) -> tuple[Command, int]:
    """A ``scan`` / ``pipeline`` for inputs of ``dtypes``: its block body (the forward
    body's first ``n_carry`` outputs) cast, its bodies derived again from that, as
    :func:`~fnnc.graph.scan.scan_bodies` derived them at build, so the gradient is
    still fnnc's ``backward`` of the (now cast) block. The carries come out in the
    type they go in, and so do a ``scan``'s per-iteration results (``n_ys``); the tape,
    typed by the new body, is new: only the carries and results map."""
    n_carry, n_stacked = cmd.param("n_carry"), cmd.param("n_stacked")
    n_ys = cmd.kwargs.get("n_ys", 0)
    forward, kept = cmd.param("forward"), n_carry + n_ys
    block = dataclasses.replace(forward, outputs=forward.outputs[:kept], out_tree=None)
    outs = [*dtypes[:n_carry], *(forward.spec(s).dtype for s in block.outputs[n_carry:])]
    block = cast(block, dtypes, outs)
    fwd, grad, wants = scan_bodies(block, n_carry, n_stacked, cmd.param("checkpoint"), n_ys)
    return cmd.replace(forward=fwd, backward=grad, wants=wants), kept


SUBGRAPH_RULES: dict[str, SubgraphRule] = {"scan": _retype_loop, "pipeline": _retype_loop}
"""Commands holding sub-graphs typed for their inputs: how to retype them."""


def _unnamed(sym: Any) -> Any:
    return dataclasses.replace(sym, name="")


def _floating(dtype: Any) -> bool:
    return bool(jnp.issubdtype(dtype, jnp.floating))
