"""Audit 9 (left-alone defects): histogram refuses a layout of too many counts before
allocating it; reduce backwards take NNC's null output gradient as ones; an autotune
winner applies only on the device kind, JAX version and matmul precision it was
measured under."""

from __future__ import annotations

import json
import math
import tracemalloc

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fnnc import config, ops
from fnnc.core import measured
from fnnc.core.command import Spec
from fnnc.errors import CommandError, GraphFormatError
from fnnc.ops.statistics import MAX_COUNTS

X = np.array([-1e19, -3.0, -1e-13, 0.0, 2e-12, 0.5, 7.0, 1e19, np.nan], np.float32)


def _nnc_log_boundaries() -> np.ndarray:
    """histogram.tests.c's 774 * 2 boundaries, built as its loop builds them."""
    h = np.zeros(774 * 2, np.float32)
    v, i = 1e-12, 0
    while v < 1e20:
        h[774 + i], h[774 - i - 1] = v, -v
        v, i = v * 1.1, i + 1
    return h


def test_the_layouts_of_nncs_own_tests_still_fit():
    """NNC's tests: CMD_HISTOGRAM_LOG() (min 1e-12, max 1e20, rate 1.1: 775 * 2
    counts) against CMD_HISTOGRAM_BINS() on its boundaries, and CMD_HISTOGRAM_EVEN(200)
    (203 counts). Oracle: NumPy's searchsorted on the test's own boundaries."""
    log, _ = ops.histogram(type="logarithmic", min=1e-12, max=1e20, rate=1.1)(X)
    h = _nnc_log_boundaries()
    want = np.bincount(np.searchsorted(h, X[:-1], side="right"), minlength=len(h) + 2)
    want[-1] += 1  # the NaN
    assert log.shape == (775 * 2,)
    np.testing.assert_array_equal(np.asarray(log), want)
    even, _ = ops.histogram(type="even", bins=200, min=-1000.0, max=1000.0)(X)
    assert even.shape == (203,) and int(np.asarray(even).sum()) == len(X)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        (
            {
                "type": "logarithmic",
                "min": 1e-12,
                "max": 1e20,
                "rate": math.exp(math.log(1e32) / 5e8),
            },
            r"min=1e-12, max=1e\+20, rate=1\.0000001.* need .*= 1e\+09 counts; at most "
            rf"{MAX_COUNTS} are allowed: raise rate or narrow",
        ),
        (
            {"type": "logarithmic", "min": 1e-300, "max": 1e300, "rate": 1 + 1e-15},
            rf"need .* counts; at most {MAX_COUNTS} are allowed",
        ),
        (
            {"type": "even", "bins": 10**9, "min": 0.0, "max": 1.0},
            rf"bins=1000000000 gives bins \+ 3 counts; at most {MAX_COUNTS} .*bins <= ",
        ),
        (
            {"type": "logarithmic", "min": 1.0, "max": float("inf"), "rate": 1.1},
            r"need finite min, max and rate, got min=1.0, max=inf",
        ),
        (
            {"type": "logarithmic", "min": 1.0, "max": 2.0, "rate": float("inf")},
            r"need finite min, max and rate, got .*rate=inf",
        ),
    ],
    ids=["log-1e9", "log-huge-span", "even-1e9", "log-max-inf", "log-rate-inf"],
)
def test_too_many_counts_are_refused_before_anything_is_allocated(params, message):
    """About 1e9 logarithmic counts allocated 8 GB of float64 boundaries (and ran out of
    memory); 1e-300..1e300 overflowed max / min; rate=inf made no boundaries and an
    IndexError; even bins=1e9 built a 4 GB count array. Oracle: the closed-form count
    2 * ceil(log(max / min) / log(rate)) + 2, and tracemalloc's peak (NumPy reports to
    it) staying under 1 MB."""
    tracemalloc.start()
    try:
        with pytest.raises(CommandError, match=message):
            ops.histogram(**params)(X)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2**20


def test_bins_with_no_boundaries_count_every_value_in_one_bin():
    """Zero boundaries indexed bounds[0] (an IndexError); every number has 0 boundaries
    at or below it, so all but the NaN land in count 0 (oracle: the definition)."""
    counts, _ = ops.histogram(type="bins")(X, np.zeros((0,), np.float32))
    np.testing.assert_array_equal(np.asarray(counts), [len(X) - 1, 1])


R = np.array([[3.0, -4.0, 1.0, 0.25], [0.5, 2.0, -2.5, 1.5], [-1.0, 0.75, 6.0, -0.5]], np.float32)
REDUCTIONS = {
    "reduce_sum": lambda x, ax: jnp.sum(x, axis=ax, keepdims=True),
    "reduce_mean": lambda x, ax: jnp.mean(x, axis=ax, keepdims=True),
    "reduce_max": lambda x, ax: jnp.max(x, axis=ax, keepdims=True),
    "reduce_min": lambda x, ax: jnp.min(x, axis=ax, keepdims=True),
    "reduce_norm2": lambda x, ax: jnp.sqrt(jnp.sum(x * x, axis=ax, keepdims=True)),
}


