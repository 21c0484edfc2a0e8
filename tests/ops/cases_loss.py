import numpy as np

from fnnc import ops
from tests.helpers import rand, randint
from tests.ops.cases import Case

_AB = rand([3, 4])
# Row 0 lies within beta (quadratic branch), rows 1 and 2 beyond it (linear branch).
_NEAR = _AB + np.array([[0.05], [2.0], [1.5]], np.float32) * rand([3, 4], seed=1)

CASES = [
    Case(
        ops.linear_softmax_crossentropy(row_chunk=4, class_chunk=4),
        (rand([7, 3]), rand([9, 3], seed=1), randint([7], 9, seed=2), rand([9], seed=3)),
        "linear_xent-ragged-bias",
        grad_inputs=(0, 1, 3),
    ),
    Case(
        ops.linear_softmax_crossentropy(trim0=0.02, trim1=0.8, row_chunk=2, class_chunk=3),
        (rand([2, 3, 4]), rand([5, 4], seed=1), randint([2, 3, 1], 5, seed=2).astype(np.float32)),
        "linear_xent-lead-trim-float-index",
        grad_inputs=(0, 1),
    ),
    Case(
        ops.linear_softmax_crossentropy_mean(row_chunk=3),
        (rand([7, 3]), rand([9, 3], seed=1), randint([7], 9, seed=2), rand([9], seed=3)),
        "linear_xent_mean-ragged-bias",
        grad_inputs=(0, 1, 3),
        # its gradient outputs are residuals, constants to differentiation: finite
        # differences through them would see a second derivative the command does not
        # give. tests/ops/test_linear_crossentropy_mean.py checks it against jax.grad.
        numeric=False,
    ),
    Case(ops.softmax_crossentropy(), (rand([3, 5]) * 3, randint([3], 5)), "softmax_xent-int"),
    Case(
        ops.softmax_crossentropy(),
        (rand([4, 1, 1, 3], seed=9) * 3, randint([4], 3, seed=9)),
        "softmax_xent-nnc-batch-label",
    ),
    Case(
        ops.softmax_crossentropy(trim0=0.05, trim1=0.8),
        (rand([3, 5], seed=1), randint([3, 1], 5, seed=1)),
        "softmax_xent-trim",
    ),
    Case(
        ops.softmax_crossentropy(),
        (rand([2, 3, 4]), rand([2, 3, 4], seed=1, lo=0.0, hi=0.5)),
        "softmax_xent-targets",
        grad_inputs=(0,),  # no gradient for targets: the backward reads only softmax and label
    ),
    Case(
        ops.softmax_crossentropy(),
        (rand([3, 4]), randint([3], 4, seed=2).astype(np.float32)),
        "softmax_xent-float-index",
        grad_inputs=(0,),
    ),
    Case(
        ops.categorical_crossentropy(),
        (rand([3, 4], lo=0.1, hi=1.0), randint([3], 4)),
        "cat_xent-int",
    ),
    Case(
        ops.categorical_crossentropy(trim0=0.1, trim1=0.7),
        (rand([3, 4], lo=0.1, hi=1.0), randint([3, 1], 4, seed=3)),
        "cat_xent-trim",
    ),
    Case(
        ops.categorical_crossentropy(),
        (rand([2, 4], lo=0.1, hi=1.0), rand([2, 4], seed=1, lo=0.0, hi=1.0)),
        "cat_xent-targets",
    ),
    Case(
        ops.binary_crossentropy(),
        (rand([3, 4], lo=0.1, hi=0.9), rand([3, 4], seed=1, lo=0.0, hi=1.0)),
        "bce",
    ),
    Case(
        ops.binary_crossentropy(pos_weight=2.5),
        (rand([2, 3, 2], lo=0.1, hi=0.9), rand([2, 3, 2], seed=1, lo=0.0, hi=1.0)),
        "bce-pos_weight",
    ),
    Case(
        ops.sigmoid_binary_crossentropy(),
        (rand([3, 4]) * 3, rand([3, 4], seed=1, lo=0.0, hi=1.0)),
        "sigmoid_bce",
        grad_inputs=(0,),  # no gradient for the label: the backward reads only sigmoid and label
    ),
    Case(
        ops.sigmoid_binary_crossentropy(pos_weight=3.0),
        (rand([3, 4]) * 3, rand([3, 4], seed=2, lo=0.0, hi=1.0)),
        "sigmoid_bce-pos_weight",
        grad_inputs=(0,),
    ),
    Case(ops.mse(), (rand([2, 3, 2]), rand([2, 3, 2], seed=1)), "mse-mean"),
    Case(ops.mse(reduce="sum"), (rand([3, 4]), rand([3, 4], seed=1)), "mse-sum"),
    Case(ops.smooth_l1(), (_AB, _NEAR), "smooth_l1"),
    Case(ops.smooth_l1(beta=0.5), (rand([2, 2, 3]), rand([2, 2, 3], seed=4)), "smooth_l1-beta"),
]
