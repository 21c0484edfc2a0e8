"""Fused family: ``fused_elementwise``, a chain of elementwise commands run as one command.

The fusion pass (:func:`fnnc.graph.passes.fuse`) turns a chain such as a bias ``add``
followed by ``gelu`` into one node whose hyper-parameter ``body`` is the chain as a
sub-graph. The reference forward runs the body's commands (their reference forwards)
inside one function, so XLA sees the whole chain at once; a Pallas backend can
generate one kernel from the body. The backward runs the members' own backwards
(hand-written ones with their hyper-parameters, derived ones otherwise) in reverse
order, recomputing the members' forwards it needs (elementwise, so cheap), inside one
function: fusing before the ``backward`` pass gives exactly the gradients of the
unfused graph (``relu``'s 0 at 0, a straight-through estimator's identity), and XLA
still sees the whole chain.

Listings print the body's commands in order: ``fused_elementwise[add, gelu]``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fnnc.core.command import Command, Spec, defcommand, vjp_backward
from fnnc.errors import ShapeError
from fnnc.ops._rules import show
from fnnc.ops._subgraph import run_graph, run_graph_nnc


def _body_shape(*specs: Spec, body: Any) -> Spec | tuple[Spec, ...]:
    want = body.input_specs
    fits = len(specs) == len(want) and all(
        tuple(s.shape) == tuple(w.shape) and np.dtype(s.dtype) == np.dtype(w.dtype)
        for s, w in zip(specs, want)
    )
    if not fits:
        raise ShapeError(
            f"fused_elementwise: inputs {[show(s) for s in specs]} do not match the body's "
            f"inputs {[show(w) for w in want]}; the body is fixed when the chain is fused"
        )
    outs = body.output_specs
    return outs[0] if len(outs) == 1 else outs


def _display(cmd: Command) -> str:
    return f"fused_elementwise[{', '.join(str(n.cmd) for n in cmd.param('body').nodes)}]"


@defcommand(family="fused", shape=_body_shape, display=_display)
def fused_elementwise(*inputs, body):
    """Runs the sub-graph ``body`` on the inputs, each node with its reference forward.

    ``body`` is a :class:`~fnnc.graph.Graph` whose inputs match the command's inputs
    (shapes and dtypes); the result is its output (a tuple if it has several).

    >>> import numpy as np
    >>> from fnnc import ops
    >>> from fnnc.graph import GraphBuilder
    >>> b = GraphBuilder()
    >>> x = b.input((2,))
    >>> body = b.build([b.exec(ops.ewprod(), x, b.exec(ops.sigmoid(), x))])
    >>> y = ops.fused_elementwise(body=body)(np.array([0.0, 2.0], np.float32))
    >>> [round(float(v), 5) for v in y]  # x * sigmoid(x)
    [0.0, 1.76159]
    """
    outs = run_graph(body, inputs, backends=False)
    return outs[0] if len(outs) == 1 else tuple(outs)


@fused_elementwise.backward
def _fused_elementwise_backward(grads, inputs, outputs, *, body):
    """``jax.vjp`` of the body run with each member's backward as its derivative
    (:func:`~fnnc.ops._subgraph.run_graph_nnc`); outputs without a gradient are left out,
    so the members that only they need get none, as in the unfused graph."""
    keep = [k for k, g in enumerate(grads) if g is not None]
    if not keep:
        return (None,) * len(inputs)

    def forward(*xs):
        outs = run_graph_nnc(body, xs)
        return tuple(outs[k] for k in keep)

    return vjp_backward(forward, [grads[k] for k in keep], inputs)
