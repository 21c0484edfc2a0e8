"""Per-node profiles read from the trace layouts of each backend, on synthetic traces.

The GPU layouts are those XLA's CUPTI collector writes (``Stream #`` lines of kernels
annotated with ``hlo_op``, ``hlo_module``, ``name``, ``prefix``; the host's launches on
``/host:CUPTI``) and the ``XLA Ops`` line XProf derives: see
``fnnc/graph/_trace_events.py`` for the sources. Oracles: the kernel durations put in
the trace (their sums per node), and the graph's node names."""

# ruff: noqa: E501  (the HLO below is printed as XLA prints it, one instruction a line)
from __future__ import annotations

import dataclasses
import importlib
import types
from typing import Any

import pytest

from fnnc import ops
from fnnc.graph import GraphBuilder
from fnnc.graph._trace_events import kernel_name, op_events, same_module
from fnnc.graph.profile import NO_NODE, parse_hlo, profile_calls

profile_module = importlib.import_module("fnnc.graph.profile")  # not fnnc.graph's profile()

# the optimised HLO of relu(x @ w.T) then tanh(relu(...)), as XLA:GPU prints it: a cuBLAS
# custom call for the gemm, loop fusions for the rest
GPU_HLO = """\
HloModule jit_program, is_scheduled=true, entry_computation_layout={(f32[64,32]{1,0}, f32[48,32]{1,0})->(f32[64,48]{1,0}, f32[64,48]{1,0})}, frontend_attributes={fingerprint_before_lhs="9c1e"}

%fused_maximum (param_0.1: f32[64,48]) -> f32[64,48] {
  %param_0.1 = f32[64,48]{1,0} parameter(0)
  %constant_1 = f32[] constant(0)
  %broadcast.1 = f32[64,48]{1,0} broadcast(f32[] %constant_1), dimensions={}
  ROOT %maximum.1 = f32[64,48]{1,0} maximum(f32[64,48]{1,0} %param_0.1, f32[64,48]{1,0} %broadcast.1), metadata={op_name="jit(program)/act/max" source_file="/fnnc/ops/activation.py" source_line=46}
}

%fused_tanh (param_0.2: f32[64,48]) -> f32[64,48] {
  %param_0.2 = f32[64,48]{1,0} parameter(0)
  ROOT %tanh.1 = f32[64,48]{1,0} tanh(f32[64,48]{1,0} %param_0.2), metadata={op_name="jit(program)/flip/tanh"}
}

ENTRY %main.9 (x.1: f32[64,32], w.1: f32[48,32]) -> (f32[64,48], f32[64,48]) {
  %x.1 = f32[64,32]{1,0} parameter(0), metadata={op_name="x"}
  %w.1 = f32[48,32]{1,0} parameter(1), metadata={op_name="w"}
  %custom-call.1 = (f32[64,48]{1,0}, s8[0]{0}) custom-call(f32[64,32]{1,0} %x.1, f32[48,32]{1,0} %w.1), custom_call_target="__cublas$gemm", metadata={op_name="jit(program)/fc/dot_general" source_file="/fnnc/ops/blas.py" source_line=64}, backend_config={"operation_queue_id":"0","wait_on_operation_queues":[],"gemm_backend_config":{"alpha_real":1,"beta":0}}
  %get-tuple-element.1 = f32[64,48]{1,0} get-tuple-element((f32[64,48]{1,0}, s8[0]{0}) %custom-call.1), index=0, metadata={op_name="jit(program)/fc/dot_general"}
  %loop_maximum_fusion = f32[64,48]{1,0} fusion(f32[64,48]{1,0} %get-tuple-element.1), kind=kLoop, calls=%fused_maximum, metadata={op_name="jit(program)/act/max" source_file="/fnnc/ops/activation.py" source_line=46}, backend_config={"operation_queue_id":"0","fusion_backend_config":{"kind":"__loop"}}
  %fusion.2 = f32[64,48]{1,0} fusion(f32[64,48]{1,0} %loop_maximum_fusion), kind=kLoop, calls=%fused_tanh, metadata={op_name="jit(program)/flip/tanh"}
  ROOT %tuple.3 = (f32[64,48]{1,0}, f32[64,48]{1,0}) tuple(f32[64,48]{1,0} %loop_maximum_fusion, f32[64,48]{1,0} %fusion.2)
}
"""

