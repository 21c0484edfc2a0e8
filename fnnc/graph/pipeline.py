"""pipeline: a stack of identical blocks split into stages over a mesh axis (GPipe).

:func:`pipeline` is :func:`~fnnc.graph.scan` with the blocks cut into ``stages``
contiguous groups and the batch into ``microbatches``, run as the GPipe schedule of
the ``pipeline`` command (:mod:`fnnc.ops.pipeline`): a buffer with one slot per stage,
``microbatches + stages - 1`` iterations in which every stage runs its group of blocks
on its slot, then the buffer shifts one stage on. Compiled on a mesh with the axis
``axis`` (``compile(graph, shardings=...)``), each device of that axis holds
``1 / stages`` of the stacked parameters, runs only its stages' blocks and passes
activations to the next device by a collective permute; without such a mesh the same
graph runs on one device and gives the same values.

The bubble: stage ``s`` idles in the first ``s`` and the last ``stages - 1 - s``
iterations, so a device is busy ``microbatches`` of ``microbatches + stages - 1``
iterations: the idle share is ``(stages - 1) / (microbatches + stages - 1)`` (3/7 for
4 stages and 4 microbatches, 3/35 with 32 microbatches). More microbatches shrink it,
at the cost of smaller matrix products per block call.

What microbatching preserves: blocks that treat every example (row of the carry's
leading axis) on its own, the common case of MLP and transformer blocks, give exactly
``scan``'s values. Blocks that couple examples across the batch (batch norm's batch
statistics, a loss reduced inside a block) see one microbatch at a time and differ,
as in every GPipe implementation. The body is built for one microbatch: its carry
inputs have ``batch / microbatches`` rows.

The gradient is made as ``scan``'s is: fnnc's ``backward`` pass (and ``remat`` with
``checkpoint``) derives a per-block forward, which also returns what the block's
backward reads, and that backward (:func:`~fnnc.graph.scan.scan_bodies`); the node
records the saved tensors of every block call (its tape) and its backward runs the
schedule transposed. So a pipeline and a scan of the same blocks keep the same tensors
per block and compute the same gradients, NNC's conventions included. (``jax.vjp`` of
the schedule inside the node's backward, as the ``call`` command differentiates, would
run the whole forward schedule a second time: a backward sees only the node's inputs
and outputs, and ``jax.vjp``'s residuals are no fixed list a shape rule could name.)
"""

from __future__ import annotations

from collections.abc import Sequence

from fnnc import ops
from fnnc.core.command import Spec
from fnnc.core.ir import Graph, Symbol
from fnnc.errors import GraphError, ShapeError
from fnnc.graph.builder import GraphBuilder
from fnnc.graph.scan import Checkpoint, scan_bodies
from fnnc.ops.pipeline import body_specs


