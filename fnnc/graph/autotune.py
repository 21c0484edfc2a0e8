"""Whole-graph autotuning: time every node's eligible backends on the graph's own values.

:func:`fnnc.ops.autotune.autotune` times one command on arrays it is given; a graph
already says which commands run on which shapes, and its inputs say which values. This
pass runs the graph once, node by node, and hands every node whose command has more
than one backend that compiles here and supports its inputs to ``autotune`` with the
values that node sees. Winners land in the autotune table, which ``compile`` consults
(and which invalidates its cached programs when written), so the next compile of the
graph uses them. Backward nodes (``gradient[of=...]``) are tuned like any other: their
backends are the forward backends that carry a backward, so the backward of a
convolution gets its own winner.

Per-node winners need not make a faster program: a backend timed alone may lose inside
the fused program (XLA fuses around it differently, or its threads compete with the
rest), and on a 2-core machine per-node picks made the digits-sized CNN's training step
twice as slow. So the whole compiled graph is then timed with the new winners against
the default choices for the same nodes (interleaved, medians), and the default choices
are written instead when the winners are not faster (``check=False`` skips this).

On CPU the pass then picks the graph's XLA:CPU library set the same way: the compiled
graph is timed under each set of :mod:`fnnc.graph.cpu_libraries` (interleaved, medians)
and the fastest is recorded for this graph (``libraries=False`` skips this). Both
whole-program choices keep the default unless the alternative is faster by
:data:`MARGIN`.

Backends forced by ``config`` (``FNNC_BACKEND``, ``backend_per_command``) are set
aside while tuning nodes: the table records the node choices made where nothing is
forced. The library set is timed on the programs the configuration in force compiles.

A (command, input specs, platform) already in the table is not timed again (NNC
measures once and caches; :func:`fnnc.ops.autotune.save` keeps the table across
processes) while its recorded winner is still eligible, unless ``retune=True``. The
graph and its outputs are unchanged: only the table is written. Nodes inside the
sub-graphs of control-flow commands are not visited (their values exist only inside
the loop or branch).

>>> import numpy as np
>>> from fnnc import ops
>>> from fnnc.graph import GraphBuilder
>>> from fnnc.graph.autotune import autotune_graph
>>> b = GraphBuilder()
>>> x = b.input((2, 3))
>>> autotune_graph(b.build([b.exec(ops.relu(), x)]), np.ones((2, 3), np.float32))
{}
"""

from __future__ import annotations

import contextlib
from typing import Any

import jax

from fnnc import config
from fnnc.core.dispatch import platform_scope, select_backend, why_not
from fnnc.core.evaluate import as_tuple, run_nodes
from fnnc.core.ir import Graph, Node
from fnnc.graph import cpu_libraries
from fnnc.graph._io import flatten_inputs
from fnnc.graph.compile import compile as compile_graph
from fnnc.ops import Command, backends_of
from fnnc.ops import autotune as _autotune

MARGIN = 0.97
"""Whole-program choices (per-node winners against the defaults, library sets) replace
the default only when at least 3% faster: medians of a few runs of one program moved by
a few percent between calls on the 2-core machines measured, and a choice made on noise
stays in the table."""


def eligible(cmd: Command, specs: Any, platform: str) -> list[str]:
    """Names of the backends of ``cmd`` that compile on ``platform`` and support ``specs``."""
    return [
        name
        for name, backend in backends_of(cmd.name).items()
        if platform in backend.platforms and why_not(backend, cmd, specs, platform) is None
    ]


def autotune_graph(
    graph: Graph,
    *args: Any,
    repeats: int = 5,
    platform: str | None = None,
    retune: bool = False,
    check: bool = True,
    libraries: bool = True,
) -> dict[int, str]:
    """Autotunes every node of ``graph`` that has a choice, on the values it sees.

    Args:
        graph: the graph (a training step from ``minimize``, a forward, ...).
        *args: one array per graph input, as for :func:`~fnnc.graph.interpret`.
        repeats: timed runs per backend (the median counts).
        platform: ``"cpu"``, ``"gpu"`` or ``"tpu"``: where the graph is timed (on its
            first device) and the winners apply; default JAX's default backend.
        retune: time again the nodes whose (command, specs, platform) the table holds
            already (by default their recorded winner stands, unmeasured).
        check: time the whole compiled graph with the per-node winners against the
            default choices, and keep the winners only if the graph runs faster (see
            the module doc).
        libraries: on CPU, time the compiled graph under each XLA:CPU library set and
            record the fastest for this graph (:mod:`fnnc.graph.cpu_libraries`; a graph
            whose set the table holds is not timed again unless ``retune``).

    Returns:
        ``{node index: winning backend}`` for the nodes that had more than one eligible
        backend (nodes sharing a command and input specs are timed once). The winners
        are also in :data:`fnnc.ops.autotune.TABLE`.

    Raises:
        BackendError: ``repeats`` below 1, an unknown platform, or one with no device
            here (tune on such a machine and load its table instead).
    """
    platform, device = _autotune.timing_target(platform, repeats, "autotune_graph")
    values = jax.device_put(flatten_inputs(graph, args, "autotune_graph"), device)
    # every program below compiles and runs there, its nodes (and the eager calls that
    # compute each node's inputs) on the backends chosen for that platform
    with jax.default_device(device), platform_scope(platform):
        return _autotune_graph(graph, values, repeats, platform, retune, check, libraries)


