"""NNC's cnnp cases (test/unit/nnc/cnnp.core.tests.c) about training: NNC's step by step
``evaluate``/``backward``/``apply_gradients``, minimizers per parameter, gradient
clipping, copying and merging parameters, new input shapes, LoRA with frozen layers.
Each test names the C case it ports. NNC's ``CMD_SGD_FORWARD(nesterov, rate, scale,
decay, momentum, dampening)`` is ``minimizers.sgd(rate, ...)`` with the same numbers."""

from __future__ import annotations

import warnings

import jax
import numpy as np
import optax
import pytest

from fnnc import ops
from fnnc.models import (
    Activation,
    Add,
    CommandLayer,
    Conv,
    Dense,
    Input,
    Model,
    Mul,
    Parameter,
    Sequential,
    minimizers,
)
from tests.helpers import assert_close, exact_on_cpu, rand
from tests.models.test_nnc_cnnp_cases import _cifar


def _f(*values: float) -> np.ndarray:
    return np.array(values, np.float32)


def _step(model: Model, data, ingrads=None, *, times: int = 1) -> np.ndarray:
    """NNC's evaluate(requires_grad) + backward (``times`` times, accumulating) + apply."""
    out = model.evaluate(data, requires_grad=True)
    for _ in range(times):
        model.backward(ingrads, outgrad=False)
    model.apply_gradients()
    return np.asarray(out)


@pytest.mark.parametrize("accumulate", [False, True])
def test_cifar10_trained_with_evaluate_backward_apply(accumulate):
    """NNC's "evaluate cifar-10 model in multi-stage mode" and "... with gradient accumulated"
    (1, 2 or 3 backward calls per apply): the softmax cross-entropy gradient is taken
    outside the model (softmax - one-hot) and fed to backward."""
    x = rand([1, 31, 31, 3], seed=1)
    model = _cifar(softmax=False)
    rate = 0.00033 if accumulate else 0.001
    model.compile([x], minimizer=minimizers.sgd(rate, decay=0.99, momentum=0.9, dampening=0.9))
    target = (int(np.argmax(model.evaluate([x]))) + 1) % 10
    onehot = np.eye(10, dtype=np.float32)[None, target]
    for i in range(100):
        logits = np.asarray(model.evaluate([x], requires_grad=True), np.float64)
        softmax = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
        times = 1 + (i % 2 == 0 and accumulate) + (i % 6 == 0 and accumulate)
        for _ in range(times):
            model.backward([(softmax - onehot).astype(np.float32)], outgrad=False)
        model.apply_gradients()
    assert int(np.argmax(model.evaluate([x]))) == target


def _uniform(key, shape, dtype):
    return jax.random.uniform(key, shape, dtype, -1.0, 1.0)


def _math(b: float = 1.0) -> Model:
    """NNC's ``(x * a + b + b - f) ** 2``: x a trainable scalar drawn from U(-1, 1), b a
    constant tensor (not a parameter), the square a hand-made L2 loss."""
    xi, bi = Input(), Input()
    x = Parameter((1,), init=_uniform, name="x")
    mul = Model([xi], [Mul()(xi, x())], name="mul")
    add = Model([bi], [Add()(bi, CommandLayer(ops.constant(_f(b)))())], name="add")
    a, fit = Input(), Input()
    diff = CommandLayer(ops.add(q=-1.0))(Sequential([mul, add, add], name="seq")(a), fit)
    return Model([a, fit], [Mul()(diff, diff)])


X = "t-seq-0-mul-0-x-0-0"
DATA = [_f(2), _f(10)]


