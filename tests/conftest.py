"""Strict JAX settings for every test: no silent rank promotion."""

import os
import pathlib

import jax
import pytest
from hypothesis import HealthCheck, settings

from tests import compile_flags

# Cheap XLA compiles on CPU (the suite's cost), before JAX starts its backend: see
# tests/compile_flags.py; FNNC_TESTS_XLA_DEFAULTS=1 keeps XLA's defaults.
compile_flags.apply()

# One hypothesis profile for every property test: reproducible in CI (derandomized, no
# example database), no deadline (JAX compiles), no health checks that flag slow draws.
# A test's own @settings only says how many examples it wants.
settings.register_profile(
    "fnnc",
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
settings.load_profile("fnnc")

jax.config.update("jax_numpy_rank_promotion", "raise")
# Oracles (plain jax.jit steps, Flax, Optax) compute float32 dots at full precision: on
# GPUs JAX's default is TF32. fnnc's programs trace under their own policy
# (fnnc.config.matmul_precision, float32 by default), which this setting does not touch:
# tests/graph/test_matmul_precision.py checks that under an ambient "bfloat16".
jax.config.update("jax_default_matmul_precision", "highest")


# ``pytest -m quick``: a subset that runs in about a minute on 2 cores (the whole suite
# takes about 11), with a file or more from every package. Paths from the repository root.
QUICK = (
    "tests/test_architecture.py",
    "tests/core/",
    "tests/io/",
    "tests/data/",
    "tests/ops/test_backends.py",
    "tests/ops/test_activation_values.py",
    "tests/graph/test_builder.py",
    "tests/graph/test_program.py",
    "tests/graph/test_verify.py",
    "tests/models/test_model.py",
    "tests/test_readme.py",
)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a real GPU (kept out of CI)")
    config.addinivalue_line("markers", "slow: slower end-to-end checks")
    config.addinivalue_line("markers", "quick: the quick subset (tests/conftest.py QUICK)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Marks the tests of the QUICK files ``quick``, except slow and GPU ones. Where
    ``FNNC_TESTS_FIRST`` names a file (``benchmarks/gpu_check.py`` does), moves the tests
    whose node ids start with one of its lines (``#`` comments and blank lines aside) to
    the front, in their own order otherwise: under ``--dist load`` xdist deals the front
    of the list out first."""
    root = config.rootpath
    for item in items:
        try:
            path = item.path.relative_to(root).as_posix()
        except ValueError:
            continue
        if path.startswith(QUICK) and not any(item.get_closest_marker(m) for m in ("slow", "gpu")):
            item.add_marker(pytest.mark.quick)
    first = os.environ.get("FNNC_TESTS_FIRST")
    if first:
        from benchmarks.gpu_first import read

        prefixes = read(pathlib.Path(first))
        items.sort(key=lambda item: not item.nodeid.startswith(prefixes))  # a stable sort


@pytest.fixture
def clean_table():
    """The autotune table emptied for one test and restored after it."""
    from fnnc.ops import autotune

    saved = dict(autotune.TABLE)
    autotune.TABLE.clear()
    yield autotune.TABLE
    autotune.TABLE.clear()
    autotune.TABLE.update(saved)


@pytest.fixture
def restore_registries():
    """Code that registers commands and backends and writes the autotune table, as users
    do (the docs' pages, the pass tutorials): other tests in this process must not see
    them (tests that walk ``ops.registry()`` would find commands with no case)."""
    from fnnc.core import command, dispatch

    commands, table = dict(command._REGISTRY), dict(dispatch.TABLE)
    backends = {name: dict(per) for name, per in dispatch._BACKENDS.items()}
    # ... nor see theirs: the autotune page prints the table's size, which an earlier
    # autotuning test in the same worker changed (an order-dependent failure)
    dispatch.TABLE.clear()
    dispatch._bump()
    yield
    changed = [n for n, d in command._REGISTRY.items() if commands.get(n) is not d]
    command._REGISTRY.clear()  # new commands go, replaced ones come back
    command._REGISTRY.update(commands)
    for name in changed:
        command._forget(name)
    dispatch._BACKENDS.clear()
    dispatch._BACKENDS.update(backends)
    dispatch._bump()
    dispatch.TABLE.clear()
    dispatch.TABLE.update(table)
