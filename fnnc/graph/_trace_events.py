"""Reading a ``jax.profiler`` trace: which executed operation of one HLO module took how
long, for :mod:`fnnc.graph.profile`.

A trace (``jax.profiler.ProfileData``, the ``.xplane.pb`` that ``jax.profiler`` writes)
holds planes of lines of events. An event has a ``name`` (its metadata's name), times in
ns, and ``stats``: ``(name, value)`` pairs where a reference value is already resolved to
its string. What holds XLA's operations depends on the backend:

- **CPU**: the plane ``/host:CPU``; each thunk XLA:CPU runs is an event on a
  ``tf_XLA...`` thread line, named after its instruction, with the stats ``hlo_op`` (the
  instruction, no ``%``), ``hlo_module`` (``jit_program``) and ``program_id``. A loop's
  thunk encloses its body's thunks, so only outermost events count.
- **GPU** (raw trace, as ``jax.profiler`` writes it): the plane ``/device:GPU:N`` has a
  line per CUDA stream, ``Stream #N(Kernel,...)``, whose events are CUPTI's kernels and
  copies, named after the kernel (``loop_add_fusion``, a cuBLAS kernel's own name). XLA:GPU
  runs each thunk under an annotation ``XlaModule:#prefix=P,hlo_module=M,program_id=I#``
  ``::Thunk:#name=N,hlo_op=H#``, which CUPTI's collector turns into the kernel's stats
  (the innermost annotation wins a key both give): ``hlo_op`` (the instruction that
  launched it; XProf reads ``a::b`` as a nesting and takes the last), ``hlo_module``,
  ``program_id``, ``name`` (the instruction's ``op_name`` less the module's common prefix
  ``P``, which is the ``prefix`` stat) and ``tf_op``, which is the name of the *outermost*
  annotation (``XlaModule:``, or a ``jax.profiler.TraceAnnotation`` around the call), not
  an ``op_name``. XLA's source runs command buffers (CUDA graphs) thunk by thunk while a
  profiler runs (``xla_enable_command_buffers_during_profiling`` is off by default), so
  that their kernels keep their own annotations; but see below. The plane
  ``/host:CUPTI`` has the launches (``cuLaunchKernel``) with the same stats, and
  ``/host:CPU`` a TraceMe per thunk: neither
  is device time, so neither is read when a device plane has operations. Where command
  buffers did run as CUDA graphs while profiled (jaxlib 0.11.2 on an H100, 2026-11-27:
  the kernels carry ``cuda_graph_id``), every kernel of a graph carried the graph's
  annotation (``hlo_op`` ``command_buffer_1``), not its own: a kernel XLA emitted is
  then known by its name, and one no name says (cuBLAS, cuDNN, a Pallas kernel) by its
  place between two known ones, against the custom calls the schedule runs between
  their instructions (:func:`_fill_gaps`). A raw trace has
  no ``XLA Ops`` line: XProf derives one (events named ``<program id>/<instruction>``, no
  ``hlo_module``) when it shows a trace.
- **TPU**, or a trace XProf has processed: the device plane's ``XLA Ops`` line.

Sources (XLA and XProf, 2025-2026; the strings checked in jaxlib and the CUDA 13 plugin
0.11.2): ``xla/backends/profiler/gpu/cupti_collector.cc`` (``CreateXEvent``, the line
names), ``xla/backends/gpu/runtime/annotation.cc`` (the annotations),
``command_buffer_thunk.cc``, ``xla/tsl/profiler/utils/parse_annotation.cc``,
``xla/python/profiler/profile_data.cc`` (the Python view), XProf's
``xprof/utils/derived_timeline.cc`` and ``xprof/utils/gpu_event_stats.cc``.
"""

from __future__ import annotations

import contextlib
import re
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

XLA_OPS = "XLA Ops"
"""The line XProf derives (and a TPU trace has) with an event per HLO instruction run."""

_WITH_PROGRAM_ID = re.compile(r"\(\d+\)$")


class OpTime(NamedTuple):
    """One executed operation: its instruction (or, when no instruction of the HLO
    matched, the best name the event gave), its time, and the ``op_name`` the event
    itself carried (used only when ``op`` is no instruction of the HLO)."""

    op: str
    seconds: float
    op_name: str = ""
    kernel: str = ""
    """The event's own name (a GPU kernel's, a CPU thunk's)."""


