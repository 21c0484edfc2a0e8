"""Audit of issue 17 (CPU convolution backends chosen per shape), functional promises only.

Speed targets (ratios against PyTorch, wall times) are not checked. Checked here:

* ``convolution`` has alternative CPU backends, each with its own backward (data and
  weight gradients), run by a graph's gradient nodes when chosen;
* every such backend, forced through dispatch, equals ``jax.lax.conv_general_dilated``
  and its ``jax.vjp`` (an oracle outside fnnc) over strides, dilations, groups (depthwise
  too), padding modes (SAME, VALID, explicit pairs), odd sizes, 1-D/2-D/3-D and no bias,
  in float32 and in float64 (1e-9); ``mixed`` on shapes that reach each of its rules;
* the autotune table picks per shape on CPU: two convolution shapes in one graph get
  their own table entries, forward and gradient nodes alike; ``ops.autotune.autotune``
  records one key per shape, and the table saved with ``save`` and read with ``load``
  keeps the choices ("measured once, cached, saved with the table");
* ``autotune_graph(graph, *args)`` tunes every node with a choice into the table,
  changes no output and no input, and after a save/load in a fresh table measures
  nothing again;
* ``Model.autotune()`` tunes a CNN's programs without changing any output (parameters,
  ``evaluate``, ``fit``); the issue's spelling with no arguments;
* torch is a benchmark dependency only, never a runtime one.
"""

from __future__ import annotations

import functools
import pathlib
import re
import tomllib

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fnnc import config, ops
from fnnc.graph import GraphBuilder, backward, compile
from fnnc.graph.autotune import autotune_graph
from fnnc.models import Conv, Dense, Flatten, MaxPool, ReLU, Sequential
from tests.helpers import assert_close

ROOT = pathlib.Path(__file__).resolve().parents[2]
HERE = jax.default_backend()
cpu_only = pytest.mark.skipif(HERE != "cpu", reason="the convolution backends compile on CPU")
spec = jax.ShapeDtypeStruct
DIMS = {1: ("NWC", "OWI", "NWC"), 2: ("NHWC", "OHWI", "NHWC"), 3: ("NDHWC", "ODHWI", "NDHWC")}


def _cpu_backends() -> list[str]:
    return [
        name
        for name, b in ops.backends_of("convolution").items()
        if name != "xla" and "cpu" in b.platforms
    ]


def _lax_conv(x, w, b, *, strides, padding, dilation, groups):
    """The oracle: XLA's convolution through ``jax.lax`` (channels last, weight
    ``[out, k..., in/groups]``), plus the bias."""
    nd = w.ndim - 2
    s = (strides,) * nd if isinstance(strides, int) else tuple(strides)
    d = (dilation,) * nd if isinstance(dilation, int) else tuple(dilation)
    if isinstance(padding, int):
        padding = ((padding, padding),) * nd
    y = jax.lax.conv_general_dilated(
        x,
        w,
        s,
        padding,
        rhs_dilation=d,
        dimension_numbers=DIMS[nd],
        feature_group_count=groups,
        precision=jax.lax.Precision.HIGHEST,
    )
    return y if b is None else y + b.reshape((1,) * (y.ndim - 1) + (-1,))


# (x shape, w shape, bias?, params); batch 9 > the chunked backend's one chunk of 8.
GEOMETRIES = {
    "stride2-same-odd": ((9, 7, 5, 3), (4, 3, 3, 3), True, dict(strides=2, padding="SAME")),
    "dilation2-valid": ((9, 9, 8, 2), (3, 3, 2, 2), True, dict(dilation=2, padding="VALID")),
    "groups2-explicit": (
        (9, 6, 7, 4),
        (6, 2, 3, 2),
        True,
        dict(groups=2, strides=(1, 2), padding=((1, 2), (0, 1))),
    ),
    "depthwise-nobias": ((9, 5, 5, 4), (4, 3, 3, 1), False, dict(groups=4, padding=1)),
    "1d-stride-dilation": ((9, 11, 3), (4, 3, 3), True, dict(strides=2, dilation=2, padding=1)),
    "3d-same": ((9, 4, 3, 5, 2), (3, 2, 2, 3, 2), True, dict(padding="SAME")),
}

