"""Per-node profiles: where a compiled program's time goes, by fnnc node and command.

:func:`profile` runs a :class:`~fnnc.graph.Program` under ``jax.profiler`` and maps
XLA's executed operations back to the graph's nodes. A Program runs each node inside
``jax.named_scope(<node name or command>)``, so every HLO instruction carries its
node's name in its ``op_name`` metadata (``jit(program)/fc1/dot_general``); the
profiler's events name the instruction they ran (their ``hlo_op`` statistic), and the
optimised HLO (:meth:`Program.compiled_text`) gives each instruction's ``op_name``.

XLA fuses: an event runs one *fusion* of instructions that may come from several
nodes. Its time goes to the node of the fusion's own ``op_name`` (that of its root
instruction); the table lists the other nodes fused into it. Nodes sharing a name (a
layer's unnamed ``relu`` used three times) share one row, with their count. Time in
instructions of no node (copies XLA adds, parameter handling) is ``(no node)``.

On CPU the events are XLA:CPU's thunks. On a GPU they are the kernels (and copies) on
the device plane's ``Stream #`` lines, never the host's launches: XLA:GPU annotates each
with the instruction that launched it (``hlo_op``; the innermost of ``a::b``), its module
(``hlo_module``, checked against the HLO's), and that instruction's ``op_name`` as the
module's common ``prefix`` and a ``name`` below it. An ``hlo_op`` that is no instruction
of the optimised HLO falls back to that ``op_name``; an event with neither, to the
instruction its kernel name was made from (``fusion.2`` -> ``fusion_2``). A trace XProf
processed, or a TPU's, has an ``XLA Ops`` line: that is read instead. The module
:mod:`fnnc.graph._trace_events` says where each of these comes from. Times are wall
time per run, averaged over ``runs`` runs after one warm-up run (compiling is never
measured); on several devices, their times add up.

>>> import numpy as np
>>> from fnnc import ops
>>> from fnnc.graph import GraphBuilder, compile, profile
>>> b = GraphBuilder()
>>> x, w = b.input((64, 32), name="x"), b.input((48, 32), name="w")
>>> y = b.exec(ops.relu(), b.exec(ops.gemm(transpose_b=True), x, w, name="fc"), name="act")
>>> program = compile(b.build([y]))
>>> report = profile(program, np.ones((64, 32), np.float32), np.ones((48, 32), np.float32))
>>> report.node("fc").command, report.node("act").command, report.runs
('gemm', 'relu', 10)
>>> print(report)  # doctest: +SKIP
node  command  nodes  us/run      %  fused with
fc    gemm         1    41.2   88.1
act   relu         1     5.6   11.9
...
"""

from __future__ import annotations

import codecs
import collections
import dataclasses
import glob
import os
import re
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from fnnc.core.ir import Graph
from fnnc.errors import GraphError
from fnnc.graph._trace_events import OpTime, op_events
from fnnc.graph._trace_events import stats_readable as stats_readable  # for trace readers
from fnnc.graph.compile import Program

NO_NODE = "(no node)"

_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%([\w.\-]+)\s.*\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%([\w.\-]+)\s*=")
_OP_NAME = re.compile(r'op_name="((?:[^"\\]|\\.)*)"')
_CALLS = re.compile(r"calls=%([\w.\-]+)")
_MODULE = re.compile(r"^HloModule\s+([\w.\-]+)")


@dataclasses.dataclass(frozen=True)
class NodeTime:
    """One row of a profile: the nodes of one name and the time their operations took.

    Attributes:
        name: the node name (the command's name for an unnamed node).
        command: the command of those nodes (``a+b`` if they differ).
        nodes: how many graph nodes have this name.
        seconds: wall time per run of the operations attributed to them.
        ops: the XLA instructions that ran for them (fusions included).
        fused_with: other nodes whose instructions XLA fused into those.
    """

    name: str
    command: str
    nodes: int
    seconds: float
    ops: tuple[str, ...] = ()
    fused_with: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Profile:
    """The result of :func:`profile`: rows per node name and time per command.

    Attributes:
        nodes: a row per node name, the slowest first (nodes that ran no operation
            of their own, e.g. fused away, last with 0 s).
        commands: command -> seconds per run, the slowest first.
        seconds: the time of all the program's operations per run.
        runs: how many runs were measured.
        platform: where it ran (``cpu``, ``gpu``).
    """

    nodes: tuple[NodeTime, ...]
    commands: dict[str, float]
    seconds: float
    runs: int
    platform: str

    def node(self, name: str) -> NodeTime:
        """The row of node name ``name``."""
        for row in self.nodes:
            if row.name == name:
                return row
        known = ", ".join(r.name for r in self.nodes[:10])
        raise GraphError(f"profile: no node named {name!r}; the rows are {known}, ...")

    def table(self, *, limit: int | None = None) -> str:
        """The per-node table then the per-command table, as text."""
        total = self.seconds or 1.0
        rows = [["node", "command", "nodes", "us/run", "%", "fused with"]]
        for r in self.nodes[:limit]:
            rows.append([r.name, r.command, str(r.nodes), f"{r.seconds * 1e6:.1f}",
                         f"{100 * r.seconds / total:.1f}", _few(r.fused_with)])  # fmt: skip
        cmds = [["command", "us/run", "%"]]
        for cmd, s in self.commands.items():
            cmds.append([cmd, f"{s * 1e6:.1f}", f"{100 * s / total:.1f}"])
        head = (
            f"profile: {self.seconds * 1e6:.1f} us per run of the program's operations "
            f"on {self.platform}, mean of {self.runs} runs"
        )
        return "\n".join([head, "", *_columns(rows), "", *_columns(cmds)])

    def __str__(self) -> str:
        return self.table()