def kernel_name(instruction: str) -> str:
    """The name XLA:GPU gives a kernel it emits for ``instruction`` (LLVM's
    ``SanitizeFunctionName``: ``loop_add_fusion.2`` -> ``loop_add_fusion_2``). XLA may add
    a suffix to keep names unique, and reuses a kernel for identical fusions, so this maps
    a kernel back only where the trace names no instruction."""
    name = re.sub(r"[^A-Za-z0-9_$]", "_", instruction) or "__unnamed"
    if name[0].isdigit():
        name = "_" + name
    return name + "_" if name in ("_", "$") else name


@contextlib.contextmanager
def stats_readable() -> Iterator[None]:
    """Where events' ``stats`` may be read: with Python's "builtin type has no
    ``__module__``" deprecation silenced. jaxlib 0.11 on Python 3.12 creates its
    ``event_stats`` type on the first read of an event's stats, and where warnings are
    errors (``-W error``, a test suite's filters) the warning fails that type's
    construction, which nanobind answers by aborting the process."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "builtin type .* has no __module__", DeprecationWarning)
        yield


Schedule = Mapping[str, Sequence[tuple[str, bool]]]
"""computation -> its instructions in schedule order, each with whether it is a custom
call (``fnnc.graph.profile.parse_hlo``'s ``schedule``)."""


def op_events(
    data: Any, module: str, op_names: Mapping[str, str], schedule: Schedule | None = None
) -> list[OpTime]:
    """The operations of HLO module ``module`` that ran in trace ``data``, outermost
    events only; ``op_names`` (instruction -> ``op_name``) says which names are
    instructions, ``schedule`` where each runs (it places the kernels of a CUDA graph
    that no name places). The device planes' operations where there are any, else the
    host's."""
    kernels = _kernel_names(op_names)
    places = _places(schedule or {})
    with stats_readable():
        planes = list(data.planes)
        device = [p for p in planes if p.name.startswith("/device:")]
        host = [p for p in planes if not p.name.startswith("/device:")]
        out = _read(device, module, op_names, kernels, places)
        return out or _read(host, module, op_names, {}, places)


class _Place(NamedTuple):
    computation: Sequence[tuple[str, bool]]
    index: int


def _places(schedule: Schedule) -> dict[str, _Place]:
    return {
        inst: _Place(insts, i) for insts in schedule.values() for i, (inst, _) in enumerate(insts)
    }


def _fill_gaps(ops: list[list[Any]], places: Mapping[str, _Place]) -> None:
    """Places, in ``ops`` (``[op, seconds, op_name, placed, ...]`` in time order on one
    stream), each run of unplaced kernels between two placed ones of one computation:
    on the custom calls scheduled between those two instructions, where there is one
    (the whole run goes to it) or as many as the run has kernels (in order)."""
    i = 0
    while i < len(ops):
        if ops[i][3]:
            i += 1
            continue
        j = i
        while j < len(ops) and not ops[j][3]:
            j += 1
        if i > 0 and j < len(ops):
            before, after = places.get(ops[i - 1][0]), places.get(ops[j][0])
            if before and after and before.computation is after.computation:
                between = before.computation[before.index + 1 : after.index]
                calls = [inst for inst, custom in between if custom]
                if len(calls) == 1 or len(calls) == j - i:
                    for k in range(i, j):
                        ops[k][0], ops[k][2] = calls[0 if len(calls) == 1 else k - i], ""
        i = j


def _kernel_names(op_names: Mapping[str, str]) -> dict[str, str]:
    """Kernel name -> instruction, for the names only one instruction gives."""
    found: dict[str, list[str]] = {}
    for inst in op_names:
        found.setdefault(kernel_name(inst), []).append(inst)
    return {kernel: insts[0] for kernel, insts in found.items() if len(insts) == 1}


def _read(
    planes: Iterable[Any],
    module: str,
    op_names: Mapping[str, str],
    kernels: Mapping[str, str],
    places: Mapping[str, _Place],
) -> list[OpTime]:
    """The operations on ``planes``: their ``XLA Ops`` lines where a plane has them, else
    their ``Stream`` lines (a GPU's), else all their lines (a host's)."""
    out = []
    for plane in planes:
        lines = list(plane.lines)
        derived = [ln for ln in lines if ln.name == XLA_OPS or ln.name.startswith(XLA_OPS + " -")]
        streams = [ln for ln in lines if ln.name.startswith("Stream")]
        for line in derived or streams or lines:
            ops = _line(line, module, op_names, kernels, bool(derived))
            _fill_gaps(ops, places)
            out += [OpTime(op, seconds, own, kernel) for op, seconds, own, _, kernel in ops]
    return out


def _line(
    line: Any, module: str, op_names: Mapping[str, str], kernels: Mapping[str, str], derived: bool
) -> list[list[Any]]:
    """``[op, seconds, op_name, placed, kernel]`` of each outermost operation on ``line``."""
    out, end = [], -1.0
    for event in sorted(line.events, key=lambda e: e.start_ns):
        stats = dict(event.stats)
        if not same_module(stats.get("hlo_module"), module):
            continue
        found = _resolve(event.name, stats, op_names, kernels, derived)
        if found is None:
            continue
        if event.start_ns < end:  # nested in the event before (a loop's body)
            continue
        end = event.end_ns
        out.append([found[0], event.duration_ns * 1e-9, found[1], found[2], event.name])
    return out


def same_module(stat: Any, module: str) -> bool:
    """Whether an event's ``hlo_module`` stat (absent: ``None``) names ``module``; XProf
    writes ``jit_program(7)``, the module with its program id."""
    if stat is None or not module:
        return True
    text = str(stat)
    return text == module or _WITH_PROGRAM_ID.sub("", text) == module


def _resolve(
    name: str,
    stats: Mapping[Any, Any],
    op_names: Mapping[str, str],
    kernels: Mapping[str, str],
    derived: bool,
) -> tuple[str, str, bool] | None:
    """``(instruction, "", True)`` for an event that names an instruction of the HLO,
    ``(label, the event's own op_name, True)`` for one of the program that names none,
    ``(label, "", False)`` for one nothing places (a kernel of a CUDA graph that its name
    does not place is placed between others: :func:`_fill_gaps`), ``None`` for an event
    that is no operation (python frames, a host transfer's copy)."""
    hlo_op = stats.get("hlo_op")
    candidates = [] if hlo_op is None else list(reversed(str(hlo_op).split("::")))
    if derived:
        candidates.append(name)
    names = [_instruction(c) for c in candidates]
    if not names:  # no operation, unless a kernel without annotation XLA named
        return (kernels[name], "", True) if name in kernels and _is_kernel(stats) else None
    if name in kernels and "cuda_graph_id" in stats:  # hlo_op names its graph, not it
        return kernels[name], "", True
    if "cuda_graph_id" in stats:
        return names[0], "", False
    for inst in names:
        if inst in op_names:
            return inst, "", True
    own = _event_op_name(stats)
    if own:  # no instruction of the HLO, but the kernel says where it comes from
        return names[0], own, True
    return (kernels[name], "", True) if name in kernels else (names[0], "", False)


def _is_kernel(stats: Mapping[Any, Any]) -> bool:
    """Whether a device event is a kernel CUPTI recorded (it has ``kernel_details``)."""
    return "kernel_details" in stats


def _instruction(text: str) -> str:
    """An instruction name from an ``hlo_op`` part or an ``XLA Ops`` event name: no
    ``%``, no ``<program id>/`` or ``<module>/`` before it."""
    return text.rsplit("/", 1)[-1].strip().lstrip("%")


def _event_op_name(stats: Mapping[Any, Any]) -> str:
    """The ``op_name`` a GPU kernel's own stats give ("" where they give none): the
    module's common ``prefix``, then the instruction's ``name`` below it (``name`` alone
    where it already starts with the prefix or with ``jit(``)."""
    name, prefix = str(stats.get("name") or ""), str(stats.get("prefix") or "")
    if not name or not prefix or name.startswith((prefix + "/", "jit(")) or name == prefix:
        return name
    return f"{prefix}/{name}"
