"""Measured backend defaults: a kernel is the default on an accelerator only where the
shipped measurements (or the autotune table) say it is faster, or where it wins by
construction (flash attention); the regenerate command records winners by timing."""

from __future__ import annotations

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fnnc import ops
from fnnc.core import dispatch, measured
from fnnc.errors import GraphFormatError
from fnnc.ops import measure_defaults

H100 = "NVIDIA H100 80GB HBM3"


def _specs(*shapes, dtype=jnp.float32):
    return [jax.ShapeDtypeStruct(s, dtype) for s in shapes]


@pytest.fixture
def restore_defaults():
    yield
    dispatch.use_measured_defaults(None)


def _abs_via_sqrt(x):
    return jnp.sqrt(x * x)


@pytest.fixture
def rival():
    """A second compiled CPU backend of ewabs with priority 0 (never chosen by priority)."""
    ops.register_backend("ewabs", ops.Backend("rival", _abs_via_sqrt, ("cpu",), priority=0))
    yield
    ops.unregister_backend("ewabs", "rival")


def test_on_an_unmeasured_gpu_only_flash_attention_is_a_kernel_default(monkeypatch):
    monkeypatch.setattr(measured, "device_kind", lambda platform: "Some Future GPU")
    x = _specs((64, 256))
    assert (
        ops.select_backend(ops.gemm(transpose_b=True), _specs((64, 32), (16, 32)), "gpu") == "xla"
    )
    assert ops.select_backend(ops.layer_norm(), [*x, *_specs((256,), (256,))], "gpu") == "xla"
    ce = ops.select_backend(
        ops.softmax_crossentropy(), [*x, jax.ShapeDtypeStruct((64,), jnp.int32)], "gpu"
    )
    assert ce == "xla"
    qkv = _specs((2, 64, 4, 16), (2, 64, 4, 16), (2, 64, 4, 16), dtype=jnp.bfloat16)
    assert ops.select_backend(ops.scaled_dot_product_attention(), qkv, "gpu") == "pallas"
    # in float32 at full precision its products run without tensor cores: unmeasured, XLA
    f32 = _specs((2, 64, 4, 16), (2, 64, 4, 16), (2, 64, 4, 16))
    assert ops.select_backend(ops.scaled_dot_product_attention(), f32, "gpu") == "xla"


def test_the_shipped_h100_measurements_choose_per_shape_class(monkeypatch):
    monkeypatch.setattr(measured, "device_kind", lambda platform: H100)
    big = _specs((4096, 32000), dtype=jnp.bfloat16)
    labels = jax.ShapeDtypeStruct((4096,), jnp.int32)
    assert measured.lookup("softmax_crossentropy", [*big, labels], "gpu") == "xla"
    qkv = _specs(*[(2, 2048, 16, 64)] * 3, dtype=jnp.bfloat16)
    assert measured.lookup("scaled_dot_product_attention", qkv, "gpu") == "pallas"
    assert ops.select_backend(ops.scaled_dot_product_attention(), qkv, "gpu") == "pallas"
    assert measured.lookup("gemm", _specs((8, 8)), "gpu") is None  # not measured: priority


def test_the_shipped_h200_measurements_keep_fused_norms_on_xla_in_bfloat16(monkeypatch):
    """The H200's run: layer norm's kernel won alone by 11% in bfloat16, short of the
    fusion margin, and by 30% in float32; attention's by 3x; the gemm lost."""
    monkeypatch.setattr(measured, "device_kind", lambda platform: "NVIDIA H200")
    x = lambda dtype: _specs((16, 1024, 1024), (1024,), (1024,), dtype=dtype)
    assert ops.select_backend(ops.layer_norm(), x(jnp.bfloat16), "gpu") == "xla"
    assert ops.select_backend(ops.layer_norm(), x(jnp.float32), "gpu") == "pallas"
    qkv = _specs(*[(16, 1024, 16, 64)] * 3, dtype=jnp.bfloat16)
    assert ops.select_backend(ops.scaled_dot_product_attention(), qkv, "gpu") == "pallas"
    ab = _specs((16384, 1024), (4096, 1024), (4096,), dtype=jnp.bfloat16)
    assert ops.select_backend(ops.gemm(transpose_b=True), ab, "gpu") == "xla"
    assert measure_defaults.FUSED_MARGIN < measure_defaults.MARGIN


