"""Which kernel libraries XLA:CPU may hand a compiled program's operations to, per program.

XLA:CPU passes dots, 2-D convolutions, and large elementwise and reduce operations to
YNNPACK, everything else to its own loops, Eigen's convolutions and Eigen's GEMM. Which
mix is fastest depends on the whole program, not on one operation: in the ResNet of
``benchmarks/cpu_vs_torch.py`` YNNPACK runs each batch-norm statistic as a reduction of
its own over an operand XLA first writes out, and the training step took 15-22% longer
than with YNNPACK kept to dots and convolutions; the same restriction made the CNN's
step (no batch norm) 10% slower. The choice is an XLA compile option
(``xla_cpu_experimental_ynn_fusion_type``), set per compiled program, so fnnc offers it as
a program-level choice, the way backends are a node-level one (:data:`LIBRARY_SETS`):

``"xla"``
    XLA's own defaults: the default for programs without training-mode batch norm.
``"ynn-gemm"``
    YNNPACK for dots and convolutions only: the default for programs with a node whose
    command computes batch statistics (training ``batch_norm``; see
    :data:`REDUCTION_HEAVY`).
``"ynn-dot"``
    YNNPACK for dots only (convolutions on Eigen).
``"ynn-no-conv"``
    YNNPACK for dots, elementwise and reduce operations, not convolutions.
``"eigen"``
    no YNNPACK.

:func:`fnnc.graph.autotune.autotune_graph` (and so ``Model.autotune``) times the
compiled graph under each set this jaxlib accepts and records the winner in the
autotune table under :func:`program_key`; :func:`fnnc.graph.compile` compiles with the
recorded set. ``config.override(cpu_libraries="eigen")`` forces one. The sets change
only which library computes each operation (float sums may round differently, as
between backends); they apply on CPU only.

>>> from fnnc import config, ops
>>> from fnnc.graph import GraphBuilder, compile
>>> b = GraphBuilder()
>>> x = b.input((2,), name="x")
>>> g = b.build([b.exec(ops.relu(), x)])
>>> with config.override(cpu_libraries="eigen"):
...     compile(g, platform="cpu").cpu_libraries
'eigen'
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping, Sequence

import jax
import jax.numpy as jnp

from fnnc import config
from fnnc.core.dispatch import TABLE, select_backend, table_key
from fnnc.core.ir import Graph
from fnnc.errors import BackendError, ConfigError

_YNN = "xla_cpu_experimental_ynn_fusion_type"
_T = "LIBRARY_FUSION_TYPE_"

DEFAULT = "xla"
_SETTING = "config (FNNC_CPU_LIBRARIES or config.override(cpu_libraries=...))"

LIBRARY_SETS: Mapping[str, Mapping[str, str]] = {
    DEFAULT: {},
    "ynn-gemm": {_YNN: f"{_T}DOT,{_T}INDIVIDUAL_CONVOLUTION"},
    "ynn-dot": {_YNN: f"{_T}DOT"},
    "ynn-no-conv": {_YNN: f"{_T}DOT,{_T}ELTWISE,{_T}REDUCE"},
    "eigen": {_YNN: ""},
}
"""XLA:CPU compile options of each library set, by name (see the module doc)."""

REDUCTION_HEAVY = "ynn-gemm"
"""The default set of a program that computes batch statistics: every statistic is a
reduction that YNNPACK would run on its own. Measured (``fit`` step, 2-core x86, batch
64, time under ``"ynn-gemm"`` / under ``"xla"``, same process): the ResNet of
``benchmarks/cpu_vs_torch.py`` 0.82-0.87 (three runs), its CNN with a BatchNorm after
each convolution 0.91; without batch norm ``"xla"`` stays ahead (the CNN 1.10, the MLP
1.04)."""


def program_key(
    graph: Graph,
    platform: str,
    backends: Sequence[str] | None = None,
    precision: str | None = None,
) -> str:
    """The autotune-table key of ``graph``'s library set on ``platform``: a digest of
    every node's command, parameters, input specs, wiring and backend (``backends``, one
    per node; default: the ones :func:`~fnnc.core.dispatch.select_backend` gives now),
    and of the matmul ``precision`` (default the one in force; see ``table_key``).
    It is the same in every process, so a saved table applies to the same graph built
    again; a set tuned with some backends does not apply when other ones are forced."""
    h = hashlib.sha256()
    for i, node in enumerate(graph.nodes):
        specs = [graph.spec(s) for s in node.inputs]
        backend = (
            backends[i]
            if backends is not None
            else select_backend(node.cmd, specs, platform, precision)
        )
        key = table_key(node.cmd, specs, platform, precision)
        line = f"{key}|{node.inputs}|{node.outputs}|{backend}"
        h.update(f"{line}\n".encode())
    h.update(f"{graph.inputs}|{graph.outputs}".encode())
    return f"program|{h.hexdigest()[:32]}|{platform}"


@functools.cache
def available(platform: str) -> tuple[str, ...]:
    """The library sets this jaxlib compiles with on ``platform`` (only ``"xla"`` off CPU,
    or where XLA no longer knows an option)."""
    if platform != "cpu":
        return (DEFAULT,)
    names = []
    probe = jax.ShapeDtypeStruct((2, 2), jnp.float32)
    for name, options in LIBRARY_SETS.items():
        try:
            jax.jit(jnp.dot).lower(probe, probe).compile(dict(options) or None)
        except Exception:  # an option this XLA rejects: that set is not offered
            continue
        names.append(name)
    return tuple(names)


class _UnknownSet(BackendError, ConfigError):
    """An unknown ``cpu_libraries`` setting: a :class:`~fnnc.errors.ConfigError`, as
    every unknown configuration value is (the errors guide), and the
    :class:`~fnnc.errors.BackendError` it was before."""


def chosen(
    graph: Graph,
    platform: str,
    backends: Sequence[str] | None = None,
    precision: str | None = None,
) -> str:
    """The library set ``graph`` compiles with (its nodes running ``backends``, its dots
    at the matmul ``precision``, default the one in force): the forced one
    (``config.override(cpu_libraries=...)``), else the autotune table's, else
    :func:`default`'s.

    Raises:
        BackendError: the forced name is no set of :data:`LIBRARY_SETS` (on every
            platform: a typo in ``FNNC_CPU_LIBRARIES`` is not ignored on a GPU; that
            error is a ``ConfigError`` too), or a set this jaxlib does not offer (on CPU).
    """
    forced = config.get().cpu_libraries
    if forced and forced not in LIBRARY_SETS:  # a typo, on every platform
        raise _UnknownSet(
            f"{_SETTING}: cpu_libraries={forced!r} is unknown."
            f"{config.close_matches(forced, LIBRARY_SETS)} Use one of {list(LIBRARY_SETS)} "
            "or leave it empty"
        )
    if platform != "cpu":
        return DEFAULT
    if forced:
        if forced not in available(platform):
            raise BackendError(
                f"{_SETTING}: cpu_libraries={forced!r} is not offered by this jaxlib; use "
                f"one of {list(available(platform))} or leave it empty"
            )
        return forced
    tuned = TABLE.get(program_key(graph, platform, backends, precision)) if len(TABLE) else None
    return tuned if tuned in available(platform) else default(graph, platform)


def default(graph: Graph, platform: str) -> str:
    """The set ``graph`` gets untuned: :data:`REDUCTION_HEAVY` if a node computes batch
    statistics (the command attribute ``batch_statistics``: training ``batch_norm``) and
    this jaxlib offers the set, else ``"xla"``."""
    heavy = any(
        node.cmd.definition.attributes.has_batch_statistics(node.cmd) for node in graph.nodes
    )
    return REDUCTION_HEAVY if heavy and REDUCTION_HEAVY in available(platform) else DEFAULT


def compiler_options(name: str) -> dict[str, str] | None:
    """``jax.jit``'s ``compiler_options`` for library set ``name`` (None: XLA's defaults)."""
    return dict(LIBRARY_SETS[name]) or None
