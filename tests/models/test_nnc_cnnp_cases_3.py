"""NNC's cnnp cases (test/unit/nnc/cnnp.core.tests.c) that test_nnc_cnnp_cases.py,
test_nnc_cnnp_cases_2.py and test_nnc_cases.py leave out or port loosely: the embedding
model, NNC's move into a view of another tensor (``write_view`` here, since fnnc's
graphs are pure: the written tensor is a new value), and ``ccv_cnnp_model_copy``
(``copy.deepcopy`` here), and a dense shared by two inputs trained with a hand-made L2
loss. Each test names the C case it ports."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from fnnc import ops
from fnnc.models import (
    Add,
    CommandLayer,
    Dense,
    Embedding,
    Input,
    Model,
    Mul,
    Parameter,
    Sequential,
    minimizers,
)
from tests.helpers import assert_close, rand
from tests.models.test_nnc_cnnp_cases_2 import DATA, _math, _step


def _f(*values: float) -> np.ndarray:
    return np.array(values, np.float32)


def test_embedding_rows_are_rows_of_its_table():
    """NNC's "embedding model can generate vector embedding": a [10, 8] float32 embedding
    on int32 indices (1, 0, 5) gives rows 1, 0 and 5 of its weight. Then one SGD step
    (rate 1) on indices (5, 2, 5) with output gradients of one moves row 2 by -1, row 5
    (picked twice) by -2, and no other row."""
    x = Input(dtype=np.int32)
    model = Model([x], [Embedding(10, 8)(x)])
    idx = np.array([1, 0, 5], np.int32)
    model.compile([idx], minimizer=minimizers.sgd(1.0))
    (pid,) = model.parameters()  # NNC's CCV_CNNP_PARAMETER_SELECT_WEIGHT: the only one
    table = np.asarray(model.parameters()[pid])
    assert table.shape == (10, 8)  # NNC's [vocabulary, dimension]
    y = np.asarray(model.evaluate([idx]))
    assert y.shape == (3, 8) and y.dtype == np.float32
    assert_close(y, table[[1, 0, 5]], rtol=0, atol=1e-5)

    twice = np.array([5, 2, 5], np.int32)
    model.evaluate([twice], requires_grad=True)
    model.backward([np.ones((3, 8), np.float32)], outgrads=False)
    model.apply_gradients()
    want = table.copy()
    want[2] -= 1.0
    want[5] -= 2.0
    assert_close(model.parameters()[pid], want, rtol=0, atol=1e-6)


def test_move_writes_a_dense_output_into_the_free_slot_of_its_input():
    """NNC's "use move semantics to write output to the empty space of the input tensor":
    x = (10, 0); a no-bias dense (weight 2.4) on the view x[0:1]; its output moved into
    the view x[1:1] and that view added to a second input 3: z = 2.4 * 10 + 3, and x
    afterwards holds (10, 24). NNC writes x in place; here the written x is a second
    output (``write_view``), and the moved view is read from it."""
    xi, yi = Input(), Input()
    first = CommandLayer(ops.slice(start=(0,), limit=(1,)), name="first reshape")(xi)
    out1 = Dense(1, no_bias=True, name="linear")(first)
    moved_x = CommandLayer(ops.write_view(shape=(1,), base=1, stride=(1,)), name="move")(xi, out1)
    second = CommandLayer(ops.slice(start=(1,), limit=(2,)), name="second reshape")(moved_x)
    z = Add(name="sum")(second, yi)
    model = Model([xi, yi], [z, moved_x], name="tiny", is_trainable=False)
    model.compile([np.zeros(2, np.float32), np.zeros(1, np.float32)])
    assert sorted(model.parameters()) == ["t-tiny-0-linear-0-0"]
    model.set_parameters({"t-tiny-0-linear-0-0": np.array([[2.4]], np.float32)})
    z_value, x_after = model.evaluate([_f(10, 0), _f(3)])
    assert abs(float(z_value[0]) - (2.4 * 10 + 3)) < 1e-5
    assert_close(x_after, _f(10, 2.4 * 10), rtol=0, atol=1e-5)


def test_two_outputs_moved_into_one_variable_feed_a_dense():
    """NNC's "use variable and move semantics to co-locate input in the same tensor", kept
    close to NNC: a [2] variable (zeros here), one shared dense (weight 2.4) on each of
    two inputs, its outputs moved into var[0:1] and var[1:2], and a second dense (weight
    (-1.1, 1.2)) on the variable: -1.1 * 2.4 * 10 + 3 * 2.4 * 1.2. NNC orders the moves
    before the dense with add_dependencies; the chain of writes orders them here."""
    x0, x1 = Input(), Input()
    linear0 = Dense(1, no_bias=True, name="linear")
    var = CommandLayer(ops.set(shape=(2,), value=0.0), name="var")()
    var = CommandLayer(ops.write_view(shape=(1,), base=0, stride=(1,)), name="move")(
        var, linear0(x0)
    )
    var = CommandLayer(ops.write_view(shape=(1,), base=1, stride=(1,)), name="move")(
        var, linear0(x1)
    )
    model = Model([x0, x1], [Dense(1, no_bias=True, name="linear")(var)], name="tiny")
    model.compile([np.zeros(1, np.float32)] * 2)
    params = model.parameters()
    assert len(params) == 2  # one shared weight, one weight of the second dense
    by_shape = {tuple(v.shape): k for k, v in params.items()}
    model.set_parameters(
        {by_shape[(1, 1)]: np.array([[2.4]], np.float32), by_shape[(1, 2)]: _f(-1.1, 1.2)[None]}
    )
    z = model.evaluate([_f(10), _f(3)])
    assert abs(float(z[0]) - (-1.1 * 2.4 * 10 + 3 * 2.4 * 1.2)) < 1e-5


def _multi_layer() -> Model:
    return Sequential([Dense(2), Dense(2), Dense(1)], name="multi_layer")


def test_a_model_copied_before_compiling_has_the_same_ids_and_its_own_parameters():
    """NNC's ``ccv_cnnp_model_copy`` as "compile simple cifar-10 model" uses it (the copy
    is what gets compiled): the copy has the original's parameter ids, takes its values
    and then gives its output, and training the copy leaves the original as it was."""
    x = rand([2, 2], seed=1)
    original = _multi_layer()
    copied = copy.deepcopy(original)
    original.compile([x], loss="mse", minimizer=minimizers.sgd(0.1))
    copied.compile([x], loss="mse", minimizer=minimizers.sgd(0.1))
    assert sorted(copied.parameters()) == sorted(original.parameters())
    copied.set_parameters(original.parameters())
    want = np.asarray(original.evaluate([x]))
    np.testing.assert_array_equal(copied.evaluate([x]), want)
    before = original.parameters()
    for _ in range(3):
        copied.fit([x], [np.full((2, 1), 5.0, np.float32)])
    after = original.parameters()
    assert all(np.array_equal(before[k], after[k]) for k in before)
    np.testing.assert_array_equal(original.evaluate([x]), want)
    assert not np.array_equal(np.asarray(copied.evaluate([x])), want)


def test_a_trained_model_copied_takes_its_parameters_and_gives_its_output():
    """NNC's "train a simple math 2 * x + 1 + 1 = 10, x = 4 and copy parameter to a new
    model entirely", its last part: final3 = ccv_cnnp_model_copy(final) of the trained
    model, its parameters set from final, gives final's output."""
    model = _math()
    model.compile(DATA, minimizer=minimizers.sgd(0.1, decay=0.1))
    for _ in range(10):
        _step(model, DATA)
    o_final = float(model.evaluate(DATA)[0])
    copied = copy.deepcopy(model)
    copied.compile(DATA, minimizer=minimizers.sgd(0.1, decay=0.1))
    copied.set_parameters(model.parameters())
    assert abs(float(copied.evaluate(DATA)[0]) - o_final) < 1e-5


