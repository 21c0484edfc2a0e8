"""Audit 9 (export9): model_function, to_nnx and their inputs, against NumPy and jax.grad."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fnnc import ops
from fnnc.errors import ModelError
from fnnc.models import Dense, Input, Model, ReLU, model_function


def _leaky_pass():
    from fnnc.graph import Pat, Rule, rewrite_pass

    rule = Rule(
        Pat.op("relu", Pat.var("x")),
        lambda m: m.exec(ops.leaky_relu(negative_slope=0.5), m["x"]),
    )
    return rewrite_pass(rule)


@pytest.fixture(scope="module")
def leaky():
    """A relu MLP compiled with a pass rewriting relu to leaky_relu(0.5)."""
    rng = np.random.default_rng(0)
    x = Input()
    m = Model(x, Dense(3, name="o")(ReLU()(Dense(8, name="h")(x))))
    xs = rng.standard_normal((8, 5)).astype(np.float32)
    m.compile(xs, loss="mse", minimizer=optax.sgd(0.1), passes=[_leaky_pass()])
    return m, xs


def _forward(p, x, slope):
    """The leaky MLP's output and the gradients of ``sum(out**2)``, in NumPy float64."""
    p = {k: np.asarray(v, np.float64) for k, v in p.items()}
    x = np.asarray(x, np.float64)
    pre = x @ p["t-h-0-0"].T + p["t-h-0-1"]
    h = np.where(pre > 0, pre, slope * pre)
    out = h @ p["t-o-0-0"].T + p["t-o-0-1"]
    dout = 2 * out
    dpre = (dout @ p["t-o-0-0"]) * np.where(pre > 0, 1.0, slope)
    grads = {"t-o-0-0": dout.T @ h, "t-o-0-1": dout.sum(0), "t-h-0-0": dpre.T @ x}
    return out, {**grads, "t-h-0-1": dpre.sum(0)}


def test_model_function_and_to_nnx_run_the_compile_passes_as_evaluate(leaky):
    """They built the layers' graph without compile's passes, so a model compiled with
    a rewrite ran without it there while evaluate ran it."""
    m, xs = leaky
    params = m.parameters()
    want, ref = _forward(params, xs, 0.5)
    assert np.abs(want - _forward(params, xs, 0.0)[0]).max() > 1e-2  # the pass matters
    np.testing.assert_allclose(m.evaluate(xs), want, rtol=1e-5, atol=1e-5)
    fn = model_function(m, [xs])
    value_and_grad = jax.jit(
        jax.value_and_grad(lambda p: (fn([xs], p)[0][0] ** 2).sum(), has_aux=False)
    )
    (out,), _ = fn([xs], params)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(m.to_nnx(deterministic=True)(xs), want, rtol=1e-5, atol=1e-5)
    _, got = value_and_grad(params)  # the gradient is that of the rewritten forward too
    for k in ref:
        np.testing.assert_allclose(got[k], ref[k], rtol=1e-4, atol=1e-4, err_msg=k)


def test_model_function_names_an_input_or_parameter_it_was_not_built_for(leaky):
    """A batch size, shape or dtype other than the build's failed deep in the graph
    (a GraphError blaming the gemm's shape rule, or JAX's reshape TypeError) or ran an
    int32 input silently; a parameter of another dtype is cast as set_parameters does."""
    m, xs = leaky
    fn = model_function(m, [xs])
    params = m.parameters()
    for bad in (xs[:3], xs[:, :4], xs.astype(np.int32), xs[0]):
        with pytest.raises(ModelError, match=r"input 0 is .*built for float32\[8, 5\]"):
            fn([bad], params)
    with pytest.raises(ModelError, match=r"inputs is one array \(float32\[8, 5\]\); pass a list"):
        fn(xs, params)  # len(xs) is 8 rows: it said 'takes 1 inputs, got 8'
    with pytest.raises(ModelError, match=r"parameter t-h-0-1 is \[8\], the value given is \[1\]"):
        fn([xs], {**params, "t-h-0-1": params["t-h-0-1"][:1]})
    half = {k: v.astype(np.float16) for k, v in params.items()}
    (out,), _ = fn([xs], half)
    assert out.dtype == np.float32
    want, _ = _forward({k: v.astype(np.float32) for k, v in half.items()}, xs, 0.5)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


