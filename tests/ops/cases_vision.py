import numpy as np

from fnnc import ops
from tests.helpers import rand
from tests.ops.cases import Case


def _boxes() -> np.ndarray:
    rows = [[4.0, 0.0, 0.0, 2.0, 2.0], [3.0, 0.5, 0.5, 2.0, 2.0], [2.0, 5.0, 5.0, 1.0, 1.0]]
    rows += [[1.0, 5.2, 5.1, 1.0, 1.0], [0.5, 9.0, 0.0, 1.0, 3.0]]
    return np.array(rows, np.float32) + rand([5, 5], lo=0, hi=0.01)


CASES = [
    Case(
        ops.grid_sample(),
        (rand([2, 3, 4, 2]), rand([2, 2, 3, 2], seed=1, lo=-1.2, hi=1.2)),
        "grid_sample",
        sweep_float64=True,
    ),
    Case(
        ops.grid_sample(align_corners=True),
        (rand([1, 4, 3, 2]), rand([1, 3, 2, 2], seed=1, lo=-1.1, hi=1.1)),
        "grid_sample-align_corners",
    ),
    Case(
        ops.roi_align(size=(2, 3)),
        (rand([2, 6, 5, 3]), np.array([[0.1, 0.2, 0.6, 0.5], [0.3, 0.0, 0.5, 0.9]], np.float32)),
        "roi_align",
        grad_inputs=(0,),
    ),
    Case(
        ops.roi_align(size=(2, 2)),  # a box partly outside the image, one image for three boxes
        (
            rand([5, 4, 2]),
            np.array(
                [[-0.2, 0.5, 0.6, 0.7], [0.0, 0.0, 1.0, 1.0], [0.5, 0.5, 0.2, 0.2]], np.float32
            ),
        ),
        "roi_align-outside-broadcast",
        grad_inputs=(0,),
    ),
    # The dropped rows' score is -FLT_MAX, so a finite-difference sum over the outputs
    # loses every other digit: the hand-written backward is checked against jax.vjp here
    # and against NNC's test in test_vision_values.py.
    Case(ops.nms(iou_threshold=0.3), (_boxes(),), "nms", numeric=False),
    Case(
        ops.nms(iou_threshold=0.5),
        (np.stack([_boxes(), _boxes()[::-1].copy()]),),
        "nms-batched",
        numeric=False,
    ),
]