def test_a_table_entry_makes_a_zero_priority_backend_the_default(rival, restore_defaults):
    spec = _specs((4, 4))
    assert ops.select_backend(ops.ewabs(), spec, "cpu") == "xla"
    before = dispatch.state()
    kind = measured.device_kind("cpu")
    dispatch.use_measured_defaults({kind: {"ewabs": {"float32:small": "rival"}}})
    assert dispatch.state() != before  # cached programs choose again
    assert ops.select_backend(ops.ewabs(), spec, "cpu") == "rival"
    assert ops.select_backend(ops.ewabs(), _specs((4096, 4096)), "cpu") == "xla"  # other class
    np.testing.assert_allclose(np.asarray(ops.ewabs()(-np.ones((4, 4), np.float32))), 1.0)
    dispatch.use_measured_defaults({kind: {"ewabs": {"*": "no-such-backend"}}})
    assert ops.select_backend(ops.ewabs(), spec, "cpu") == "xla"


def test_shape_classes():
    assert measured.shape_class(_specs((8, 8))) == "float32:small"
    assert measured.shape_class([None, *_specs((2048, 1024), dtype=jnp.bfloat16)]) == (
        "bfloat16:medium"
    )
    assert measured.shape_class(_specs((4, 1), (4096, 1024))) == "float32:large"


def test_measure_records_the_faster_backend_only_past_the_margin(rival, monkeypatch, tmp_path):
    def one_case(z, dtype):
        return [(ops.ewabs(), [jnp.asarray(np.linspace(-1, 1, 16, dtype=np.float32))], (0,))]

    def timings(ratio):
        def fake(fns, repeats):
            assert sorted(fns) == ["rival fwd", "rival fwd+bwd", "xla fwd", "xla fwd+bwd"]
            for fn in fns.values():  # each program runs and differentiates
                jax.block_until_ready(fn())
            return {k: (ratio if k.startswith("rival") else 1.0) for k in fns}

        return fake

    run = dict(platform="cpu", sizes=["small"], dtypes=[jnp.float32], make_cases=one_case)
    monkeypatch.setattr(measure_defaults.autotune, "median_seconds", timings(0.5))
    assert measure_defaults.measure(**run, log=lambda s: None) == {
        "ewabs": {"float32:small": "rival"}
    }
    monkeypatch.setattr(measure_defaults.autotune, "median_seconds", timings(0.99))
    assert measure_defaults.measure(**run, log=lambda s: None) == {
        "ewabs": {"float32:small": "xla"}
    }
    # a command XLA fuses with its neighbours must win alone by FUSED_MARGIN
    monkeypatch.setattr(measure_defaults, "FUSED_BY_XLA", frozenset({"ewabs"}))
    for ratio, winner in ((0.9, "xla"), (0.8, "rival")):
        monkeypatch.setattr(measure_defaults.autotune, "median_seconds", timings(ratio))
        assert measure_defaults.measure(**run, log=lambda s: None) == {
            "ewabs": {"float32:small": winner}
        }
    path = tmp_path / "defaults.json"
    measured.write("cpu", {"ewabs": {"float32:small": "rival"}}, "test", path)
    measured.write("cpu", {"gemm": {"*": "xla"}}, "test again", path)
    data = json.loads(path.read_text())
    assert data["devices"]["cpu"] == {
        "ewabs": {"float32:small": "rival"},
        "gemm": {"*": "xla"},
    }
    assert data["sources"]["cpu"] == "test again"


def test_a_damaged_defaults_file_is_a_clear_error(tmp_path):
    path = tmp_path / "d.json"
    path.write_text(json.dumps({"format": 7, "devices": {}}))
    with pytest.raises(GraphFormatError, match=r"expected format 1.*measure_defaults"):
        measured.read(path)
    path.write_text("{")
    with pytest.raises(GraphFormatError, match="not JSON"):
        measured.read(path)
    assert measured.read(tmp_path / "missing.json")["devices"] == {}