def test_export_of_an_empty_example_batch_says_why_and_a_single_array_is_the_example(
    leaky, monkeypatch
):
    """Zero example rows reached jax.export's bare 'Expected value >= 1 for dimension
    variable' ValueError from the check; one array (not a list) given as the example was
    set aside for random inputs."""
    m, xs = leaky
    with pytest.raises(ModelError, match=r"example input\(s\) \[0\] have no rows"):
        m.export(inputs=[xs[:0]])
    exported = m.export(inputs=[xs[:0]], check=False)  # a valid artifact all the same
    np.testing.assert_allclose(exported.call(xs[:2]), _forward(m.parameters(), xs[:2], 0.5)[0],
                               rtol=1e-5, atol=1e-5)  # fmt: skip
    assert m.export(inputs=xs[:0], batch=None).call(xs[:0]).shape == (0, 3)
    built = type(m).forward_graph  # the passes left out: the check fails, naming its inputs
    monkeypatch.setattr(m, "forward_graph", lambda s, **kw: built(m, s))
    with pytest.raises(ModelError, match="differs from evaluate on the given example inputs"):
        m.export(inputs=xs)


def test_backward_on_a_mesh_computes_in_the_precision_compute_type():
    """On a mesh (set_data_parallel) backward's program ran the forward again without
    compile's precision cast: a bfloat16 model's gradients were float32 math, those of
    the same model off the mesh bfloat16 math."""
    rng = np.random.default_rng(0)
    xs = rng.standard_normal((4, 5)).astype(np.float32)
    x = Input()
    m = Model(x, Dense(3, name="o")(ReLU()(Dense(8, name="h")(x))))
    m.set_data_parallel(1)
    m.compile(xs, minimizer=optax.sgd(0.1), precision="bfloat16")
    m.evaluate(xs, requires_grad=True)
    (gx,) = m.backward(np.ones((4, 3), np.float32))
    grads = m.engine.grads

    def loss(p, x, dtype):
        p = {k: jnp.asarray(v, dtype) for k, v in p.items()}
        h = jax.nn.relu(jnp.asarray(x, dtype) @ p["t-h-0-0"].T + p["t-h-0-1"][None])
        return (h @ p["t-o-0-0"].T + p["t-o-0-1"][None]).astype(jnp.float32).sum()

    params = m.parameters()
    grad = jax.jit(jax.grad(loss, argnums=(0, 1)), static_argnums=2)
    want, f32 = grad(params, xs, jnp.bfloat16), grad(params, xs, jnp.float32)
    np.testing.assert_allclose(gx, np.asarray(want[1], np.float32), rtol=2**-6, atol=2**-6)
    assert np.abs(gx - np.asarray(f32[1])).max() > 1e-3  # not float32 math
    for k in params:
        np.testing.assert_allclose(
            grads[k], np.asarray(want[0][k], np.float32), rtol=2**-6, atol=2**-5, err_msg=k
        )
    assert np.abs(grads["t-h-0-0"] - np.asarray(f32[0]["t-h-0-0"])).max() > 1e-3


def test_export_of_a_model_random_in_test_mode_names_the_random_layer():
    """export asked forward_graph for the test-mode forward, whose error then said to
    'pass is_test=True': a Linen module built to drop draws keys in test mode too."""
    import flax.linen as nn

    class Drop(nn.Module):
        @nn.compact
        def __call__(self, x):
            return nn.Dropout(0.5, deterministic=False)(nn.Dense(3)(x))

    xs = np.ones((4, 5), np.float32)
    net = Drop()
    v = {
        "params": {
            "Dense_0": {"kernel": np.ones((5, 3), np.float32), "bias": np.zeros(3, np.float32)}
        }
    }
    m = Model.from_flax(net, v, name="d")
    m.compile(xs)
    with pytest.raises(
        ModelError, match=r"test-mode forward draws random keys \(read by .*Dropout_0"
    ):
        m.export()


def test_export_of_an_output_without_the_batch_axis_says_so():
    """An output that is a parameter (no batch axis) was said to 'mix samples of a batch'."""
    from fnnc.models import Parameter

    x = Input()
    m = Model(x, [Dense(2, name="fc")(x), Parameter((2,), init=1.0, name="p")()])
    xs = np.ones((4, 3), np.float32)
    m.compile(xs)
    with pytest.raises(ModelError, match=r"output 1 shaped \[2\], whose first axis is not") as e:
        m.export()
    assert "mixes samples" not in str(e.value)
    (y, p) = m.export(batch=None).call(xs)  # the way out the error gives
    np.testing.assert_array_equal(p, np.ones(2, np.float32))
    np.testing.assert_allclose(y, m.evaluate(xs)[0], rtol=1e-6)