# Shapes the ``mixed`` backend takes (>= 4096 output positions over the batch), one per
# rule: wide forward, strided (col2im data gradient), 1x1 kernel (GEMMs), thin channels
# on a big map (chunked weight gradient).
MIXED_GEOMETRIES = {
    "wide": ((16, 16, 16, 32), (8, 3, 3, 32), True, dict(padding="SAME")),
    "strided": ((16, 32, 32, 4), (8, 3, 3, 4), True, dict(strides=2, padding="SAME")),
    "1x1": ((16, 16, 16, 8), (4, 1, 1, 8), False, dict()),
    "thin-big-map": ((16, 32, 32, 8), (4, 3, 3, 8), True, dict(padding="SAME")),
}


def _full(params):
    return dict(dict(strides=1, padding=0, dilation=1, groups=1), **params)


def _inputs(geometries, dtype, seed=0):
    rng = np.random.default_rng(seed)
    out = {}
    for name, (xs, ws, bias, params) in geometries.items():
        x = rng.uniform(-1, 1, xs).astype(dtype)
        w = rng.uniform(-1, 1, ws).astype(dtype)
        b = rng.uniform(-1, 1, ws[0]).astype(dtype) if bias else None
        y = _lax_conv(jnp.asarray(x), jnp.asarray(w), None if b is None else jnp.asarray(b),
                      **_full(params))  # fmt: skip
        out[name] = (x, w, b, rng.uniform(-1, 1, y.shape).astype(dtype))
    return out


def _graph(geometries, dtype):
    """One graph: every geometry's convolution, seeded with its own output gradient;
    returns the outputs, then the gradients of x, w (and b) of each."""
    b = GraphBuilder()
    ys, wrt, seeds = [], [], []
    for name, (xs, ws, bias, params) in geometries.items():
        x = b.input(xs, dtype, name=f"{name}.x")
        w = b.input(ws, dtype, name=f"{name}.w")
        ins = [x, w] + ([b.input((ws[0],), dtype, name=f"{name}.b")] if bias else [])
        y = b.exec(ops.convolution(**params), *ins, name=name)
        seeds.append(b.input(y.shape, dtype, name=f"{name}.dy"))
        ys.append(y)
        wrt += ins
    graph = b.build(ys)
    grad_graph, _ = backward(graph, ys, wrt, df=seeds)
    return grad_graph


def _feed(geometries, data):
    """The graph's inputs in the order :func:`_graph` made them: x, w, (b), dy each."""
    feed = []
    for name, (_, _, bias, _) in geometries.items():
        x, w, bb, dy = data[name]
        feed += [x, w] + ([bb] if bias else []) + [dy]
    return feed


def _oracle(geometries, data):
    ys, grads = [], []
    for name, (_, _, bias, params) in geometries.items():
        x, w, b, dy = map(lambda a: None if a is None else jnp.asarray(a), data[name])
        conv = functools.partial(_lax_conv, **_full(params))
        if bias:
            y, pull = jax.vjp(conv, x, w, b)
        else:
            y, pull = jax.vjp(lambda x_, w_: conv(x_, w_, None), x, w)
        ys.append(y)
        grads += list(pull(dy))
    return ys, grads


