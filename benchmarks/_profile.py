"""Where a training step's device time goes: kernel times from a profile, by kind.

``benchmarks/lm_step.py --profile N`` profiles N steps of each implementation (JAX's
profiler for fnnc and NNX, ``torch.profiler`` for PyTorch) and reports milliseconds per
step by kind of kernel (:data:`KINDS`), side by side, then each implementation's largest
kernels. A ratio of step times says *that* one step is slower; this says *where*: it is
what a GPU session needs to act on a gap it cannot otherwise see from a CPU machine.

Kernel time is summed over streams, so kernels that overlap count twice, and the gap
between a step's time and its kernel time is launch overhead and idle device time.
"""

from __future__ import annotations

import collections
import re
import tempfile
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from fnnc.errors import GraphError
from fnnc.graph.profile import read_trace, stats_readable, trace_runs

KINDS: tuple[tuple[str, str], ...] = (
    ("optimizer", r"adam|multi_tensor"),
    ("attention", r"attention|flash|fmha|sdpa|mha|cudnn"),
    ("cross-entropy", r"crossentropy|cross_entropy|nll|log_softmax|softmax"),
    (
        "gemm",
        r"gemm|gemv|cutlass|xmma|cublas|nvjet|matmul|\bdot|::(add)?b?mm\b|sm\d\d_|ampere_|hopper",
    ),
    ("norm", r"norm|welford"),
    ("copy/layout", r"copy|transpose|memcpy|memset|concatenate|dynamic.update|gather|scatter"),
    ("other fusions", r""),
)
"""(kind, regular expression on the lowercased kernel name), first match wins: rough by
design (XLA names its fusions after their root), which is why the largest kernels are
listed by name beside it."""

KEPT = 200
"""Kernels kept by name per implementation; the rest are summed under ``(rest)``."""

_CPU_NOISE = ("end:", "ThunkExecutor", "ThreadpoolListener")


def kind_of(name: str) -> str:
    """The :data:`KINDS` entry a kernel name falls under."""
    low = name.lower()
    return next(kind for kind, pattern in KINDS if re.search(pattern, low))


def _kept(totals: Mapping[str, float], steps: int) -> dict[str, float]:
    ranked = sorted(totals.items(), key=lambda kv: -kv[1])
    out = {name[:160]: ms / steps for name, ms in ranked[:KEPT]}
    rest = sum(ms for _, ms in ranked[KEPT:])
    if rest:
        out["(rest)"] = rest / steps
    return out


def kernel_ms(data: Any) -> dict[str, float]:
    """Total milliseconds per kernel name in one JAX profile (``jax.profiler.ProfileData``):
    the device planes' stream lines on a GPU (their ``XLA Ops`` line where a profile has
    no streams), the thunks on XLA:CPU's threads on a CPU (rough there: a thunk that
    waits for its parallel parts counts its wait too)."""
    totals: collections.Counter[str] = collections.Counter()
    device = [p for p in data.planes if p.name.startswith("/device:")]
    if device:
        for plane in device:
            lines = [ln for ln in plane.lines if ln.name.startswith("Stream")]
            lines = lines or [ln for ln in plane.lines if ln.name == "XLA Ops"]
            for line in lines:
                for e in line.events:
                    totals[e.name] += e.duration_ns / 1e6
        return dict(totals)
    for plane in data.planes:
        for line in plane.lines:
            if not line.name.startswith("tf_XLA"):
                continue
            for e in line.events:
                if not e.name.startswith(_CPU_NOISE):
                    totals[e.name] += e.duration_ns / 1e6
    return dict(totals)


def jax_kernels(step: Callable[[], Any], steps: int) -> dict[str, float]:
    """Milliseconds per step of each kernel over ``steps`` calls of ``step`` (already
    compiled and warm), traced by :func:`fnnc.graph.profile.trace_runs`."""
    with tempfile.TemporaryDirectory() as folder:
        return _kept(kernel_ms(trace_runs(step, steps, folder)), steps)


