"""``scan``: one sub-graph run over a stack of per-iteration tensors (``lax.scan``).

A run of structurally identical blocks (the 16 residual blocks of an MLP, the layers of
a transformer) is one block body applied ``length`` times to a carried activation, each
time with its own parameters. ``scan`` holds that body once and lowers to one
``lax.scan`` over the parameters stacked on a leading axis, so XLA compiles one loop
instead of ``length`` copies and, above all, keeps only what the loop carries between
iterations: what the backward needs from each iteration is an explicit, stacked output
(the *tape*), and nothing else survives an iteration.

Build it with :func:`fnnc.graph.scan`, which derives the two sub-graphs stored here
from a block body with fnnc's own ``backward`` pass (and ``remat`` for checkpointing):

* ``forward``: inputs ``(*carry, *slices, *consts)`` (carry: the carried tensors;
  slices: one slice of each stacked input; consts: loop-invariant inputs), outputs
  ``(*carry', *ys, *saved)``: the next carry, the ``n_ys`` per-iteration results
  (``ys``: values no gradient flows through, such as each block's new batch-norm
  running statistics), then the tensors its backward reads.
* ``backward``: inputs ``(*saved, *slices, *consts, *dcarry')``, outputs the gradients
  of the ``forward`` inputs listed in ``wants`` (every carry first, in order).

Node inputs are ``(*carry, *stacked, *consts)``; ``stacked[k]`` is ``[length, *slice
shape]``. Node outputs are ``(*final carry, *ys, *tape)``; ``ys[k]`` and ``tape[k]`` are
that forward output of every iteration, ``[length, *shape]``. Checkpointing the body
(``jax.checkpoint``'s trade) is a choice of what ``saved`` holds: the carries alone (the
backward recomputes each iteration from its carry) or every activation the body's
backward reads.

The backward (NNC convention) runs ``backward`` once per iteration in a reverse
``lax.scan``, reading the tape, the stacked inputs and the constants; gradients of the
stacked inputs come out stacked, those of the constants summed over iterations.
``backward_uses`` names every input and output (a static mask cannot name "the tape"
of a command whose output count varies; the extra reads are the carries' first and
last values, one iteration's worth of bytes).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax import lax

from fnnc.core.command import Command, Spec, Uses, defcommand
from fnnc.core.dtypes import at_least_float32
from fnnc.core.ir import Graph
from fnnc.errors import CommandError, GraphError, ShapeError
from fnnc.ops._rules import show
from fnnc.ops._subgraph import check_inputs, require_graph, require_spec, run_graph

MAX_OUTPUTS = 256
"""Most outputs (carries + tape) a ``scan`` node may have: its ``backward_uses``."""


@functools.lru_cache(maxsize=512)
def _check_scan(forward, backward, length, n_carry, n_stacked, wants, n_ys=0) -> None:
    """Structural rules of the two sub-graphs (cached: graphs are hashable)."""
    require_graph("scan", "forward", forward)
    require_graph("scan", "backward", backward)
    if not isinstance(length, int) or length < 1:
        raise CommandError(f"scan: length must be an int >= 1, got {length!r}")
    n_in = len(forward.inputs)
    if not (isinstance(n_carry, int) and isinstance(n_stacked, int)) or not (
        1 <= n_carry <= len(forward.outputs) and 0 <= n_stacked <= n_in - n_carry
    ):
        raise CommandError(
            f"scan: n_carry={n_carry!r}, n_stacked={n_stacked!r} do not fit a forward body "
            f"with {n_in} inputs and {len(forward.outputs)} outputs (need 1 <= n_carry, "
            "n_carry + n_stacked <= inputs)"
        )
    if len(forward.outputs) > MAX_OUTPUTS:
        raise CommandError(
            f"scan: the forward body returns {len(forward.outputs)} tensors; at most "
            f"{MAX_OUTPUTS} (carries + saved) are supported"
        )
    for k in range(n_carry):
        require_spec(
            f"scan: forward output {forward.label(forward.outputs[k])} (next carry {k})",
            forward.spec(forward.outputs[k]),
            forward.spec(forward.inputs[k]),
            f"the carry input {forward.label(forward.inputs[k])}",
        )
    if not isinstance(n_ys, int) or not 0 <= n_ys <= len(forward.outputs) - n_carry:
        raise CommandError(
            f"scan: n_ys={n_ys!r} does not fit a forward body with {len(forward.outputs)} "
            f"outputs and {n_carry} carries (need 0 <= n_ys <= outputs - carries)"
        )
    if tuple(wants[:n_carry]) != tuple(range(n_carry)) or not all(
        isinstance(w, int) and 0 <= w < n_in for w in wants
    ):
        raise CommandError(
            f"scan: wants={wants!r} must list every carry first (0..{n_carry - 1}), then "
            f"positions of other forward inputs (< {n_in})"
        )
    saved = forward.outputs[n_carry + n_ys :]
    specs = [forward.spec(s) for s in saved] + [forward.spec(s) for s in forward.inputs[n_carry:]]
    specs += [forward.spec(s) for s in forward.inputs[:n_carry]]  # the incoming gradients
    check_inputs("scan", "backward body", backward, specs)
    if len(backward.outputs) != len(wants):
        raise GraphError(
            f"scan: the backward body returns {len(backward.outputs)} gradients, wants "
            f"lists {len(wants)}; it must return one per wanted forward input"
        )
    for w, sid in zip(wants, backward.outputs):
        require_spec(
            f"scan: backward output {backward.label(sid)}",
            backward.spec(sid),
            forward.spec(forward.inputs[w]),
            f"the forward input {forward.label(forward.inputs[w])} it is the gradient of",
        )


def _scan_shape(*specs: Spec, forward, backward, length, n_carry, n_stacked, wants,
                checkpoint=False, n_ys=0):  # fmt: skip
    _check_scan(forward, backward, length, n_carry, n_stacked, wants, n_ys)
    n_in = len(forward.inputs)
    if len(specs) != n_in:
        raise GraphError(
            f"scan: the node has {len(specs)} inputs, the body takes {n_in} "
            f"({n_carry} carried, {n_stacked} stacked, {n_in - n_carry - n_stacked} constant)"
        )
    sliced = list(specs)
    for k in range(n_carry, n_carry + n_stacked):
        spec = specs[k]
        if not spec.shape or spec.shape[0] != length:
            raise ShapeError(
                f"scan: stacked input {k - n_carry} is {show(spec)}; its leading axis must "
                f"be the loop length {length} (one slice per iteration)"
            )
        sliced[k] = Spec(tuple(spec.shape[1:]), spec.dtype)
    check_inputs("scan", "forward body", forward, sliced)
    tape = [stacked_spec(forward.spec(s), length) for s in forward.outputs[n_carry:]]
    return (*specs[:n_carry], *tape)


def _scan_display(cmd: Command) -> str:
    try:
        fwd, n = cmd.param("forward"), cmd.param("n_carry")
        ys = cmd.param("n_ys")
        saved = len(fwd.outputs) - n - ys
        return (
            f"scan[length={cmd.param('length')}; {len(fwd.nodes)} nodes; carry {n}; "
            f"stacked {cmd.param('n_stacked')}; " + (f"ys {ys}; " if ys else "") + f"saves {saved}]"
        )
    except (AttributeError, TypeError):
        return "scan[?]"


@defcommand(
    family="control",
    shape=_scan_shape,
    display=_scan_display,
    uses=Uses(inputs=None, outputs=tuple(range(MAX_OUTPUTS))),
)
def scan(*inputs, forward, backward, length, n_carry, n_stacked, wants, checkpoint=False,
         n_ys=0):  # fmt: skip
    """``forward`` applied ``length`` times over stacked inputs (see the module doc).

    Build it with :func:`fnnc.graph.scan`. Returns the final carries, the stacked ``ys``
    (``n_ys`` of them), then the tape.
    ``checkpoint`` is the one :func:`fnnc.graph.scan` derived the bodies with; the loop
    does not read it (passes that retype the body derive them again with it).
    """
    carry0 = tuple(inputs[:n_carry])
    stacked = tuple(inputs[n_carry : n_carry + n_stacked])
    consts = tuple(inputs[n_carry + n_stacked :])
    dtypes = [c.dtype for c in carry0]

    def step(carry, xs):
        outs = run_graph(forward, [*carry, *xs, *consts])
        new = tuple(lax.convert_element_type(o, d) for o, d in zip(outs[:n_carry], dtypes))
        return new, tuple(outs[n_carry:])

    carry, tape = lax.scan(step, carry0, stacked, length=length)
    outs = (*carry, *tape)
    return outs[0] if len(outs) == 1 else outs


@scan.backward
def _scan_backward(grads, inputs, outputs, *, forward, backward, length, n_carry, n_stacked, wants,
                   checkpoint=False, n_ys=0):  # fmt: skip
    if any(g is not None for g in grads[n_carry : n_carry + n_ys]):
        raise CommandError(
            "scan: a per-iteration result (ys) has a gradient; ys carry no gradient "
            "(running statistics and the like): read them where no loss depends on them"
        )
    if any(g is not None for g in grads[n_carry + n_ys :]):
        raise CommandError(
            "scan: a tape output has a gradient; the tape is the backward's record of the "
            "loop and must only be read by the scan's own gradient node"
        )
    cut = n_carry + n_stacked
    tape, stacked = tuple(outputs[n_carry + n_ys :]), tuple(inputs[n_carry:cut])
    consts = inputs[cut:]
    d_carry = tuple(
        jnp.zeros(x.shape, x.dtype) if g is None else g for g, x in zip(grads[:n_carry], inputs)
    )
    at_stacked, at_const = wanted_inputs(wants, n_carry, n_stacked)
    dc, dk, dxs = reverse_blocks(backward, wants, n_carry, consts, d_carry, tape, stacked, length)
    out: list[Any] = [None] * len(inputs)
    for k, g in enumerate(dc):
        out[k] = g
    for w, g in zip(at_stacked, dxs):
        out[w] = g
    for w, g in zip(at_const, dk):
        out[w] = g.astype(inputs[w].dtype)
    return tuple(out)


def wanted_inputs(wants: Sequence[int], n_carry: int, n_stacked: int) -> tuple[list, list]:
    """The wanted input positions that are stacked slices and those that are constants."""
    cut = n_carry + n_stacked
    return [w for w in wants if n_carry <= w < cut], [w for w in wants if w >= cut]


def reverse_blocks(
    backward: Graph,
    wants: Sequence[int],
    n_carry: int,
    consts: Sequence[Any],
    d_carry: Sequence[Any],
    tape: Sequence[Any],
    stacked: Sequence[Any],
    length: int | None = None,
) -> tuple[tuple, tuple, tuple]:
    """The gradient loop of a run of blocks (``scan``'s, and each ``pipeline`` stage's):
    the blocks' ``backward`` body in reverse over their ``tape`` and ``stacked`` slices.
    Returns the carry's cotangents, the wanted constants' gradients summed over the
    blocks (in :func:`accumulator` types) and the wanted slices' gradients, stacked."""
    at_stacked, at_const = wanted_inputs(wants, n_carry, len(stacked))
    cut = n_carry + len(stacked)
    d_const0 = tuple(
        jnp.zeros(consts[w - cut].shape, accumulator(consts[w - cut].dtype)) for w in at_const
    )

    def step(acc: tuple, per: tuple) -> tuple[tuple, tuple]:
        dc, dk = acc
        saved, xs = per
        got = dict(zip(wants, run_graph(backward, [*saved, *xs, *consts, *dc])))
        dc = tuple(got[k].astype(c.dtype) for k, c in zip(range(n_carry), dc))
        dk = tuple(a + got[w].astype(a.dtype) for a, w in zip(dk, at_const))
        return (dc, dk), tuple(got[w] for w in at_stacked)

    init = (tuple(d_carry), d_const0)
    (dc, dk), dxs = lax.scan(step, init, (tuple(tape), tuple(stacked)), length=length, reverse=True)
    return dc, dk, dxs


accumulator = at_least_float32
"""The type a loop sums gradients over iterations in: at least float32, so that a sum of
many bfloat16 / float16 terms (mixed precision) is rounded once, not per term."""


def stacked_spec(spec: Spec, length: int) -> Spec:
    """The spec of ``length`` slices shaped like ``spec`` stacked on a new leading axis."""
    return Spec((int(length), *spec.shape), np.dtype(spec.dtype))
