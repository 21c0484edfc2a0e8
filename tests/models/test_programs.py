"""The engine's typed program records: positional layouts match the compiled graphs."""

from __future__ import annotations

import numpy as np
import optax
import pytest

from fnnc import ops
from fnnc.errors import ModelError
from fnnc.models import (
    BatchNorm,
    BuildContext,
    Dense,
    Dropout,
    Input,
    Layer,
    Model,
    ReLU,
    Sequential,
    minimizers,
)
from fnnc.models.programs import ApplyProgram, FitProgram, ForwardProgram
from fnnc.models.residuals import ResidualGradient
from tests.helpers import rand


def _model():
    x = Input()
    h = Dropout(0.2, name="drop")(ReLU(name="r")(BatchNorm(name="bn")(Dense(8, name="h")(x))))
    return Model([x], [Dense(3, name="out", is_trainable=False)(h)])


def _programs(model, kind):
    return [p for k, p in model.engine._programs.items() if k[0] == kind]


def _feed_names(feed):
    inputs = [f"input[{i}]" for i in range(feed.n_inputs)]
    return [*inputs, *feed.params, *(f"key[{i}]" for i in range(feed.n_keys))]


def test_every_program_kind_is_a_record_whose_layout_names_its_graph_inputs():
    model = _model()
    x, y = rand([6, 4]), (np.arange(6) % 3).astype(np.int32)
    model.compile([x], loss="softmax_crossentropy", minimizer=optax.adam(1e-3))
    model.fit([x], [y])
    model.evaluate([x], is_test=False, requires_grad=True)
    model.backward([np.ones((6, 3), np.float32)])
    model.apply_gradients()

    (fit,) = _programs(model, "fit")
    assert isinstance(fit, FitProgram)
    assert fit.params == ("t-h-0-0", "t-h-0-1", "t-bn-0-0", "t-bn-0-1")
    # Adam over the parameter dict: one count, mu and nu per parameter, then its float
    # hyper-parameters as inputs (eps, eps_root, -learning rate), so a new learning rate
    # compiles nothing
    assert fit.train.n_params == 4 and fit.train.n_state == 1 + 2 * 4 + 3
    assert fit.updates == ("r-bn-0-0", "r-bn-0-1")
    assert "t-out-0-0" in fit.feed.params and fit.feed.n_keys == 1
    state = [f"opt_state[{i}]" for i in range(9)] + [f"hyper[{i}]" for i in range(3)]
    assert list(fit.names) == [*fit.params, *state, *_feed_names(fit.feed), "target[0]"]
    n_out = fit.train.n_params + fit.train.n_state + 1 + len(fit.updates)
    assert len(fit.program.graph.outputs) == n_out

    (fwd,) = _programs(model, "evaluate")
    assert isinstance(fwd, ForwardProgram)
    assert list(fwd.names) == _feed_names(fwd.feed)
    assert fwd.n_outputs == 1 and fwd.updates == fit.updates

    (grad,) = _programs(model, "backward")
    assert isinstance(grad, ResidualGradient)  # the forward's residuals, not a re-run
    assert grad.params == fit.params and grad.out_shapes == ((6, 3),)
    assert grad.names[-1] == "df[0]"
    assert len(grad.program.graph.outputs) == len(grad.params) + 1  # + the input's gradient

    (apply,) = _programs(model, "apply")
    assert isinstance(apply, ApplyProgram)
    assert apply.params == fit.params and apply.n_state == fit.train.n_state
    grads = [f"grad[{p}]" for p in apply.params]
    assert list(apply.names) == [*grads, *state[: apply.n_state], *apply.params]


def test_fit_program_layout_follows_the_trainable_set():
    x = Input()
    model = Model([x], [Dense(3, name="out")(Dense(8, name="hidden")(x))])
    data, y = rand([4, 5]), np.zeros((4,), np.int32)
    model.compile([data], loss="softmax_crossentropy", minimizer=optax.sgd(0.1))
    model.fit([data], [y])
    model.set_minimizer(minimizers.noop(), params=["t-hidden-0-0"])
    model.fit([data], [y])
    first, second = _programs(model, "fit")
    assert first.params == ("t-hidden-0-0", "t-hidden-0-1", "t-out-0-0", "t-out-0-1")
    assert second.params == ("t-hidden-0-1", "t-out-0-0", "t-out-0-1")
    assert second.feed.params == ("t-hidden-0-0",)


def test_backward_checks_the_number_of_output_gradients():
    model = Sequential([Dense(2, name="d")])
    x = rand([3, 4])
    model.compile([x], minimizer=optax.sgd(0.1))
    model.evaluate([x], requires_grad=True)
    with pytest.raises(ModelError, match="1 outputs, got 2 ingrads"):
        model.backward([np.ones((3, 2), np.float32)] * 2)


class _SneakyInput(Layer):
    def build(self, ctx: BuildContext, x):
        extra = ctx.b.input(x.shape, x.dtype, name="sneaky")
        return ctx.b.exec(ops.ewsum(), x, extra)


def test_a_layer_making_its_own_graph_input_is_named():
    model = Sequential([_SneakyInput()])
    x = rand([2, 3])
    model.compile([x])
    with pytest.raises(ModelError, match="sneaky"):
        model.evaluate([x])


def test_build_context_pushes_every_named_model_on_the_id_stack():
    # NNC names the outermost model too when it has a name (prefix=False changes nothing)
    outer, inner, leaf = Layer(name="outer"), Layer(name="inner"), Layer(name="w")
    ctx = BuildContext(training=False)
    with ctx.inside(outer, prefix=False), ctx.inside(inner):
        ctx.param(leaf, 0, (2,), lambda key, shape, dtype: np.zeros(shape, dtype))
    assert list(ctx.params) == ["t-outer-0-inner-0-w-0-0"]
    assert ctx.params["t-outer-0-inner-0-w-0-0"].owners == (outer, inner, leaf)
    assert ctx.layer_id(Layer(name="next")) == "next"  # both scopes left; numbers nothing
