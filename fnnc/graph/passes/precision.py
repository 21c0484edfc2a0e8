"""cast_precision: mixed precision by inserting ``datatype_conversion`` nodes.

The policy (NNC's half-precision training, Keras's ``mixed_float16``):

- graph inputs keep their types, so parameters (and an optimizer's state, which a
  later ``minimize`` adds) stay float32, and the outputs are converted back to the
  types they had, so callers see no change;
- every node that reads floating-point tensors computes in the low type (``bfloat16``
  or ``float16``): its float32 inputs are converted down where they are read;
- nodes in ``keep_float32`` (losses, softmax, reductions, normalisations' statistics,
  ``scan`` loops, whose bodies are typed sub-graphs: :data:`KEEP_FLOAT32`) compute in
  float32: low inputs are converted up;
- nodes that only move data (:data:`FOLLOW`: reshape, transpose, slice, ...) keep the
  type their input has, so a float32 loss is reshaped as float32, not rounded to the
  low type and converted back (a round trip that cost the reported loss its digits).

The backward of ``datatype_conversion`` converts the gradient back, so
:func:`~fnnc.graph.passes.backward.backward` of the result gives float32 gradients
of float32 parameters. Input symbol ids are kept (outputs get new ones), so symbols of
the inputs still name the same inputs.

>>> import numpy as np
>>> from fnnc import ops
>>> from fnnc.graph import GraphBuilder, interpret
>>> from fnnc.graph.passes.precision import cast_precision
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

from collections.abc import Iterable
from typing import Any

import jax.numpy as jnp
import numpy as np

from fnnc import ops
from fnnc.core.ir import Graph, TensorSymbol
from fnnc.errors import GraphError
from fnnc.graph.builder import GraphBuilder

LOW = {"bfloat16": jnp.bfloat16, "float16": np.float16}

KEEP_FLOAT32 = frozenset(
    {
        "softmax", "log_softmax", "softmax_crossentropy", "categorical_crossentropy",
        "binary_crossentropy", "sigmoid_binary_crossentropy", "mse", "smooth_l1",
        "reduce_sum", "reduce_mean", "reduce_norm2", "reduce_max", "reduce_min",
        "batch_norm", "layer_norm", "group_norm", "rmsnorm", "optax_update",
        # a loop's bodies are sub-graphs typed at build: it runs them in float32
        "scan", "pipeline",
    }
)  # fmt: skip


FOLLOW = frozenset(
    {
        "reshape", "transpose", "format_transform", "slice", "pad", "broadcast_to",
        "data_transfer", "index_select",
    }
)  # fmt: skip
"""Data movement: computes in its (first) input's type, whatever it is."""


def low_dtype(dtype: Any) -> Any:
    """The low type for ``"bfloat16"`` / ``"float16"`` (or those dtypes)."""
    name = np.dtype(dtype).name if not isinstance(dtype, str) else dtype
    if name not in LOW:
        raise GraphError(f"cast_precision: dtype {dtype!r}; expected one of {sorted(LOW)}")
    return LOW[name]


def cast_precision(
    graph: Graph, dtype: Any, *, keep_float32: Iterable[str] = KEEP_FLOAT32
) -> Graph:
    """``graph`` computing in ``dtype`` by the module's policy.

    Args:
        graph: any graph (without alias symbols).
        dtype: ``"bfloat16"`` or ``"float16"``.
        keep_float32: command names that compute in float32.

    Raises:
        GraphError: an unknown ``dtype`` or a graph with alias symbols.
    """
    low = np.dtype(low_dtype(dtype))
    keep = frozenset(keep_float32)
    b = GraphBuilder()
    b._symbols = list(graph.symbols)  # inputs keep their ids; new symbols follow
    b._inputs = list(graph.inputs)
    now: dict[int, TensorSymbol] = {i: graph.symbols[i] for i in graph.inputs}
    casts: dict[tuple[int, str], TensorSymbol] = {}

    def read(sid: int, want: np.dtype) -> TensorSymbol:
        sym = now.get(sid)
        if sym is None:
            raise GraphError(
                f"cast_precision: {graph.label(sid)} is read before it is written (an "
                "alias or an unordered graph); run the pass on a plain SSA graph"
            )
        if not _floating(sym.dtype) or np.dtype(sym.dtype) == want:
            return sym
        key = (sid, want.name)
        if key not in casts:
            casts[key] = b.exec(ops.datatype_conversion(dtype=want.name), sym)
        return casts[key]

    for node in graph.nodes:
        float32 = node.cmd.name in keep
        want = np.dtype(np.float32) if float32 else low
        if node.cmd.name in FOLLOW and node.inputs and node.inputs[0] in now:
            first = np.dtype(now[node.inputs[0]].dtype)
            want = first if _floating(first) else want
        ins = [read(s, want) for s in node.inputs]
        outs = b.exec(node.cmd, *ins, name=node.name)
        outs = outs if isinstance(outs, tuple) else (outs,)
        for old, new in zip(node.outputs, outs):
            now[old] = new
    results = []
    for sid in graph.outputs:
        sym = now[sid]
        original = np.dtype(graph.symbols[sid].dtype)
        results.append(read(sid, original) if np.dtype(sym.dtype) != original else sym)
    return b.build(results, out_tree=graph.out_tree)


def _floating(dtype: Any) -> bool:
    return bool(jnp.issubdtype(dtype, jnp.floating))