def _check_forced(backend, geometries, dtype, rtol, atol):
    data = _inputs(geometries, dtype)
    grad_graph = _graph(geometries, dtype)
    with config.override(backend_per_command={"convolution": backend}):
        program = compile(grad_graph)
        outs = program(*_feed(geometries, data))
    chosen = {label: name for _, label, name in program.backends}
    conv_nodes = [lab for lab in chosen if lab.split(".")[0] in geometries]
    assert conv_nodes and all(chosen[lab] == backend for lab in conv_nodes), chosen
    assert sum("backward" in lab for lab in conv_nodes) == len(geometries), chosen
    ys, grads = _oracle(geometries, data)
    n = len(geometries)
    for i, name in enumerate(geometries):
        assert_close(outs[i], ys[i], rtol, atol, what=f"{backend} {name} forward")
    for j, (got, want) in enumerate(zip(outs[n:], grads)):
        assert_close(got, want, rtol, atol, what=f"{backend} gradient {j}")


@cpu_only
def test_convolution_has_cpu_backends_each_with_its_own_backward():
    """Several CPU backends of ``convolution``; each carries a backward, so the gradient
    nodes of a graph have backends of the same names."""
    names = _cpu_backends()
    assert len(names) >= 2, names
    for name in names:
        assert ops.backends_of("convolution")[name].backward is not None, name
    assert set(names) <= set(ops.backends_of("gradient"))


SINGLE = ["dilated", "chunked", "im2col"]


@cpu_only
@pytest.mark.parametrize("backend", SINGLE)
def test_forced_backend_matches_lax_forward_and_vjp_float32(backend):
    """Strides, dilations, groups, padding modes, odd sizes, 1-D/3-D, no bias (float32)."""
    assert backend in _cpu_backends()
    _check_forced(backend, GEOMETRIES, np.float32, 2e-5, 2e-5)


F64 = ("stride2-same-odd", "groups2-explicit")


@cpu_only
@pytest.mark.parametrize("backend", SINGLE)
def test_forced_backend_matches_lax_forward_and_vjp_float64(backend):
    """Float64, to 1e-9: strided SAME on odd sizes, grouped with explicit pairs."""
    with jax.enable_x64(True):
        _check_forced(backend, {k: GEOMETRIES[k] for k in F64}, np.float64, 1e-9, 1e-9)


@cpu_only
def test_mixed_backend_matches_lax_on_every_rule_float32():
    """``mixed`` on shapes that reach its rules (wide, strided, 1x1, thin big map)."""
    assert "mixed" in _cpu_backends()
    _check_forced("mixed", MIXED_GEOMETRIES, np.float32, 1e-4, 1e-4)


@cpu_only
def test_mixed_backend_declines_small_shapes_in_its_support_predicate():
    """A backend fast only for some shapes says so: ``mixed`` declines a tiny input (the
    reason is a string) and dispatch falls back; forcing it there names the reason."""
    mixed = ops.backends_of("convolution")["mixed"]
    cmd = ops.convolution(padding="SAME")
    tiny = [spec((2, 5, 5, 3), np.float32), spec((4, 3, 3, 3), np.float32)]
    reason = mixed.supports(cmd, tiny)
    assert isinstance(reason, str) and reason
    assert ops.select_backend(cmd, tiny, "cpu") != "mixed"
    big = [spec(s, np.float32) for s in MIXED_GEOMETRIES["wide"][:2]]
    assert mixed.supports(cmd, big) is None
    from fnnc.errors import BackendError

    with (
        config.override(backend_per_command={"convolution": "mixed"}),
        pytest.raises(BackendError, match="mixed"),
    ):
        ops.select_backend(cmd, tiny, "cpu")


# -- the autotune table, per shape ----------------------------------------------------

TWO = {
    "a": ((9, 8, 8, 3), (4, 3, 3, 3), True, dict(padding="SAME")),
    "b": ((9, 6, 6, 4), (5, 3, 3, 4), True, dict(strides=2, padding="VALID")),
}


