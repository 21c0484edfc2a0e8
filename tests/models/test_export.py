"""Model.export: a jax.export artifact that a fresh process with only jax and numpy (fnnc
not importable) loads and runs at several batch sizes, matching Model.evaluate."""

import os
import subprocess
import sys
import sysconfig

import jax
import numpy as np
import optax
import pytest

from fnnc import ops
from fnnc.errors import ModelError
from fnnc.io.cli import main
from fnnc.models import BatchNorm, Conv, Dense, Flatten, Input, Model, ReLU
from tests.helpers import ACROSS_PLATFORMS_ATOL, cpu_and_here

# Runs with python -I -S: no PYTHONPATH, no current directory, no .pth files (fnnc's
# editable install is one); site-packages comes back by hand for jax and numpy.
RUNNER = """
import importlib.abc, importlib.util, sys
sys.path.append(sys.argv[1])
if importlib.util.find_spec("fnnc") is not None:  # installed into site-packages itself
    class Hide(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "fnnc" or name.startswith("fnnc."):
                raise ModuleNotFoundError(name)
    sys.meta_path.insert(0, Hide())
try:
    import fnnc
except ImportError:
    pass
else:
    raise SystemExit("fnnc is importable in the runner")
import jax, numpy as np
artifact, data, out = sys.argv[2:5]
exported = jax.export.deserialize(bytearray(open(artifact, "rb").read()))
arrays = np.load(data)
params = {k[2:]: arrays[k] for k in arrays.files if k.startswith("p:")}
results = {}
for k in sorted(k for k in arrays.files if k.startswith("x")):
    args = ([params] if params else []) + [arrays[k]]
    results[k] = np.asarray(exported.call(*args))
np.savez(out, **results)
print("modules:", sorted(m for m in sys.modules if m.split(".")[0] == "fnnc"))
"""


@pytest.fixture(scope="module")
def model():
    rng = np.random.default_rng(0)
    x = Input()
    h = ReLU()(BatchNorm(name="bn")(Conv(4, (3, 3), name="conv")(x)))
    m = Model(x, Dense(3, name="fc")(Flatten()(h)))
    xs = rng.standard_normal((4, 6, 6, 2)).astype(np.float32)
    m.compile(xs, loss="mse", minimizer=optax.adam(0.01))
    for _ in range(2):  # trained weights and running statistics, not the initial ones
        m.fit(xs, rng.standard_normal((4, 3)).astype(np.float32))
    return m


def _run_without_fnnc(tmp_path, artifact, inputs, params=None):
    data, out = tmp_path / "data.npz", tmp_path / "out.npz"
    arrays = {f"x{k}": x for k, x in enumerate(inputs)}
    arrays |= {f"p:{k}": np.asarray(v) for k, v in (params or {}).items()}
    np.savez(data, **arrays)
    (script := tmp_path / "runner.py").write_text(RUNNER)
    env = {"PATH": os.environ.get("PATH", ""), "JAX_PLATFORMS": "cpu"}
    purelib = sysconfig.get_paths()["purelib"]
    command = [sys.executable, "-I", "-S", str(script), purelib, str(artifact), str(data), str(out)]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "modules: []" in done.stdout
    got = np.load(out)
    return [got[f"x{k}"] for k in range(len(inputs))]


@pytest.mark.parametrize("parameters", ["embedded", "argument"])
def test_artifact_runs_without_fnnc_at_two_batch_sizes(model, tmp_path, parameters):
    rng = np.random.default_rng(1)
    artifact = tmp_path / "model.jax"
    exported = model.export(artifact, batch="b", parameters=parameters, platforms=cpu_and_here())
    assert str(exported.in_avals[-1].shape[0]) == "b"
    inputs = [rng.standard_normal((n, 6, 6, 2)).astype(np.float32) for n in (3, 9)]
    params = model.parameters() if parameters == "argument" else None
    for x, got in zip(inputs, _run_without_fnnc(tmp_path, artifact, inputs, params)):
        want = np.asarray(model.evaluate(x))
        assert got.shape == want.shape == (x.shape[0], 3)
        np.testing.assert_allclose(got, want, rtol=0, atol=ACROSS_PLATFORMS_ATOL)


def test_inspect_shows_the_signature(model, tmp_path, capsys):
    artifact = tmp_path / "model.jax"
    model.export(artifact, parameters="argument")
    assert main(["inspect", str(artifact)]) == 0
    out = capsys.readouterr().out
    assert "jax.export artifact" in out
    assert "[0]  parameters, a dict of 8:" in out and "t-conv-0-0: float32[4,3,3,2]" in out
    assert "[1]  float32[b,6,6,2]" in out and "outputs:\n  [0]  float32[b,3]" in out
    assert "symbolic dimensions: b" in out


def test_fixed_shapes_and_bad_arguments(model, tmp_path):
    exported = model.export(tmp_path / "fixed.jax", batch=None)
    assert exported.in_avals[0].shape == (4, 6, 6, 2)
    x = np.ones((4, 6, 6, 2), np.float32)
    np.testing.assert_allclose(exported.call(x), model.evaluate(x), rtol=0, atol=1e-6)
    with pytest.raises(ModelError, match="parameters='weights'"):
        model.export(parameters="weights")
    (garbage := tmp_path / "garbage.jax").write_bytes(b"\x10\0\0\0" + b"\x01" * 60)
    assert main(["inspect", str(garbage)]) == 1


