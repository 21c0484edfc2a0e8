"""One sweep over every registered command.

For each case: the shape rule equals ``jax.eval_shape`` of the reference forward; a
hand-written backward equals ``jax.vjp`` of the reference (a derived backward *is*
``jax.vjp`` of it, so comparing the two would check nothing); every backward, with each
tensor outside ``backward_uses`` handed in as a bare spec (so a backward that reads what
it did not declare fails), passes a float64 finite-difference check (float32 for
commands whose results are float32 whatever their inputs); an eager call equals the
reference.
"""

from __future__ import annotations

import importlib
import pkgutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fnnc import ops
from fnnc.core.command import is_float
from fnnc.core.dispatch import compiled_forward
from tests import ops as ops_tests
from tests.helpers import assert_close
from tests.ops.cases import Case

CASES: list[Case] = []
for info in pkgutil.iter_modules(ops_tests.__path__):
    if info.name.startswith("cases_"):
        CASES += importlib.import_module(f"tests.ops.{info.name}").CASES

# Commands that cannot be given a fixed case here, with the test that covers them.
COVERED_ELSEWHERE = {"primitive": "tests/graph/test_trace.py"}


def _ids(cases: list[Case]) -> list[str]:
    return [c.id for c in cases]


def _forward(case: Case, *xs):
    out = compiled_forward(case.cmd)(*xs)
    return out if isinstance(out, tuple) else (out,)


def _grad_inputs(case: Case) -> list[int]:
    if case.grad_inputs is not None:
        return list(case.grad_inputs)
    return [i for i, x in enumerate(case.inputs) if is_float(np.asarray(x))]


def _cotangents(outs, seed: int = 7):
    rng = np.random.default_rng(seed)
    return tuple(
        jnp.asarray(rng.uniform(-1, 1, o.shape).astype(o.dtype)) if is_float(o) else None
        for o in outs
    )


def _our_backward(case: Case, cts, xs, outs):
    """The command's backward, jitted, with every tensor outside backward_uses a bare spec."""
    opdef = case.cmd.definition
    uses = opdef.backward_uses
    spec = lambda t: jax.ShapeDtypeStruct(t.shape, t.dtype)
    in_specs = tuple(None if uses.input_used(i) else spec(x) for i, x in enumerate(xs))
    out_specs = tuple(None if i in uses.outputs else spec(o) for i, o in enumerate(outs))

    def run(cts, used_in, used_out):
        ins = tuple(s if s is not None else x for s, x in zip(in_specs, used_in))
        outs = tuple(s if s is not None else o for s, o in zip(out_specs, used_out))
        return opdef.backward(cts, ins, outs, **case.cmd.kwargs)

    used_in = tuple(None if s is not None else x for s, x in zip(in_specs, xs))
    used_out = tuple(None if s is not None else o for s, o in zip(out_specs, outs))
    return jax.jit(run)(cts, used_in, used_out)


def test_every_command_has_a_case() -> None:
    have = {c.cmd.name for c in CASES}
    missing = [n for n in ops.registry() if n not in have and n not in COVERED_ELSEWHERE]
    assert not missing, f"commands without a case in tests/ops/cases_*.py: {missing}"


@pytest.mark.parametrize("case", CASES, ids=_ids(CASES))
def test_shape_rule_matches_eval_shape(case: Case) -> None:
    specs = [jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype) for x in case.inputs]
    want = jax.eval_shape(lambda *xs: _forward(case, *xs), *specs)
    got = case.cmd.shape(*specs)
    assert [(tuple(s.shape), np.dtype(s.dtype)) for s in got] == [
        (tuple(s.shape), np.dtype(s.dtype)) for s in want
    ]


@pytest.mark.parametrize("case", CASES, ids=_ids(CASES))
def test_eager_call_matches_reference(case: Case) -> None:
    got = case.cmd(*case.inputs)
    want = _forward(case, *map(jnp.asarray, case.inputs))
    assert_close(got if isinstance(got, tuple) else (got,), want, case.rtol, case.atol)


_DIFF = [c for c in CASES if c.cmd.definition.attributes.differentiable]
_HAND_WRITTEN = [c for c in _DIFF if c.cmd.definition.backward_fn is not None]


@pytest.mark.parametrize("case", _HAND_WRITTEN, ids=_ids(_HAND_WRITTEN))
def test_backward_matches_vjp(case: Case) -> None:
    xs = tuple(map(jnp.asarray, case.inputs))
    which = _grad_inputs(case)

    def f(*diff):
        args = list(xs)
        for i, d in zip(which, diff):
            args[i] = d
        return tuple(o for o in _forward(case, *args))

    outs, pullback = jax.vjp(f, *[xs[i] for i in which])
    cts = _cotangents(outs)
    full_cts = tuple(
        c if c is not None else np.zeros(o.shape, jax.dtypes.float0) for c, o in zip(cts, outs)
    )
    want = pullback(full_cts)
    got = _our_backward(case, cts, xs, outs)
    assert len(got) == len(xs), f"backward returned {len(got)} gradients for {len(xs)} inputs"
    for i, w in zip(which, want):
        assert got[i] is not None, f"input {i}: backward gave None"
        assert_close(got[i], w, case.rtol, case.atol, what=f"grad of input {i}")


_NUMERIC = [c for c in _DIFF if c.numeric or c.numeric_float32]


def test_every_derived_backward_has_an_independent_check() -> None:
    unchecked = [c.id for c in _DIFF if c.cmd.definition.backward_fn is None and c not in _NUMERIC]
    assert not unchecked, f"derived backwards checked against nothing: {unchecked}"


@pytest.mark.parametrize("case", _NUMERIC, ids=_ids(_NUMERIC))
def test_backward_finite_differences(case: Case) -> None:
    f32 = case.numeric_float32
    with jax.enable_x64(not f32):
        dtype = jnp.float32 if f32 else jnp.float64
        xs = tuple(
            jnp.asarray(x, dtype) if is_float(np.asarray(x)) else jnp.asarray(x)
            for x in case.inputs
        )
        which = _grad_inputs(case)
        outs = _forward(case, *xs)
        cts = _cotangents(outs)
        got = _our_backward(case, cts, xs, outs)
        # The perturbations and sums run in NumPy (float64 sums): eager jnp arithmetic
        # would compile one small XLA program per new shape, most of this test's cost.
        host = [np.asarray(x) for x in xs]
        rng = np.random.default_rng(11)
        dirs = {i: rng.uniform(-1, 1, host[i].shape).astype(host[i].dtype) for i in which}
        eps = 1e-2 if f32 else 1e-6

        def objective(sign: float) -> float:
            args = list(host)
            for i in which:
                args[i] = (host[i] + host[i].dtype.type(sign * eps) * dirs[i]).astype(host[i].dtype)
            total = 0.0
            for c, o in zip(cts, _forward(case, *args)):
                if c is not None:
                    total += float(np.sum(np.asarray(c, np.float64) * np.asarray(o, np.float64)))
            return total

        numeric = (objective(1.0) - objective(-1.0)) / (2 * eps)
        analytic = sum(
            float(np.sum(np.asarray(got[i], np.float64) * dirs[i].astype(np.float64)))
            for i in which
        )
        rtol, atol = (1e-3, 1e-4) if f32 else (1e-4, 1e-6)
        assert np.isclose(analytic, numeric, rtol=rtol, atol=atol), (analytic, numeric)