def test_zero_output_gradients_give_zero_input_gradients():
    """NNC's "learn simple math of 2 * x + 1 + 1 = 10, x = 4", the phase with ingrad 0 and
    outgrads for both inputs: ``(x a + 1 + 1 - f) ** 2`` backpropagated from 0 gives
    zero gradients for a and f and leaves x where it was; from the default (one) it
    gives 2 x (x a + 2 - f) and -2 (x a + 2 - f)."""
    a_in = Input()
    x = Parameter((1,), init=0.5, name="x")
    mul = Model([a_in], [CommandLayer(ops.ewprod())(a_in, x())], name="mul")
    b_in = Input()
    one = CommandLayer(ops.constant(_f(1)))()
    add = Model([b_in], [CommandLayer(ops.ewsum())(b_in, one)], name="add")
    a, f = Input(), Input()
    diff = CommandLayer(ops.add(q=-1.0))(Sequential([mul, add, add], name="seq")(a), f)
    model = Model([a, f], [CommandLayer(ops.ewprod())(diff, diff)])
    data = [_f(2), _f(10)]
    model.compile(data, minimizer=minimizers.sgd(0.01))
    (pid,) = model.parameters()
    xv = float(model.parameters()[pid][0])
    model.evaluate(data, requires_grad=True)
    da, df = model.backward([_f(0)])
    assert_close([da, df], [_f(0), _f(0)], rtol=0, atol=0)
    model.apply_gradients()
    assert float(model.parameters()[pid][0]) == xv
    model.evaluate(data, requires_grad=True)
    da, df = model.backward()
    r = 2 * xv + 2 - 10
    assert_close([da, df], [_f(2 * xv * r), _f(-2 * r)], rtol=1e-5)


