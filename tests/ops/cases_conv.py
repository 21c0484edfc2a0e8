from fnnc import ops
from tests.helpers import rand
from tests.ops.cases import Case

CASES = [
    Case(
        ops.convolution(),
        (rand([2, 5, 5, 3]), rand([4, 3, 3, 3], seed=1), rand([4], seed=2)),
        "conv2d-bias",
    ),
    Case(
        ops.convolution(strides=2, padding="SAME"),
        (rand([1, 6, 6, 2]), rand([3, 3, 3, 2], seed=1)),
        "conv2d-same-s2",
    ),
    Case(
        ops.convolution(dilation=(2, 1), padding=((1, 2), (0, 1))),
        (rand([1, 6, 5, 2]), rand([2, 2, 2, 2], seed=1)),
        "conv2d-dilated-pad",
    ),
    Case(
        ops.convolution(strides=(1, 2), padding=1, groups=2),
        (rand([1, 5, 5, 4]), rand([6, 3, 3, 2], seed=1), rand([6], seed=2)),
        "conv2d-groups",
    ),
    Case(
        ops.convolution(strides=(2,), padding=((1, 1),)),
        (rand([2, 7, 3]), rand([4, 3, 3], seed=1), rand([4], seed=2)),
        "conv1d",
    ),
    Case(
        ops.convolution(padding="VALID"),
        (rand([1, 3, 4, 3, 2]), rand([2, 2, 2, 2, 2], seed=1)),
        "conv3d",
    ),
    Case(
        ops.convolution_transpose(),
        (rand([2, 3, 3, 4]), rand([4, 3, 3, 3], seed=1), rand([3], seed=2)),
        "conv_t2d-bias",
    ),
    Case(
        ops.convolution_transpose(strides=2, padding=1, output_padding=1),
        (rand([1, 3, 3, 2]), rand([2, 3, 3, 3], seed=1)),
        "conv_t2d-s2-outpad",
    ),
    Case(
        ops.convolution_transpose(strides=2, padding="SAME", groups=2),
        (rand([1, 3, 3, 4]), rand([4, 3, 3, 3], seed=1), rand([6], seed=2)),
        "conv_t2d-same-groups",
    ),
    Case(
        ops.convolution_transpose(dilation=2, strides=(3,), padding=((2, 1),)),
        (rand([1, 4, 2]), rand([2, 3, 3], seed=1)),
        "conv_t1d-dilated",
    ),
]