CUBLAS = "sm90_xmma_gemm_f32f32_f32f32_f32_nt_n_tilesize64x64x8_stage3_warpsize2x2x1_ffma"


# ------------------------------------------------------------- a ProfileData look-alike


@dataclasses.dataclass
class Event:
    name: str
    start_ns: float
    duration_ns: float
    stats: list[tuple[str, Any]] = dataclasses.field(default_factory=list)

    @property
    def end_ns(self) -> float:
        return self.start_ns + self.duration_ns


@dataclasses.dataclass
class Line:
    name: str
    events: list[Event]


@dataclasses.dataclass
class Plane:
    name: str
    lines: list[Line]
    stats: list[tuple[str, Any]] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Data:
    planes: list[Plane]


def annotated(hlo_op: str, name: str = "", module: str = "jit_program") -> list[tuple]:
    """The stats CUPTI's collector gives an event launched under XLA:GPU's annotation
    ``XlaModule:#prefix=jit(program),hlo_module=M,program_id=12#::Thunk:#name=N,hlo_op=H#``
    (innermost key first; ``tf_op`` is the outermost annotation's name)."""
    own = [("name", name)] if name else []
    return [("correlation_id", 811), ("tf_op", "XlaModule:"), *own, ("hlo_op", hlo_op),
            ("prefix", "jit(program)"), ("hlo_module", module), ("program_id", 12)]  # fmt: skip


def kernel(name: str, start: float, duration: float, stats: list[tuple]) -> Event:
    details = "regs:32 static_shared:0 dynamic_shared:0 grid:16,1,1 block:128,1,1 occ_pct:100"
    extra = [("context_id", "$$1"), ("theoretical_occupancy_pct", 100.0),
             ("kernel_details", details)]  # fmt: skip
    return Event(name, start, duration, extra + stats)


def host_planes() -> list[Plane]:
    """``/host:CPU`` (python frames, a TraceMe per thunk) and ``/host:CUPTI`` (kernel
    launches, with the kernels' annotation stats): neither is device time."""
    python = Line("python", [Event("$compile.py:174 _call", 0, 90_000)])
    thunks = Line("tf_XLAPjRtCpuClient/1", [Event("custom-call.1", 100, 4_000)])
    launches = Line("Host Threads/4711", [
        Event("cuLaunchKernel", 200, 50_000, [("device_id", 0), *annotated("custom-call.1")]),
        Event("cuLaunchKernel", 60_000, 50_000,
              [("device_id", 0), *annotated("loop_maximum_fusion")]),
    ])  # fmt: skip
    return [Plane("/host:CPU", [python, thunks]), Plane("/host:CUPTI", [launches])]


def raw_gpu_trace() -> Data:
    """Two runs of the program as jax.profiler writes them on a GPU: kernels on a stream
    line, the launches on the host, a host-to-device copy and another module's kernel."""
    events = []
    for t0 in (1_000_000, 2_000_000):
        events += [
            Event("MemcpyH2D", t0 - 50_000, 7_000, [("memcpy_details", "kind_src:pinned")]),
            kernel(CUBLAS, t0, 30_000, annotated("custom-call.1", "fc/dot_general")),
            kernel("loop_maximum_fusion", t0 + 40_000, 5_000,
                   annotated("loop_maximum_fusion", "act/max")),
            kernel("fusion_2", t0 + 50_000, 2_000, annotated("fusion.2", "flip/tanh")),
            kernel("loop_maximum_fusion", t0 + 60_000, 9_000,
                   annotated("loop_maximum_fusion", "x", module="jit_other")),
        ]  # fmt: skip
    stream = Line("Stream #13(Kernel,MemcpyH2D)", events)
    return Data([*host_planes(), Plane("/device:GPU:0", [stream])])


def graph():
    b = GraphBuilder()
    x, w = b.input((64, 32), name="x"), b.input((48, 32), name="w")
    act = b.exec(ops.relu(), b.exec(ops.gemm(transpose_b=True), x, w, name="fc"), name="act")
    return b.build([act, b.exec(ops.tanh(), act, name="flip")])


