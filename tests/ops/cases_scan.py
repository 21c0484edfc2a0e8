"""Cases of ``scan``: a linear block body, whose backward reads nothing of the forward.

The sweep gives every float output a cotangent, and a ``scan``'s tape outputs (what a
nonlinear body saves for its backward) take none by design, so the sweep runs a body
that saves nothing; bodies with a tape, checkpointing and the gradients of a 16-block
net against the unrolled backward and ``jax.grad`` are in ``tests/graph/test_scan.py``.
"""

from fnnc import ops
from fnnc.graph import GraphBuilder
from fnnc.graph.scan import scan_bodies
from tests.helpers import rand
from tests.ops.cases import Case


def _linear_scan(checkpoint: bool):
    """``h <- 0.9 h + w_i + c`` over 4 slices ``w_i``, a loop-invariant ``c``."""
    b = GraphBuilder()
    h, w, c = b.input((2, 3), name="h"), b.input((2, 3), name="w"), b.input((2, 3), name="c")
    body = b.build([b.exec(ops.ewsum(), b.exec(ops.add(p=0.9, q=1.0), h, w), c)])
    forward, backward, wants = scan_bodies(body, 1, 1, checkpoint)
    return ops.scan(
        forward=forward,
        backward=backward,
        length=4,
        n_carry=1,
        n_stacked=1,
        wants=wants,
        checkpoint=checkpoint,
    )


def _inputs():
    return (rand([2, 3]), rand([4, 2, 3], seed=1), rand([2, 3], seed=2))


CASES = [
    Case(_linear_scan(False), _inputs(), "scan-linear"),
    Case(_linear_scan(True), _inputs(), "scan-linear-checkpoint"),
]
