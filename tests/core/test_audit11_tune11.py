"""Audit 11 (backend selection and autotuning): the measured defaults file."""

import json

import jax.numpy as jnp
import pytest

from fnnc.core import measured
from fnnc.errors import ConfigError, GraphFormatError
from fnnc.ops import measure_defaults


@pytest.mark.parametrize(
    ("devices", "said"),
    [
        ({"X": {"gemm": "xla"}}, "command 'gemm' maps to a str"),
        ({"X": ["gemm"]}, "device 'X': got a list"),
        ({"X": {"gemm": {"float32:small": 3}}}, "backend 3 is no name"),
    ],
)
def test_a_measured_defaults_file_of_the_wrong_shape_is_a_clear_error(tmp_path, devices, said):
    # Only the top level was checked: on that device kind, selection later failed with a
    # bare AttributeError ('str' object has no attribute 'get') naming no file.
    path = tmp_path / "defaults.json"
    path.write_text(json.dumps({"format": 1, "devices": devices}))
    with pytest.raises(GraphFormatError, match=f"{path}.*{said}.*measure_defaults"):
        measured.read(path)


def test_the_shipped_file_and_what_write_makes_read_back(tmp_path):
    assert measured.read()["devices"]  # the package's own file passes the check
    path = tmp_path / "defaults.json"
    measured.write("Kind", {"gemm": {"bfloat16:large": "xla"}}, "here", path)
    measured.write("Kind", {"gemm": {"float32:large": "pallas"}}, "again", path)
    data = measured.read(path)
    assert data["devices"] == {
        "Kind": {"gemm": {"bfloat16:large": "xla", "float32:large": "pallas"}}
    }
    assert data["sources"] == {"Kind": "again"}


def test_measure_takes_the_platform_names_compile_takes(monkeypatch):
    # measure(platform="cuda") matched no backend's platforms ("gpu") and silently
    # measured nothing; a misspelt name did the same.
    monkeypatch.setattr(
        measure_defaults.autotune, "median_seconds", lambda fns, repeats: {k: 1.0 for k in fns}
    )
    run = dict(
        sizes=["small"],
        dtypes=[jnp.bfloat16],
        make_cases=lambda z, dtype: measure_defaults.cases(z, dtype, specs_only=True)[4:5],
        log=lambda s: None,
    )
    entries = {"scaled_dot_product_attention": {"bfloat16:small": "xla"}}  # timer: all tie
    assert measure_defaults.measure("gpu", **run) == entries
    assert measure_defaults.measure("CUDA", **run) == entries
    with pytest.raises(ConfigError, match="measure_defaults: unknown platform 'gpus'"):
        measure_defaults.measure("gpus", **run)


def test_a_command_calling_another_follows_a_config_override_after_its_first_call(
    restore_registries,
):
    """The jitted forward of a command whose forward calls ``gemm`` was keyed on the
    config only for commands holding sub-graphs: after one plain call, a forced gemm
    backend that cannot run was ignored (a direct gemm call refuses it)."""
    import numpy as np

    from fnnc import config, ops
    from fnnc.core.command import Spec, defcommand
    from fnnc.errors import BackendError

    @defcommand(
        family="blas",
        shape=lambda a, b: Spec((a.shape[0], b.shape[1]), a.dtype),
        name="audit11_twice_gemm",
    )
    def twice_gemm(a, b):
        return ops.gemm()(a, b) * 2

    a = np.ones((2, 3), np.float32)
    b = np.ones((3, 2), np.float32)
    np.testing.assert_array_equal(twice_gemm()(a, b), 2 * a @ b)  # the oracle: NumPy
    with config.override(backend_per_command={"gemm": "nonexistent"}):
        with pytest.raises(BackendError, match="nonexistent"):
            ops.gemm()(a, b)
        with pytest.raises(BackendError, match="nonexistent"):
            twice_gemm()(a, b)
    np.testing.assert_array_equal(twice_gemm()(a, b), 2 * a @ b)
