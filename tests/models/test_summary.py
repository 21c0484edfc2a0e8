"""model.summary() and repr(model): rows checked against the compiled model's own
parameters (ids, shapes, sizes, bytes), closed-form output shapes, and Flax's state."""

from __future__ import annotations

import numpy as np
import optax
import pytest
from flax import nnx

from fnnc.errors import ModelError
from fnnc.models import Conv, Dense, Flatten, Input, MaxPool, Model, ReLU, Sequential, minimizers

RNG = np.random.default_rng(0)
IMAGES = RNG.standard_normal((32, 8, 8, 1)).astype(np.float32)


def readme_model() -> Model:
    """The README's tour model, compiled as there."""
    model = Sequential(
        [Conv(16, 3, name="conv"), ReLU(), MaxPool(), Flatten(), Dense(10, name="logits")]
    )
    model.compile(IMAGES, loss="softmax_crossentropy", minimizer=minimizers.adam(1e-3))
    return model


def cells(text: str) -> list[list[str]]:
    return [line.split() for line in text.splitlines()]


def test_summary_of_the_readme_model_lists_layers_shapes_ids_counts_and_bytes():
    model = readme_model()
    printed: list[str] = []
    text = model.summary(print_fn=printed.append)
    assert printed == [text]
    rows = cells(text)
    assert rows[0] == ["Model:", "1", "input,", "1", "output"]
    assert rows[1] == ["layer", "output", "parameter", "type", "count", "bytes"]
    # output shapes: 3x3 convolution keeping 8x8 (NNC's default padding for Conv(16, 3)),
    # 2x2 max pooling, flatten 4*4*16, dense 10 (the last one is what evaluate gives)
    assert [r[:2] for r in rows[2:] if not r[0].startswith("t-")] == [
        ["input[0]", "f32[32,8,8,1]"],
        ["Conv('conv')", "f32[32,8,8,16]"],
        ["relu", "f32[32,8,8,16]"],
        ["MaxPool", "f32[32,4,4,16]"],
        ["Flatten", "f32[32,256]"],
        ["Dense('logits')", "f32[32,10]"],
        ["total:", "2730"],
    ]
    assert model.evaluate(IMAGES).shape == (32, 10)
    params = model.parameters()
    listed = {}
    for r in rows[2:-1]:
        pid, typ, count, nbytes = r[-4:] if len(r) >= 4 and r[-4].startswith("t-") else [None] * 4
        if pid is not None:
            listed[pid] = (typ, int(count), int(nbytes))
    assert listed.keys() == params.keys()
    for pid, value in params.items():
        shape = ",".join(map(str, value.shape))
        assert listed[pid] == (f"f32[{shape}]", value.size, value.nbytes)
    total = sum(v.size for v in params.values())
    assert rows[-1][:4] == ["total:", str(total), "parameters", f"({total}"]
    assert rows[-1][-2:] == [str(sum(v.nbytes for v in params.values())), "bytes"]


def test_repr_says_what_the_model_is_before_and_after_compile():
    x = Input()
    model = Model(x, Dense(2, name="out")(ReLU()(Dense(4, name="hidden")(x))), name="mlp")
    assert repr(model) == "Model('mlp', 1 in, 1 out, 3 layer calls, not compiled)"
    model.compile(np.zeros((8, 3), np.float32), loss="mse", minimizer=optax.sgd(0.1))
    n = sum(v.size for v in model.parameters().values())
    assert n == 3 * 4 + 4 + 4 * 2 + 2
    assert repr(model) == (
        f"Model('mlp', 1 in, 1 out, 3 layer calls, inputs f32[8,3], {n} parameters, loss mse)"
    )


class FlaxNet(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.fc1 = nnx.Linear(5, 4, rngs=rngs)
        self.bn = nnx.BatchNorm(4, rngs=rngs)
        self.fc2 = nnx.Linear(4, 3, rngs=rngs)

    def __call__(self, x):
        return self.fc2(nnx.relu(self.bn(self.fc1(x))))


def test_summary_of_a_from_flax_model_names_flax_paths_and_counts_its_state():
    module = FlaxNet(nnx.Rngs(0))
    model = Model.from_flax(module, name="net")
    model.compile(np.zeros((8, 5), np.float32), loss="mse", minimizer=optax.sgd(0.1))
    text = model.summary(print_fn=None)
    rows = cells(text)
    assert rows[2] == ["input[0]", "f32[8,5]"]
    assert rows[3][:2] == ["FlaxLayer('net')", "f32[8,3]"]
    # the oracle: Flax's own state of the module, by path
    flat = {
        ".".join(map(str, path)): np.asarray(v.get_value())
        for path, v in nnx.to_flat_state(nnx.state(module, nnx.Not(nnx.RngState)))
    }
    paths = model.parameter_paths()
    found = {}
    for r in rows[3:-1]:
        pid, path, typ, count, nbytes = r[-5:]
        found[pid] = (path.strip("()"), typ, int(count), int(nbytes))
    assert found.keys() == paths.keys() == model.parameters().keys()
    for pid, (path, typ, count, nbytes) in found.items():
        assert path == paths[pid]
        shape = ",".join(map(str, flat[path].shape))
        assert (typ, count, nbytes) == (f"f32[{shape}]", flat[path].size, flat[path].nbytes)
    stats = sum(flat[p].size for p in ("bn.mean", "bn.var"))
    total = sum(v.size for v in flat.values())
    assert f"total: {total} parameters ({total - stats} trainable, {stats} in internals)" in text


def test_summary_marks_a_shared_layer_and_needs_input_shapes():
    x = Input()
    dense = Dense(3, name="d")
    inner = Model(x, dense(x), name="inner")
    y = Input()
    outer = Model(y, dense(inner(y)))
    with pytest.raises(ModelError, match=r"not compiled.*model.summary\("):
        outer.summary()
    rows = cells(outer.summary(np.zeros((2, 3), np.float32), print_fn=None))
    assert rows[3][:3] == ["Model('inner')", "f32[2,3]", "t-inner-0-d-0-0"]
    assert rows[5] == ["Dense('d')", "f32[2,3]", "(shared)"]
    assert rows[-1][:2] == ["total:", "12"]


def test_summary_marks_a_reused_nested_model_as_shared():
    """A nested model called twice owns its parameters once: its second row says
    "(shared)" as a reused Dense's does, and the total counts them once."""
    x = Input()
    inner = Model(x, ReLU()(Dense(4, name="d")(x)), name="inner")
    a, b = Input(), Input()
    outer = Model([a, b], [Dense(2, name="o")(inner(a)), Dense(2, name="p")(inner(b))])
    spec = np.zeros((2, 4), np.float32)
    rows = cells(outer.summary([spec, spec], print_fn=None))
    inner_rows = [r for r in rows if r[0] == "Model('inner')"]
    assert inner_rows[0][2] == "t-inner-0-d-0-0" and inner_rows[1][2:] == ["(shared)"]
    assert rows[-1][:2] == ["total:", str(4 * 4 + 4 + 2 * (2 * 4 + 2))]
