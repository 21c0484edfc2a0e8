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
        sweep_float64=True,
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
    # More geometries for the CPU backends (fnnc.ops.conv_cpu; tests/ops/test_backend_sweep.py):
    # odd sizes with SAME, a non-square kernel, unequal strides, depthwise; a 5x5 kernel
    # at stride 3; a 1x1 grouped convolution at stride 2 over 9 images ("chunked" splits
    # them 8 + 1).
    Case(
        ops.convolution(strides=(2, 1), padding="SAME", groups=3),
        (rand([3, 7, 6, 3]), rand([3, 3, 2, 1], seed=1), rand([3], seed=2)),
        "conv2d-depthwise-odd-s2x1",
    ),
    Case(
        ops.convolution(strides=3, padding=(2, 1)),
        (rand([1, 9, 8, 2]), rand([3, 5, 5, 2], seed=1)),
        "conv2d-k5-s3",
    ),
    Case(
        ops.convolution(strides=2, groups=2),
        (rand([9, 5, 5, 4]), rand([6, 1, 1, 2], seed=1), rand([6], seed=2)),
        "conv2d-1x1-s2-groups-b9",
    ),
    # Shapes the "mixed" backend takes (>= 4096 output positions), one per rule: thin
    # channels on a 32x32 map (chunked weight gradient), 32 channels (the dilated forms),
    # a 1x1 kernel (im2col for all three), stride 2 (the im2col data gradient).
    Case(
        ops.convolution(padding="SAME"),
        (rand([9, 32, 32, 8]), rand([4, 3, 3, 8], seed=1)),
        "conv2d-mixed-thin",
        atol=3e-4,  # float32 sums of thousands of products (float64 checks exactness)
        sweep_float64=True,
    ),
    Case(
        ops.convolution(padding="SAME"),
        (rand([4, 32, 32, 32]), rand([32, 3, 3, 32], seed=1), rand([32], seed=2)),
        "conv2d-mixed-wide",
        atol=3e-4,  # float32 sums of thousands of products (float64 checks exactness)
        sweep_float64=True,
    ),
    Case(
        ops.convolution(strides=2),
        (rand([4, 64, 64, 2]), rand([3, 1, 1, 2], seed=1), rand([3], seed=2)),
        "conv2d-mixed-1x1-s2",
    ),
    Case(
        ops.convolution(strides=2, padding="SAME"),
        (rand([4, 64, 64, 2]), rand([4, 3, 3, 2], seed=1)),
        "conv2d-mixed-s2",
        atol=3e-4,  # float32 sums of thousands of products (float64 checks exactness)
        sweep_float64=True,
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
