"""Cases of ``pipeline``: ``h <- tanh(h * w_i + c)`` over 4 blocks in 2 stages.

Values and gradients of residual MLP stacks against ``scan`` and ``jax.grad``, and
sharded training on a 4-device mesh, are in ``tests/graph/test_pipeline.py``.
"""

from fnnc import ops
from fnnc.graph import GraphBuilder
from tests.helpers import rand
from tests.ops.cases import Case


def _tanh_pipeline(microbatches: int, checkpoint: bool):
    b = GraphBuilder()
    rows = 2 // microbatches
    h, w, c = b.input((rows, 3), name="h"), b.input((rows, 3), name="w"), b.input((3,), name="c")
    body = b.build([b.exec(ops.tanh(), b.exec(ops.add(), b.exec(ops.ewprod(), h, w), c))])
    return ops.pipeline(
        body=body,
        stages=2,
        microbatches=microbatches,
        n_carry=1,
        n_stacked=1,
        axis="stage",
        checkpoint=checkpoint,
    )


def _inputs(rows: int):
    return (rand([2, 3]), rand([4, rows, 3], seed=1), rand([3], seed=2))


CASES = [
    Case(_tanh_pipeline(2, False), _inputs(1), "pipeline-2-stages-2-microbatches"),
    Case(_tanh_pipeline(1, True), _inputs(2), "pipeline-checkpoint-1-microbatch"),
]
