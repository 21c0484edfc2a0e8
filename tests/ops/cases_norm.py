from fnnc import ops
from tests.helpers import rand
from tests.ops.cases import Case

X4 = rand([2, 2, 3, 4])
C = 4


def _bn_inputs(channels, seed=1):
    return (
        rand([channels], seed=seed, lo=0.5, hi=1.5),
        rand([channels], seed=seed + 1),
        rand([channels], seed=seed + 2),
        rand([channels], seed=seed + 3, lo=0.5, hi=1.5),
    )


CASES = [
    Case(ops.batch_norm(), (X4, *_bn_inputs(C)), "batch_norm"),
    Case(ops.batch_norm(is_test=True), (X4, *_bn_inputs(C)), "batch_norm-test"),
    Case(
        ops.batch_norm(axes=(0,), momentum=0.5), (rand([5, 3]), *_bn_inputs(3)), "batch_norm-dense"
    ),
    Case(ops.layer_norm(), (rand([3, 5]),), "layer_norm-plain"),
    Case(
        ops.layer_norm(), (rand([3, 5]), rand([5], seed=1), rand([5], seed=2)), "layer_norm-affine"
    ),
    Case(
        ops.layer_norm(axes=(1, -1), epsilon=1e-3),
        (X4, rand([2, 4], seed=1)),
        "layer_norm-axes-scale",
    ),
    Case(ops.group_norm(groups=2), (X4,), "group_norm"),
    Case(
        ops.group_norm(groups=2, reduce_axes=None),
        (X4, rand([C], seed=1), rand([C], seed=2)),
        "group_norm-affine",
    ),
    Case(
        ops.group_norm(groups=1, axis=1), (rand([2, 3, 4]), rand([3], seed=1)), "group_norm-axis1"
    ),
    Case(ops.group_norm(groups=2, reduce_axes=(1,)), (X4, rand([C], seed=1)), "group_norm-reduce"),
    Case(  # NNC's default: each position over its group's channels alone
        ops.group_norm(groups=1, reduce_axes=()),
        (X4, rand([1, 2, 3, C], seed=1), rand([1, 1, 1, C], seed=2)),
        "group_norm-no-reduce-nnc-affine",
    ),
    Case(
        ops.group_norm(groups=2, axis=1, reduce_axes=(0, 2)),
        (rand([3, 4, 5], seed=3), rand([4], seed=1), rand([4], seed=2)),
        "group_norm-axis1-batch-reduced",
    ),
    Case(ops.rms_norm(), (rand([3, 5]),), "rms_norm-plain"),
    Case(ops.rms_norm(), (rand([3, 5]), rand([5], seed=1)), "rms_norm-scale"),
    Case(ops.rms_norm(axes=(0, 2)), (rand([2, 3, 4]), rand([2, 4], seed=1)), "rms_norm-axes"),
]
