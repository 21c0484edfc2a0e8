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


def test_a_dynamic_alias_with_nncs_empty_stride_takes_the_parents_strides():
    """NNC's "dynamic graph with alias" writes ccv_nnc_tensor_variable_alias_new(a,
    DIM_ALLOC(1), DIM_ALLOC(), [1]): stride all zeros means none given (NNC takes
    ``stride[0] == 0`` as the parent's strides). fnnc read it as a stride of 0, so the view
    at offset 1 read a[0] (10, not 11). NNC's expected 11 / 10, then 21 / 20."""
    dg = DynamicGraph()
    a = dg.variable(F32([10, 11]), name="a")
    a0 = dg.alias(a, (1,), offset=(1,), stride=(0,))
    a1 = dg.alias(a, (1,), stride=[0])
    assert (a0.numpy().tolist(), a1.numpy().tolist()) == ([11.0], [10.0])
    dg.set(a, F32([20, 21]))
    assert (a0.numpy().tolist(), a1.numpy().tolist()) == ([21.0], [20.0])
    x = dg.variable(np.arange(12, dtype=F32).reshape(3, 4), name="x")
    row = dg.alias(x, (1, 4), offset=(2, 0), stride=(0, 0))  # DIM_ALLOC() in 2-D
    np.testing.assert_array_equal(row.numpy(), [[8, 9, 10, 11]])
    col = dg.alias(x, (3, 1), offset=(0, 1), stride=(0, 1))  # not all zeros: kept as is
    np.testing.assert_array_equal(col.numpy(), [[1], [1], [1]])