@cpu_only
def test_table_entries_choose_per_shape_for_forward_and_gradient_nodes(clean_table):
    """Two convolution shapes in one graph, each with its own recorded winner (forward
    and gradient nodes): the compiled program follows each entry and stays exact."""
    grad_graph = _graph(TWO, np.float32)
    keys = {}
    for node in grad_graph.nodes:
        name = node.name.split(".")[0] if node.name else ""
        if name in TWO:
            kind = "grad" if node.cmd.name == "gradient" else "fwd"
            specs = [grad_graph.spec(s) for s in node.inputs]
            keys[(name, kind)] = ops.autotune.key(node.cmd, specs, HERE)
    assert len(keys) == 4 and len(set(keys.values())) == 4, keys
    want = {("a", "fwd"): "im2col", ("a", "grad"): "dilated",
            ("b", "fwd"): "dilated", ("b", "grad"): "im2col"}  # fmt: skip
    for k, v in want.items():
        clean_table[keys[k]] = v
    program = compile(grad_graph)
    got = {}
    for index, _, backend in program.backends:
        node = grad_graph.nodes[index]
        name = node.name.split(".")[0] if node.name else ""
        if name in TWO:
            got[(name, "grad" if node.cmd.name == "gradient" else "fwd")] = backend
    assert got == want
    data = _inputs(TWO, np.float32)
    outs = program(*_feed(TWO, data))
    ys, grads = _oracle(TWO, data)
    assert_close(list(outs), [*ys, *grads], 2e-5, 2e-5)


@cpu_only
def test_autotune_records_one_winner_per_shape_and_the_saved_table_keeps_them(
    clean_table, tmp_path
):
    """``ops.autotune.autotune`` per shape; ``save`` / ``load`` carries the choices."""
    cmd = ops.convolution(padding="SAME")
    rng = np.random.default_rng(0)
    shapes = [((9, 8, 8, 3), (4, 3, 3, 3)), ((9, 5, 5, 6), (2, 3, 3, 6))]
    winners = {}
    for xs, ws in shapes:
        x = jnp.asarray(rng.uniform(-1, 1, xs), jnp.float32)
        w = jnp.asarray(rng.uniform(-1, 1, ws), jnp.float32)
        winner = ops.autotune.autotune(cmd, x, w, repeats=1)
        assert winner in ops.backends_of("convolution")
        winners[ops.autotune.key(cmd, [spec(xs, np.float32), spec(ws, np.float32)], HERE)] = winner
    assert dict(clean_table) == winners
    path = tmp_path / "table.json"
    ops.autotune.save(path)
    clean_table.clear()
    ops.autotune.load(path)
    assert dict(clean_table) == winners
    for (xs, ws), winner in zip(shapes, winners.values()):
        specs = [spec(xs, np.float32), spec(ws, np.float32)]
        assert ops.select_backend(cmd, specs, HERE) == winner


@pytest.fixture
def one_library_set(monkeypatch):
    """Per-node tuning only: the XLA:CPU library-set timing (a dozen extra compiles,
    checked by tests/models/test_model_autotune.py) is skipped to keep this file quick."""
    from fnnc.graph import autotune as graph_autotune

    monkeypatch.setattr(graph_autotune.cpu_libraries, "available", lambda platform: ("xla",))


ONE = {"a": TWO["a"]}


# -- whole-graph autotune ---------------------------------------------------------------