def test_learn_2x_plus_1_plus_1_is_10():
    """NNC's "learn simple math of 2 * x + 1 + 1 = 10, x = 4": zero output gradients leave the
    model as it is; gradients of one (the default for a scalar) train x to 4."""
    model = _math()
    model.compile(DATA, minimizer=minimizers.sgd(0.1, decay=0.1))
    assert list(model.parameters()) == [X]
    for _ in range(10):
        o = _step(model, DATA)
    assert abs(float(o[0]) - 10) > 1e-5
    model.set_minimizer(minimizers.sgd(0.01))
    zero = [_f(0)]
    for _ in range(10):
        old, o = o, _step(model, DATA, zero)
    assert abs(float(o[0]) - float(old[0])) < 1e-5
    model.set_minimizer(minimizers.sgd(0.01, decay=0.01))
    for _ in range(100):
        o = _step(model, DATA)
    x = float(model.parameters()[X][0])
    model.evaluate(DATA, requires_grad=True)
    da, df = model.backward()  # NNC's outgrads of both inputs; d/dp (x a + 2 - f) ** 2
    assert_close([da, df], [_f(2 * x * (2 * x - 8)), _f(-2 * (2 * x - 8))], rtol=1e-4)
    model.apply_gradients()
    model.set_minimizer(minimizers.sgd(0.001))
    for _ in range(10):
        old, o = o, _step(model, DATA, zero)
    assert abs(float(o[0]) - float(old[0])) < 1e-5
    model.set_minimizer(minimizers.sgd(0.001, decay=0.001))
    for _ in range(1000):
        _step(model, DATA, [_f(1)])
    assert abs(float(model.evaluate(DATA)[0])) < 1e-5
    assert abs(float(model.parameters()[X][0]) - 4) < 1e-3


def test_clipped_gradients_have_norm_at_most_half():
    """NNC's "learn simple math of 2 * x + 1 + 1 = 10, x = 4 and clip grad to max_norm =
    0.5": NNC clips the accumulated gradients before applying them; here
    optax.clip_by_global_norm(0.5) precedes NNC's SGD in the minimizer. |d/dx| =
    |8x - 32| > 24 for x in [-1, 1], so the clipped gradient is exactly -0.5 and a step
    moves x by 0.1 * (0.5 - 0.1 x) (rate 0.1, decay 0.1)."""
    model = _math()
    clip = optax.chain(optax.clip_by_global_norm(0.5), minimizers.sgd(0.1, decay=0.1))
    model.compile(DATA, minimizer=clip)
    for times in (1, 2):  # one backward, then two accumulated
        x = float(model.parameters()[X][0])
        _step(model, DATA, times=times)
        assert_close(model.parameters()[X], _f(x - 0.1 * (-0.5 + 0.1 * x)), rtol=1e-6)


def _train_math() -> tuple[Model, float]:
    model = _math()
    model.compile(DATA, minimizer=minimizers.sgd(0.1, decay=0.1))
    for _ in range(10):
        _step(model, DATA)
    return model, float(model.evaluate(DATA)[0])


def test_parameters_copied_into_a_new_model_give_its_output():
    """NNC's "train a simple math 2 * x + 1 + 1 = 10, x = 4 and copy parameter to a new model
    entirely" (NNC's model_copy is another call of the builder here)."""
    model, o = _train_math()
    other = _math()
    other.compile(DATA, minimizer=minimizers.sgd(0.1, decay=0.1))
    other.set_parameters(model.parameters())
    assert abs(float(other.evaluate(DATA)[0]) - o) < 1e-5
    other.set_parameters({k: np.zeros_like(v) for k, v in other.parameters().items()})
    assert abs(float(other.evaluate(DATA)[0]) - 64) < 1e-5  # (0 + 1 + 1 - 10) ** 2


def test_parameters_merged_with_another_model():
    """NNC's "train a simple math 2 * x + 1 + 1 = 10, x = 4 and merge parameters with a model":
    x set to 1, then 0.6 * x + 0.4 * (the trained model's x)."""
    model, _ = _train_math()
    other = _math()
    other.compile(DATA, minimizer=minimizers.sgd(0.1, decay=0.1))
    other.set_parameters({k: np.ones_like(v) for k, v in other.parameters().items()})
    assert abs(float(other.evaluate(DATA)[0]) - 36) < 1e-5  # (2 + 1 + 1 - 10) ** 2
    trained = model.parameters()
    assert trained[X].shape == (1,)
    mine = other.parameters()
    other.set_parameters({k: 0.6 * mine[k] + 0.4 * trained[k] for k in mine})
    x = float(trained[X][0]) * 0.4 + 0.6
    assert abs(float(other.evaluate(DATA)[0]) - (2 * x + 2 - 10) ** 2) < 1e-5


