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
    return Case(cmd, (g, a, b), "gradient-of-gemm", numeric_float32=True)


def _tanh_gradient():
    x = rand([2, 3])
    y = jax.numpy.tanh(x)
    cmd = gradient_command(ops.tanh(), (_spec(x),), (_spec(y),), (True,), (0,))
    inputs = (rand([2, 3], seed=1), y)
    return Case(cmd, inputs, "gradient-of-tanh-uses-output", numeric_float32=True)


# numeric_float32: a gradient command casts its results to the float32 specs it carries
# (they are the forward's dtypes), so its finite-difference check runs in float32 (both
# are low-degree polynomials, where central differences are exact up to rounding). Also
# checked against jax.grad in tests/graph/passes/test_backward.py.
CASES = [_gemm_gradient(), _tanh_gradient()]