def pipeline(
    builder: GraphBuilder,
    body: Graph,
    carry: Sequence[Symbol],
    stacked: Sequence[Symbol],
    consts: Sequence[Symbol] = (),
    *,
    stages: int,
    microbatches: int,
    axis: str = "stage",
    checkpoint: Checkpoint = False,
    name: str | None = None,
    keys: Sequence[int] = (),
    n_ys: int = 0,
) -> tuple[Symbol, ...]:
    """Adds a ``pipeline`` node: the blocks of ``stacked`` in ``stages`` stages.

    Block ``j`` (``j < n``) runs ``body(*h, *(s[j] for s in stacked), *consts)`` as in
    :func:`~fnnc.graph.scan`; blocks ``k n/stages ... (k+1) n/stages - 1`` form stage
    ``k``, placed on the ``k``-th device group of mesh axis ``axis``.

    With ``n_ys``, the body's last ``n_ys`` outputs are per-call results (each block's
    new batch-norm running statistics, say): no gradient flows through them, and the
    node returns each of every block on every microbatch, ``[n, microbatches, *shape]``.

    Args:
        builder: the outer graph's builder.
        body: one block, built for one microbatch: inputs ``(*carry, *slices,
            *consts)``, outputs the next carry, each with its carry input's spec, then
            the ``n_ys`` per-call results.
        carry: outer symbols, the initial carried values; their leading axis is the
            batch, split into ``microbatches``.
        stacked: outer symbols ``[n, *slice]``, the blocks' parameters (``n``
            divisible by ``stages``).
        consts: outer symbols fed unchanged to every block.
        stages: how many groups the blocks are cut into.
        microbatches: how many parts the batch is cut into.
        axis: the mesh axis the stages are spread over when compiled on a mesh.
        checkpoint: what each block call keeps for the backward, as for ``scan``
            (:data:`~fnnc.graph.scan.Checkpoint`): ``True`` keeps its input alone and
            recomputes the block in the backward.
        name: the node's name.
        keys: positions in ``stacked`` of per-block random keys (``uint32[n, 2]``,
            :func:`fnnc.ops.random_split` rows): each block call reads its block's key
            with the microbatch folded in, so every microbatch draws its own mask.
        n_ys: how many of the body's outputs, after the carries, are per-call results.

    Returns:
        The final carried values, one per ``carry``, then the ``n_ys`` results
        ``[n, microbatches, *shape]``.

    Raises:
        GraphError: the body's inputs do not match the call.
        ShapeError: ``n`` does not divide by ``stages``, the batch by ``microbatches``,
            or the body is not built for one microbatch.

    >>> import numpy as np
    >>> from fnnc import ops
    >>> from fnnc.graph import GraphBuilder, compile, pipeline
    >>> body = GraphBuilder()  # one block, for one microbatch of 2 rows
    >>> h, w = body.input((2, 8), name="h"), body.input((8, 8), name="w")
    >>> block = body.build([body.exec(ops.tanh(), body.exec(ops.gemm(), h, w))])
    >>> b = GraphBuilder()
    >>> x, ws = b.input((8, 8), name="x"), b.input((4, 8, 8), name="ws")
    >>> (y,) = pipeline(b, block, [x], [ws], stages=2, microbatches=4, name="blocks")
    >>> rng = np.random.default_rng(0)
    >>> xv, wv = rng.normal(size=(8, 8)), rng.normal(scale=0.3, size=(4, 8, 8))
    >>> out = compile(b.build([y]))(xv.astype(np.float32), wv.astype(np.float32))
    >>> want = xv
    >>> for k in range(4):
    ...     want = np.tanh(want @ wv[k])
    >>> bool(np.allclose(out, want, atol=1e-5))
    True

    On a mesh, give the stacked parameters the stage axis (here a 1-device mesh; with
    ``("stage": 2)`` each device would hold ``ws[:2]`` or ``ws[2:]``):

    >>> import jax
    >>> from jax.sharding import PartitionSpec as P
    >>> from fnnc.graph import Shardings
    >>> plan = Shardings(jax.make_mesh((1,), ("stage",)), (P(), P("stage")))
    >>> sharded = compile(b.build([y]), shardings=plan)
    >>> bool(np.allclose(sharded(xv.astype(np.float32), wv.astype(np.float32)), want, atol=1e-5))
    True
    """
    where = f"pipeline {name!r}" if name else "pipeline"
    n_carry, n_stacked = len(carry), len(stacked)
    given = n_carry + n_stacked + len(consts)
    if len(body.inputs) != given:
        raise GraphError(
            f"{where}: the body takes {len(body.inputs)} inputs, the call gives {given} "
            f"({n_carry} carry + {n_stacked} stacked + {len(consts)} consts); the body's "
            "inputs are (*carry, *slices, *consts), in that order"
        )
    if not carry or not stacked:
        raise GraphError(
            f"{where}: carry at least one tensor (the activation) and stack at least one "
            "(the blocks' parameters, which the stages split)"
        )
    for what, v in (("stages", stages), ("microbatches", microbatches)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise GraphError(f"{where}: {what} must be an int >= 1, got {v!r}")
    specs = [Spec(tuple(s.shape), s.dtype) for s in (*carry, *stacked, *consts)]
    try:
        body_specs(specs, stages, microbatches, n_carry, n_stacked)
    except ShapeError as e:
        raise ShapeError(f"{where}: {str(e).removeprefix('pipeline: ')}") from None
    for k, c in enumerate(carry):
        want = body.spec(body.inputs[k])
        if c.shape and want.shape and tuple(want.shape[1:]) == tuple(c.shape[1:]):
            rows = c.shape[0] // microbatches
            if want.shape[0] != rows:
                raise ShapeError(
                    f"{where}: the body's carry input {body.label(body.inputs[k])} has "
                    f"{want.shape[0]} rows; build the body for one microbatch: "
                    f"{c.shape[0]} rows / microbatches={microbatches} = {rows} rows"
                )
    try:
        forward, grad, wants = scan_bodies(body, n_carry, n_stacked, checkpoint, n_ys)
    except GraphError as e:
        raise GraphError(f"{where}: {str(e).removeprefix('scan: ')}") from None
    cmd = ops.pipeline(
        forward=forward,
        backward=grad,
        stages=stages,
        microbatches=microbatches,
        n_carry=n_carry,
        n_stacked=n_stacked,
        wants=wants,
        axis=axis,
        checkpoint=checkpoint,
        keys=tuple(int(k) for k in keys),
        n_ys=n_ys,
    )
    outs = builder.exec(cmd, *carry, *stacked, *consts, name=name or "")
    outs = outs if isinstance(outs, tuple) else (outs,)
    return tuple(outs[: n_carry + n_ys])
