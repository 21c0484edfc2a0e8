"""Shared assertions and input makers for the tests."""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import sqlite3
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
import pytest

from tests import compile_flags


def assert_close(
    got: Any, want: Any, rtol: float = 1e-5, atol: float = 1e-5, what: str = ""
) -> None:
    """Pytrees ``got`` and ``want`` agree leaf by leaf (shapes, dtypes kinds, values)."""
    g_leaves, g_tree = jax.tree.flatten(got)
    w_leaves, w_tree = jax.tree.flatten(want)
    assert len(g_leaves) == len(w_leaves), f"{what}: {g_tree} != {w_tree}"
    for i, (g, w) in enumerate(zip(g_leaves, w_leaves)):
        g, w = np.asarray(g), np.asarray(w)
        assert g.shape == w.shape, f"{what} leaf {i}: shape {g.shape} != {w.shape}"
        np.testing.assert_allclose(
            g.astype(np.float64),
            w.astype(np.float64),
            rtol=rtol,
            atol=atol,
            err_msg=f"{what} leaf {i}",
        )


MATMUL_RTOL = {"float32": 1e-5, "tensorfloat32": 5e-3, "default": 5e-3, "bfloat16": 3e-2}
"""Relative error of a float32 dot of unit-scale values at each matmul precision, on an
accelerator (TF32 keeps 10 mantissa bits, bfloat16 7)."""


def matmul_rtol(precision: str, platform: str) -> float:
    """The relative tolerance a float32 result earns at the matmul ``precision`` a program
    really used (``Program.matmul_precision``) on ``platform``: XLA:CPU computes every
    float32 dot in float32 whatever the precision says."""
    return MATMUL_RTOL["float32"] if platform == "cpu" else MATMUL_RTOL[precision]


def exact_on_cpu(rtol: float, atol: float) -> tuple[float, float]:
    """``(rtol, atol)`` for comparing two XLA programs that compute one float function:
    ``(0, 0)`` on CPU, where they agree bit for bit; the given tolerance elsewhere, since
    on a GPU XLA fuses each program its own way (float32 FMAs, reductions in another
    order) and its autotuner picks a gemm or convolution algorithm per compilation."""
    return (0.0, 0.0) if jax.default_backend() == "cpu" else (rtol, atol)


def cpu_and_here() -> tuple[str, ...] | None:
    """``platforms=`` for a ``jax.export`` artifact that a CPU subprocess runs: ``None``
    (this platform's) on CPU, else the CPU's and this one's (``cuda`` on a GPU)."""
    here = jax.default_backend()
    return None if here == "cpu" else ("cpu", "cuda" if here == "gpu" else here)


ACROSS_PLATFORMS_ATOL = 1e-6 if jax.default_backend() == "cpu" else 1e-5
"""Absolute tolerance between an artifact run on CPU and fnnc run here, on unit-scale
float32 values: XLA:GPU's FMAs and reduction orders round differently from XLA:CPU's."""


def nnc_unequal(a: Any, b: Any) -> int:
    """How many entries NNC's REQUIRE_TENSOR_EQ (``ccv_nnc_tensor_eq``) rejects: more than
    128 ULPs apart (sign-magnitude floats read as integers) and more than FLT_EPSILON."""
    a, b = np.ascontiguousarray(a, np.float32), np.ascontiguousarray(b, np.float32)
    ia, ib = (v.view(np.int32).astype(np.int64) for v in (a, b))
    ia, ib = (np.where(i < 0, 0x80000000 - i, i) for i in (ia, ib))
    return int(np.sum((np.abs(ia - ib) > 128) & (np.abs(a - b) > np.finfo(np.float32).eps)))


def assert_tensor_eq(got: Any, want: Any, atol_elsewhere: float = 1e-5) -> None:
    """NNC's REQUIRE_TENSOR_EQ on CPU. NNC sets it for its CPU kernels; a GPU reduces in
    another order, which moves results near zero (a normalisation's, after the mean's
    subtraction) by more than 128 ULPs of themselves, so there the test is
    ``atol_elsewhere`` absolute on these unit-scale values."""
    if jax.default_backend() == "cpu":
        assert nnc_unequal(got, want) == 0
    else:
        assert_close(got, want, 0.0, atol_elsewhere)