@cpu_only
def test_autotune_graph_tunes_every_choice_changes_nothing_and_is_measured_once(
    clean_table, tmp_path, monkeypatch, one_library_set
):
    """``autotune_graph(graph, *args)``: winners for the convolution and its
    gradient, the same outputs, untouched inputs; a saved table read into an empty one
    makes a second call time nothing and return the same winners."""
    grad_graph = _graph(ONE, np.float32)
    data = _inputs(ONE, np.float32)
    feed = _feed(ONE, data)
    copies = [np.array(a, copy=True) for a in feed]
    before = compile(grad_graph)(*feed)

    winners = autotune_graph(grad_graph, *feed, repeats=1)
    kinds = {grad_graph.nodes[i].cmd.name for i in winners}
    assert kinds == {"convolution", "gradient"}, winners
    assert len(winners) == 2
    for i, name in winners.items():
        node = grad_graph.nodes[i]
        assert name in ops.backends_of(node.cmd.name), (i, name)
    for a, b in zip(feed, copies):
        assert np.array_equal(a, b)
    after = compile(grad_graph)(*feed)
    assert_close(list(after), list(before), 1e-5, 1e-5)
    ys, grads = _oracle(ONE, data)
    assert_close(list(after), [*ys, *grads], 2e-5, 2e-5)

    path = tmp_path / "tuned.json"
    ops.autotune.save(path)
    clean_table.clear()
    ops.autotune.load(path)

    def no_timing(*args, **kwargs):
        raise AssertionError("autotune_graph timed something the saved table holds")

    monkeypatch.setattr(ops.autotune, "median_seconds", no_timing)
    monkeypatch.setattr(ops.autotune, "autotune", no_timing)
    assert autotune_graph(grad_graph, *feed, repeats=1) == winners


# -- Model.autotune ---------------------------------------------------------------------

MX = np.random.default_rng(5).uniform(-1, 1, (8, 8, 8, 1)).astype(np.float32)
MY = (np.arange(8) % 3).astype(np.int32)


def _cnn():
    """The issue's CNN in miniature: conv3x3(SAME)-ReLU-maxpool2-dense."""
    model = Sequential([Conv(4, (3, 3), padding="SAME"), ReLU(), MaxPool(), Flatten(), Dense(3)])
    model.compile([MX], loss="softmax_crossentropy", minimizer=optax.sgd(0.1))
    return model


@cpu_only
def test_model_autotune_changes_no_output(clean_table, one_library_set):
    """Tuning a CNN's fit and evaluate programs changes no parameter and no output: the
    same step from the same parameters gives the same loss and parameters as untuned."""
    model = _cnn()
    start = model.parameters()
    want_eval = np.asarray(model.evaluate([MX]))
    want_loss = float(model.fit([MX], [MY]))  # SGD: no optimizer state to put back
    want_params = model.parameters()
    model.set_parameters(start)

    winners = model.autotune([MX], [MY], repeats=1)
    assert set(winners) == {"fit", "evaluate"}
    assert winners["fit"], winners  # the convolutions had a choice on CPU
    assert_close(model.parameters(), start, 0, 0, what="parameters after autotune")
    assert_close(np.asarray(model.evaluate([MX])), want_eval, 1e-5, 1e-5)
    assert float(model.fit([MX], [MY])) == pytest.approx(want_loss, rel=1e-5, abs=1e-6)
    assert_close(model.parameters(), want_params, 1e-5, 1e-5)


@cpu_only
def test_model_autotune_with_no_arguments_tunes_the_compiled_shapes(clean_table, one_library_set):
    """``Model.autotune()`` as the issue spells it: on the shapes the model was compiled
    for; the evaluate program's convolutions get table entries, outputs unchanged."""
    model = _cnn()
    want = np.asarray(model.evaluate([MX]))
    winners = model.autotune()
    assert winners.get("evaluate"), winners
    assert_close(np.asarray(model.evaluate([MX])), want, 1e-5, 1e-5)


# -- torch stays a benchmark dependency -------------------------------------------------


def test_torch_is_a_benchmark_dependency_only():
    """Neither the package's dependencies nor any module of ``fnnc`` needs torch; the
    CPU benchmark against it exists and imports it."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not any(d.lower().startswith("torch") for d in project["dependencies"])
    pattern = re.compile(r"^\s*(import|from)\s+torch\b|import_module\([\"']torch", re.M)
    found = [
        str(path.relative_to(ROOT))
        for path in sorted((ROOT / "fnnc").rglob("*.py"))
        if pattern.search(path.read_text())
    ]
    assert not found, found
    bench = (ROOT / "benchmarks" / "cpu_vs_torch.py").read_text()
    assert "import torch" in bench
