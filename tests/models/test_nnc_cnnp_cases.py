"""NNC's cnnp cases (test/unit/nnc/cnnp.core.tests.c) about building models: functional
and sequential structure, shared layers, multiple outputs, constants, data-movement
layers. Each test names the C case it ports; shapes are smaller than NNC's.
Training cases are in test_nnc_cnnp_cases_2.py."""

from __future__ import annotations

import jax
import numpy as np
from jax import lax

from fnnc import ops
from fnnc.models import (
    Activation,
    Add,
    AvgPool,
    BatchNorm,
    BuildContext,
    CommandLayer,
    Concat,
    Conv,
    Dense,
    Flatten,
    Input,
    Layer,
    MaxPool,
    Model,
    Mul,
    Parameter,
    ReLU,
    Sequential,
    minimizers,
)
from tests.helpers import assert_close, rand


def _f(*values: float) -> np.ndarray:
    return np.array(values, np.float32)


def _conv(x, p, name, pad):
    """A 'same'-padded stride-1 NHWC convolution from the layer's parameters."""
    w, b = np.asarray(p[f"t-{name}-0-0"]), np.asarray(p[f"t-{name}-0-1"])
    y = lax.conv_general_dilated(
        x, w, (1, 1), [(pad, pad)] * 2, dimension_numbers=("NHWC", "OHWI", "NHWC")
    )
    return y + b[None, None, None, :]


def _sigmoid(v: float) -> float:
    return 1.0 / (1.0 + np.exp(-v))


def _cifar(softmax: bool = True) -> Model:
    """NNC's simple CIFAR-10 net: 5x5 convs (pad 2), 3x3 stride-2 pools, dense, softmax."""
    layers = [
        Conv(32, 5, padding=2),
        ReLU(),
        MaxPool((3, 3), strides=2),
        Conv(32, 5, padding=2),
        ReLU(),
        AvgPool((3, 3), strides=2),
        Conv(64, 5, padding=2),
        ReLU(),
        AvgPool((3, 3), strides=2),
        Flatten(),
        Dense(256),
        ReLU(),
        Dense(10),
    ]
    return Sequential([*layers, Activation("softmax")] if softmax else layers)


def test_cifar10_fits_a_target_and_a_reloaded_copy_agrees(tmp_path):
    """NNC's "compile simple cifar-10 model": 100 SGD steps make a wrong class win; a fresh
    model that reads the written file predicts the same class."""
    x = rand([1, 31, 31, 3], seed=1)
    sgd = minimizers.sgd(0.001, momentum=0.9, nesterov=True, decay=0.99)
    model = _cifar()
    model.compile([x], loss="categorical_crossentropy", minimizer=sgd)
    first = int(np.argmax(model.evaluate([x])))
    target = (first + 1) % 10
    for _ in range(100):
        model.fit([x], [np.array([target], np.float32)])  # NNC's labels are float32
    assert int(np.argmax(model.evaluate([x]))) == target
    model.write(tmp_path / "cifar.sqlite3")
    again = _cifar()
    again.compile([x], loss="categorical_crossentropy", minimizer=sgd)
    assert again.read(tmp_path / "cifar.sqlite3") == []
    assert int(np.argmax(again.evaluate([x]))) == target


