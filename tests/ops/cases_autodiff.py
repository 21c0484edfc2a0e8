import jax

from fnnc import ops
from fnnc.ops.autodiff import gradient_command
from tests.helpers import rand
from tests.ops.cases import Case


def _spec(x):
    return jax.ShapeDtypeStruct(x.shape, x.dtype)


def _gemm_gradient():
    a, b, bias = rand([3, 4]), rand([5, 4], seed=1), rand([5], seed=2)
    g = rand([3, 5], seed=3)
    out = jax.ShapeDtypeStruct((3, 5), a.dtype)
    cmd = gradient_command(
        ops.gemm(transpose_b=True), (_spec(a), _spec(b), _spec(bias)), (out,), (True,), (0, 1, 2)
    )
    return Case(cmd, (g, a, b), "gradient-of-gemm", numeric=False)


def _tanh_gradient():
    x = rand([2, 3])
    y = jax.numpy.tanh(x)
    cmd = gradient_command(ops.tanh(), (_spec(x),), (_spec(y),), (True,), (0,))
    return Case(cmd, (rand([2, 3], seed=1), y), "gradient-of-tanh-uses-output", numeric=False)


# numeric=False: a gradient command casts its results to the float32 specs it carries
# (they are the forward's dtypes), so a float64 finite-difference run is quantised to
# float32. Its values are checked against jax.vjp here and against jax.grad in
# tests/graph/passes/test_backward.py.
CASES = [_gemm_gradient(), _tanh_gradient()]