@pytest.mark.parametrize("axes", [(1,), (0, 1)], ids=["rows", "all"])
@pytest.mark.parametrize("name", sorted(REDUCTIONS))
def test_a_reduce_backward_with_no_output_gradient_takes_ones(name, axes):
    """NNC's null output gradient (``None``, a backward kernel's ``inputs[0] == 0``)
    raised AttributeError in every reduce backward; NNC's REDUCE_NORM2 backward gives
    ``x / norm`` for it, and fnnc's other commands read it as ones. Oracle: jax.grad of
    the sum of the jnp reduction (in float64)."""
    cmd = getattr(ops, name)(axes=axes)
    y = cmd(R)
    (got,) = cmd.definition.backward((None,), (R,), (y,), **cmd.kwargs)
    with jax.enable_x64():
        want = jax.grad(lambda x: jnp.sum(REDUCTIONS[name](x, axes)))(R.astype(np.float64))
    assert got.dtype == np.float32
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-7)


# -- autotune keys name where a winner was measured ----------------------------------------


@pytest.fixture
def twin(clean_table):
    """A second ewabs backend that compiles here and wins by priority when nothing is
    tuned: a table entry for "xla" is then visible in the choice."""
    here = jax.default_backend()
    ops.register_backend("ewabs", ops.Backend("twin", jnp.abs, (here,), priority=5))
    yield clean_table, here
    ops.unregister_backend("ewabs", "twin")


def _choice(here: str) -> str:
    return ops.select_backend(ops.ewabs(), [Spec((2, 2), jnp.float32)], here)


def test_a_winner_applies_only_where_it_was_measured(twin, monkeypatch):
    """The key was (command, params, specs, platform): a winner tuned on an H100, under
    another JAX or at another matmul precision ran here as if measured here. Oracle:
    the selection rule: an entry that does not apply leaves the priority's choice."""
    table, here = twin
    assert _choice(here) == "twin"
    table[ops.autotune.key(ops.ewabs(), [Spec((2, 2), jnp.float32)], here)] = "xla"
    assert _choice(here) == "xla"
    with config.override(matmul_precision="tensorfloat32"):
        assert _choice(here) == "twin"
    assert _choice(here) == "xla"
    with monkeypatch.context() as m:
        m.setattr(jax, "__version__", "0.0.1")
        assert _choice(here) == "twin"
    with monkeypatch.context() as m:
        m.setattr(measured, "device_kind", lambda platform: "Another GPU")
        assert _choice(here) == "twin"
    key = ops.autotune.key(ops.ewabs(), [Spec((2, 2), jnp.float32)], here)
    kind = measured.device_kind(here)
    assert f"|{kind}|jax {jax.__version__}|float32" in key


def test_table_files_carry_a_version_and_old_ones_load_as_not_matching(twin, tmp_path):
    """The file was a bare {key: backend} with no version. Now it has format and
    version; a version-1 table (keys without device kind, JAX version, precision)
    loads with a warning and changes no choice; save replaces it; a newer version is
    refused by name. The shipped measured defaults still load."""
    table, here = twin
    old = tmp_path / "old.json"
    old.write_text(json.dumps({f"ewabs|()|float32[2, 2]|{here}": "xla"}))
    with pytest.warns(UserWarning, match=r"old\.json: its 1 entries .*earlier fnnc.*tune again"):
        ops.autotune.load(old)
    assert len(table) == 0 and _choice(here) == "twin"
    key = ops.autotune.key(ops.ewabs(), [Spec((2, 2), jnp.float32)], here)
    table[key] = "xla"
    ops.autotune.save(old)
    data = json.loads(old.read_text())
    assert data == {"format": "fnnc.autotune", "version": 2, "entries": {key: "xla"}}
    table.clear()
    ops.autotune.load(old)
    assert dict(table) == {key: "xla"} and _choice(here) == "xla"
    newer = tmp_path / "newer.json"
    newer.write_text(json.dumps({**data, "version": 3}))
    with pytest.raises(GraphFormatError, match=r"newer\.json: .*version 3; this fnnc reads up"):
        ops.autotune.load(newer)
    shipped = measured.read()
    assert shipped["format"] == measured.FORMAT and "NVIDIA H200" in shipped["devices"]


def test_logarithmic_bounds_past_float64s_power_range_are_not_inf():
    """min=1e-300, rate=2: rate^i overflowed float64 from i = 1024 on, so every bound
    from 1e-300 * 2^1024 (1.8e8) up was inf and 1e31 fell in the last finite bin, with
    a RuntimeWarning. Oracle: the exact bounds math.ldexp(1e-300, i) in float32."""
    low, high = 1e-300, 1e300
    side = math.ceil((math.log(high) - math.log(low)) / math.log(2.0))  # high / low is inf
    right = np.array([math.ldexp(low, i) for i in range(side)], np.float64)
    with np.errstate(over="ignore"):
        bounds = np.concatenate([-right[::-1], right]).astype(np.float32)
    # no 0: XLA flushes the bounds that are float32 denormals to 0, NumPy does not
    x = np.array([1e31, -1e31, 5e37, 3e9, 1e-20, -7.0, np.nan], np.float32)
    want = np.bincount(np.searchsorted(bounds, x[:-1], side="right"), minlength=len(bounds) + 2)
    want[-1] += 1
    counts, _ = ops.histogram(type="logarithmic", min=low, max=high, rate=2.0)(x)
    np.testing.assert_array_equal(np.asarray(counts), want)