def _two_x_plus_y() -> Model:
    """NNC's ``(a * x + y - f) ** 2`` with trainable x = 1 ("mul") and y = 2 ("add")."""
    xi, yi = Input(), Input()
    mul = Model([xi], [Mul()(xi, Parameter((1,), init=1.0)())], name="mul")
    add = Model([yi], [Add()(yi, Parameter((1,), init=2.0)())], name="add")
    a, fit = Input(), Input()
    diff = CommandLayer(ops.add(q=-1.0))(Sequential([mul, add], name="seq")(a), fit)
    return Model([a, fit], [Mul()(diff, diff)])


MUL, ADD = ["t-seq-0-mul-0-0-0"], ["t-seq-0-add-0-0-0"]
DATA12 = [_f(2), _f(12)]


def test_learn_2x_plus_y_is_12_one_parameter_at_a_time_converges():
    """NNC's "learn 2 * x + y = 12, first learn x, and then learn y, evaluate convergence": a
    no-op minimizer on one parameter's ids freezes it while the other trains."""
    model = _two_x_plus_y()
    model.compile(DATA12, minimizer=minimizers.sgd(0.1, decay=0.1))
    assert sorted(model.parameters()) == sorted(MUL + ADD)
    model.set_minimizer(minimizers.noop(), params=MUL)
    for _ in range(10):
        o = _step(model, DATA12)
    assert abs(float(o[0]) - 12) > 1e-5
    assert float(model.parameters()[MUL[0]][0]) == 1.0
    model.set_minimizer(minimizers.sgd(0.01, decay=0.01), params=MUL)
    model.set_minimizer(minimizers.noop(), params=ADD)
    y = model.parameters()[ADD[0]]
    old = float(model.evaluate(DATA12)[0])
    for _ in range(10):
        o = _step(model, DATA12)
    assert float(o[0]) < old
    model.set_minimizer(minimizers.sgd(0.001, decay=0.001), params=MUL)
    for _ in range(1000):
        o = _step(model, DATA12)
    assert abs(float(o[0])) < 1e-5
    assert np.array_equal(model.parameters()[ADD[0]], y)


def test_learn_2x_plus_y_is_12_one_parameter_at_a_time_learns_each():
    """NNC's "learn 2 * x + y = 12, first learn x, and then learn y, evaluate learn-ability":
    y alone reaches 10 (x = 1); reset to 2, x alone reaches 5."""
    model = _two_x_plus_y()
    model.compile(DATA12, minimizer=minimizers.sgd(0.01, decay=0.01))
    model.set_minimizer(minimizers.noop(), params=MUL)
    for _ in range(1000):
        o = _step(model, DATA12)
    assert abs(float(o[0])) < 5e-3
    assert abs(float(model.parameters()[ADD[0]][0]) - 10) < 1e-1
    model.set_parameters({ADD[0]: _f(2)})
    model.set_minimizer(minimizers.sgd(0.01, decay=0.01), params=MUL)
    model.set_minimizer(minimizers.noop(), params=ADD)
    for _ in range(1000):
        o = _step(model, DATA12)
    assert abs(float(o[0])) < 5e-3
    assert abs(float(model.parameters()[MUL[0]][0]) - 5) < 1e-2


def test_a_compiled_model_takes_other_batch_sizes_with_its_weights():
    """NNC's "a compiled model absorbs a new model with slightly different configuration": NNC
    absorbs a model built for a new batch size; fnnc recompiles for the new shape."""
    model = Sequential([Dense(2), Dense(2), Dense(1)], name="multi_layer")
    x = rand([2, 2], seed=1)
    model.compile([x], minimizer=minimizers.sgd(0.01, decay=0.01))
    y = np.asarray(model.evaluate([x], requires_grad=True))
    assert_close(model.evaluate([x[:1]], requires_grad=True), y[:1])
    large = np.concatenate([x, rand([2, 2], seed=2)])
    assert_close(np.asarray(model.evaluate([large], requires_grad=True))[:2], y)


