"""The registry sweep per backend: every backend of every command, forced, on its cases.

For each case of ``tests/ops/cases_*.py`` and each backend of its command besides the
reference whose support predicate accepts the case's inputs on this platform (compiled
or interpreted, as Pallas kernels are on CPU), the backend is forced through dispatch
(``config.override(backend_per_command=...)``) and:

* its forward equals the reference forward;
* where it carries a ``backward``, the case's ``gradient`` node, which dispatch then
  runs on the same backend, equals the reference backward's (every float input wanted,
  every float output given a gradient);

in float32 within the case's tolerances, and, on the cases marked ``sweep_float64``
(a few per command, reaching each code path of its backends) where the backend takes
float64, in float64 within 1e-9. The reference's float64 backward passes finite
differences in ``test_registry.py``, so agreement to 1e-9 is that check for the
backend, and a tighter one. Forward and backward of a (case, backend, dtype) run as
one jitted function (one compile).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import pkgutil
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fnnc import config, ops
from fnnc.core.command import is_float
from fnnc.core.dispatch import REFERENCE, as_specs, backends_of, why_not
from fnnc.ops.autodiff import gradient_command
from tests import ops as ops_tests
from tests.helpers import assert_close
from tests.ops.cases import Case

CASES: list[Case] = []
for info in pkgutil.iter_modules(ops_tests.__path__):
    if info.name.startswith("cases_"):
        CASES += importlib.import_module(f"tests.ops.{info.name}").CASES
BY_ID = {c.id: c for c in CASES}
PLATFORM = jax.default_backend()
F64_TOL = 1e-9


def _cast(inputs, dtype):
    return tuple(np.asarray(x, dtype) if is_float(np.asarray(x)) else np.asarray(x) for x in inputs)


def _accepts(backend, case: Case, dtype) -> tuple[bool, str | None]:
    """(accepted, error): whether ``backend`` supports ``case`` in ``dtype``; a predicate
    that raises instead of answering is reported, not collected."""
    specs = as_specs(_cast(case.inputs, dtype), case.id)
    try:
        return why_not(backend, case.cmd, specs, PLATFORM) is None, None
    except Exception as e:  # reported by test_support_predicates_answer
        return False, f"{case.id} / {backend.name}: {type(e).__name__}: {e}"


def _runs_in_float64(case: Case) -> bool:
    """Whether the command takes the case's float inputs as float64 and computes in it
    (some, e.g. ``gradient`` or a fused body, are fixed to the specs they carry)."""
    with jax.enable_x64(True):
        specs = as_specs(_cast(case.inputs, np.float64), case.id)
        try:
            outs = case.cmd.shape(*specs)
        except (ValueError, TypeError):
            return False
    return all(np.dtype(o.dtype) == np.float64 for o in outs if is_float(o))


PAIRS: list[tuple[str, str]] = []
F64_PAIRS: list[tuple[str, str]] = []
PREDICATE_ERRORS: list[str] = []
for _case in CASES:
    if any(x is None for x in _case.inputs):  # inputs left out run the reference only
        continue
    for _name, _backend in backends_of(_case.cmd.name).items():
        if _name == REFERENCE:
            continue
        ok, error = _accepts(_backend, _case, np.float32)
        PREDICATE_ERRORS += [error] if error else []
        if ok:
            PAIRS.append((_case.id, _name))
            f64 = _case.sweep_float64 and _runs_in_float64(_case)
            if f64 and _accepts(_backend, _case, np.float64)[0]:
                F64_PAIRS.append((_case.id, _name))


def _ids(pairs):
    return [f"{c}-{b}" for c, b in pairs]


def _has_backward(case: Case, backend: str) -> bool:
    differentiable = case.cmd.definition.attributes.differentiable
    return differentiable and backends_of(case.cmd.name)[backend].backward is not None


def _wants(case: Case) -> tuple[int, ...]:
    if case.grad_inputs is not None:
        return tuple(case.grad_inputs)
    return tuple(i for i, x in enumerate(case.inputs) if is_float(np.asarray(x)))


def _gradient(case: Case, xs, outs, cts):
    """The case's ``gradient`` node (every float output seeded) and its inputs."""
    uses = case.cmd.definition.backward_uses
    spec = lambda t: jax.ShapeDtypeStruct(t.shape, t.dtype)
    grad_mask = tuple(c is not None for c in cts)
    cmd = gradient_command(
        case.cmd, tuple(map(spec, xs)), tuple(map(spec, outs)), grad_mask, _wants(case)
    )
    args = [c for c in cts if c is not None]
    args += [x for i, x in enumerate(xs) if uses.input_used(i)]
    args += [o for i, o in enumerate(outs) if i in uses.outputs]
    return cmd, args


