"""Audit 12 (issue 7): ``fnnc.ops.autotune`` and ``select_backend`` given no command."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from fnnc import ops
from fnnc.errors import CommandError
from fnnc.ops import autotune


@pytest.mark.parametrize("cmd", ["gemm", ops.gemm, None])
def test_autotune_of_no_command_says_what_to_pass(cmd):
    """A name or the uncalled factory was an AttributeError on ``.definition``."""
    x = np.ones((4, 8), np.float32)
    with pytest.raises(CommandError, match=r"autotune: expected a Command .*fnnc\.ops\.gemm\("):
        autotune(cmd, x, x.T)


@pytest.mark.parametrize("cmd", ["gemm", ops.gemm])
def test_select_backend_of_no_command_says_what_to_pass(cmd):
    """A name was an AttributeError on ``.name``; a bound command gets the reference."""
    specs = [jax.ShapeDtypeStruct((4, 8), np.float32), jax.ShapeDtypeStruct((8, 4), np.float32)]
    with pytest.raises(CommandError, match=r"select_backend: expected a Command .*ops\.gemm\("):
        ops.select_backend(cmd, specs, "cpu")
    assert ops.select_backend(ops.gemm(), specs, "cpu") == "xla"