def test_a_dense_weight_as_the_input_for_more_computation():
    """NNC's "use linear model's parameter as the input for more computation", as NNC
    writes it: ``(x w + b) w`` where the second w is ``linear.parameter(0)``, the dense's
    own weight (ccv_cnnp_model_parameters as an input); the step's gradient adds both
    uses (jax.grad of the closed form), no parameter is added, and training on
    1 -> 3, 2 -> 4 converges as NNC's test requires (w = 1, b = 2 is a solution)."""
    import jax

    x, t = Input(), Input()
    linear = Dense(1, name="linear")
    out = CommandLayer(ops.gemm())(linear(x), linear.parameter(0))
    diff = CommandLayer(ops.add(q=-1.0))(out, t)
    model = Model([x, t], [CommandLayer(ops.mul())(diff, diff)])
    pairs = [[_f(1.0).reshape(1, 1), _f(3.0).reshape(1, 1)]]
    pairs.append([_f(2.0).reshape(1, 1), _f(4.0).reshape(1, 1)])
    model.compile(pairs[0], minimizer=minimizers.sgd(0.05))
    assert sorted(model.parameters()) == ["t-linear-0-0", "t-linear-0-1"]
    model.set_parameters({"t-linear-0-0": _f(1.4).reshape(1, 1), "t-linear-0-1": _f(0.0)})
    model.evaluate(pairs[0], requires_grad=True)
    model.backward(None, outgrad=False)
    got = model.engine.grads  # what apply_gradients will apply
    loss = lambda w, b: ((1.0 * w + b) * w - 3.0) ** 2
    dw, db = jax.grad(loss, argnums=(0, 1))(1.4, 0.0)
    assert_close(np.ravel(got["t-linear-0-0"]), np.float32([dw]), rtol=1e-5)
    assert_close(np.ravel(got["t-linear-0-1"]), np.float32([db]), rtol=1e-5)
    for i in range(1000):
        if i == 100:
            model.set_minimizer(minimizers.sgd(0.01))
        _step(model, pairs[i % 2])
    assert abs(float(np.ravel(model.evaluate(pairs[0]))[0])) < 1e-2