def _autotune_graph(
    graph: Graph,
    values: list[Any],
    repeats: int,
    platform: str,
    retune: bool,
    check: bool,
    libraries: bool,
) -> dict[int, str]:
    keys: dict[int, str] = {}
    pending: dict[str, int] = {}  # key -> the first node that needs it timed
    for index, node in enumerate(graph.nodes):
        specs = [graph.spec(s) for s in node.inputs]
        names = eligible(node.cmd, specs, platform)
        if len(names) > 1:
            key = keys[index] = _autotune.key(node.cmd, specs, platform)
            if retune or _autotune.TABLE.get(key) not in names:
                pending.setdefault(key, index)
    if pending:
        # The table holds the node choices made where nothing is forced: a forced backend
        # (FNNC_BACKEND, backend_per_command) would make the default choices the forced
        # ones and the "tuned" and "default" programs one program, whose timing noise
        # then recorded the forced backend as the winner. (The library set below is
        # chosen for the programs this configuration compiles, forced backends included.)
        with config.override(backend="", backend_per_command={}):
            _time(graph, values, pending, repeats, platform)
            if check:
                _keep_if_faster(graph, values, pending, repeats, platform)
    if libraries and len(cpu_libraries.available(platform)) > 1:
        key = cpu_libraries.program_key(graph, platform)
        if retune or _autotune.TABLE.get(key) not in cpu_libraries.available(platform):
            _choose_libraries(graph, values, key, repeats, platform)
    return {index: _autotune.TABLE[key] for index, key in keys.items()}


class _Stop(Exception):
    """Ends a run of the graph after the last node whose inputs are wanted."""


def _node_inputs(graph: Graph, values: list[Any], wanted: set[int]) -> dict[int, list[Any]]:
    """The input values of the nodes ``wanted``, from one compiled run of the graph's
    nodes up to the last of them (one XLA compile instead of one per node)."""
    last = max(wanted)

    def run(*args: Any) -> dict[int, list[Any]]:
        seen: dict[int, list[Any]] = {}

        def run_node(index: int, node: Node, inputs: list[Any]) -> tuple[Any, ...]:
            if index in wanted:
                seen[index] = list(inputs)
            if index == last:
                raise _Stop
            return as_tuple(node.cmd(*inputs))

        with contextlib.suppress(_Stop):
            run_nodes(graph, args, run_node)
        return seen

    return jax.jit(run)(*values)


def _time(
    graph: Graph, values: list[Any], pending: dict[str, int], repeats: int, platform: str
) -> None:
    """Times the ``pending`` nodes of ``graph`` on the inputs they see given ``values``.

    Every input is computed before anything is timed: each table write moves the
    dispatch state, after which cached functions compile anew.
    """
    seen = _node_inputs(graph, values, set(pending.values()))
    for index in pending.values():
        cmd = graph.nodes[index].cmd
        _autotune.autotune(cmd, *seen[index], repeats=repeats, platform=platform)


def _keep_if_faster(
    graph: Graph, values: list[Any], pending: dict[str, int], repeats: int, platform: str
) -> None:
    """Keeps the per-node winners of ``pending`` only if the compiled graph runs faster
    with them than with the default choices; else writes the defaults (so a later call
    measures nothing again)."""
    table = _autotune.TABLE
    tuned = {key: table[key] for key in pending}
    defaults = {}
    for key, index in pending.items():
        node = graph.nodes[index]
        del table[key]
        defaults[key] = select_backend(node.cmd, [graph.spec(s) for s in node.inputs], platform)
    if defaults == tuned:
        table.update(tuned)
        return
    programs = {}
    for name, choice in (("tuned", tuned), ("default", defaults)):
        table.update(choice)
        program = compile_graph(graph, platform=platform)
        jax.block_until_ready(program(*values))  # traced and compiled under this choice
        programs[name] = program
    times = _autotune.median_seconds(programs, *values, repeats=max(repeats, 3))
    table.update(tuned if times["tuned"] < MARGIN * times["default"] else defaults)


def _choose_libraries(
    graph: Graph, values: list[Any], key: str, repeats: int, platform: str
) -> None:
    """Times the compiled graph under every XLA:CPU library set; records the fastest."""
    programs = {}
    for name in cpu_libraries.available(platform):
        with config.override(cpu_libraries=name):
            programs[name] = compile_graph(graph, platform=platform)
    times = _autotune.median_seconds(programs, *values, repeats=max(repeats, 3))
    fastest = min(times, key=times.__getitem__)
    default = cpu_libraries.default(graph, platform)  # always one of the sets timed
    _autotune.TABLE[key] = fastest if times[fastest] < MARGIN * times[default] else default