def test_a_linear_layers_weight_is_reused_after_it():
    """NNC's "use linear model's parameter as the input for more computation": ``(x w + b) w``
    fitted to 1 -> 3 and 2 -> 4 (w = 1, b = 2). NNC takes the weight of a dense; fnnc has
    no handle on a layer's parameter as a model value, so the dense is a gemm of
    Parameter layers, and the weight is applied twice."""
    w, b = Parameter((1, 1), init=1.4, name="w"), Parameter((1,), name="b")
    x, t = Input(), Input()
    linear = CommandLayer(ops.gemm(transpose_b=True))(x, w(), b())
    out = CommandLayer(ops.gemm())(linear, w())
    diff = CommandLayer(ops.add(q=-1.0))(out, t)
    model = Model([x, t], [Mul()(diff, diff)])
    pairs = [[np.array([[1.0]], np.float32), np.array([[3.0]], np.float32)]]
    pairs.append([np.array([[2.0]], np.float32), np.array([[4.0]], np.float32)])
    model.compile(pairs[0], minimizer=minimizers.sgd(0.05))
    for i in range(1000):
        if i == 100:  # NNC sets the minimizer at every step; it changes here only
            model.set_minimizer(minimizers.sgd(0.01))
        _step(model, pairs[i % 2])
    assert abs(float(model.evaluate(pairs[0]).reshape(()))) < 1e-2


def _lora(checkpointing: bool) -> tuple[Model, list[Dense]]:
    """NNC's LoRA on a frozen 10x10 dense: ``linear(x) + up(down(x))`` in a model that is
    not trainable, down and up marked trainable, linear inheriting."""
    x = Input()
    linear = Dense(10, no_bias=True, name="linear")
    down = Dense(2, no_bias=True, name="down", is_trainable=True)
    up = Dense(10, no_bias=True, name="up", is_trainable=True)
    out = Add(name="sum")(linear(x), up(down(x)))
    model = Model([x], [out], name="tiny", is_trainable=False)
    model.set_gradient_checkpointing(checkpointing)
    return model, [linear, down, up]


