import numpy as np

from fnnc import ops
from tests.helpers import rand, randint
from tests.ops.cases import Case

CASES = [
    Case(ops.reshape(shape=(3, -1)), (rand([2, 3, 2]),), "reshape-infer"),
    Case(ops.reshape(shape=(6,)), (rand([2, 3]),), "reshape-flat"),
    Case(ops.transpose(perm=(2, 0, 1)), (rand([2, 3, 4]),), "transpose"),
    Case(ops.format_transform(), (rand([2, 3, 2, 2]),), "format-nchw-nhwc"),
    Case(ops.format_transform(src="NHWC", dst="CHWN"), (rand([2, 3, 2, 4]),), "format-nhwc-chwn"),
    # float16 rounding swallows the 1e-6 steps of the finite-difference check.
    Case(
        ops.datatype_conversion(dtype="float16"),
        (rand([2, 3]),),
        "convert-f16",
        numeric=False,
        rtol=1e-3,
        atol=1e-3,
    ),
    # Rounding to int32 is piecewise constant; only the (zero) gradient is compared.
    Case(
        ops.datatype_conversion(dtype="int32"),
        (rand([2, 3], lo=-5, hi=5),),
        "convert-to-int",
        numeric=False,
    ),
    Case(ops.datatype_conversion(dtype=np.float32), (randint([4], 5),), "convert-from-int"),
    Case(ops.concat(axis=1), (rand([2, 1]), rand([2, 3], seed=1), rand([2, 2], seed=2)), "concat"),
    Case(ops.concat(axis=-1), (rand([3]), rand([2], seed=1)), "concat-neg-axis"),
    Case(ops.slice(start=(1, 0), limit=(3, 4)), (rand([4, 4]),), "slice"),
    Case(ops.slice(start=(0, 1), limit=(5, 4), strides=(2, 2)), (rand([5, 4]),), "slice-strided"),
    Case(ops.index_select(), (rand([4, 3]), np.array([3, 0, 3], np.int32)), "index_select"),
    Case(
        ops.index_select(axis=-1),
        (rand([2, 4]), np.array([1, 1, 2, 0, -1], np.int32)),
        "index_select-axis",
    ),
    Case(  # NNC's float positions interpolate between rows; they get no gradient
        ops.index_select(),
        (rand([4, 3]), np.array([1.5, 0.25, 3.0, 2.75], np.float32)),
        "index_select-float",
        grad_inputs=(0,),
    ),
    Case(
        ops.index_select(axis=1),
        (rand([2, 3]), np.array([0.5, 2.0], np.float32)),
        "index_select-float-axis",
        grad_inputs=(0,),
    ),
    Case(ops.pad(pads=((1, 0), (2, 1))), (rand([2, 3]),), "pad-zero"),
    Case(ops.pad(pads=((0, 1), (1, 1)), value=2.5), (rand([2, 3]),), "pad-value"),
    Case(ops.pad(pads=((1, 1), (2, 1)), mode="reflect"), (rand([2, 3]),), "pad-reflect"),
    Case(ops.pad(pads=((2, 0), (1, 3)), mode="edge"), (rand([2, 3]),), "pad-edge"),
    Case(ops.upsample(), (rand([1, 2, 3, 2]),), "upsample-nearest"),
    Case(ops.upsample(scale=(2, 1.5), mode="bilinear"), (rand([1, 2, 2, 2]),), "upsample-bilinear"),
    Case(
        ops.upsample(scale=3, mode="bilinear", align_corners=True),
        (rand([2, 2, 2, 1]),),
        "upsample-bilinear-ac",
    ),
    Case(ops.set(shape=(2, 3), value=1.5), (), "set"),
    Case(ops.set(shape=(4,), dtype="int32", value=7), (), "set-int"),
    Case(ops.masked_fill(eq=1, fill=-9.0), (rand([2, 3]), randint([2, 3], 2)), "masked_fill"),
    Case(
        ops.masked_fill(fill=3.0), (rand([2, 3]), randint([1, 3], 2, seed=1)), "masked_fill-bcast"
    ),
    # A float mask has no gradient (NNC's backward returns none for it).
    Case(
        ops.masked_fill(eq=0.0),
        (rand([3, 2]), np.array([0.0, 1.0], np.float32)),
        "masked_fill-float",
        grad_inputs=(0,),
    ),
    Case(ops.broadcast_to(shape=(2, 3, 4)), (rand([3, 1]),), "broadcast_to"),
    Case(ops.data_transfer(), (rand([2, 3]),), "data_transfer"),
]
