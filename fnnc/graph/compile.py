"""compile: a graph lowered to one jitted XLA computation, a :class:`Program`
(:mod:`fnnc.graph.program`), cached by graph, donation, platform, dispatch state,
numerics check, shardings and matmul precision; passes given to it run first.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

from fnnc import config
from fnnc.core import dispatch
from fnnc.core.ir import Graph, require_graph
from fnnc.core.platforms import platform_name
from fnnc.errors import GraphError, GraphInputError
from fnnc.graph.memory import Donate, donated_positions
from fnnc.graph.program import HOIST_ELEMENTS as HOIST_ELEMENTS
from fnnc.graph.program import IN_FLIGHT as IN_FLIGHT
from fnnc.graph.program import MemoryReport as MemoryReport
from fnnc.graph.program import Program as Program
from fnnc.graph.sharding import Shardings


@functools.lru_cache(maxsize=256)
def _compile_cached(
    graph: Graph,
    donate: tuple[int, ...],
    platform: str,
    dispatch_state: Any,
    numerics: bool,
    shardings: Shardings | None,
    matmul_precision: str,
) -> Program:
    return Program(graph, donate, platform, numerics, shardings, matmul_precision)


def compile(  # noqa: A001 - the name NNC users look for
    graph: Graph,
    *,
    donate: Donate = (),
    platform: str | None = None,
    shardings: Shardings | None = None,
    matmul_precision: str | None = None,
    passes: Sequence[str | Callable[[Graph], Graph]] = (),
) -> Program:
    """Lowers ``graph`` to one jitted XLA computation.

    Each node runs inside ``jax.named_scope(<node name or command>)``, so profiles, the
    compiled HLO's metadata (:meth:`Program.compiled_text`) and the lowered text's
    locations (``lowered_text(debug_info=True)``) show fnnc's node names. With the
    numerics check on (``config.override(numerics=True)``), the program also computes
    one finiteness flag per node and a call that produced a NaN or an infinity raises
    :class:`~fnnc.errors.NumericsError` naming the first node, with its inputs' statistics.
    The check donates nothing (``donate`` is ignored), so a failing call's inputs are
    still there to re-run up to that node.

    Compiled programs are cached by (graph, donation, platform, dispatch state), so
    compiling an equal graph again is free, and registering a backend, writing the
    autotune table or overriding backend settings compiles anew. ``passes`` run first
    (:func:`~fnnc.graph.run_passes`: verified after each, blamed by name, shown with
    ``FNNC_DEBUG``), so the cache keys on the graph they produce and
    :attr:`Program.graph` is that graph.

    Args:
        graph: the graph to compile.
        donate: graph inputs (positions, names or symbols, one or a list) whose buffers the
            program may reuse for its outputs (NNC's in-place execution); callers must
            not use them after.
        platform: ``"cpu"``, ``"gpu"`` or ``"tpu"`` (any case; JAX's ``"cuda"`` and
            ``"rocm"`` are ``"gpu"``; another name is a :class:`~fnnc.errors.ConfigError`)
            whose backends are chosen for each node (and, on CPU, the library set);
            default: JAX's default backend. The program still runs where its inputs
            are (JAX's default device for host arrays): to run on another platform, put
            the inputs there (``jax.device_put(x, jax.devices("cpu")[0])``).
        shardings: layouts of the inputs (and outputs) on a device mesh, e.g. from
            :func:`~fnnc.graph.data_parallel`; XLA inserts the collectives.
        matmul_precision: how float32 dots and convolutions run: ``"float32"`` (full
            precision), ``"tensorfloat32"`` (TF32 on GPUs), ``"bfloat16"`` or
            ``"default"`` (JAX's setting); default: ``config.get().matmul_precision``,
            which is ``"float32"`` unless ``FNNC_MATMUL_PRECISION`` says otherwise.
        passes: passes ``Graph -> Graph`` (or names of the built-in ones, ``"cse"``,
            ``"dce"``, ``"fold"``, ``"fuse"``) to run on ``graph`` first, in order;
            they must keep its inputs and outputs (their number and specs).

    >>> import numpy as np
    >>> from fnnc import ops
    >>> from fnnc.graph import GraphBuilder, compile
    >>> b = GraphBuilder()
    >>> x = b.input((2,), name="x")
    >>> program = compile(b.build([b.exec(ops.scalar_mul(a=3.0), x)]))
    >>> program(np.array([1.0, 2.0], np.float32))
    Array([3., 6.], dtype=float32)
    """
    require_graph(graph, "compile")
    if shardings is not None and not isinstance(shardings, Shardings):
        raise GraphInputError(  # 3 was an AttributeError on .inputs when first called
            f"compile: shardings is {type(shardings).__name__} {shardings!r:.40}; expected a "
            "fnnc.graph.Shardings, e.g. data_parallel(graph, mesh)"
        )
    if passes:
        graph = _after_passes(graph, passes)
    numerics = config.get().numerics
    donated = donated_positions(graph, donate, "compile")
    return _compile_cached(
        graph,
        () if numerics else donated,  # the numerics report re-runs the inputs
        platform_name(platform, "compile"),
        dispatch.state(),
        numerics,
        shardings,
        config.matmul_precision_name(
            matmul_precision or config.get().matmul_precision, "compile: matmul_precision"
        ),
    )


def _after_passes(graph: Graph, passes: Any) -> Graph:
    from fnnc.graph.passes.pipeline import resolve_passes, run_passes

    passes = resolve_passes(passes, "compile")
    new = run_passes(graph, passes)
    if new.input_specs != graph.input_specs or new.output_specs != graph.output_specs:
        raise GraphError(
            f"compile: passes {[getattr(p, '__name__', p) for p in passes]} changed the "
            f"graph's inputs or outputs ({len(graph.inputs)} inputs, {len(graph.outputs)} "
            f"outputs before, {len(new.inputs)} and {len(new.outputs)} after); a pass run "
            "by compile keeps them (their number, shapes and dtypes)"
        )
    return new