def profiled(monkeypatch, data: Data, runs: int = 2):
    """``profile_calls`` of a program whose optimised HLO is ``GPU_HLO``, on trace ``data``."""
    program = types.SimpleNamespace(graph=graph(), compiled_text=lambda: GPU_HLO, platform="gpu")
    monkeypatch.setattr(profile_module, "trace_runs", lambda run, n, folder: data)
    return profile_calls(lambda: None, program, runs=runs)


# ------------------------------------------------------------------------- the layouts


def test_a_raw_gpu_trace_gives_each_node_its_kernels_and_nothing_of_the_host(monkeypatch):
    report = profiled(monkeypatch, raw_gpu_trace())
    rows = {r.name: r for r in report.nodes}
    assert report.platform == "gpu" and NO_NODE not in rows
    assert rows["fc"].seconds == pytest.approx(30e-6) and rows["fc"].ops == ("custom-call.1",)
    assert rows["act"].seconds == pytest.approx(5e-6)
    assert rows["act"].ops == ("loop_maximum_fusion",)
    assert rows["flip"].seconds == pytest.approx(2e-6) and rows["flip"].ops == ("fusion.2",)
    # no launch (50 us each), no host copy, no kernel of another module
    assert report.seconds == pytest.approx(37e-6)
    assert report.commands == pytest.approx({"gemm": 30e-6, "relu": 5e-6, "tanh": 2e-6})


def test_a_nested_or_percent_hlo_op_names_its_innermost_instruction():
    hlo = parse_hlo(GPU_HLO)
    line = Line("Stream #7(Kernel)", [
        kernel("loop_maximum_fusion", 0, 4_000, annotated("while.4::loop_maximum_fusion")),
        kernel(CUBLAS, 10_000, 8_000, annotated("%custom-call.1")),
    ])  # fmt: skip
    events = op_events(Data([Plane("/device:GPU:0", [line])]), hlo.module, hlo.op_names)
    assert [(e.op, e.seconds) for e in events] == [
        ("loop_maximum_fusion", pytest.approx(4e-6)),
        ("custom-call.1", pytest.approx(8e-6)),
    ]


def test_a_trace_xprof_processed_is_read_from_its_xla_ops_line(monkeypatch):
    """XProf adds ``XLA Modules`` and ``XLA Ops`` lines to the device plane (events named
    ``<program id>/<instruction>``, no ``hlo_module``): those, not the streams, count."""
    data = raw_gpu_trace()
    device = data.planes[-1]
    device.lines += [
        Line("XLA Modules", [Event("jit_program(12)", 1_000_000, 60_000)]),
        Line("XLA Ops", [
            Event("12/custom-call.1", 1_000_000, 31_000, [("group_id", 1)]),
            Event("12/loop_maximum_fusion", 1_040_000, 6_000, [("group_id", 1)]),
            Event("12/fusion.2", 1_050_000, 3_000, [("group_id", 1)]),
        ]),
    ]  # fmt: skip
    report = profiled(monkeypatch, data, runs=1)
    rows = {r.name: r for r in report.nodes}
    assert rows["fc"].seconds == pytest.approx(31e-6) and rows["fc"].ops == ("custom-call.1",)
    assert rows["act"].seconds == pytest.approx(6e-6) and rows["flip"].seconds == pytest.approx(
        3e-6
    )
    assert report.seconds == pytest.approx(40e-6)


def test_kernels_the_hlo_does_not_name_go_by_their_own_op_name_or_kernel_name(monkeypatch):
    """A kernel whose ``hlo_op`` is no instruction of the HLO goes to the node of its own
    ``prefix``/``name``; one with no annotation at all, to the instruction its kernel
    name was made from; one that says nothing usable, to ``(no node)`` under its
    ``hlo_op``."""
    line = Line("Stream #13(Kernel)", [
        kernel(CUBLAS, 0, 20_000, annotated("command_buffer", "fc/dot_general")),
        kernel("fusion_2", 30_000, 3_000, []),
        kernel("input_reduce_fusion", 40_000, 1_000, annotated("mystery.7")),
        Event("MemcpyD2D", 50_000, 9_000, [("memcpy_details", "size:4")]),
    ])  # fmt: skip
    report = profiled(monkeypatch, Data([Plane("/device:GPU:0", [line])]), runs=1)
    rows = {r.name: r for r in report.nodes}
    assert rows["fc"].seconds == pytest.approx(20e-6) and rows["fc"].ops == ("command_buffer",)
    assert rows["flip"].seconds == pytest.approx(3e-6) and rows["flip"].ops == ("fusion.2",)
    assert rows[NO_NODE].seconds == pytest.approx(1e-6) and rows[NO_NODE].ops == ("mystery.7",)
    assert rows["act"].seconds == 0