def _nnc_nesterov_sgd(rate: float) -> optax.GradientTransformation:
    """NNC's ``CMD_SGD_FORWARD(1, rate, 1, 0.1, 0, 0)``: Nesterov without momentum, whose
    rule drops the decay (fnnc warns that it does)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return minimizers.sgd(rate, nesterov=True, decay=0.1)


@pytest.mark.parametrize("checkpointing", [False, True])
def test_lora_on_a_frozen_dense_fits_the_target(checkpointing):
    """NNC's "LoRA fine-tuning GEMM set is_trainable to false" and "... with gradient
    checkpointing": from identity weights and a zero up-projection, 10 steps of the
    MSE loss fit 10 - i; the frozen dense keeps its weights."""
    model, (linear, down, up) = _lora(checkpointing)
    x = np.arange(10, dtype=np.float32)
    target = 10 - x
    model.compile([x], loss="mse", minimizer=_nnc_nesterov_sgd(0.01))
    eye = np.eye(10, dtype=np.float32)
    model.set_parameters({"t-tiny-0-linear-0-0": eye, "t-tiny-0-up-0-0": np.zeros((10, 2))})
    for _ in range(10):
        model.fit([x], [target])
    assert_close(model.evaluate([x]), target, rtol=0, atol=1e-2)
    assert model.is_trainable is False and linear.is_trainable is None
    assert down.is_trainable is True and up.is_trainable is True
    assert np.array_equal(model.parameters()["t-tiny-0-linear-0-0"], eye)


def test_lora_on_a_frozen_convolution_trains_only_the_adapter():
    """NNC's "LoRA fine-tuning convolution set is_trainable to false": one evaluate, backward
    and apply change the down and up convolutions and leave the frozen one."""
    x = Input()
    conv = Conv(8, 3, padding=1, name="conv")
    down = Conv(2, 3, padding=1, name="down", is_trainable=True)
    up = Conv(8, 1, name="up", is_trainable=True)
    model = Model([x], [Add(name="sum")(conv(x), up(down(x)))], name="tiny", is_trainable=False)
    data = rand([1, 5, 5, 4])
    model.compile([data], minimizer=minimizers.sgd(0.1))
    before = model.parameters()
    _step(model, [data], [np.ones((1, 5, 5, 8), np.float32)])
    after = model.parameters()
    changed = sorted(k for k in before if not np.array_equal(before[k], after[k]))
    assert changed == [f"t-tiny-0-{n}-0-{i}" for n in ("down", "up") for i in (0, 1)]


def test_lora_on_a_frozen_gelu_mlp_with_checkpointing_fits_the_target():
    """NNC's "LoRA fine-tuning MLP with GELU, set is_trainable to false and with gradient
    checkpointing": ``fc3(fc1(x) * gelu(fc2(x)))`` with an adapter beside each frozen
    dense; 100 steps fit 5 - i within 0.1."""

    def dense(n, name, trainable=None):
        return Dense(n, no_bias=True, name=name, is_trainable=trainable)

    def adapted(h, name, n):
        lora = dense(n, f"up_{name}", True)(dense(2, f"down_{name}", True)(h))
        return Add(name=f"sum_{name}")(dense(n, name)(h), lora)

    x = Input()
    gated = Mul(name="mul_fc12")(
        adapted(x, "fc1", 10), Activation("gelu", name="gelu_fc2")(adapted(x, "fc2", 10))
    )
    model = Model([x], [adapted(gated, "fc3", 5)], name="tiny", is_trainable=False)
    model.set_gradient_checkpointing(True)
    xs = np.arange(10, dtype=np.float32)
    target = 5 - np.arange(5, dtype=np.float32)
    model.compile([xs], loss="mse", minimizer=_nnc_nesterov_sgd(0.001))
    eye = np.eye(10, dtype=np.float32)
    frozen = {"t-tiny-0-fc1-0-0": eye, "t-tiny-0-fc2-0-0": eye, "t-tiny-0-fc3-0-0": eye[:5]}
    zeros = {f"t-tiny-0-up_fc{i}-0-0": np.zeros((10 if i < 3 else 5, 2)) for i in (1, 2, 3)}
    model.set_parameters({**frozen, **zeros})
    for _ in range(100):
        model.fit([xs], [target])
    assert_close(model.evaluate([xs]), target, rtol=0, atol=1e-1)
    params = model.parameters()
    for k, v in frozen.items():
        assert np.array_equal(params[k], v)


def _lora_model(name: str, with_lora: bool) -> Model:
    x = Input()
    out = Dense(10, no_bias=True, name="linear")(x)
    if with_lora:
        lora = Dense(10, no_bias=True, name="up")(Dense(2, no_bias=True, name="down")(x))
        out = Add(name="sum")(out, lora)
    return Model([x], [out], name=name, is_trainable=False)


def test_two_models_share_parameters():
    """NNC's "two models share the same parameters" (matched in order: the models' names, and
    so the ids, differ) and "two models, one with LoRA, one with not, share the same
    parameters" (matched by id; the LoRA up-projection is zero)."""
    x = rand([10], seed=1)
    tiny0, tiny1 = _lora_model("tiny0", True), _lora_model("tiny1", True)
    for model in (tiny0, tiny1):
        model.compile([x])
    ours, theirs = sorted(tiny1.parameters()), sorted(tiny0.parameters())
    tiny1.set_parameters(dict(zip(ours, (tiny0.parameters()[k] for k in theirs))))
    np.testing.assert_array_equal(tiny1.evaluate([x]), tiny0.evaluate([x]))
    plain, lora = _lora_model("tiny", False), _lora_model("tiny", True)
    for model in (plain, lora):
        model.compile([x])
    lora.set_parameters({"t-tiny-0-up-0-0": np.zeros((10, 2)), **plain.parameters()})
    # two different programs (tiny0 and tiny1 above are one program under two names): on
    # a GPU, XLA may merge the LoRA model's two dots of x into one and sum in another order
    assert_close(lora.evaluate([x]), plain.evaluate([x]), *exact_on_cpu(1e-5, 1e-6))
