"""``pipeline``: a stack of blocks split into stages, run on microbatches (GPipe).

The ``n`` blocks of a ``scan`` (one body over parameters stacked ``[n, ...]``) are cut
into ``stages`` contiguous groups of ``n / stages`` blocks, and the batch into
``microbatches``. The schedule is Praxis's ``LayerwiseShardablePipelined`` and MaxText's
pipeline, written with array operations so that XLA's SPMD partitioner does the rest:

* a state buffer ``[stages, microbatch rows, ...]`` per carried tensor: slot ``s``
  holds the activation stage ``s`` works on;
* ``T = microbatches + stages - 1`` iterations (one ``lax.scan``); in iteration ``i``
  microbatch ``i`` enters slot 0, every stage applies its group of blocks to its slot
  at once (``vmap`` over stages of a ``lax.scan`` over the group), the last slot is
  microbatch ``i - stages + 1`` leaving the pipeline, and the buffer shifts one stage
  on (``jnp.roll`` along the stage axis);
* the stage axis of the buffer, of the parameters (reshaped ``[stages, n/stages,
  ...]``) and of the tape is constrained to the mesh axis ``axis`` when the program is
  compiled on a mesh that has it (JAX's context mesh, which :func:`fnnc.graph.compile`
  sets): each device then holds its stages' parameters and runs only their blocks, and
  the roll becomes a collective permute between neighbouring devices. Without such a
  mesh the same code runs on one device.

Microbatch ``m`` is the rows ``m, m + microbatches, m + 2 microbatches, ...`` of the
batch (strided, not contiguous), so a batch split over a data axis stays split the same
way inside every microbatch.

The node holds the two sub-graphs of a ``scan`` node (:func:`fnnc.graph.scan.scan_bodies`,
built by fnnc's ``backward`` pass, ``remat`` for checkpointing), for one microbatch:
``forward`` (inputs ``(*carry, *slices, *consts)``, outputs ``(*carry', *saved)``) and
``backward`` (inputs ``(*saved, *slices, *consts, *dcarry')``, outputs the gradients
of the inputs ``wants`` lists). With ``n_ys``, the forward body's outputs are ``(*carry',
*ys, *saved)`` as a ``scan``'s: ``ys`` are per-call results no gradient flows through
(each block's new batch-norm running statistics). Node inputs are ``(*carry, *stacked,
*consts)``; outputs the final carries, then each ``ys[k]`` of every block on every
microbatch, ``[n, microbatches, *shape]``, then the tape: ``saved[k]`` of every real block
call, ``[stages, microbatches, n/stages, *shape]`` (stage ``s``'s calls on microbatch
``mb``, written in iteration ``mb + s``). The bubble calls write nothing, so the tape
holds ``microbatches`` calls per block, not ``T``.

Random keys: the stacked inputs listed in ``keys`` are per-block key data (``uint32[n,
2]``, e.g. :func:`~fnnc.ops.random_split` rows). The call of block ``j`` on microbatch
``mb`` reads block ``j``'s key with ``mb`` folded in (:func:`~fnnc.ops.random.fold_keys`),
so each microbatch draws its own dropout mask, and the backward folds the same index in
again (a recomputed block draws the same mask).

The backward is the transposed schedule: iterations in reverse, the cotangent buffer
shifted back one stage (``jnp.roll`` by -1, the reverse permute), every stage running
``backward`` over its group in reverse from the tape. The cotangents of the bubble
calls are zero, so they add nothing to the parameters' gradients.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec

from fnnc.core.command import Command, Spec, Uses, defcommand
from fnnc.errors import CommandError, ShapeError
from fnnc.ops._rules import show
from fnnc.ops._subgraph import check_inputs, run_graph
from fnnc.ops.random import fold_keys
from fnnc.ops.scan import MAX_OUTPUTS, _check_scan, accumulator, reverse_blocks, wanted_inputs


def body_specs(
    specs: Sequence[Spec], stages: int, microbatches: int, n_carry: int, n_stacked: int
) -> list[Spec]:
    """The specs one body call sees: carries cut to a microbatch, stacked to a slice.

    Raises:
        ShapeError: stacked inputs of different lengths, a length that does not split
            into ``stages`` groups, or a batch that does not split into ``microbatches``.
    """
    out = list(specs)
    for k in range(n_carry):
        s = specs[k]
        if not s.shape or s.shape[0] % microbatches:
            rows = f"{s.shape[0]} rows" if s.shape else "no rows (a scalar)"
            raise ShapeError(
                f"pipeline: carry {k} is {show(s)}; its leading (batch) axis, {rows}, must "
                f"split into microbatches={microbatches} equal parts: pick microbatches "
                "dividing it"
            )
        out[k] = Spec((s.shape[0] // microbatches, *s.shape[1:]), s.dtype)
    cut = n_carry + n_stacked
    lengths = [specs[k].shape[0] if specs[k].shape else 0 for k in range(n_carry, cut)]
    n = lengths[0] if lengths else 0
    if any(m != n for m in lengths) or n % stages or n == 0:
        raise ShapeError(
            f"pipeline: the stacked inputs hold {lengths} blocks; they must all hold the same "
            f"number n >= 1 of blocks, with n divisible by stages={stages} (each stage runs "
            "n / stages of them): pick stages dividing n"
        )
    for k in range(n_carry, cut):
        out[k] = Spec(tuple(specs[k].shape[1:]), specs[k].dtype)
    return out


def _check_counts(stages: Any, microbatches: Any, axis: Any) -> None:
    for what, v in (("stages", stages), ("microbatches", microbatches)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise CommandError(f"pipeline: {what} must be an int >= 1, got {v!r}")
    if not isinstance(axis, str):
        raise CommandError(f"pipeline: axis must be a mesh axis name, got {axis!r}")


def _pipeline_shape(*specs: Spec, forward, backward, stages, microbatches, n_carry, n_stacked,
                    wants, axis, checkpoint=False, keys=(), n_ys=0):  # fmt: skip
    _check_counts(stages, microbatches, axis)
    if n_stacked < 1 or len(specs) != len(forward.inputs):
        raise CommandError(
            f"pipeline: the node has {len(specs)} inputs ({n_stacked} stacked), the body "
            f"takes {len(forward.inputs)}; pass one per body input and stack at least one "
            "(the blocks' parameters, which the stages split)"
        )
    sliced = body_specs(specs, stages, microbatches, n_carry, n_stacked)
    _check_keys(keys, specs[n_carry : n_carry + n_stacked])
    n = specs[n_carry].shape[0]
    _check_scan(forward, backward, n, n_carry, n_stacked, wants, n_ys)
    check_inputs("pipeline", "forward body", forward, sliced)
    calls = (stages, microbatches, n // stages)
    ys = [forward.spec(s) for s in forward.outputs[n_carry : n_carry + n_ys]]
    tape = [forward.spec(s) for s in forward.outputs[n_carry + n_ys :]]
    return (
        *specs[:n_carry],
        *(Spec((n, microbatches, *y.shape), np.dtype(y.dtype)) for y in ys),
        *(Spec((*calls, *t.shape), np.dtype(t.dtype)) for t in tape),
    )


def _check_keys(keys: Any, stacked: Sequence[Spec]) -> None:
    if not isinstance(keys, tuple) or any(
        not isinstance(k, int) or not 0 <= k < len(stacked) for k in keys
    ):
        raise CommandError(
            f"pipeline: keys={keys!r} must be a tuple of positions among the "
            f"{len(stacked)} stacked inputs"
        )
    for k in keys:
        spec = stacked[k]
        if np.dtype(spec.dtype) != np.uint32 or tuple(spec.shape[1:]) != (2,):
            raise CommandError(
                f"pipeline: stacked input {k} is listed in keys but is {show(spec)}; a "
                "per-block key stack is uint32[n, 2] (fnnc.ops.random_split)"
            )


def _fold_microbatches(params: tuple, keys: Sequence[int], held: Any) -> tuple:
    """``params`` (stage-major) with each key stack's stage ``s`` keyed for microbatch
    ``held[s]``, the one that stage works on (:func:`_held`)."""
    if not keys:
        return params
    return tuple(jax.vmap(fold_keys)(p, held) if k in keys else p for k, p in enumerate(params))


def _display(cmd: Command) -> str:
    try:
        fwd, n, ys = cmd.param("forward"), cmd.param("n_carry"), cmd.kwargs.get("n_ys", 0)
        return (
            f"pipeline[stages={cmd.param('stages')}; microbatches={cmd.param('microbatches')}; "
            f"axis={cmd.param('axis')}; {len(fwd.nodes)} nodes; "
            + (f"ys {ys}; " if ys else "")
            + f"saves {len(fwd.outputs) - n - ys}]"
        )
    except (AttributeError, TypeError):
        return "pipeline[?]"


def stage_constraint(axis: str, stages: int) -> Callable[..., Any]:
    """``constrain(x, dim=0)``: places axis ``dim`` of ``x`` (its stage axis) on the mesh
    axis ``axis``, the other axes free.

    The identity when no mesh is being compiled for (JAX's context mesh, which
    :func:`fnnc.graph.compile` sets with ``Auto`` axes) or it lacks ``axis``.

    Raises:
        ShapeError: ``stages`` does not spread evenly over the mesh axis.
    """
    mesh = jax.sharding.get_abstract_mesh()  # compile traces under its Auto-typed mesh
    if mesh.empty or axis not in mesh.axis_names or mesh.shape[axis] == 1:
        return lambda x, dim=0: x
    if stages % mesh.shape[axis]:
        raise ShapeError(
            f"pipeline: stages={stages} do not spread evenly over mesh axis {axis!r} of "
            f"{mesh.shape[axis]} devices; use a multiple of {mesh.shape[axis]} stages"
        )

    def constrain(x: Any, dim: int = 0) -> Any:
        spec = [PartitionSpec.UNCONSTRAINED] * x.ndim
        spec[dim] = axis
        return lax.with_sharding_constraint(x, PartitionSpec(*spec))

    return constrain


def _split(x: Any, m: int) -> Any:
    """``[B, ...] -> [m, B / m, ...]``, microbatch ``j`` the rows ``j, j + m, ...``."""
    return jnp.moveaxis(x.reshape(x.shape[0] // m, m, *x.shape[1:]), 1, 0)


def _merge(x: Any) -> Any:
    return jnp.moveaxis(x, 0, 1).reshape(x.shape[0] * x.shape[1], *x.shape[2:])


def _at(mask: Any, x: Any) -> Any:
    """``mask`` (one bool per stage) broadcast against a stage buffer ``x``."""
    return mask.reshape(-1, *[1] * (x.ndim - 1))


@defcommand(
    family="control",
    shape=_pipeline_shape,
    display=_display,
    uses=Uses(inputs=None, outputs=tuple(range(MAX_OUTPUTS))),
)
def pipeline(*inputs, forward, backward, stages, microbatches, n_carry, n_stacked, wants, axis,
             checkpoint=False, keys=(), n_ys=0):  # fmt: skip
    """``forward`` over stacked blocks as a GPipe schedule of stages (see the module doc).

    Build it with :func:`fnnc.graph.pipeline`. Returns the final carries, the ``n_ys``
    per-call results ``[n, microbatches, ...]``, then the tape.
    ``checkpoint`` is the one the bodies were derived with, as for ``scan``.
    """
    m, cut = microbatches, n_carry + n_stacked
    carry, consts = inputs[:n_carry], tuple(inputs[cut:])
    shard = stage_constraint(axis, stages)
    params = tuple(
        shard(s.reshape(stages, s.shape[0] // stages, *s.shape[1:])) for s in inputs[n_carry:cut]
    )
    micro = tuple(_split(c, m) for c in carry)
    dtypes = [c.dtype for c in carry]

    def block(h: tuple, xs: tuple) -> tuple[tuple, tuple]:
        outs = run_graph(forward, [*h, *xs, *consts])
        new = tuple(lax.convert_element_type(o, d) for o, d in zip(outs[:n_carry], dtypes))
        return new, tuple(outs[n_carry:])

    every_stage = jax.vmap(lambda h, group: lax.scan(block, h, group))
    first = lax.broadcasted_iota(jnp.int32, (stages,), 0) == 0
    # The bubble slots start as copies of microbatch 0, so blocks only ever see real rows.
    state0 = tuple(shard(jnp.broadcast_to(x[0], (stages, *x.shape[1:]))) for x in micro)

    def step(loop: tuple, i: Any) -> tuple[tuple, None]:
        state, out, tape = loop
        held, real = _held(i, stages, m)
        entering = [lax.dynamic_index_in_dim(x, jnp.minimum(i, m - 1), 0, False) for x in micro]
        state = tuple(jnp.where(_at(first, s), x[None], s) for s, x in zip(state, entering))
        new, saved = every_stage(state, _fold_microbatches(params, keys, held))
        new = tuple(shard(x) for x in new)
        # Before iteration stages - 1 the last slot holds bubble rows: they land in slot 0
        # and are overwritten by microbatch 0 when it arrives.
        slot = jnp.maximum(i - (stages - 1), 0)
        out = tuple(lax.dynamic_update_index_in_dim(o, x[-1], slot, 0) for o, x in zip(out, new))
        state = tuple(shard(jnp.roll(x, 1, axis=0)) for x in new)
        tape = tuple(shard(_record(t, x, held, real)) for t, x in zip(tape, saved))
        return (state, out, tape), None

    out0 = tuple(jnp.zeros_like(x) for x in micro)
    tape0 = _empty_tape(forward, n_carry, stages, m, params[0].shape[1], shard)
    (_, out, tape), _ = lax.scan(step, (state0, out0, tape0), jnp.arange(m + stages - 1))
    # ys leave as [n, m, ...]: [stages, m, n/stages] -> [stages, n/stages, m] -> [n, m]
    ys = tuple(
        jnp.swapaxes(y, 1, 2).reshape(y.shape[0] * y.shape[2], m, *y.shape[3:]) for y in tape[:n_ys]
    )
    outs = (*(_merge(o) for o in out), *ys, *tape[n_ys:])
    return outs[0] if len(outs) == 1 else outs


def _held(i: Any, stages: int, m: int) -> tuple[Any, Any]:
    """The microbatch each stage's slot holds in iteration ``i`` (clamped to a valid
    index) and whether it is a real one (not a bubble)."""
    held = i - jnp.arange(stages)
    return jnp.clip(held, 0, m - 1), (held >= 0) & (held < m)


def _record(tape: Any, saved: Any, held: Any, real: Any) -> Any:
    """``tape`` (``[stages, m, ...]``) with each stage's ``saved`` written at the
    microbatch it holds, where that is a real call (a bubble's leaves the tape as is)."""

    def one(t: Any, x: Any, j: Any, ok: Any) -> Any:
        old = lax.dynamic_index_in_dim(t, j, 0, False)
        return lax.dynamic_update_index_in_dim(t, jnp.where(ok, x, old), j, 0)

    return jax.vmap(one)(tape, saved, held, real)


def _empty_tape(forward: Any, n_carry: int, stages: int, m: int, group: int, shard: Any) -> tuple:
    """Zeros ``[stages, m, n/stages, *shape]`` for each tensor a block call saves."""
    specs = [forward.spec(s) for s in forward.outputs[n_carry:]]
    return tuple(shard(jnp.zeros((stages, m, group, *t.shape), t.dtype)) for t in specs)


@pipeline.backward
def _pipeline_backward(grads, inputs, outputs, *, forward, backward, stages, microbatches,
                       n_carry, n_stacked, wants, axis, checkpoint=False, keys=(),
                       n_ys=0):  # fmt: skip
    if any(g is not None for g in grads[n_carry : n_carry + n_ys]):
        raise CommandError(
            "pipeline: a per-call result (ys) has a gradient; ys carry no gradient "
            "(running statistics and the like): read them where no loss depends on them"
        )
    if any(g is not None for g in grads[n_carry + n_ys :]):
        raise CommandError(
            "pipeline: a tape output has a gradient; the tape is the backward's record of "
            "the schedule and must only be read by the pipeline's own gradient node"
        )
    m, cut = microbatches, n_carry + n_stacked
    consts = tuple(inputs[cut:])
    tape = tuple(outputs[n_carry + n_ys :])  # [stages, m, n/stages, ...]
    shard = stage_constraint(axis, stages)
    params = tuple(
        shard(s.reshape(stages, s.shape[0] // stages, *s.shape[1:])) for s in inputs[n_carry:cut]
    )
    at_stacked, at_const = wanted_inputs(wants, n_carry, n_stacked)
    d_out = tuple(
        _split(jnp.zeros(x.shape, x.dtype) if g is None else g.astype(x.dtype), m)
        for g, x in zip(grads[:n_carry], inputs)
    )
    every_stage = jax.vmap(functools.partial(_stage_backward, backward, consts, n_carry, wants))
    first = lax.broadcasted_iota(jnp.int32, (stages,), 0) == 0
    last = lax.broadcasted_iota(jnp.int32, (stages,), 0) == stages - 1

    def step(acc: tuple, i: Any) -> tuple[tuple, None]:
        d_state, d_params, d_consts, d_micro = acc
        # a bubble call reads a real call's record: its cotangent is zero, so is its part
        held, _ = _held(i, stages, m)
        saved = tuple(jax.vmap(lambda t, j: lax.dynamic_index_in_dim(t, j, 0, False))(t, held)
                      for t in tape)  # fmt: skip
        # transposes, last forward operation first: the roll, the output write (only the
        # write of iteration j + stages - 1 to slot j survived), the blocks, the injection
        d_new = [jnp.roll(d, -1, axis=0) for d in d_state]
        leaving = jnp.maximum(i - (stages - 1), 0)
        d_new = [
            shard(d + jnp.where(_at(last, d) & (i >= stages - 1), g[leaving][None], 0))
            for d, g in zip(d_new, d_out)
        ]
        keyed = _fold_microbatches(params, keys, held)
        d_in, d_k, d_xs = every_stage(tuple(d_new), saved, keyed)
        d_params = tuple(a + x.astype(a.dtype) for a, x in zip(d_params, d_xs))
        d_consts = tuple(a + x.sum(0).astype(a.dtype) for a, x in zip(d_consts, d_k))
        entered = jnp.minimum(i, m - 1)
        d_micro = tuple(
            lax.dynamic_update_index_in_dim(dm, dm[entered] + d[0], entered, 0)
            for dm, d in zip(d_micro, d_in)
        )
        d_state = tuple(shard(jnp.where(_at(first, d), 0, d)) for d in d_in)
        return (d_state, d_params, d_consts, d_micro), None

    init = (
        tuple(shard(jnp.zeros((stages, *d.shape[1:]), d.dtype)) for d in d_out),
        # summed over every microbatch: in float32 at least, rounded once at the end
        tuple(
            shard(jnp.zeros(params[w - n_carry].shape, accumulator(params[w - n_carry].dtype)))
            for w in at_stacked
        ),
        tuple(jnp.zeros(inputs[w].shape, accumulator(inputs[w].dtype)) for w in at_const),
        tuple(jnp.zeros_like(d) for d in d_out),
    )
    iters = jnp.arange(m + stages - 1)
    (d_state, d_params, d_consts, d_micro), _ = lax.scan(step, init, iters, reverse=True)
    # the initial buffer was microbatch 0 broadcast to every slot
    d_micro = tuple(dm.at[0].add(d.sum(0)) for dm, d in zip(d_micro, d_state))
    out: list[Any] = [None] * len(inputs)
    for k, d in enumerate(d_micro):
        out[k] = _merge(d)
    for w, d in zip(at_stacked, d_params):
        out[w] = d.reshape(inputs[w].shape).astype(inputs[w].dtype)
    for w, d in zip(at_const, d_consts):
        out[w] = d.astype(inputs[w].dtype)
    return tuple(out)


def _stage_backward(backward, consts, n_carry, wants, dh, saved, group):
    """One stage's blocks in reverse (:func:`~fnnc.ops.scan.reverse_blocks`)."""
    return reverse_blocks(backward, wants, n_carry, consts, dh, saved, group)