def test_a_parameter_reference_says_what_is_wrong():
    """A layer not applied yet, a negative index and an index the layer does not have
    are ModelErrors naming the layer."""
    import pytest

    from fnnc.errors import ModelError

    dense = Dense(2, name="d")
    with pytest.raises(
        ModelError, match=r"Dense\('d'\)\.parameter\(0\): the layer was not applied"
    ):
        dense.parameter(0)
    x = Input()
    y = dense(x)
    with pytest.raises(ModelError, match="index=-1"):
        dense.parameter(-1)
    model = Model([x], [CommandLayer(ops.add())(y, dense.parameter(5))])
    with pytest.raises(ModelError, match=r"Dense\('d'\) has no parameter 5 \(it has \[0, 1\]\)"):
        model.compile([np.ones((1, 3), np.float32)])


@pytest.fixture(scope="module")
def shared_l2():
    """NNC's model for both "train model with share weights and L2 loss" cases: one dense
    (with bias) applied to two inputs, ``(dense(a0) - b0) ** 2 + (dense(a1) - b1) ** 2``
    written by hand (``CMD_ADD_FORWARD(1, -1)`` then ``CMD_EWPROD_FORWARD``), the output
    itself the loss (``CMD_NOOP``), trained on a = (1, 3), b = (2, 3) as NNC trains it:
    10 fits of SGD(0.1, decay 0.1), 100 of SGD(0.01, decay 0.01), 1000 of SGD(0.001,
    decay 0.001). It fits w a + bias = b: w = 0.5, bias = 1.5."""
    a0, a1, f0, f1 = Input(), Input(), Input(), Input()
    dense = Dense(1)
    d0 = CommandLayer(ops.add(p=1.0, q=-1.0))(dense(a0), f0)
    d1 = CommandLayer(ops.add(p=1.0, q=-1.0))(dense(a1), f1)
    final = Model([a0, a1, f0, f1], [Add()(Mul()(d0, d0), Mul()(d1, d1))])
    data = [_f(1).reshape(1, 1), _f(3).reshape(1, 1), _f(2).reshape(1, 1), _f(3).reshape(1, 1)]
    final.compile(data, minimizer=minimizers.sgd(0.1, decay=0.1))
    for rate, fits in ((0.1, 10), (0.01, 100), (0.001, 1000)):
        if rate != 0.1:
            final.set_minimizer(minimizers.sgd(rate, decay=rate))
        for _ in range(fits):
            final.fit(data)
    return final


def _one(*values: float) -> list[np.ndarray]:
    return [_f(v).reshape(1, 1) for v in values]


def test_train_a_shared_dense_with_a_hand_made_l2_loss(shared_l2):
    """NNC's "train model with share weights and L2 loss": after training, a = (2, 2),
    b = (2, 3) give 0.5 (diffs of 0.5 and -0.5, squared and summed), within 2e-2."""
    o = shared_l2.evaluate(_one(2, 2, 2, 3))
    assert abs(float(np.asarray(o).ravel()[0]) - 0.5) < 2e-2


def test_train_a_shared_dense_with_a_hand_made_l2_loss_and_check_its_gradients(shared_l2):
    """NNC's "train model with share weights and L2 loss and check out gradients": w and
    bias read back through the model (all zeros give 2 bias^2, a = 1 and b = 0 give
    2 (w + bias)^2), then the input gradients of a = (2, 2), b = (2, 3) for an output
    gradient of 1 are NNC's closed forms: da_i = 2 w (w a_i + bias - b_i), db_i =
    -2 (w a_i + bias - b_i), within 1e-5."""
    bias = np.sqrt(float(np.asarray(shared_l2.evaluate(_one(0, 0, 0, 0))).ravel()[0]) * 0.5)
    w = np.sqrt(float(np.asarray(shared_l2.evaluate(_one(1, 1, 0, 0))).ravel()[0]) * 0.5) - bias
    shared_l2.evaluate(_one(2, 2, 2, 3), is_test=False, requires_grad=True)
    da0, da1, db0, db1 = shared_l2.backward([np.ones((1, 1), np.float32)])
    want = [2 * w * (w * 2 + bias - 2), 2 * w * (w * 2 + bias - 3)]
    want += [-2 * (w * 2 + bias - 2), -2 * (w * 2 + bias - 3)]
    got = [float(np.asarray(g).ravel()[0]) for g in (da0, da1, db0, db1)]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