def torch_kernels(
    step: Callable[[], Any], steps: int, sync: Callable[[], None]
) -> dict[str, float]:
    """Milliseconds per step of each CUDA kernel (CPU ops on a CPU) over ``steps`` calls
    of ``step``, from ``torch.profiler``'s self device time."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.cuda.is_available()
    activities = [ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]
    sync()
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        sync()
    totals: dict[str, float] = {}
    for e in prof.key_averages():
        if cuda:
            us = getattr(e, "self_device_time_total", None)
            us = e.self_cuda_time_total if us is None else us
        else:
            us = e.self_cpu_time_total
        if us > 0:
            totals[e.key] = totals.get(e.key, 0.0) + us / 1e3
    return _kept(totals, steps)


def by_kind(kernels: Mapping[str, float]) -> dict[str, float]:
    """Milliseconds per step of each kind in :data:`KINDS` (all of them, zeros too)."""
    out = {kind: 0.0 for kind, _ in KINDS}
    for name, ms in kernels.items():
        out[kind_of(name)] += ms
    return out


def breakdown(rows: Sequence[tuple[str, float | None, Mapping[str, float]]], top: int = 8) -> str:
    """The report: (implementation, ms/step, kernel ms per step) rows, as a table of kinds
    by implementation, then each implementation's ``top`` kernels."""
    rows = [r for r in rows if r[2]]
    if not rows:
        return ""
    kinds = {impl: by_kind(k) for impl, _, k in rows}
    head = f"{'ms/step by kernel kind':24s}" + "".join(f"{impl:>15s}" for impl, _, _ in rows)
    lines = [head]
    for kind, _ in KINDS:
        lines.append(f"{kind:24s}" + "".join(f"{kinds[i][kind]:15.3f}" for i, _, _ in rows))
    total = {impl: sum(k.values()) for impl, _, k in rows}
    lines.append(f"{'kernels, total':24s}" + "".join(f"{total[i]:15.3f}" for i, _, _ in rows))
    gaps = [f"{ms - total[i]:15.3f}" if ms else f"{'-':>15s}" for i, ms, _ in rows]
    lines.append(f"{'step - kernels':24s}" + "".join(gaps))
    for impl, _, k in rows:
        lines += ["", f"{impl}: largest kernels, ms/step"]
        for name, ms in sorted(k.items(), key=lambda kv: -kv[1])[:top]:
            lines.append(f"  {ms:8.3f}  {kind_of(name):14s} {name[:90]}")
    return "\n".join(lines)


def trace_sample(folder: str, hlo_text: str = "", events: int = 4) -> str:
    """What a trace under ``folder`` holds, for a GPU run where ``Model.profile``
    placed little of the step: each plane's lines, the first ``events`` events of each
    device stream line (or of the first line elsewhere) with their stats, and the HLO's
    module line and first instructions. The next session reads attribution off this."""
    try:
        data = read_trace(folder)
    except GraphError:
        return f"no trace under {folder}"
    out = []
    with stats_readable():
        for plane in data.planes:
            lines = list(plane.lines)
            out.append(f"plane {plane.name}: lines {[ln.name for ln in lines][:12]}")
            shown = [ln for ln in lines if ln.name.startswith("Stream")] or lines[:1]
            for line in shown[:2]:
                for e in list(line.events)[:events]:
                    stats = {str(k): str(v)[:80] for k, v in dict(e.stats).items()}
                    out.append(f"  {line.name[:40]} | {e.name[:60]} | {stats}")
    if hlo_text:
        head = hlo_text.splitlines()
        instructions = [ln.strip()[:100] for ln in head if ln.strip().startswith(("%", "ROOT"))]
        out += [f"hlo: {head[0][:160]}", *(f"  {i}" for i in instructions[:4])]
    return "\n".join(out)
