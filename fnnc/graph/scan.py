"""scan: a run of identical blocks as one loop, optionally checkpointed per iteration.

Why a command and not a pass over unrolled blocks: XLA keeps what a loop *carries*
and nothing else of an iteration, so a loop is the structure on which XLA's own memory
figure (:meth:`fnnc.graph.Program.memory`) shows what checkpointing saves. In an
unrolled graph XLA:CPU's scheduler is free to hoist the recomputation back next to the
forward or keep activations anyway, and hides the saving. Writing the blocks as one
body over stacked parameters (``[n, out, in]``, as layer stacks are stored in JAX
codebases) states the structure directly instead of rediscovering it from a graph.

:func:`scan` takes a block *body* graph (inputs ``(*carry, *slices, *consts)``, outputs
the next carry) and adds one ``scan`` node (:mod:`fnnc.ops.scan`). It derives the two
sub-graphs that node holds with fnnc's own passes, so the loop's gradient is made of
the same gradient commands the unrolled backward would use:

1. ``backward(body, carry', wrt=inputs, df=seeds)``: the body and its gradient nodes;
2. with ``checkpoint``, :func:`~fnnc.graph.remat` on that graph (``True`` = recompute
   everything from the carry, as ``jax.checkpoint`` on the body; or any remat policy);
3. a split at the first gradient node: the forward part returns the next carry and the
   tensors the gradient part reads (the *saved* set: with checkpointing, the carry
   alone), the gradient part reads them, the slices, the constants and the seeds.

Per iteration the node records the saved set in a stacked output, the tape (``[n,
*shape]``): without checkpointing every activation the block's backward reads, with it
the carry only. That is the whole memory difference, and XLA sees it.

>>> import numpy as np
>>> from fnnc import ops
>>> from fnnc.graph import GraphBuilder, backward, compile, scan
>>> body = GraphBuilder()
>>> h, w = body.input((4, 8), name="h"), body.input((8, 8), name="w")
>>> y = body.exec(ops.ewsum(), h, body.exec(ops.tanh(), body.exec(ops.gemm(), h, w)))
>>> block = body.build([y])
>>> b = GraphBuilder()
>>> x, ws = b.input((4, 8), name="x"), b.input((16, 8, 8), name="ws")
>>> (out,) = scan(b, block, [x], [ws], checkpoint=True, name="blocks")
>>> loss = b.exec(ops.reduce_sum(axes=(0, 1)), out)
>>> g, (dws,) = backward(b.build([loss]), loss, [ws])
>>> rng = np.random.default_rng(0)
>>> args = rng.normal(size=(4, 8)), rng.normal(scale=0.1, size=(16, 8, 8))
>>> loss_value, grad = compile(g)(*(a.astype(np.float32) for a in args))
>>> grad.shape
(16, 8, 8)
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import jax.numpy as jnp
import numpy as np

from fnnc import ops
from fnnc.core.ir import Graph, Symbol, require_graph
from fnnc.errors import GraphError, located
from fnnc.graph.builder import GraphBuilder
from fnnc.graph.passes.backward import backward
from fnnc.graph.passes.compact import compact
from fnnc.graph.passes.remat import Policy, backward_start, remat

Checkpoint = bool | str | Policy
"""``False``: save what the backward reads; ``True``: recompute all from the carry; a
:func:`~fnnc.graph.remat` policy name or function: save what it keeps."""


def scan(
    builder: GraphBuilder,
    body: Graph,
    carry: Sequence[Symbol],
    stacked: Sequence[Symbol] = (),
    consts: Sequence[Symbol] = (),
    *,
    length: int | None = None,
    checkpoint: Checkpoint = False,
    name: str = "",
    n_ys: int = 0,
) -> tuple[Symbol, ...]:
    """Adds a ``scan`` node running ``body`` once per slice of ``stacked``.

    Iteration ``i`` runs ``body(*carry_i, *(s[i] for s in stacked), *consts)`` and its
    outputs are ``carry_{i+1}``: for blocks ``h <- block_i(h)`` with parameters ``W_i``,
    pass the blocks' parameters stacked (``[n, *shape]``) and one block as ``body``.
    With ``n_ys``, the body's last ``n_ys`` outputs are per-iteration results (each
    block's new batch-norm statistics, say), returned stacked ``[length, *shape]``; no
    gradient flows through them.

    Args:
        builder: the outer graph's builder.
        body: the block: inputs ``(*carry, *slices, *consts)``; outputs the next carry,
            each with its carry input's spec, then the ``n_ys`` per-iteration results.
            Carried tensors must be floating-point.
        carry: outer symbols, the initial carried values.
        stacked: outer symbols ``[length, *slice]``, one per body slice input.
        consts: outer symbols fed unchanged to every iteration.
        length: the trip count; default the leading axis of ``stacked``.
        checkpoint: what an iteration keeps for the backward (see :data:`Checkpoint`).
        name: the node's name.
        n_ys: how many of the body's outputs, after the carries, are per-iteration
            results.

    Returns:
        The final carried values, one per ``carry``, then the stacked ``ys``.

    Raises:
        GraphError: the body's inputs or outputs do not match ``carry``/``stacked``/
            ``consts``, or no length is known.
    """
    require_graph(body, "scan: body")  # None was an AttributeError on body.inputs
    n_carry, n_stacked = len(carry), len(stacked)
    if length is None:
        if not stacked:
            raise GraphError("scan: give length= when nothing is stacked")
        length = int(stacked[0].shape[0]) if stacked[0].shape else 0
    given = n_carry + n_stacked + len(consts)
    if len(body.inputs) != given:
        raise GraphError(
            f"scan: the body takes {len(body.inputs)} inputs, the call gives {given} "
            f"({n_carry} carry + {n_stacked} stacked + {len(consts)} consts); the body's "
            "inputs are (*carry, *slices, *consts), in that order"
        )
    if isinstance(checkpoint, np.bool_):  # NumPy's True/False are the bools, not policies
        checkpoint = bool(checkpoint)
    try:
        forward, grad, wants = scan_bodies(body, n_carry, n_stacked, checkpoint, n_ys)
    except GraphError as error:  # name the node, as the errors of its own checks do
        if not name:
            raise
        raise located(error, f"node {name!r}") from error
    cmd = ops.scan(
        forward=forward,
        backward=grad,
        length=int(length),
        n_carry=n_carry,
        n_stacked=n_stacked,
        wants=wants,
        checkpoint=checkpoint,
        n_ys=n_ys,
    )
    outs = builder.exec(cmd, *carry, *stacked, *consts, name=name)
    outs = outs if isinstance(outs, tuple) else (outs,)
    return tuple(outs[: n_carry + n_ys])


@functools.lru_cache(maxsize=256)
def scan_bodies(
    body: Graph, n_carry: int, n_stacked: int, checkpoint: Checkpoint = False, n_ys: int = 0
) -> tuple[Graph, Graph, tuple[int, ...]]:
    """The ``forward`` and ``backward`` sub-graphs of a ``scan`` node, and ``wants``.

    See the module doc for the three steps; ``wants`` lists the body inputs that get a
    gradient (every carry, then the floating-point slices and constants). The body's
    ``n_ys`` outputs after the carries stay forward outputs and get no seed.
    """
    _check_body(body, n_carry, n_ys)
    b = GraphBuilder.from_graph(body)
    carried = body.outputs[:n_carry]
    seeds = [
        b.input(body.spec(s).shape, body.spec(s).dtype, name=f"d.{body.symbols[s].name}")
        for s in carried
    ]
    outs = [body.symbols[s] for s in carried]
    wants = tuple(
        i for i, s in enumerate(body.inputs) if jnp.issubdtype(body.symbols[s].dtype, jnp.inexact)
    )
    combined, grads = backward(
        b.build(outs), outs, [body.symbols[body.inputs[i]] for i in wants], df=seeds
    )
    combined = dataclasses.replace(combined, outputs=tuple(g.id for g in grads), out_tree=None)
    n_fwd = len(body.nodes)
    if checkpoint is not False:
        start = backward_start(combined)
        if start is not None and start != n_fwd:
            raise GraphError(
                "scan: checkpoint= needs a body without gradient nodes of its own (its "
                f"node {start} is one); build the loop with checkpoint=False"
            )
        combined = remat(combined, policy="nothing_saveable" if checkpoint is True else checkpoint)
    saved = _saved(combined, n_fwd, body.inputs[:n_carry])
    forward = dataclasses.replace(body, outputs=(*body.outputs, *saved), out_tree=None)
    grad = dataclasses.replace(
        combined,
        inputs=(*saved, *body.inputs[n_carry:], *(s.id for s in seeds)),
        nodes=combined.nodes[n_fwd:],
        out_tree=None,
    )
    return compact(forward), compact(grad), wants


def _saved(graph: Graph, n_fwd: int, carries: Sequence[int]) -> tuple[int, ...]:
    """Roots made by the first ``n_fwd`` nodes, or carried in, that the rest reads."""
    symbols = graph.symbols
    made = {symbols[o].root for node in graph.nodes[:n_fwd] for o in node.outputs}
    made.update(carries)
    read = [s for node in graph.nodes[n_fwd:] for s in node.inputs] + list(graph.outputs)
    return tuple(dict.fromkeys(symbols[s].root for s in read if symbols[s].root in made))


def _check_body(body: Graph, n_carry: int, n_ys: int = 0) -> None:
    if n_carry < 1:
        raise GraphError("scan: carry at least one tensor (the blocks' activation)")
    if not isinstance(n_ys, int) or n_ys < 0:
        raise GraphError(f"scan: n_ys must be an int >= 0, got {n_ys!r}")
    if len(body.outputs) != n_carry + n_ys:
        raise GraphError(
            f"scan: the body returns {len(body.outputs)} tensors for {n_carry} carried "
            f"ones and {n_ys} per-iteration results (n_ys); it must return the next value "
            "of each carry, in order, then the per-iteration results"
        )
    for k in range(n_carry):
        sym = body.symbols[body.inputs[k]]
        if not jnp.issubdtype(sym.dtype, jnp.inexact):
            raise GraphError(
                f"scan: carry {k} ({body.label(sym.id)}) is {sym.dtype}; carried tensors "
                "must be floating-point (pass integer tensors as consts or stacked)"
            )