@functools.cache
def _program(case_id: str, backend: str, with_backward: bool):
    """``(xs, cts) -> (forward outputs, gradients)`` with ``backend`` forced, jitted once."""
    case = BY_ID[case_id]

    def run(xs, cts):
        with config.override(backend_per_command={case.cmd.name: backend}):
            assert ops.select_backend(case.cmd, as_specs(xs, case_id)) == backend
            outs = case.cmd(*xs)
            outs = outs if isinstance(outs, tuple) else (outs,)
            if not with_backward:
                return outs, None
            # Forcing the forward's backend forces its gradient node's too.
            cmd, args = _gradient(case, xs, outs, cts)
            assert ops.select_backend(cmd, as_specs(args, case_id)) == backend
            return outs, cmd(*args)

    return jax.jit(run)


def _cotangents(case: Case, xs):
    specs = jax.eval_shape(lambda *a: case.cmd.definition.forward(*a, **case.cmd.kwargs), *xs)
    specs = specs if isinstance(specs, tuple) else (specs,)
    rng = np.random.default_rng(7)
    return tuple(
        jnp.asarray(rng.uniform(-1, 1, s.shape).astype(s.dtype)) if is_float(s) else None
        for s in specs
    )


def _check(case_id: str, backend: str, dtype, rtol: float, atol: float) -> None:
    case = BY_ID[case_id]
    xs = tuple(map(jnp.asarray, _cast(case.inputs, dtype)))
    cts = _cotangents(case, xs)
    backward = _has_backward(case, backend)
    got = _program(case_id, backend, backward)(xs, cts)
    want = _program(case_id, REFERENCE, backward)(xs, cts)
    assert_close(got[0], want[0], rtol, atol, what=f"{case_id} forward on {backend!r}")
    if backward:
        assert_close(got[1], want[1], rtol, atol, what=f"{case_id} backward on {backend!r}")


@pytest.mark.parametrize(("case_id", "backend"), PAIRS, ids=_ids(PAIRS))
def test_forced_backend_matches_the_reference(case_id: str, backend: str) -> None:
    case = BY_ID[case_id]
    _check(case_id, backend, np.float32, case.rtol, case.atol)


@pytest.mark.parametrize(("case_id", "backend"), F64_PAIRS, ids=_ids(F64_PAIRS))
def test_forced_backend_matches_the_reference_in_float64(case_id: str, backend: str) -> None:
    with jax.enable_x64(True):
        _check(case_id, backend, np.float64, F64_TOL, F64_TOL)


def test_support_predicates_answer() -> None:
    """A predicate returns ``None`` or a reason for any well-formed input, never raises
    (dispatch calls it while choosing, so a raise breaks every compile that meets it)."""
    assert not PREDICATE_ERRORS, "\n".join(PREDICATE_ERRORS)


def _accepted_anywhere(name: str, backend) -> bool:
    """Whether some case of command ``name`` passes ``backend``'s support predicate,
    whatever the platform (the sweep runs it on a platform where it runs)."""
    for case in CASES:
        if case.cmd.name == name and not any(x is None for x in case.inputs):
            with contextlib.suppress(Exception):  # reported by test_support_predicates_answer
                if backend.supports(case.cmd, as_specs(_cast(case.inputs, np.float32), "")) is None:
                    return True
    return False


CHECKED_ELSEWHERE = {
    ("scaled_dot_product_attention", "cudnn"): (
        "16-bit only, and the sweep runs float32: tests/ops/test_attention_cudnn.py checks "
        "its adaptor here, tests/ops/pallas/test_gpu.py the compiled cuDNN call"
    ),
}
"""Backends no float32 case can reach, with the tests that check them instead."""


def _fnnc_own(forward: Any) -> bool:
    """A command fnnc defines, not one a test or an example in this process registered
    (``examples/pass_custom_kernel.py`` adds ``dense_relu`` with its own backend)."""
    return getattr(forward, "__module__", "").startswith("fnnc.")


def test_every_backend_has_a_case() -> None:
    """Each registered backend accepts at least one case, so none goes unchecked: swept
    here if it runs on this platform (compiled or interpreted), else swept where it runs
    (the CPU convolution backends on a GPU machine), unless :data:`CHECKED_ELSEWHERE`
    names its own tests. (Backends of ``gradient`` are the forwards' ``backward``s,
    checked with them.)"""
    swept = set()
    for case_id, backend in PAIRS:
        swept.add((BY_ID[case_id].cmd.name, backend))
    missing = [
        f"{name}/{backend}"
        for name in ops.registry()
        if ops.lookup(name).backward_node is None
        and _fnnc_own(backends_of(name)[REFERENCE].forward)
        for backend, b in backends_of(name).items()
        if backend != REFERENCE
        and (name, backend) not in swept
        and (name, backend) not in CHECKED_ELSEWHERE
        and (PLATFORM in b.platforms + b.interpret_platforms or not _accepted_anywhere(name, b))
    ]
    assert not missing, f"backends no case in tests/ops/cases_*.py reaches: {missing}"
