"""Backend choice: reference by default, priority on compiled platforms, forcing, autotune."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fnnc import config, ops
from fnnc.errors import BackendError, ConfigError, FnncError, GraphFormatError
from fnnc.graph import GraphBuilder, compile
from fnnc.ops import Backend
from tests.helpers import assert_close


def _abs_via_sqrt(x):
    return jnp.sqrt(x * x)


def _only_rank2(cmd, specs):
    return None if len(specs[0].shape) == 2 else f"needs rank 2, got rank {len(specs[0].shape)}"


HERE = jax.default_backend()  # where compile and autotune choose by default
ELSEWHERE = "tpu" if HERE == "gpu" else "gpu"


@pytest.fixture
def fake_backend():
    """A second backend of ewabs that compiles here (JAX's default platform), supports
    rank-2 inputs only."""
    ops.register_backend(
        "ewabs",
        Backend("sqrt", _abs_via_sqrt, platforms=(HERE,), supports=_only_rank2, priority=5),
    )
    yield
    ops.unregister_backend("ewabs", "sqrt")
    ops.autotune.TABLE.clear()


@pytest.fixture
def interpret_only_backend():
    """A kernel-like backend that only interprets on CPU (like Pallas there)."""
    ops.register_backend(
        "ewabs",
        Backend(
            "kernel", _abs_via_sqrt, platforms=("gpu",), interpret_platforms=("cpu",), priority=9
        ),
    )
    yield
    ops.unregister_backend("ewabs", "kernel")


def spec(*shape):
    return jax.ShapeDtypeStruct(shape, np.float32)


def test_reference_is_the_default():
    assert ops.select_backend(ops.ewexp(), [spec(2, 2)], "cpu") == "xla"
    assert list(ops.backends_of("ewexp")) == ["xla"]


def test_priority_backend_is_chosen_where_supported(fake_backend):
    assert ops.select_backend(ops.ewabs(), [spec(2, 2)], HERE) == "sqrt"
    assert ops.select_backend(ops.ewabs(), [spec(2, 2, 2)], HERE) == "xla"  # falls back quietly
    assert ops.select_backend(ops.ewabs(), [spec(2, 2)], ELSEWHERE) == "xla"


def test_interpret_only_backend_never_chosen_for_speed_on_cpu(interpret_only_backend):
    assert ops.select_backend(ops.ewabs(), [spec(3)], "cpu") == "xla"
    with config.override(backend_per_command={"ewabs": "kernel"}):
        assert ops.select_backend(ops.ewabs(), [spec(3)], "cpu") == "kernel"


def test_forcing_gives_identical_results_and_is_reported(fake_backend):
    b = GraphBuilder()
    x = b.input((3, 4))
    graph = b.build([b.exec(ops.ewabs(), x, name="abs")])
    xs = np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4)
    with config.override(backend_per_command={"ewabs": "xla"}):
        ref = compile(graph)
        assert ref.backends == ((0, "abs", "xla"),)
    fast = compile(graph)
    assert fast.backends == ((0, "abs", "sqrt"),)
    assert_close(fast(xs), ref(xs), rtol=1e-6, atol=1e-6)


def test_forcing_an_unsupported_input_says_why(fake_backend):
    with (
        config.override(backend_per_command={"ewabs": "sqrt"}),
        pytest.raises(BackendError, match=r"ewabs.*needs rank 2, got rank 3"),
    ):
        ops.select_backend(ops.ewabs(), [spec(2, 2, 2)], HERE)
    with (
        config.override(backend_per_command={"ewexp": "pallas"}),
        pytest.raises(BackendError, match=r"ewexp.*has only \['xla'\]"),
    ):
        ops.ewexp()(jnp.ones(2))


def test_global_force_applies_only_to_commands_that_have_the_backend(fake_backend):
    with config.override(backend="sqrt"):
        assert ops.select_backend(ops.ewabs(), [spec(2, 2)], HERE) == "sqrt"
        assert ops.select_backend(ops.ewexp(), [spec(2, 2)], HERE) == "xla"


def test_autotune_records_a_winner_that_compile_uses(fake_backend, tmp_path):
    x = jnp.ones((64, 64))
    winner = ops.autotune.autotune(ops.ewabs(), x)
    assert winner in ("xla", "sqrt")
    key = ops.autotune.key(ops.ewabs(), [spec(64, 64)], HERE)
    assert ops.autotune.TABLE[key] == winner
    ops.autotune.TABLE[key] = "xla"  # a recorded winner beats priority
    assert ops.select_backend(ops.ewabs(), [spec(64, 64)], HERE) == "xla"
    path = tmp_path / "table.json"
    ops.autotune.save(path)
    ops.autotune.TABLE.clear()
    ops.autotune.load(path)
    assert ops.autotune.TABLE[key] == "xla"


def _slow_abs(x):
    """ewabs through a host callback that sleeps: slow inside any compiled program."""

    def host(v):
        import time

        time.sleep(0.02)
        return np.abs(v)

    return jax.pure_callback(host, jax.ShapeDtypeStruct(x.shape, x.dtype), x)


@pytest.mark.parametrize("check", [True, False])
def test_autotune_graph_keeps_per_node_winners_only_if_the_graph_runs_faster(check, monkeypatch):
    from fnnc.graph.autotune import autotune_graph

    ops.register_backend("ewabs", Backend("slow", _slow_abs, platforms=(HERE,), priority=0))
    # per-node timing that (wrongly) prefers the slow backend, as a noisy one might
    monkeypatch.setattr(
        ops.autotune,
        "autotune",
        lambda cmd, *a, **k: ops.autotune.TABLE.__setitem__(
            ops.autotune.key(cmd, ops.autotune.as_specs(a, "t"), HERE), "slow"
        ),
    )
    try:
        b = GraphBuilder()
        x = b.input((3, 4))
        graph = b.build([b.exec(ops.ewabs(), x)])
        x0 = np.full((3, 4), -2.0, np.float32)
        (winner,) = autotune_graph(graph, x0, repeats=3, check=check).values()
        assert winner == ("xla" if check else "slow")
        assert_close(compile(graph)(x0), np.abs(x0), 0, 0)
        assert autotune_graph(graph, x0, check=check) == {0: winner}  # measured once
    finally:
        ops.unregister_backend("ewabs", "slow")
        ops.autotune.TABLE.clear()


def _error_of(fn):
    with pytest.raises(Exception) as info:
        fn()
    return info.value


@pytest.mark.parametrize(
    "inputs",
    [
        (jnp.ones((1, 4, 4, 2)), jnp.ones((3, 3, 3, 5))),  # wrong channel count
        (jnp.ones((1, 4, 4, 2)), jnp.ones((3, 3, 3, 2), jnp.int32)),  # int weight
        (jnp.ones((1, 4, 4, 2)),),  # the weight left out
        (None, jnp.ones((3, 3, 3, 2))),  # a required input given as None
    ],
)
def test_autotune_checks_its_inputs_as_an_eager_call_does(inputs):
    conv = ops.convolution(padding="SAME")
    eager = _error_of(lambda: conv(*inputs))  # the oracle: what the eager call raises
    tuned = _error_of(lambda: ops.autotune.autotune(conv, *inputs, repeats=1))
    assert type(tuned) is type(eager) and str(tuned) == str(eager)
    assert isinstance(tuned, FnncError)
    assert len(ops.autotune.TABLE) == 0


def test_autotune_takes_lists_as_an_eager_call_does():
    a, b = [[1.0, 2.0]], [[1.0], [2.0]]
    assert ops.gemm()(a, b).tolist() == [[5.0]]
    try:
        assert ops.autotune.autotune(ops.gemm(), a, b, repeats=1) == "xla"
        specs = [spec(1, 2), spec(2, 1)]  # what np.asarray makes of the lists
        assert ops.autotune.TABLE[ops.autotune.key(ops.gemm(), specs, HERE)] == "xla"
    finally:
        ops.autotune.TABLE.clear()


def test_autotune_rejects_no_repeats_and_unknown_platforms_by_name():
    x = jnp.ones((2, 2))
    with pytest.raises(BackendError, match=r"repeats must be an int >= 1, got 0"):
        ops.autotune.autotune(ops.relu(), x, repeats=0)
    with pytest.raises(BackendError, match=r"unknown platform 'gpus'.*\['cpu', 'gpu', 'tpu'\]"):
        ops.autotune.autotune(ops.relu(), x, repeats=1, platform="gpus")
    if not any(d.platform == "gpu" for d in jax.devices()):  # JAX's name, as compile takes it
        with pytest.raises(BackendError, match=r"platform 'gpu' has no device in this process"):
            ops.autotune.autotune(ops.relu(), x, repeats=1, platform="cuda")
    assert len(ops.autotune.TABLE) == 0


def test_loading_a_file_that_is_not_json_says_which_and_what(tmp_path):
    path = tmp_path / "table.json"
    path.write_text("{not json")
    with pytest.raises(GraphFormatError, match=r"table.json: not an fnnc autotune table"):
        ops.autotune.load(path)


def test_autotune_for_a_platform_with_no_device_here_is_an_error_not_a_wrong_winner():
    """Timing on this machine's device would record, say, Pallas in interpret mode on a
    CPU as the GPU winner."""
    from fnnc.graph.autotune import autotune_graph

    assert not any(d.platform == ELSEWHERE for d in jax.devices())
    x = jnp.ones((4, 32))
    with pytest.raises(BackendError, match=rf"autotune: platform '{ELSEWHERE}' has no device"):
        ops.autotune.autotune(ops.layer_norm(), x, repeats=1, platform=ELSEWHERE)
    b = GraphBuilder()
    graph = b.build(list(b.exec(ops.rms_norm(), b.input((4, 32)))))
    with pytest.raises(BackendError, match=rf"autotune_graph: platform '{ELSEWHERE}' has no"):
        autotune_graph(graph, np.ones((4, 32), np.float32), repeats=1, platform=ELSEWHERE)
    with pytest.raises(BackendError, match=r"autotune_graph: repeats must be an int >= 1"):
        autotune_graph(graph, np.ones((4, 32), np.float32), repeats=0)
    assert len(ops.autotune.TABLE) == 0


def test_autotune_times_on_the_first_device_of_the_platform(fake_backend, monkeypatch):
    seen = []
    timer = ops.autotune.median_seconds

    def spy(fns, *args, repeats):
        seen.extend(d for a in args for d in a.devices())
        return timer(fns, *args, repeats=repeats)

    monkeypatch.setattr(ops.autotune, "median_seconds", spy)
    ops.autotune.autotune(ops.ewabs(), np.ones((2, 2), np.float32), repeats=1, platform=HERE)
    assert seen == [jax.devices(HERE)[0]]


def test_save_merges_into_the_file_as_load_merges_into_the_table(tmp_path):
    """Two processes tuning different shapes save to one file in turn: both stay."""
    path = tmp_path / "table.json"
    first, second, shared = "relu|()|float32[1]|cpu", "relu|()|float32[2]|cpu", "k|()||cpu"
    table = {"format": "fnnc.autotune", "version": 2}
    earlier = {**table, "entries": {first: "xla", shared: "old"}}
    path.write_text(json.dumps(earlier))  # an earlier process's save
    ops.autotune.TABLE.update({second: "xla", shared: "new"})
    try:
        ops.autotune.save(path)
        merged = {first: "xla", second: "xla", shared: "new"}
        assert json.loads(path.read_text()) == {**table, "entries": merged}
        path.write_text("[1, 2]")
        with pytest.raises(GraphFormatError, match=r"save: .*table.json: not an fnnc"):
            ops.autotune.save(path)
        assert path.read_text() == "[1, 2]" and [p.name for p in tmp_path.iterdir()] == [
            "table.json"
        ]
    finally:
        ops.autotune.TABLE.clear()


@pytest.mark.parametrize("name", ["CUDA", "rocm", "Gpu"])
def test_platform_names_are_normalised_as_jax_spells_them(interpret_only_backend, name):
    """JAX's cuda / rocm and capitals are fnnc's gpu: they took the reference for every
    node, where "gpu" takes the kernels."""
    b = GraphBuilder()
    graph = b.build([b.exec(ops.ewabs(), b.input((2, 2)), name="abs")])
    assert ops.select_backend(ops.ewabs(), [spec(2, 2)], name) == "kernel"
    assert compile(graph, platform=name).backends == compile(graph, platform="gpu").backends
    assert compile(graph, platform=name).backends == ((0, "abs", "kernel"),)


def test_an_unknown_platform_name_is_an_error_that_lists_the_names():
    b = GraphBuilder()
    graph = b.build([b.exec(ops.ewabs(), b.input((2, 2)))])
    want = r"unknown platform 'gpus'; expected one of \['cpu', 'gpu', 'tpu'\].*'gpu'\?"
    with pytest.raises(ConfigError, match="compile: " + want):
        compile(graph, platform="gpus")
    with pytest.raises(ConfigError, match="select_backend: " + want):
        ops.select_backend(ops.ewabs(), [spec(2, 2)], "gpus")
