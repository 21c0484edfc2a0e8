"""Audit 12 (issue 7): ``fnnc.ops.autotune`` called as the issue names it."""

from __future__ import annotations

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