def test_from_flax_of_linen_variables_missing_a_collection_says_what_to_pass():
    """Linen's params tree given for its variables (Model.from_flax(net, v['params'])), or
    variables without batch_stats, failed at compile with Flax's bare
    ScopeCollectionNotFound."""
    import flax.linen as nn

    class Net(nn.Module):
        @nn.compact
        def __call__(self, x):
            return nn.BatchNorm(use_running_average=True)(nn.Dense(3)(x))

    xs = np.ones((4, 5), np.float32)
    dense = {"kernel": np.ones((5, 3), np.float32), "bias": np.zeros(3, np.float32)}
    bn = {"scale": np.ones(3, np.float32), "bias": np.zeros(3, np.float32)}
    params = {"Dense_0": dense, "BatchNorm_0": bn}
    with pytest.raises(ModelError, match=r"look like a params tree \(variables\['params'\]\)"):
        Model.from_flax(Net(), params).compile(xs)
    with pytest.raises(ModelError, match=r"they hold 'params'\): pass every collection"):
        Model.from_flax(Net(), {"params": params}).compile(xs)
    stats = {"BatchNorm_0": {"mean": np.zeros(3, np.float32), "var": np.ones(3, np.float32)}}
    m = Model.from_flax(Net(), {"params": params, "batch_stats": stats})
    m.compile(xs)  # the way out: y = (x @ 1 + 0) / sqrt(1 + eps)
    np.testing.assert_allclose(m.evaluate(xs), np.full((4, 3), 5 / np.sqrt(1 + 1e-5)), rtol=1e-6)


def test_to_nnx_takes_an_input_given_as_nested_lists(leaky):
    """An input as nested lists (one per positional argument) was AttributeError:
    'list' object has no attribute 'dtype' from the module's cache of functions."""
    m, xs = leaky
    rows = xs[:2].tolist()
    got = m.to_nnx(deterministic=True)(rows)
    np.testing.assert_allclose(got, _forward(m.parameters(), xs[:2], 0.5)[0], rtol=1e-5, atol=1e-5)


def test_read_and_write_say_what_a_file_of_another_kind_is(leaky, tmp_path):
    """format= given with an open file of the other kind was ignored (an NNC file written
    and read as NNC under format='safetensors'); a jax.export artifact read as weights was
    only 'not an SQLite database'."""
    from fnnc.errors import TensorFileError
    from fnnc.io import TensorFile

    m, _ = leaky
    with TensorFile(tmp_path / "w.sqlite3") as f:
        for call in (m.write, m.read):
            with pytest.raises(TensorFileError, match="format='safetensors', but the file"):
                call(f, format="safetensors")
        m.write(f, format="nnc")  # the same kind: fine
        assert m.read(f) == []
    m.export(tmp_path / "m.jax", check=False)
    for fmt in (None, "safetensors"):
        with pytest.raises(TensorFileError, match=r"It is a jax\.export artifact"):
            m.read(tmp_path / "m.jax", format=fmt)
    (tmp_path / "t.txt").write_text("hello")
    with pytest.raises(TensorFileError, match="not an SQLite database") as e:
        m.read(tmp_path / "t.txt")
    assert "jax.export" not in str(e.value)


def test_to_nnx_follows_a_later_compile_with_other_passes():
    """The module cached one function per input shape, so compiling the model again with
    a rewrite left the module on the old graph while evaluate ran the new one."""
    rng = np.random.default_rng(1)
    x = Input()
    m = Model(x, Dense(3, name="o")(ReLU()(Dense(8, name="h")(x))))
    xs = rng.standard_normal((8, 5)).astype(np.float32)
    m.compile(xs)
    module = m.to_nnx(deterministic=True)
    relu, _ = _forward(m.parameters(), xs, 0.0)
    np.testing.assert_allclose(module(xs), relu, rtol=1e-5, atol=1e-5)
    m.compile(xs, passes=[_leaky_pass()])
    leaky, _ = _forward(m.parameters(), xs, 0.5)
    assert np.abs(leaky - relu).max() > 1e-2
    np.testing.assert_allclose(module(xs), leaky, rtol=1e-5, atol=1e-5)