def rand(
    shape: Sequence[int], dtype: Any = np.float32, seed: int = 0, lo: float = -1.0, hi: float = 1.0
) -> np.ndarray:
    """Deterministic uniform values."""
    rng = np.random.default_rng(seed)
    return rng.uniform(lo, hi, size=tuple(shape)).astype(dtype)


def randint(shape: Sequence[int], high: int, seed: int = 0, dtype: Any = np.int32) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(0, high, size=tuple(shape)).astype(dtype)


def assert_pass_keeps_semantics(
    graph_pass: Any, graph: Any, arrays: Sequence[Any], rtol: float = 1e-5, atol: float = 1e-5
) -> Any:
    """``graph_pass(graph)`` verifies, keeps the input and output specs, computes the same
    values as ``graph`` under ``interpret`` and is a fixpoint of the pass; returns it."""
    from fnnc.graph import interpret, verify

    new = verify(graph_pass(graph))
    assert new.input_specs == graph.input_specs, f"{graph_pass}: inputs changed\n{new}"
    assert new.output_specs == graph.output_specs, f"{graph_pass}: outputs changed\n{new}"
    assert graph_pass(new) is new, f"{graph_pass} is not idempotent on\n{new}"
    assert_close(interpret(new, *arrays), interpret(graph, *arrays), rtol, atol, what=str(new))
    return new


# Files written by libccv itself (liuliu/ccv c6ce5b1), in the team's shared folder beside
# the repository; tests that read them skip where that folder is absent.
NNC_FILES = pathlib.Path(__file__).resolve().parents[1].parent / "shared" / "nnc-files"
needs_nnc_files = pytest.mark.skipif(
    not (NNC_FILES / "model.sqlite3").exists(),
    reason=f"no files written by NNC at {NNC_FILES}",
)


ROOT = pathlib.Path(__file__).resolve().parents[1]


def subprocess_env(**extra: str) -> dict[str, str]:
    """The environment of a child Python process a test starts: this checkout first on
    ``PYTHONPATH`` with the parent's entries kept (packages installed with
    ``pip install --target`` live there, e.g. grain on the GPU machines), JAX on CPU
    (such tests are about processes, not accelerators), then ``extra``. An ``XLA_FLAGS``
    there keeps the suite's compile flags (:mod:`tests.compile_flags`) before its own."""
    paths = [str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    if "XLA_FLAGS" in extra:
        extra["XLA_FLAGS"] = compile_flags.merged(extra["XLA_FLAGS"])
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths), "JAX_PLATFORMS": "cpu", **extra}


def run_on_cpu_devices(script: str, devices: int = 4, timeout: int = 600) -> str:
    """Runs ``script`` (Python source that prints ``OK`` when its checks pass) in a child
    process with ``devices`` virtual CPU devices; fails with the child's error otherwise.
    Returns its standard output."""
    done = subprocess.run(
        [sys.executable, "-c", script],
        env=subprocess_env(XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}"),
        capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    assert "OK" in done.stdout, done.stdout[-2000:]
    return done.stdout


class BackgroundDevices:
    """A script of named checks run in a child process with ``devices`` virtual CPU
    devices, started at once so it runs beside the tests that read its results; the
    script prints ``RESULTS {name: "ok" | traceback}`` as JSON."""

    def __init__(self, script: str, devices: int = 4) -> None:
        flags = f"--xla_force_host_platform_device_count={devices}"
        self.proc = subprocess.Popen(
            [sys.executable, "-c", script],
            env=subprocess_env(XLA_FLAGS=flags),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._results: dict[str, str] | None = None

    def results(self) -> dict[str, str]:
        """The checks' results, waiting for the script on first use."""
        if self._results is None:
            out, err = self.proc.communicate(timeout=600)
            line = [ln for ln in out.splitlines() if ln.startswith("RESULTS ")]
            assert line, f"device script failed (exit {self.proc.returncode}):\n{err[-4000:]}"
            self._results = json.loads(line[-1][len("RESULTS ") :])
        return self._results

    def close(self) -> None:
        """Stops the script if it still runs."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


def fetch_rows(path: Any, query: str, params: Sequence[Any] = ()) -> list[tuple]:
    """The rows of one SQL query on the file ``path``, on a connection closed at once
    (Python 3.13 reports a connection left to the garbage collector)."""
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return conn.execute(query, params).fetchall()
