"""Audit (round 12) of fnnc.graph against NNC's graph-level unit tests as NNC writes them
(liuliu/ccv test/unit/nnc): case_of.tests.c's "1/b" branch (and the norm tests' "1/std")
write ``CMD_EWDIV_FORWARD()`` with ``NO_TENSOR_SYMBOL`` as the numerator, which NNC's
CPU reference takes as all ones."""

from __future__ import annotations

import numpy as np
import pytest

from fnnc import ops
from fnnc.errors import CommandError
from fnnc.graph import DynamicGraph, GraphBuilder, interpret

F32 = np.float32


def test_a_nil_ewdiv_numerator_says_to_pass_ones():
    """The message said to pass 'a zero additive mask ... for attention' (a zero
    numerator gives 0, not 1 / x); it now names ones, and following it gives NNC's
    expected 1 / 2.2 (case_of.tests.c "symbolic graph case..of with 4 branches")."""
    b = GraphBuilder()
    x = b.input((1,), name="x")
    with pytest.raises(CommandError, match=r"node '1/b' \(ewdiv\): input 0 is None.*ones"):
        b.exec(ops.ewdiv(), None, x, name="1/b")
    y = b.exec(ops.ewdiv(), b.constant(F32(1)), x, name="1/b")
    np.testing.assert_allclose(interpret(b.build([y]), F32([2.2])), [1 / 2.2], rtol=1e-6)
    dg = DynamicGraph()
    with pytest.raises(CommandError, match=r"ewdiv.*input 0 is None.*ewdiv\(ones, b\)"):
        dg.exec(ops.ewdiv(), None, dg.variable(F32([2.2])))
