"""``constrain_activations``: pins the activations of tensor-parallel layers with
``sharding_constraint`` nodes, so XLA's SPMD partitioner keeps Megatron's layout.

Needs the layouts of the parameters (:func:`~fnnc.graph.parameter_specs`, by input
name). For each dense (a ``gemm`` with a parameter weight, see
:mod:`fnnc.graph.sharding_roles`) whose weight is split by output features over a mesh
axis, its output is pinned as ``(data, ..., axis)``: batch over ``data``, features over
the model axis. One split by input features gets ``(data, ...)``: its features whole,
so the partial sums meet in one all-reduce there. Attention whose query projection is
split by heads gets ``(data, None, axis, None)`` on its ``[B, S, H, D]`` output.
Consumers read the pinned value; inputs, outputs and every existing id and name stay,
so ids and names a caller holds (parameters, the loss) still name the same tensors (a
pinned value is named ``<name>/shard``); a value already pinned is not pinned again, so
the pass is idempotent::

    %4 = gemm[transpose_b=True](%0, %1)     %4 = gemm[transpose_b=True](%0, %1)
    %5 = relu(%4)                     ->    %7 = sharding_constraint[spec=(data, model)](%4)
                                            %5 = relu(%7)

The constraints change layouts only, never values; on one device, or compiled without
a mesh, they do nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from jax.sharding import PartitionSpec

from fnnc.core.ir import Graph, Node, TensorSymbol
from fnnc.graph.sharding_roles import Walk
from fnnc.ops.sharding import sharding_constraint


def constrain_activations(
    graph: Graph,
    specs: Mapping[str, PartitionSpec],
    *,
    sizes: Mapping[str, int],
    data: str = "data",
) -> Graph:
    """Adds ``sharding_constraint`` nodes after tensor-parallel layers (module doc).

    Args:
        graph: a forward graph whose parameter inputs are named by their ids.
        specs: parameter id -> layout.
        sizes: mesh axis name -> size (heads are pinned only where they divide).
        data: the batch's mesh axis.

    Returns:
        The graph with the constraints, or ``graph`` itself when none applies.
    """
    names = {graph.symbols[s].name: s for s in graph.inputs}
    by_sid = {names[p]: spec for p, spec in specs.items() if p in names}
    walk = Walk(graph, by_sid)
    # a value already pinned to that layout (the pass run twice) is not pinned again
    done = {(n.inputs[0], n.cmd.param("spec")) for n in graph.nodes if n.cmd.name == CONSTRAINT}
    pins = {}
    for node in graph.nodes:
        pin = _pin(walk, node, by_sid, sizes, data)
        out = node.outputs[0]
        if pin is not None and not graph.symbols[out].is_alias and (out, pin) not in done:
            pins[out] = pin
    if not pins:
        return graph
    symbols, nodes, rename = list(graph.symbols), [], {}
    for node in graph.nodes:
        ins = tuple(rename.get(s, s) for s in node.inputs)
        nodes.append(node if ins == node.inputs else dataclasses.replace(node, inputs=ins))
        for out in node.outputs:
            if out in pins:
                sym = graph.symbols[out]
                # its own name: a copy of the layer's made that name name two symbols
                name = f"{sym.name}/shard" if sym.name else ""
                new = TensorSymbol(len(symbols), sym.shape, sym.dtype, name)
                symbols.append(new)
                cmd = sharding_constraint(spec=pins[out])
                nodes.append(Node(cmd, (out,), (new.id,), f"{node.name or node.cmd.name}/shard"))
                rename[out] = new.id
    return dataclasses.replace(graph, symbols=tuple(symbols), nodes=tuple(nodes))


def _axis(spec: PartitionSpec | None, dim: int, data: str) -> object:
    """The model axes ``spec`` splits ``dim`` over; the data axis is FSDP's storage
    split, gathered before use, so it never says how an activation is laid out."""
    entry = spec[dim] if spec is not None and dim < len(spec) else None
    axes = tuple(a for a in ((entry,) if isinstance(entry, str) else entry or ()) if a != data)
    return None if not axes else axes[0] if len(axes) == 1 else axes


def _pin(
    walk: Walk, node: Node, specs: Mapping[int, PartitionSpec], sizes: Mapping[str, int], data: str
) -> tuple | None:
    """The constraint of ``node``'s first output, or ``None``: a dense's by its weight's
    split, other commands by their rule in :data:`PINS`."""
    rank = len(walk.graph.symbols[node.outputs[0]].shape)
    dense = walk.dense(node)
    if dense is not None and rank >= 2:
        spec = specs.get(dense.weight)
        out_axis, in_axis = _axis(spec, dense.out_dim, data), _axis(spec, dense.in_dim, data)
        if out_axis is not None:
            return (data, *([None] * (rank - 2)), out_axis)
        if in_axis is not None:
            return (data, *([None] * (rank - 1)))
        return None
    rule = PINS.get(node.cmd.name)
    return None if rule is None else rule(walk, node, rank, specs, sizes, data)


def _pin_attention(
    walk: Walk, node: Node, rank: int, specs: Mapping[int, PartitionSpec],
    sizes: Mapping[str, int], data: str,
) -> tuple | None:  # fmt: skip
    """Attention's output ``[B, T, H, D]`` split by heads as its query projection is."""
    if rank != 4:
        return None
    q = walk.dense_before(node.inputs[0])
    axis = None if q is None else _axis(specs.get(q.weight), q.out_dim, data)
    heads = walk.graph.symbols[node.outputs[0]].shape[2]
    if isinstance(axis, str) and heads % sizes.get(axis, 1) == 0:
        return (data, None, axis, None)
    return None


CONSTRAINT = "sharding_constraint"

PINS = {"scaled_dot_product_attention": _pin_attention}
"""Command name -> ``rule(walk, node, rank, specs, sizes, data)``: the layout to pin
its output to (besides denses, which follow their weight)."""