def test_a_cpu_trace_counts_outermost_thunks_of_its_module_only():
    """XLA:CPU's layout: thunk events with ``hlo_op`` on host thread lines; a loop's thunk
    encloses its body's, whose time it already holds; ``end:`` markers and python
    frames are no operations."""
    hlo = parse_hlo(GPU_HLO)
    thunks = Line("tf_XLAPjRtCpuClient/-87", [
        Event("loop_maximum_fusion", 0, 10_000,
              [("hlo_op", "loop_maximum_fusion"), ("hlo_module", "jit_program"),
               ("program_id", 10)]),
        Event("fusion.2", 2_000, 3_000, [("hlo_op", "fusion.2"), ("hlo_module", "jit_program")]),
        Event("end: loop_maximum_fusion", 10_000, 500, [("_c", 0)]),
        Event("fusion.2", 20_000, 4_000, [("hlo_op", "fusion.2"), ("hlo_module", "jit_other")]),
        Event("fusion_2", 30_000, 4_000, [("kernel_details", "none on a CPU")]),
    ])  # fmt: skip
    python = Line("python", [Event("$compile.py:174 _call", 0, 90_000, [("name", "fc")])])
    data = Data([Plane("/host:CPU", [python, thunks])])
    events = op_events(data, hlo.module, hlo.op_names)
    assert [(e.op, e.seconds, e.op_name) for e in events] == [
        ("loop_maximum_fusion", pytest.approx(10e-6), "")
    ]


def test_module_names_and_kernel_names_as_xla_and_xprof_write_them():
    assert same_module("jit_program", "jit_program") and same_module(None, "jit_program")
    assert same_module("jit_program(12)", "jit_program")  # XProf's XLA Modules line
    assert not same_module("jit_program_1", "jit_program")
    assert not same_module("jit_other(12)", "jit_program")
    assert kernel_name("loop_add_fusion.2") == "loop_add_fusion_2"
    assert kernel_name("custom-call.1") == "custom_call_1" and kernel_name("7.a") == "_7_a"


# XLA:GPU's HLO for the same graph with a transpose before the gemm and two Pallas
# kernels after relu: every kernel of it ran in one CUDA graph
GRAPH_HLO = GPU_HLO.replace(
    "  %custom-call.1 = ",
    '  %input_transpose_fusion = f32[32,48]{1,0} fusion(f32[48,32]{1,0} %w.1), kind=kInput, calls=%fused_tanh, metadata={op_name="jit(program)/fc/transpose"}\n'
    "  %custom-call.1 = ",
).replace(
    "  %fusion.2 = ",
    '  %custom-call.2 = f32[64,48]{1,0} custom-call(f32[64,48]{1,0} %loop_maximum_fusion), custom_call_target="__gpu$xla.gpu.triton", metadata={op_name="jit(program)/flip/pallas_call"}\n'
    '  %custom-call.3 = f32[64,48]{1,0} custom-call(f32[64,48]{1,0} %custom-call.2), custom_call_target="__gpu$xla.gpu.triton", metadata={op_name="jit(program)/act/pallas_call"}\n'
    "  %fusion.2 = ",
)


def in_graph(start: float, name: str, duration: float) -> Event:
    """A kernel as CUPTI records it inside a CUDA graph XLA made of a command buffer: the
    graph's annotation (``hlo_op`` ``command_buffer_1``, no ``name``), its graph ids."""
    stats = [("cuda_graph_id", 37), ("cuda_graph_node_id", int(start)),
             *annotated("command_buffer_1")]  # fmt: skip
    return kernel(name, start, duration, stats)