def test_measure_defaults_can_measure_some_commands_and_keeps_the_rest(monkeypatch, tmp_path):
    """``--commands``/``--dtypes`` measure a part: the device's other entries stay and
    its source line gains the new run's; an unknown name is a clear error."""
    seen = {}

    def fake_measure(platform, sizes, dtypes, repeats, commands):
        seen.update(sizes=sizes, dtypes=[d.name for d in dtypes], commands=commands)
        return {"scaled_dot_product_attention": {"bfloat16:large": "pallas_split"}}

    monkeypatch.setattr(measure_defaults, "measure", fake_measure)
    path = tmp_path / "defaults.json"
    platform = jax.default_backend()  # main records under this machine's device kind
    kind = measured.device_kind(platform) or platform
    measured.write(kind, {"gemm": {"bfloat16:large": "xla"}}, "the first run", path)
    only = ["--sizes", "large", "--dtypes", "bfloat16"]
    measure_defaults.main(["--out", str(path), *only, "--commands", "scaled_dot_product_attention"])
    assert seen == {
        "sizes": ["large"],
        "dtypes": ["bfloat16"],
        "commands": ["scaled_dot_product_attention"],
    }
    data = json.loads(path.read_text())
    assert data["devices"][kind] == {
        "gemm": {"bfloat16:large": "xla"},
        "scaled_dot_product_attention": {"bfloat16:large": "pallas_split"},
    }
    source = data["sources"][kind]
    assert source.startswith("the first run | python -m fnnc.ops.measure_defaults")
    assert source.endswith("(scaled_dot_product_attention, bfloat16, large only)")
    with pytest.raises(SystemExit, match=r"--commands 'attention': expected some of \["):
        measure_defaults.main(["--out", str(path), "--commands", "attention"])


def test_measure_skips_the_commands_not_asked_for(rival, monkeypatch):
    def one_case(z, dtype):
        return [(ops.ewabs(), [jnp.asarray(np.linspace(-1, 1, 16, dtype=np.float32))], (0,))]

    monkeypatch.setattr(
        measure_defaults.autotune, "median_seconds", lambda fns, repeats: {k: 1.0 for k in fns}
    )
    run = dict(platform="cpu", sizes=["small"], dtypes=[jnp.float32], make_cases=one_case)
    assert measure_defaults.measure(**run, log=lambda s: None, commands=["gemm"]) == {}
    assert measure_defaults.measure(**run, log=lambda s: None, commands=["ewabs"]) == {
        "ewabs": {"float32:small": "xla"}
    }


@pytest.mark.parametrize("size", list(measure_defaults.SIZES))
def test_each_size_records_the_shape_class_it_is_named_after(size, monkeypatch):
    """``--sizes small`` records ``small`` entries (its cases once all fell in medium)."""
    bounds = {"small": (0, 2**16), "medium": (2**16, 2**22), "large": (2**22, math.inf)}
    low, high = bounds[size]  # measured.SIZES, restated
    for cmd, args, _ in measure_defaults.cases(
        measure_defaults.SIZES[size], jnp.float32, specs_only=True
    ):
        largest = max(math.prod(a.shape) for a in args)
        assert low <= largest < high, (cmd.name, largest)
    monkeypatch.setattr(
        measure_defaults.autotune, "median_seconds", lambda fns, repeats: {k: 1.0 for k in fns}
    )
    entries = measure_defaults.measure(
        "gpu",  # where every case has kernels to time (nothing runs: the timer is faked)
        sizes=[size],
        dtypes=[jnp.float32, jnp.bfloat16],
        make_cases=lambda z, dtype: measure_defaults.cases(z, dtype, specs_only=True),
        log=lambda s: None,
    )
    assert sorted(entries) == sorted(measure_defaults._case_commands())
    for classes in entries.values():
        assert sorted(classes) == [f"bfloat16:{size}", f"float32:{size}"]
