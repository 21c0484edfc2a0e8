"""Jitted forwards: one command on one backend, compiled once per command and state.

:func:`compiled_forward` is what eager calls, ``interpret`` and constant folding run. It
traces the forward under the matmul precision in force (:func:`matmul_precision_scope`)
and, for commands holding sub-graphs, under :func:`reference_only` as keyed; while
tracing it checks the result against the command's shape rule, so a backend returning
the wrong shapes or dtypes is a :class:`~fnnc.errors.CommandError` naming it.
:mod:`fnnc.core.dispatch` re-exports every name here.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import operator
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax

from fnnc import config
from fnnc.core import backends, selection
from fnnc.core.backends import REFERENCE, _backends_of
from fnnc.core.command import Command, Spec, output_specs, spec_text
from fnnc.core.evaluate import disagreement, part_of, results_agree
from fnnc.errors import BackendError, CommandError, FnncError


def forward_of(cmd: Command, backend: str = REFERENCE) -> Callable[..., Any]:
    """The plain (unjitted) forward of ``cmd`` on one backend, hyper-parameters bound."""
    return functools.partial(
        _backends_of(cmd.name, backends._generation)[backend].forward, **cmd.kwargs
    )


@contextlib.contextmanager
def matmul_precision_scope(precision: str | None = None) -> Iterator[None]:
    """The context fnnc traces commands under: float32 dots and convolutions at
    ``precision`` (a name in :data:`fnnc.config.MATMUL_PRECISIONS`; default: the
    configured policy, :attr:`fnnc.config.Config.matmul_precision`).

    It sets ``jax.default_matmul_precision`` while a forward is traced, so every dot and
    convolution the forward emits (Pallas kernels' in-kernel dots included) carries the
    precision; ``"default"`` leaves JAX's own setting in force. Backends chosen inside
    (sub-graphs' nodes) are chosen for it too (:func:`~fnnc.core.selection.precision_scope`).
    """
    name = config.matmul_precision_name(precision or config.get().matmul_precision)
    value = config.MATMUL_PRECISIONS[name]
    with selection.precision_scope(name):
        if value is None:
            yield
        else:
            with jax.default_matmul_precision(value):
                yield


_REFERENCE_ONLY = contextvars.ContextVar("fnnc_reference_only", default=False)


@contextlib.contextmanager
def reference_only() -> Iterator[None]:
    """Inside, the nodes of sub-graphs (loop and branch bodies, ``call``) run their
    reference forwards instead of the backends :func:`select_backend` would pick: what
    :func:`fnnc.graph.interpret`, the oracle, runs under."""
    token = _REFERENCE_ONLY.set(True)
    try:
        yield
    finally:
        _REFERENCE_ONLY.reset(token)


def references_only() -> bool:
    """Whether :func:`reference_only` is in force."""
    return _REFERENCE_ONLY.get()


def compiled_forward(cmd: Command, backend: str = REFERENCE) -> Callable[..., Any]:
    """A jitted forward of ``cmd`` on one backend, traced under the matmul precision in
    force (a program's while it is traced, :func:`~fnnc.core.selection.selection_precision`),
    cached per command value, state, precision and the platform of
    :func:`~fnnc.core.selection.platform_scope` (a forward calling other commands
    chooses their backends for it), the configuration in force and
    :func:`reference_only` (the backends a forward's inner commands or a command's
    sub-graph nodes get are chosen when it is traced)."""
    cfg = config.get()
    return _compiled(
        cmd,
        backend,
        backends._generation,
        # a program's compile(matmul_precision=...) while it is traced (a command's
        # forward calling another command), else the configured one
        selection.selection_precision(),
        _REFERENCE_ONLY.get(),
        cfg.serial,
        selection.platform_in_scope(),  # a command calling others chooses for it too
    )


@functools.lru_cache(maxsize=4096)
def _compiled(
    cmd: Command,
    backend: str,
    generation: int,
    precision: str,
    references: bool,
    serial: int,
    platform: str | None,
) -> Callable[..., Any]:
    forward = forward_of(cmd, backend)

    def run(*args: Any, **kwargs: Any) -> Any:
        token = _REFERENCE_ONLY.set(references)  # as keyed, whenever jit traces
        try:
            with matmul_precision_scope(precision), selection.platform_scope(platform):
                result = forward(*args, **kwargs)
        finally:
            _REFERENCE_ONLY.reset(token)
        _check_result(cmd, backend, args, result)  # while tracing: free at run time
        return result

    return jax.jit(run)


def _check_result(cmd: Command, backend: str, args: Sequence[Any], result: Any) -> None:
    """A :class:`CommandError` unless ``result`` is as many arrays, of the shapes and
    dtypes, as ``cmd``'s shape rule gives for ``args``."""
    specs = [None if a is None else Spec(tuple(a.shape), a.dtype) for a in args]
    try:
        want = output_specs(cmd, specs)
    except FnncError:  # inputs its rule refuses (a body replayed in float64): no judge
        return
    outs = result if isinstance(result, tuple) else (result,)
    # With x64 on, fnnc replays float32 programs in float64 (finite differences, pass
    # checks), where rules that pin an output dtype (primitive, optax_update) say float32
    # and the forward computes float64: there only the kind of dtype is compared.
    same = operator.eq if not jax.config.jax_enable_x64 else lambda a, b: a.kind == b.kind
    if results_agree(outs, want, same):
        return
    judge = f"for inputs {[spec_text(s) for s in specs]} the rule gives"
    raise CommandError(
        f"{cmd}: its {part_of(cmd)} ({backend!r} backend) returned "
        f"{disagreement(cmd, outs, [spec_text(w) for w in want], judge)}"
    )


_NO_FORWARD_MODE = "forward-mode autodiff (jvp) to a custom_vjp"


def is_forward_mode_error(error: BaseException) -> bool:
    """Whether ``error`` is JAX's refusal of ``jax.jvp`` through a ``jax.custom_vjp``."""
    return isinstance(error, TypeError) and _NO_FORWARD_MODE in str(error)


def forward_mode_error(
    error: BaseException, runs: Sequence[tuple[str, str, str]]
) -> BackendError | None:
    """What to tell a caller whose ``jax.jvp`` (``jax.jacfwd``, ``jax.linearize``) met
    a kernel backend, or ``None`` when ``error`` is not that or no kernel ran.

    ``runs`` are ``(where, command name, backend)`` of what the call ran. A kernel
    backend (Pallas, cuDNN) is a ``jax.custom_vjp`` whose backward is a kernel: JAX
    differentiates it in reverse mode, any number of times, but has no forward mode for
    it, and says so naming neither the command nor the way out.
    """
    if not is_forward_mode_error(error):
        return None
    kernels = [(where, name, b) for where, name, b in runs if b != REFERENCE]
    if not kernels:
        return None
    shown = "; ".join(f"{where} runs the {b!r} backend" for where, _, b in kernels)
    names = ", ".join(dict.fromkeys(f'"{name}": "xla"' for _, name, _ in kernels))
    return BackendError(
        f"{shown}: a kernel backend has reverse-mode derivatives only (jax.grad, grad of "
        "grad, jax.hessian, Hessian-vector products jax.jvp(jax.grad(f))); forward mode "
        "(jax.jvp, jax.jacfwd, jax.linearize) of it needs the reference: run it on the "
        f'"xla" backend, config.override(backend_per_command={{{names}}}) or '
        'FNNC_BACKEND=xla (docs/guides/commands.md, "Derivatives of eager calls")'
    )
