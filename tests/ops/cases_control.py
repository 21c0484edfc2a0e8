"""Cases of the control family: compare, while_loop (bounded, so it differentiates), case_of.

Inputs sit away from the points where a condition or a selector changes its answer, so
the finite-difference steps never flip a branch.
"""

import numpy as np

from fnnc import ops
from fnnc.graph import GraphBuilder
from tests.helpers import rand, randint
from tests.ops.cases import Case


def _count_below(n: int):
    c = GraphBuilder()
    count = c.input((), np.int32, name="count")
    return c.build([c.exec(ops.compare(op="lt"), count, c.constant(np.int32(n)))])


def _power_body():
    """z1 = z0 * x; w1 = w0 + z1 (two carried tensors, one invariant)."""
    b = GraphBuilder()
    z0, w0, x = b.input((3,), name="z0"), b.input((3,), name="w0"), b.input((3,), name="x")
    z1 = b.exec(ops.ewprod(), z0, x, name="z1")
    w1 = b.exec(ops.ewsum(), w0, z1, name="w1")
    return b.build([z1, w1])


def _while(breakpoint=(), bound=6, cond=None, cond_inputs=()):
    return ops.while_loop(
        body=_power_body(),
        cond=cond or _count_below(3),
        carry_overs=((0, 0), (1, 1)),
        cond_inputs=cond_inputs,
        breakpoint=breakpoint,
        max_iterations=bound,
    )


def _sum_above(limit: float):
    """count < 8 and sum(z) > limit: a loop that stops on a value."""
    c = GraphBuilder()
    count = c.input((), np.int32, name="count")
    z = c.input((3,), name="z1")
    total = c.exec(ops.reshape(shape=()), c.exec(ops.reduce_sum(axes=(0,)), z))
    big = c.exec(ops.compare(op="gt"), total, c.constant(np.float32(limit)))
    early = c.exec(ops.compare(op="lt"), count, c.constant(np.int32(8)))
    return c.build([c.exec(ops.select(), big, early, big)])


def _case_of():
    """Selector: -1 if s < 0, 0 if s < 1, else 1; branches x * y and x + y; bypass x."""
    s = GraphBuilder()
    sv, _, _ = s.input((), name="s"), s.input((2, 3), name="x"), s.input((2, 3), name="y")

    def below(v, then, other):
        test = s.exec(ops.compare(op="lt"), sv, s.constant(np.float32(v)))
        return s.exec(ops.select(), test, s.constant(np.int32(then)), other)

    selector = s.build([below(0.0, -1, below(1.0, 0, s.constant(np.int32(1))))])
    branches = []
    for cmd in (ops.ewprod(), ops.ewsum()):
        g = GraphBuilder()
        _, x, y = g.input((), name="s"), g.input((2, 3), name="x"), g.input((2, 3), name="y")
        branches.append(g.build([g.exec(cmd, x, y, name="out")]))
    return ops.case_of(selector=selector, branches=tuple(branches), bypass=(1,))


def _loop_inputs():
    return (rand([3], lo=0.5, hi=1.0), rand([3], seed=1), rand([3], seed=2, lo=0.8, hi=1.2))


def _case_inputs(s: float):
    return (np.float32(s), rand([2, 3]), rand([2, 3], seed=1))


CASES = [
    Case(ops.compare(op="lt"), (rand([2, 3]), rand([1, 3], seed=1)), "compare-lt-bcast"),
    Case(ops.compare(op="eq"), (randint([4], 3), randint([4], 3, seed=1)), "compare-eq-int"),
    Case(_while(), _loop_inputs(), "while-before"),
    Case(_while(breakpoint=(0, 1)), _loop_inputs(), "while-after"),
    Case(_while(breakpoint=(0,)), _loop_inputs(), "while-between"),
    Case(_while(bound=2), _loop_inputs(), "while-bound-stops"),
    Case(
        _while(breakpoint=(0,), cond=_sum_above(1.85), cond_inputs=(("out", 0),)),
        _loop_inputs(),
        "while-on-value",
    ),
    Case(_case_of(), _case_inputs(-0.5), "case-of-bypass"),
    Case(_case_of(), _case_inputs(0.5), "case-of-0"),
    Case(_case_of(), _case_inputs(1.5), "case-of-1"),
]
