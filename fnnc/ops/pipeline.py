"""``pipeline``: a stack of blocks split into stages, run on microbatches (GPipe).

The ``n`` blocks of a ``scan`` (one body over parameters stacked ``[n, ...]``) are cut
into ``stages`` contiguous groups of ``n / stages`` blocks, and the batch into
``microbatches``. The schedule is Praxis's ``LayerwiseShardablePipelined`` and MaxText's
pipeline, written with array operations so that XLA's SPMD partitioner does the rest:

* a state buffer ``[stages, microbatch rows, ...]`` per carried tensor: slot ``s``
  holds the activation stage ``s`` works on;
* ``microbatches + stages - 1`` iterations (one ``lax.scan``); in iteration ``i``
  microbatch ``i`` enters slot 0, every stage applies its group of blocks to its slot
  at once (``vmap`` over stages of a ``lax.scan`` over the group), the last slot is
  microbatch ``i - stages + 1`` leaving the pipeline, and the buffer shifts one stage
  on (``jnp.roll`` along the stage axis);
* the stage axis of the buffer and of the parameters (reshaped ``[stages, n/stages,
  ...]``) is constrained to the mesh axis ``axis`` when the program is compiled on a
  mesh that has it (:func:`fnnc.core.dispatch.current_mesh`): each device then holds
  its stages' parameters and runs only their blocks, and the roll becomes a
  collective permute between neighbouring devices. Without such a mesh the same code
  runs on one device.

Microbatch ``m`` is the rows ``m, m + microbatches, m + 2 microbatches, ...`` of the
batch (strided, not contiguous), so a batch split over a data axis stays split the same
way inside every microbatch. The body is built for one microbatch: its carry inputs
have ``batch / microbatches`` rows.

Node inputs are ``(*carry, *stacked, *consts)`` and outputs the final carries, as for
``scan``; the body's inputs are ``(*carry, *slices, *consts)``.

The backward (``backward_uses``: the inputs) differentiates the schedule with
``jax.vjp``, each body node by its own NNC backward rule
(:func:`~fnnc.ops._subgraph.run_graph_nnc`), as the ``call`` command does: the
transposed schedule runs the stages in reverse with the roll reversed, which is the
GPipe backward. It recomputes the forward schedule first (the node keeps no tape: what
``jax.vjp`` keeps per iteration is not a fixed list of tensors a shape rule could
name); with ``checkpoint`` it keeps only each block's carried input and recomputes the
blocks while going back.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from fnnc.core.command import Command, Spec, Uses, defcommand, is_float
from fnnc.core.dispatch import current_mesh
from fnnc.errors import CommandError, ShapeError
from fnnc.ops._rules import show
from fnnc.ops._subgraph import check_inputs, require_graph, require_spec, run_graph, run_graph_nnc


def _check_params(body, stages, microbatches, n_carry, n_stacked, axis, checkpoint) -> None:
    require_graph("pipeline", "body", body)
    for what, v in (("stages", stages), ("microbatches", microbatches), ("n_carry", n_carry)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise CommandError(f"pipeline: {what} must be an int >= 1, got {v!r}")
    if not isinstance(n_stacked, int) or not 1 <= n_stacked <= len(body.inputs) - n_carry:
        raise CommandError(
            f"pipeline: n_stacked={n_stacked!r}; the body takes {len(body.inputs)} inputs "
            f"with {n_carry} carried, and at least one stacked input (the blocks' "
            "parameters, split into stages) is needed"
        )
    if len(body.outputs) != n_carry:
        raise CommandError(
            f"pipeline: the body returns {len(body.outputs)} tensors for {n_carry} carried "
            "ones; it must return exactly the next value of each carry, in order"
        )
    if not isinstance(axis, str) or not isinstance(checkpoint, bool):
        raise CommandError(
            f"pipeline: axis must be a mesh axis name and checkpoint a bool, got "
            f"axis={axis!r}, checkpoint={checkpoint!r}"
        )


def body_specs(specs: Sequence[Spec], stages: int, microbatches: int, n_carry: int, n_stacked: int):
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
    lengths = [
        specs[k].shape[0] if specs[k].shape else 0 for k in range(n_carry, n_carry + n_stacked)
    ]
    n = lengths[0]
    if any(m != n for m in lengths) or n % stages or n == 0:
        raise ShapeError(
            f"pipeline: the stacked inputs hold {lengths} blocks; they must all hold the same "
            f"number n of blocks, with n divisible by stages={stages} (each stage runs n / "
            "stages of them): pick stages dividing n"
        )
    for k in range(n_carry, n_carry + n_stacked):
        out[k] = Spec(tuple(specs[k].shape[1:]), specs[k].dtype)
    return out


def _pipeline_shape(*specs: Spec, body, stages, microbatches, n_carry, n_stacked, axis, checkpoint):
    _check_params(body, stages, microbatches, n_carry, n_stacked, axis, checkpoint)
    if len(specs) != len(body.inputs):
        raise CommandError(
            f"pipeline: the node has {len(specs)} inputs, the body takes {len(body.inputs)}"
        )
    check_inputs(
        "pipeline", "body", body, body_specs(specs, stages, microbatches, n_carry, n_stacked)
    )
    for k in range(n_carry):
        require_spec(
            f"pipeline: body output {body.label(body.outputs[k])} (next carry {k})",
            body.spec(body.outputs[k]),
            body.spec(body.inputs[k]),
            f"the carry input {body.label(body.inputs[k])}",
        )
    return tuple(specs[:n_carry])


def _display(cmd: Command) -> str:
    try:
        return (
            f"pipeline[stages={cmd.param('stages')}; microbatches={cmd.param('microbatches')}; "
            f"axis={cmd.param('axis')}; {len(cmd.param('body').nodes)} nodes]"
        )
    except (AttributeError, TypeError):
        return "pipeline[?]"


def stage_constraint(axis: str, stages: int) -> Callable[[Any], Any]:
    """Places an array's leading (stage) axis on the mesh axis ``axis``, other axes free.

    The identity when no mesh is being compiled for or it lacks ``axis``. The mesh's axes
    are taken as ``Auto`` here: a constraint is a hint to the partitioner, not a type.
    """
    mesh = current_mesh()
    if mesh is None or axis not in mesh.axis_names or mesh.shape[axis] == 1:
        return lambda x: x
    if stages % mesh.shape[axis]:
        raise ShapeError(
            f"pipeline: stages={stages} do not spread evenly over mesh axis {axis!r} of "
            f"{mesh.shape[axis]} devices; use a multiple of {mesh.shape[axis]} stages"
        )
    auto = Mesh(mesh.devices, mesh.axis_names, axis_types=(AxisType.Auto,) * mesh.devices.ndim)

    def constrain(x: Any) -> Any:
        spec = PartitionSpec(axis, *([PartitionSpec.UNCONSTRAINED] * (x.ndim - 1)))
        return lax.with_sharding_constraint(x, NamedSharding(auto, spec))

    return constrain


def schedule(run: Callable, inputs: Sequence[Any], **p: Any) -> tuple[Any, ...]:
    """The GPipe schedule of the module doc; ``run(graph, args)`` evaluates the body."""
    body, n_carry, n_stacked = p["body"], p["n_carry"], p["n_stacked"]
    stages, micro_n = p["stages"], p["microbatches"]
    cut = n_carry + n_stacked
    carry, consts = inputs[:n_carry], tuple(inputs[cut:])
    shard = stage_constraint(p["axis"], stages)
    params = tuple(
        shard(s.reshape(stages, s.shape[0] // stages, *s.shape[1:])) for s in inputs[n_carry:cut]
    )
    # Strided microbatches: [B] -> [B / M, M] -> [M, B / M] keeps a data split local.
    micro = tuple(
        jnp.moveaxis(c.reshape(c.shape[0] // micro_n, micro_n, *c.shape[1:]), 1, 0) for c in carry
    )
    dtypes = [c.dtype for c in carry]

    def block(h: tuple, xs: tuple) -> tuple[tuple, None]:
        outs = run(body, [*h, *xs, *consts])
        return tuple(lax.convert_element_type(o, d) for o, d in zip(outs, dtypes)), None

    if p["checkpoint"]:
        block = jax.checkpoint(block)

    def stage(h: tuple, group: tuple) -> tuple:
        return lax.scan(block, h, group)[0]

    every_stage = jax.vmap(stage)
    first = lax.broadcasted_iota(jnp.int32, (stages,), 0) == 0
    # The bubble slots start as copies of microbatch 0, so blocks only ever see real rows.
    state0 = tuple(shard(jnp.broadcast_to(m[0], (stages, *m.shape[1:]))) for m in micro)
    out0 = tuple(jnp.zeros_like(m) for m in micro)

    def step(loop: tuple, i: Any) -> tuple[tuple, None]:
        state, out = loop
        entering = (
            lax.dynamic_index_in_dim(m, jnp.minimum(i, micro_n - 1), 0, False) for m in micro
        )
        state = tuple(
            jnp.where(first.reshape(-1, *[1] * (s.ndim - 1)), x[None], s)
            for s, x in zip(state, entering)
        )
        new = tuple(shard(n) for n in every_stage(state, params))
        # Before iteration stages - 1 the last slot holds bubble rows: they land in slot 0
        # and are overwritten by microbatch 0 when it arrives.
        slot = jnp.maximum(i - (stages - 1), 0)
        out = tuple(lax.dynamic_update_index_in_dim(o, n[-1], slot, 0) for o, n in zip(out, new))
        return (tuple(shard(jnp.roll(n, 1, axis=0)) for n in new), out), None

    (_, out), _ = lax.scan(step, (state0, out0), jnp.arange(micro_n + stages - 1))
    return tuple(jnp.moveaxis(o, 0, 1).reshape(c.shape) for o, c in zip(out, carry))


@defcommand(family="control", shape=_pipeline_shape, display=_display, uses=Uses(outputs=()))
def pipeline(*inputs, body, stages, microbatches, n_carry, n_stacked, axis, checkpoint):
    """``body`` over stacked blocks as a GPipe schedule of stages (see the module doc).

    Build it with :func:`fnnc.graph.pipeline`. Returns the final carries.
    """
    outs = schedule(
        run_graph,
        inputs,
        body=body,
        stages=stages,
        microbatches=microbatches,
        n_carry=n_carry,
        n_stacked=n_stacked,
        axis=axis,
        checkpoint=checkpoint,
    )
    return outs[0] if len(outs) == 1 else outs


@pipeline.backward
def _pipeline_backward(grads, inputs, outputs, **params):
    wants = tuple(i for i, x in enumerate(inputs) if is_float(x))

    def f(*xs: Any) -> tuple[Any, ...]:
        args = list(inputs)
        for i, x in zip(wants, xs):
            args[i] = x
        return schedule(run_graph_nnc, args, **params)

    outs, pullback = jax.vjp(f, *[inputs[i] for i in wants])
    cts = tuple(
        jnp.zeros(o.shape, o.dtype) if g is None else g.astype(o.dtype) for g, o in zip(grads, outs)
    )
    got = dict(zip(wants, pullback(cts)))
    return tuple(got.get(i) for i in range(len(inputs)))