def test_inception_block_sums_three_towers():
    """NNC's "inception layer for model" (without NNC's owner-change notify hooks): three
    conv towers and a pooled one on one input, summed; checked against lax."""
    x = Input()

    def conv(name, k, h):
        return ReLU()(Conv(4, k, padding=k // 2, name=name)(h))

    t1 = conv("t1b", 3, conv("t1a", 1, x))
    t2 = conv("t2b", 5, conv("t2a", 1, x))
    t3 = conv("t3", 1, MaxPool((3, 3), strides=1, padding=1)(x))
    model = Model([x], [Add()(t1, t2, t3)])
    data = rand([1, 8, 8, 3])
    model.compile([data])
    p = model.parameters()
    relu = jax.nn.relu
    pooled = lax.reduce_window(
        data, -np.inf, lax.max, (1, 3, 3, 1), (1, 1, 1, 1), [(0, 0), (1, 1), (1, 1), (0, 0)]
    )
    want = (
        relu(_conv(relu(_conv(data, p, "t1a", 0)), p, "t1b", 1))
        + relu(_conv(relu(_conv(data, p, "t2a", 0)), p, "t2b", 2))
        + relu(_conv(pooled, p, "t3", 0))
    )
    assert_close(model.evaluate([data]), want, rtol=1e-4, atol=1e-5)


def test_a_model_output_that_is_several_outputs_feeds_a_sum():
    """NNC's "functional model's IO can represent multiple outputs": a two-output model inside
    a three-output one, whose outputs are summed."""
    i0, i1 = Input(), Input()
    pair = Model(
        [i0, i1],
        [ReLU()(Conv(4, 1, name="c1")(i0)), ReLU()(Conv(4, 3, padding=1, name="c3")(i1))],
    )
    j0, j1, j2 = Input(), Input(), Input()
    interim = Model([j0, j1, j2], [*pair(j0, j1), ReLU()(Conv(4, 5, padding=2, name="c5")(j2))])
    a0, a1, a2 = Input(), Input(), Input()
    final = Model([a0, a1, a2], [Add()(*interim(a0, a1, a2))])
    xs = [rand([1, 6, 6, 3], seed=s) for s in range(3)]
    final.compile(xs)
    p = final.parameters()
    assert sorted(p) == [f"t-{n}-0-{i}" for n in ("c1", "c3", "c5") for i in (0, 1)]
    relu = jax.nn.relu
    want = (
        relu(_conv(xs[0], p, "c1", 0))
        + relu(_conv(xs[1], p, "c3", 1))
        + relu(_conv(xs[2], p, "c5", 2))
    )
    assert_close(final.evaluate(xs), want, rtol=1e-4, atol=1e-5)


def test_an_intermediate_value_can_also_be_an_output():
    """NNC's "functional model's IO outputs can be non-terminal" and "... can introduce
    non-functional dependencies" (fnnc's graphs are pure: no ordering edges to add).

    NNC TEST_CASE covered here:
    "functional model's IO can introduce non-functional dependencies".
    """
    a0, a1, a2, a3 = Input(), Input(), Input(), Input()
    s = Add()(a0, a1)
    chained = Model([a0, a1, a2, a3], [s, Add()(Mul()(s, a2), a3)])
    side = Model([a0, a1, a2, a3], [s, Add()(s, Mul()(a2, a3))])
    data = [_f(0.5), _f(0.75), _f(1.75), _f(2.5)]
    for model, want in ((chained, (0.5 + 0.75) * 1.75 + 2.5), (side, 0.5 + 0.75 + 1.75 * 2.5)):
        model.compile(data)
        b0, b1 = model.evaluate(data)
        assert abs(float(b0[0]) - 1.25) < 1e-5
        assert abs(float(b1[0]) - want) < 1e-5


def test_a_dense_applied_twice_shares_its_weights_and_sums_their_gradients():
    """NNC's "make sure reuse model enables share weights": one dense on two inputs owns one
    weight and one bias; a step adds the gradients of both uses (jax.grad oracle)."""
    a0, a1 = Input(), Input()
    dense = Dense(1)
    model = Model([a0, a1], [Add()(dense(a0), dense(a1))])
    xs = [np.array([[1.5]], np.float32), np.array([[-0.25]], np.float32)]
    model.compile(xs, minimizer=minimizers.sgd(1.0))
    p = model.parameters()
    assert sorted(p) == ["t-0-0", "t-0-1"]

    def f(p):
        return sum(x @ p["t-0-0"].T + p["t-0-1"][None, :] for x in xs).sum()

    assert_close(model.evaluate(xs), f(p).reshape(1, 1))
    grads = jax.grad(f)(p)
    model.evaluate(xs, requires_grad=True)
    model.backward()
    model.apply_gradients()
    after = model.parameters()
    for k in p:
        assert_close(after[k], p[k] - grads[k])
    assert_close(grads["t-0-1"], _f(2.0))


def _mul_add(constant_mul: float, constant_add: float) -> tuple[Model, Model]:
    """NNC's cmd_exec "mul" and "add" models: an input times (plus) a constant tensor,
    which is not a parameter (NNC's INIT_SHARED_TENSOR)."""
    xi, bi = Input(), Input()
    two = CommandLayer(ops.constant(_f(constant_mul)))()
    mul = Model([xi], [Mul()(xi, two)], name="mul")
    one = CommandLayer(ops.constant(_f(constant_add)))()
    add = Model([bi], [Add()(bi, one)], name="add")
    return mul, add


def test_a_model_applied_twice_in_a_functional_or_sequential_model():
    """NNC's "apply functional model as forward pass" and "apply sequential model as forward
    pass": 1.12 * 2.12 * 2.12 - 1 through a constant-multiplying model used twice."""
    mul, add = _mul_add(2.12, -1.0)
    x = Input()
    functional = Model([x], [add(mul(mul(x)))], name="final")
    sequential = Sequential([mul, mul, add], name="seq")
    for model in (functional, sequential):
        model.compile([_f(0)], minimizer=minimizers.sgd(0.1, decay=0.1))
        assert model.parameters() == {}
        assert abs(float(model.evaluate([_f(1.12)])[0]) - (1.12 * 2.12 * 2.12 - 1)) < 1e-5


def test_one_output_feeds_the_next_layer_and_both_are_outputs():
    """NNC's "model can have multiple outputs and some of them can be used in the computation"."""
    x = Input()
    out1 = Dense(1, no_bias=True)(x)
    model = Model([x], [out1, Dense(1, no_bias=True)(out1)])
    model.compile([_f(0)])
    model.set_parameters({"t-0-0": np.array([[2.4]], np.float32), "t-1-0": np.array([[-1.5]])})
    t, y = model.evaluate([_f(10)])
    assert abs(float(t[0]) - 10 * 2.4) < 1e-5
    assert abs(float(y[0]) + 10 * 2.4 * 1.5) < 1e-5


def test_index_select_takes_rows_of_a_vocabulary_input():
    """NNC's "index select model can select a part from vocabulary"."""
    v, i = Input(), Input(dtype=np.int32)
    model = Model([v, i], [CommandLayer(ops.index_select())(v, i)])
    table, idx = rand([10, 8], seed=1), np.array([1, 0, 5], np.int32)
    model.compile([table, idx])
    assert_close(model.evaluate([table, idx]), table[[1, 0, 5]])


def test_outputs_of_a_nested_model_feed_different_layers():
    """NNC's "extract one output each feed into different feed-forward": a two-output "tiny"
    model's outputs, unpacked (NNC's extract), each go through their own dense."""
    x = Input()
    linear = Dense(1, no_bias=True, name="linear")(x)
    tiny = Model([x], [linear, Activation("sigmoid", name="sigmoid")(linear)], name="tiny")
    i0 = Input()
    o00, o01 = tiny(i0)
    l0, l1 = Dense(1, no_bias=True, name="l0"), Dense(1, no_bias=True, name="l1")
    final = Model([i0], [l0(o00), l1(o01)], name="final")
    final.compile([_f(0)])
    final.set_parameters(
        {
            "t-final-0-tiny-0-linear-0-0": np.array([[2.4]], np.float32),
            "t-final-0-l0-0-0": np.array([[-1.5]], np.float32),
            "t-final-0-l1-0-0": np.array([[1.7]], np.float32),
        }
    )
    t, y = final.evaluate([_f(10)])
    assert abs(float(t[0]) - 10 * 2.4 * -1.5) < 1e-5
    assert abs(float(y[0]) - _sigmoid(10 * 2.4) * 1.7) < 1e-5


def _linear_sigmoid(x):
    return Activation("sigmoid", name="sigmoid")(Dense(1, no_bias=True, name="linear")(x))


def test_a_parameter_layer_is_a_value():
    """NNC's "use parameter for values": sigmoid(2.4 x) plus a free parameter set to -1.5."""
    x = Input()
    out = Add(name="sum")(_linear_sigmoid(x), Parameter((1,), name="value")())
    model = Model([x], [out], name="tiny")
    model.compile([_f(0)])
    assert sorted(model.parameters()) == ["t-tiny-0-linear-0-0", "t-tiny-0-value-0-0"]
    model.set_parameters(
        {"t-tiny-0-linear-0-0": np.array([[2.4]], np.float32), "t-tiny-0-value-0-0": _f(-1.5)}
    )
    assert abs(float(model.evaluate([_f(10)])[0]) - (_sigmoid(24) - 1.5)) < 1e-5


class _ScalarLike(Layer):
    """A ``[1]`` tensor of ``value`` in its input's dtype (NNC's scalar applied to an input)."""

    def __init__(self, value: float, **kw):
        super().__init__(**kw)
        self.value = value

    def build(self, ctx, x):
        cmd = ops.set(shape=(1,), dtype=np.dtype(x.dtype).name, value=self.value)
        return ctx.b.exec(cmd, name=ctx.layer_id(self))


def test_a_scalar_is_a_value_with_its_own_or_an_inputs_type():
    """NNC's "use scalar for values" and "use scalar for values and copy types from other
    inputs": sigmoid(2.4 x) + 1.5, the scalar not a parameter."""
    x = Input()
    own = CommandLayer(ops.set(shape=(1,), value=1.5), name="value")()
    for scalar in (own, _ScalarLike(1.5, name="value")(x)):
        model = Model([x], [Add(name="sum")(_linear_sigmoid(x), scalar)], name="tiny")
        model.compile([_f(0)])
        assert sorted(model.parameters()) == ["t-tiny-0-linear-0-0"]
        model.set_parameters({"t-tiny-0-linear-0-0": np.array([[2.4]], np.float32)})
        assert abs(float(model.evaluate([_f(10)])[0]) - (_sigmoid(24) + 1.5)) < 1e-5
    half = Model([x], [Add()(x, _ScalarLike(1.5)(x))])
    half.compile([np.zeros(1, np.float16)])
    assert half.evaluate([np.ones(1, np.float16)]).dtype == np.float16


def _bottleneck(filters: int, strides: int, projection: bool) -> Model:
    """NNC's ResNet-v1d bottleneck (1x1, 3x3 with the stride, 1x1 x4, avg-pool shortcut)."""
    x = Input()
    shortcut = x
    if projection:
        shortcut = Conv(filters * 4, 1, no_bias=True)(AvgPool((strides,) * 2, strides=strides)(x))
    h = x
    for width, k, s in ((filters, 1, 1), (filters, 3, strides), (filters * 4, 1, 1)):
        h = BatchNorm(momentum=0.9, epsilon=1e-4)(Conv(width, k, strides=s, padding=k // 2)(h))
        h = ReLU()(h) if width == filters else h
    return Model([x], [ReLU()(Add()(h, shortcut))])


def _fpn_rpn(filters=(2, 4, 8, 16), d=8) -> Model:
    """NNC's ResNet-50-v1d + FPN + RPN at one block per stage and narrow widths."""
    x = Input()
    h = x
    for c, s in ((4, 2), (4, 1), (8, 1)):
        h = ReLU()(BatchNorm(epsilon=1e-4)(Conv(c, 3, strides=s, padding=1, no_bias=True)(h)))
    h = MaxPool((3, 3), strides=2, padding=1)(h)
    c = []
    for f, s in zip(filters, (1, 2, 2, 2)):
        h = _bottleneck(f, s, True)(h)
        c.append(h)
    p = [Conv(d, 1)(c[3])]
    for level in (2, 1, 0):
        up = CommandLayer(ops.upsample(scale=(2, 2), mode="bilinear"))(p[0])
        lateral = Conv(d, 1)(c[level])
        p.insert(0, Conv(d, 3, padding=1, no_bias=True)(Add()(lateral, up)))
    p.append(AvgPool((2, 2), strides=2)(p[3]))
    rpn = Conv(18, 1, name="rpn")  # one head shared by the five levels
    return Model([x], [rpn(level) for level in p])


def test_fpn_rpn_has_five_outputs_of_one_shared_head():
    """NNC's "FPN-RPN use cnnp model with multiple outputs": output sizes, from one build of the
    graph (no parameter values, no XLA). NNC's 835x1146 input makes its strided shortcut
    and main path disagree (104 vs 105 rows), which NNC's symbolic compile never checks;
    here the input keeps every stage even."""
    ctx = BuildContext(False)
    outs = _fpn_rpn().build(ctx, ctx.b.input((2, 64, 96, 3), np.float32), nested=False)
    shapes = [o.shape for o in outs]
    assert shapes == [(2, 16, 24, 18), (2, 8, 12, 18), (2, 4, 6, 18), (2, 2, 3, 18), (2, 1, 1, 18)]
    assert [k for k in ctx.params if "rpn" in k] == ["t-rpn-0-0", "t-rpn-0-1"]


def test_pad_then_add():
    """NNC's "pad a tensor with padding": zero padding (0, 2, 2, 0) before, (0, 1, 2, 1) after."""
    x0, x1 = Input(), Input()
    pads = ((0, 0), (2, 1), (2, 2), (0, 1))
    model = Model([x0, x1], [Add()(CommandLayer(ops.pad(pads=pads))(x0), x1)], name="tiny")
    a, b = rand([1, 3, 3, 10], seed=1), np.ones((1, 6, 7, 11), np.float32)
    model.compile([a, b])
    assert_close(model.evaluate([a, b]), np.pad(a, pads) + 1)


def test_outputs_gathered_into_one_tensor_feed_a_dense():
    """NNC's "use variable and move semantics to co-locate input in the same tensor": NNC moves
    two outputs into halves of one variable; fnnc concatenates them."""
    x0, x1 = Input(), Input()
    linear0 = Dense(1, no_bias=True, name="linear")
    both = Concat(axis=-1)(linear0(x0), linear0(x1))
    model = Model([x0, x1], [Dense(1, no_bias=True, name="linear")(both)], name="tiny")
    model.compile([np.zeros((1, 1), np.float32)] * 2)
    model.set_parameters(
        {
            "t-tiny-0-linear-0-0": np.array([[2.4]], np.float32),
            "t-tiny-0-linear-2-0": np.array([[-1.1, 1.2]], np.float32),
        }
    )
    z = model.evaluate([np.array([[10.0]], np.float32), np.array([[3.0]], np.float32)])
    assert abs(float(z[0, 0]) - (-1.1 * 2.4 * 10 + 3 * 2.4 * 1.2)) < 1e-5


def test_a_strided_view_of_an_output_feeds_a_sigmoid():
    """NNC's "use contiguous to make certain tensor contiguous during model inference": the last
    two columns of a [2, 4] dense output (a view in NNC, a slice here) into a sigmoid."""
    x = Input()
    y = Dense(4, no_bias=True, name="linear")(x)
    cols = CommandLayer(ops.slice(start=(0, 2), limit=(2, 4)))(y)
    model = Model([x], [Activation("sigmoid")(cols)], name="tiny")
    model.compile([np.zeros((2, 1), np.float32)])
    model.set_parameters({"t-tiny-0-linear-0-0": _f(2.4, -0.4, 1.2, -3.6).reshape(4, 1)})
    z = model.evaluate([_f(1, -1).reshape(2, 1)])
    assert_close(z, _sigmoid(np.array([[1.2, -3.6], [-1.2, 3.6]])))


def _chunk(shape: tuple[int, ...], axis: int) -> Model:
    """NNC's chunk(2, axis) for inputs of ``shape``: a model whose two outputs are the halves."""
    xi = Input()
    halves = []
    for k in range(2):
        start, limit = [0] * len(shape), list(shape)
        start[axis], limit[axis] = k * shape[axis] // 2, (k + 1) * shape[axis] // 2
        halves.append(CommandLayer(ops.slice(start=tuple(start), limit=tuple(limit)))(xi))
    return Model([xi], halves, name="chunk")


def test_chunks_of_a_tensor_are_separate_outputs():
    """NNC's "chunk a tensor into several smaller ones, variant 1" (axis 1) and "variant 2"
    (axis 0): a two-output chunk model, its outputs unpacked (NNC's extract)."""
    data = _f(1, -1, 2, 3, 4, 5, 6, 7).reshape(2, 4)
    want = {1: [[[1, -1], [4, 5]], [[2, 3], [6, 7]]], 0: [[[1, -1, 2, 3]], [[4, 5, 6, 7]]]}
    for axis in (1, 0):
        x = Input()
        y0, y1 = _chunk(data.shape, axis)(x)
        model = Model([x], [y0, y1], name="tiny")
        model.compile([data])
        assert_close(model.evaluate([data]), [np.array(w, np.float32) for w in want[axis]])


def test_a_debug_callback_sees_an_intermediate_value():
    """NNC's "debug can intercept model execution": a Flax module calling jax.debug.callback,
    brought in with Model.from_flax, sees 0.5 + 0.75 while the model computes
    (0.5 + 0.75) * 1.75 + 2.5."""
    from flax import nnx

    seen = []

    class Tap(nnx.Module):
        def __call__(self, h):
            jax.debug.callback(lambda v: seen.append(float(v[0])), h)
            return h

    a0, a1, a2, a3 = Input(), Input(), Input(), Input()
    tapped = Model.from_flax(Tap())(Add()(a0, a1))
    model = Model([a0, a1, a2, a3], [Add()(Mul()(tapped, a2), a3)])
    data = [_f(0.5), _f(0.75), _f(1.75), _f(2.5)]
    model.compile(data)
    out = model.evaluate(data)
    assert abs(float(out[0]) - ((0.5 + 0.75) * 1.75 + 2.5)) < 1e-5
    assert seen and abs(seen[-1] - 1.25) < 1e-5