def test_an_artifact_for_other_platforms_lowers_the_references(model, tmp_path):
    """Backends are chosen for this process's platform, so an artifact for another one
    takes every node's XLA reference (a CPU-only backend here, which would break the
    lowering, is never traced), and is not run here, where it cannot run."""

    def refuses(x):
        raise AssertionError("a backend of this platform was traced for another")

    ops.register_backend("relu", ops.Backend("cpu_only_relu", refuses, ("cpu",), priority=50))
    try:
        exported = model.export(None, platforms=("cuda",))
        assert exported.platforms == ("cuda",)
        if jax.default_backend() == "cpu":  # here the backend is chosen, and traced
            with pytest.raises(AssertionError, match="was traced"):
                model.export(None)
    finally:
        ops.unregister_backend("relu", "cpu_only_relu")


def _relu_model(**compile_options):
    rng = np.random.default_rng(0)
    x = Input()
    m = Model(x, Dense(3, name="o")(ReLU()(Dense(8, name="h")(x))))
    xs = rng.standard_normal((8, 5)).astype(np.float32)
    m.compile(xs, loss="mse", minimizer=optax.sgd(0.1), **compile_options)
    return m, xs


def _leaky_pass():
    from fnnc.graph import Pat, Rule, rewrite_pass

    rule = Rule(
        Pat.op("relu", Pat.var("x")),
        lambda m: m.exec(ops.leaky_relu(negative_slope=0.5), m["x"]),
    )
    return rewrite_pass(rule)


def _numpy_forward(m, x, slope):
    p = {k: np.asarray(v, np.float64) for k, v in m.parameters().items()}
    h = x @ p["t-h-0-0"].T + p["t-h-0-1"]
    h = np.where(h > 0, h, slope * h)
    return h @ p["t-o-0-0"].T + p["t-o-0-1"]


@pytest.mark.parametrize("batch", ["b", None])
def test_export_runs_the_compile_passes_as_evaluate_does(batch):
    m, xs = _relu_model(passes=[_leaky_pass()])
    want = _numpy_forward(m, xs, 0.5)  # relu rewritten to leaky_relu(0.5)
    assert np.abs(want - _numpy_forward(m, xs, 0.0)).max() > 1e-2  # the pass matters here
    exported = m.export(batch=batch, inputs=[xs])
    np.testing.assert_allclose(exported.call(xs), want, rtol=1e-5, atol=1e-5)


def test_export_of_a_bfloat16_model_computes_in_bfloat16():
    import jax.numpy as jnp

    m, xs = _relu_model(precision="bfloat16")
    for kw in ({}, {"inputs": [xs]}, {"batch": None}):
        exported = m.export(**kw)  # the check against evaluate passes
    exported = m.export(inputs=[xs])
    p = {k: jnp.asarray(v, jnp.bfloat16) for k, v in m.parameters().items()}
    h = jax.nn.relu(jnp.asarray(xs, jnp.bfloat16) @ p["t-h-0-0"].T + p["t-h-0-1"][None])
    want = np.asarray(h @ p["t-o-0-0"].T + p["t-o-0-1"][None], np.float32)
    got = np.asarray(exported.call(xs), np.float32)
    np.testing.assert_allclose(got, want, rtol=2**-7, atol=2**-7)
    assert np.abs(got - _numpy_forward(m, xs, 0.0)).max() > 1e-4  # not float32 math


def test_the_check_runs_on_random_inputs_and_says_why_it_failed(monkeypatch):
    """A graph without the compile passes agrees with evaluate on zeros (relu and
    leaky_relu agree at 0 and the biases start at 0), so only random inputs catch it; the
    model mixes no samples, so the error must not say it does."""
    m, _ = _relu_model(passes=[_leaky_pass()])
    built = type(m).forward_graph
    monkeypatch.setattr(m, "forward_graph", lambda s, **kw: built(m, s))  # the passes left out
    with pytest.raises(ModelError, match="random example inputs") as info:
        m.export()
    assert "mixes samples" not in str(info.value)


def test_only_a_model_that_mixes_samples_is_said_to():
    from fnnc.models import CommandLayer

    x = Input()
    m = Model(x, CommandLayer(ops.softmax(axis=0))(Dense(3, name="o")(x)))
    xs = np.random.default_rng(0).standard_normal((4, 5)).astype(np.float32)
    m.compile(xs, loss="mse", minimizer=optax.sgd(0.1))
    with pytest.raises(ModelError, match="mixes samples of a batch"):
        m.export(inputs=[xs])
    exported = m.export(batch=None, inputs=[xs])
    np.testing.assert_allclose(exported.call(xs).sum(axis=0), np.ones(3), rtol=1e-5)


def test_export_argument_errors_name_what_was_given(tmp_path):
    m, _ = _relu_model()
    for bad in ("5", "b c", 3):
        with pytest.raises(ModelError, match=f"batch={bad!r}; expected the name"):
            m.export(batch=bad)
    with pytest.raises(ModelError, match=r"input 0 is float32\[4, 7\], compiled for"):
        m.export(inputs=[jax.ShapeDtypeStruct((4, 7), np.float32)])
    with pytest.raises(ModelError, match=r"input 0 is int32\[4, 5\], compiled for"):
        m.export(inputs=[np.ones((4, 5), np.int32)])
    with pytest.raises(IsADirectoryError, match="a folder"):
        m.export(tmp_path)
