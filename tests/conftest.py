"""Strict JAX settings for every test: no silent rank promotion."""

import jax
import pytest

jax.config.update("jax_numpy_rank_promotion", "raise")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a real GPU (kept out of CI)")
    config.addinivalue_line("markers", "slow: slower end-to-end checks")