def _few(names: Sequence[str], n: int = 3) -> str:
    """Up to ``n`` names, then how many more."""
    more = f", +{len(names) - n} more" if len(names) > n else ""
    return ", ".join(names[:n]) + more


def _columns(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    numeric = {c for c in range(len(rows[0])) if all(_is_number(r[c]) for r in rows[1:])}
    out = []
    for r in rows:
        cells = [
            v.rjust(w) if c in numeric else v.ljust(w) for c, (v, w) in enumerate(zip(r, widths))
        ]
        out.append("  ".join(cells).rstrip())
    return out


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


@dataclasses.dataclass(frozen=True)
class _Hlo:
    """What the optimised HLO says of each instruction: its ``op_name`` and, for a
    fusion or call, the ``op_name`` s of the instructions of the computation it runs."""

    module: str
    op_names: dict[str, str]
    inner: dict[str, list[str]]
    schedule: dict[str, list[tuple[str, bool]]] = dataclasses.field(default_factory=dict)
    """computation -> its instructions in order (a scheduled module's order is the order
    they run in), each with whether it is a custom call (a kernel no name says: cuBLAS,
    cuDNN, a Pallas kernel); see :func:`fnnc.graph._trace_events.op_events`."""


def parse_hlo(text: str) -> _Hlo:
    """Instruction -> ``op_name`` (and the ``op_name`` s inside each fusion) of HLO text."""
    module, computation = "", ""
    op_names: dict[str, str] = {}
    by_computation: dict[str, list[str]] = collections.defaultdict(list)
    calls: dict[str, str] = {}
    schedule: dict[str, list[tuple[str, bool]]] = collections.defaultdict(list)
    for line in text.splitlines():
        head = _MODULE.match(line)
        if head:
            module = head.group(1)
            continue
        comp = _COMPUTATION.match(line)
        if comp and "=" not in line.split("{")[0]:
            computation = comp.group(1)
            continue
        inst = _INSTRUCTION.match(line)
        if not inst:
            continue
        schedule[computation].append((inst.group(1), " custom-call(" in line))
        found = _OP_NAME.search(line)
        if found:
            name = _unescape(found.group(1))
            op_names[inst.group(1)] = name
            by_computation[computation].append(name)
        called = _CALLS.search(line)
        if called:
            calls[inst.group(1)] = called.group(1)
    inner = {inst: by_computation.get(comp, []) for inst, comp in calls.items()}
    for inst, names in inner.items():  # a wrapper XLA made: named by what it runs
        if inst not in op_names and names:
            op_names[inst] = collections.Counter(names).most_common(1)[0][0]
    return _Hlo(module, op_names, inner, dict(schedule))


def _unescape(text: str) -> str:
    """An ``op_name`` as written in HLO text (C-escaped: ``r\\303\\251sum\\303\\251``
    for ``résumé``, ``\\"`` and ``\\\\``) back to the node name it holds."""
    if "\\" not in text:
        return text
    return codecs.escape_decode(text.encode("utf-8"))[0].decode("utf-8", "replace")


def scope_of(op_name: str, scopes: Sequence[str]) -> str | None:
    """The node scope an ``op_name`` (``jit(program)/fc1/dot_general``) lies in: the
    longest scope that a path of its components after the outer ``jit(...)`` starts with."""
    parts = op_name.split("/")
    if parts and parts[0].startswith("jit("):
        parts = parts[1:]
    rest = "/".join(parts)
    best = None
    for scope in scopes:
        if (rest == scope or rest.startswith(scope + "/")) and (
            best is None or len(scope) > len(best)
        ):
            best = scope
    return best


def trace_runs(run: Callable[[], Any], runs: int, folder: str) -> Any:
    """``runs`` calls of ``run`` under ``jax.profiler``, traced to ``folder``; the
    trace read back (``jax.profiler.ProfileData``)."""
    try:
        jax.profiler.start_trace(folder)
    except RuntimeError as e:
        raise GraphError(
            f"profile: jax.profiler could not start ({e}); stop the trace already "
            "running (jax.profiler.stop_trace()) and profile again"
        ) from None
    try:
        for _ in range(runs):
            jax.block_until_ready(run())
    finally:
        jax.profiler.stop_trace()
    return read_trace(folder)


def trace_file(folder: str) -> str:
    """The path of the newest trace (``.xplane.pb``) ``jax.profiler`` wrote under
    ``folder``; a :class:`~fnnc.errors.GraphError` where there is none."""
    found = glob.glob(os.path.join(folder, "**", "*.xplane.pb"), recursive=True)
    if not found:
        raise GraphError(f"profile: jax.profiler wrote no trace under {folder}")
    return max(found, key=os.path.getmtime)


def read_trace(folder: str) -> Any:
    """The newest trace ``jax.profiler`` wrote under ``folder`` (a
    ``jax.profiler.ProfileData``); a :class:`~fnnc.errors.GraphError` where there is none."""
    return jax.profiler.ProfileData.from_file(trace_file(folder))


def check_runs(runs: Any) -> None:
    """Refuses a ``runs`` that is no positive int (a :class:`~fnnc.errors.GraphError`),
    before anything runs: a model's profile trains."""
    if not isinstance(runs, int) or isinstance(runs, bool) or runs < 1:
        raise GraphError(
            f"profile: runs must be a positive int, the runs to time and average (e.g. "
            f"runs=10), got {runs!r}"
        )


def profile_calls(
    run: Callable[[], Any], program: Any, *, runs: int = 10, log_dir: str | None = None
) -> Profile:
    """Profiles ``runs`` calls of ``run``, which runs ``program`` (a
    :class:`~fnnc.graph.Program`) once per call; see :func:`profile`."""
    check_runs(runs)
    jax.block_until_ready(run())  # compiles anything left to compile: never measured
    hlo = parse_hlo(program.compiled_text())
    if log_dir is not None:
        data = trace_runs(run, runs, log_dir)
    else:
        with tempfile.TemporaryDirectory(prefix="fnnc-profile-") as folder:
            data = trace_runs(run, runs, folder)
    events = op_events(data, hlo.module, hlo.op_names, hlo.schedule)
    return _attribute(program.graph, hlo, events, runs, program.platform)


def _attribute(
    graph: Any, hlo: _Hlo, events: Sequence[OpTime], runs: int, platform: str
) -> Profile:
    names = [node.name or node.cmd.name for node in graph.nodes]
    commands: dict[str, list[str]] = collections.defaultdict(list)
    for name, node in zip(names, graph.nodes):
        if node.cmd.name not in commands[name]:
            commands[name].append(node.cmd.name)
    scopes = list(commands)
    seconds: dict[str, float] = collections.defaultdict(float)
    ops: dict[str, set[str]] = collections.defaultdict(set)
    fused: dict[str, set[str]] = collections.defaultdict(set)
    for op, duration, own_op_name, _ in events:
        scope = scope_of(hlo.op_names.get(op) or own_op_name, scopes) or NO_NODE
        seconds[scope] += duration / runs
        ops[scope].add(op)
        for inner in hlo.inner.get(op, []):
            other = scope_of(inner, scopes)
            if other is not None and other != scope:
                fused[scope].add(other)
    count = collections.Counter(names)
    rows = [
        NodeTime(
            s,
            "+".join(commands.get(s, ["-"])),
            count.get(s, 0),
            seconds.get(s, 0.0),
            tuple(sorted(ops.get(s, ()))),
            tuple(sorted(fused.get(s, ()))),
        )
        for s in [*scopes, *([NO_NODE] if NO_NODE in seconds else [])]
    ]
    rows.sort(key=lambda r: -r.seconds)
    per_command: dict[str, float] = collections.defaultdict(float)
    for r in rows:
        per_command[r.command if r.name != NO_NODE else NO_NODE] += r.seconds
    ordered = dict(sorted(per_command.items(), key=lambda kv: -kv[1]))
    return Profile(tuple(rows), ordered, float(sum(seconds.values())), runs, platform)


def profile(
    program: Any, *args: Any, runs: int = 10, log_dir: str | os.PathLike[str] | None = None
) -> Profile:
    """Runs ``program(*args)`` ``runs`` times under ``jax.profiler`` (after one warm-up
    run) and returns the time per node and per command (see the module docstring).

    Args:
        program: a :class:`~fnnc.graph.Program` (from :func:`fnnc.graph.compile`).
        args: its inputs. Inputs it donates are copied for each run, so they stay valid.
        runs: how many runs to average.
        log_dir: keep the trace there (open it in TensorBoard's or XProf's profile
            viewer); by default it goes to a temporary folder, removed after.

    Returns:
        a :class:`Profile`; ``print(profile)`` shows its tables.

    Raises:
        GraphError: ``program`` is no :class:`~fnnc.graph.Program` (a graph not yet
            compiled, a jitted function), or ``runs`` is no positive int.
    """
    if not isinstance(program, Program):
        hint = "compile it first: profile(compile(graph), *args)"
        if not isinstance(program, Graph):
            hint = "profile times fnnc programs only; use jax.profiler for other functions"
        raise GraphError(
            f"profile: expected a compiled Program (from fnnc.graph.compile), got "
            f"{type(program).__name__}; {hint}"
        )
    donated = set(program.donate)

    def run() -> Any:
        fresh = [jnp.array(a, copy=True) if i in donated else a for i, a in enumerate(args)]
        return program(*fresh)

    return profile_calls(
        run, program, runs=runs, log_dir=None if log_dir is None else os.fspath(log_dir)
    )
