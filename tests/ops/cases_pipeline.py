"""Cases of ``pipeline``: ``h <- 0.9 h + w_i + c`` over 4 blocks in 2 stages.

As for ``scan`` (``cases_scan.py``), the sweep gives every float output a cotangent and
a tape takes none by design, so the body is linear and saves nothing; residual MLP stacks
with a tape, checkpointing and gradients against ``scan`` and ``jax.grad``, and sharded
training on a 4-device mesh, are in ``tests/graph/test_pipeline.py``.
"""

from fnnc import ops
from fnnc.graph import GraphBuilder
from fnnc.graph.scan import scan_bodies
from tests.helpers import rand
from tests.ops.cases import Case


def _linear_pipeline(microbatches: int, checkpoint: bool):
    b = GraphBuilder()
    rows = 4 // microbatches
    h, w, c = b.input((rows, 3), name="h"), b.input((3,), name="w"), b.input((3,), name="c")
    body = b.build([b.exec(ops.add(), b.exec(ops.add(p=0.9, q=1.0), h, w), c)])
    forward, backward, wants = scan_bodies(body, 1, 1, checkpoint)
    return ops.pipeline(
        forward=forward,
        backward=backward,
        stages=2,
        microbatches=microbatches,
        n_carry=1,
        n_stacked=1,
        wants=wants,
        axis="stage",
        checkpoint=checkpoint,
    )


def _inputs():
    return (rand([4, 3]), rand([4, 3], seed=1), rand([3], seed=2))


CASES = [
    Case(_linear_pipeline(2, False), _inputs(), "pipeline-2-stages-2-microbatches"),
    Case(_linear_pipeline(4, True), _inputs(), "pipeline-checkpoint-4-microbatches"),
]
