from fnnc import ops
from tests.helpers import rand
from tests.ops.cases import Case

X = rand([3, 4], lo=-3, hi=3)

CASES = [
    Case(ops.relu(), (X,), "relu"),
    Case(ops.leaky_relu(), (X,), "leaky_relu"),
    Case(ops.leaky_relu(negative_slope=0.2), (rand([2, 2, 3], seed=1),), "leaky_relu-0.2"),
    Case(ops.sigmoid(), (X,), "sigmoid"),
    Case(ops.tanh(), (X,), "tanh"),
    Case(ops.softplus(), (X,), "softplus"),
    Case(ops.softplus(), (rand([2, 3], lo=-40, hi=40, seed=3),), "softplus-wide"),
    Case(ops.swish(), (X,), "swish"),
    Case(ops.swish(beta=1.7), (X,), "swish-beta"),
    Case(ops.gelu(), (X,), "gelu"),
    Case(ops.gelu(approximate=True), (X,), "gelu-tanh"),
    Case(ops.mish(), (X,), "mish"),
    Case(ops.softmax(), (X,), "softmax"),
    Case(ops.softmax(axis=0), (rand([3, 2, 2], seed=2),), "softmax-axis0"),
    Case(ops.log_softmax(), (X,), "log_softmax"),
    Case(ops.log_softmax(axis=-2), (rand([2, 3, 2], seed=3),), "log_softmax-neg-axis"),
]