def test_kernels_of_a_cuda_graph_are_placed_by_name_or_between_the_named_ones(monkeypatch):
    """The fusions by their kernel names; cuBLAS's kernel, the only custom call between
    the transpose and relu, to the gemm (its split-K reduction with it); the two Pallas
    kernels between relu and tanh to those two custom calls in order; a kernel after the
    last named one stays ``(no node)`` under the graph's annotation."""
    line = Line("Stream #14(Compute,Memset)", [
        in_graph(0, "input_transpose_fusion", 1_000),
        in_graph(2_000, CUBLAS, 20_000),
        in_graph(23_000, "splitk_reduce_kernel", 1_000),
        in_graph(25_000, "loop_maximum_fusion", 2_000),
        in_graph(30_000, "fnnc_flash_attention", 4_000),
        in_graph(35_000, "fnnc_flash_attention_dq", 8_000),
        in_graph(44_000, "fusion_2", 3_000),
        in_graph(50_000, "memcpy32_post", 500),
    ])  # fmt: skip
    data = Data([Plane("/device:GPU:0", [line])])
    hlo = parse_hlo(GRAPH_HLO)
    events = op_events(data, hlo.module, hlo.op_names, hlo.schedule)
    assert [e.op for e in events] == [
        "input_transpose_fusion", "custom-call.1", "custom-call.1", "loop_maximum_fusion",
        "custom-call.2", "custom-call.3", "fusion.2", "command_buffer_1",
    ]  # fmt: skip
    program = types.SimpleNamespace(graph=graph(), compiled_text=lambda: GRAPH_HLO, platform="gpu")
    monkeypatch.setattr(profile_module, "trace_runs", lambda run, n, folder: data)
    rows = {r.name: r for r in profile_calls(lambda: None, program, runs=1).nodes}
    assert rows["fc"].seconds == pytest.approx(22e-6)
    assert rows["act"].seconds == pytest.approx(10e-6)  # relu and the second Pallas kernel
    assert rows["flip"].seconds == pytest.approx(7e-6)
    assert rows[NO_NODE].seconds == pytest.approx(0.5e-6)


def test_a_graph_annotated_with_an_instruction_still_places_kernels_by_name():
    """Where the graph's ``hlo_op`` is an instruction (a command buffer XLA made in the
    HLO, whose ``op_name`` is its most common inner one), its kernels still go by name
    and by place, not all to it."""
    hlo = parse_hlo(GRAPH_HLO)
    line = Line("Stream #14(Compute)", [
        kernel(n, t, 1_000, [("cuda_graph_id", 3), *annotated("fusion.2")])
        for n, t in (("input_transpose_fusion", 0), (CUBLAS, 2_000), ("loop_maximum_fusion", 4_000))
    ])  # fmt: skip
    events = op_events(Data([Plane("/device:GPU:0", [line])]), hlo.module, hlo.op_names,
                       hlo.schedule)  # fmt: skip
    assert [e.op for e in events] == ["input_transpose_fusion", "custom-call.1",
                                      "loop_maximum_fusion"]  # fmt: skip


def test_a_gap_the_schedule_does_not_explain_stays_unplaced():
    """Two unnamed kernels between relu and tanh where three custom calls run there, or
    between instructions of two computations (a loop's body and its caller): no guess."""
    hlo = parse_hlo(GRAPH_HLO.replace(
        "  %fusion.2 = ",
        '  %custom-call.4 = f32[64,48]{1,0} custom-call(f32[64,48]{1,0} %custom-call.3), custom_call_target="__cublas$gemm", metadata={op_name="jit(program)/flip/dot"}\n'
        "  %fusion.2 = ",
    ))  # fmt: skip
    line = Line("Stream #14(Compute)", [
        in_graph(0, "loop_maximum_fusion", 2_000),
        in_graph(3_000, "a_kernel", 1_000),
        in_graph(5_000, "b_kernel", 1_000),
        in_graph(7_000, "fusion_2", 1_000),
        in_graph(9_000, "c_kernel", 1_000),
        in_graph(11_000, "maximum_1", 1_000),  # the relu inside %fused_maximum
    ])  # fmt: skip
    events = op_events(Data([Plane("/device:GPU:0", [line])]), hlo.module, hlo.op_names,
                       hlo.schedule)  # fmt: skip
    assert [e.op for e in events] == [
        "loop_maximum_fusion", "command_buffer_1", "command_buffer_1", "fusion.2",
        "command_buffer_1", "maximum.1",
    ]  # fmt: skip
