"""A kept profile, kernel by kernel: what ``lm_step.py --profile N --keep-trace DIR`` wrote.

A GPU session is short; a trace kept from it can be read on any machine afterwards.
``lm_step.py`` keeps, per fnnc implementation, ``DIR/<impl>.xplane.pb.gz`` (the
``jax.profiler`` trace of ``Model.profile``'s runs) and ``DIR/<impl>.hlo.txt.gz`` (the
optimised HLO that ran, its first line ``# runs=N``). This reads them with the same code
``Model.profile`` uses (:func:`fnnc.graph._trace_events.op_events`) and prints each
kernel's milliseconds per run, the instruction it was placed on and that instruction's
``op_name`` (the fnnc node is its first component after ``jit(...)``), the time by kind of
kernel and what stayed unplaced; ``--hlo NAME`` prints an instruction and the computation
it calls (what a fusion computes)::

    python benchmarks/trace_report.py DIR fnnc [--top 40] [--hlo input_reduce_fusion.3]
"""

from __future__ import annotations

import argparse
import collections
import gzip
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Sequence

if __package__ in (None, ""):  # run as a script: the checkout's packages come first
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks._profile import kind_of
from fnnc.graph._trace_events import op_events
from fnnc.graph.profile import parse_hlo, read_trace

_RUNS = re.compile(r"^# runs=(\d+)")


def load(folder: str, name: str) -> tuple[str, object, int]:
    """``(hlo text, ProfileData, runs)`` of one kept profile."""
    with gzip.open(os.path.join(folder, f"{name}.hlo.txt.gz"), "rt") as f:
        hlo = f.read()
    found = _RUNS.match(hlo)
    kept = os.path.join(folder, f"{name}.xplane.pb.gz")
    with tempfile.TemporaryDirectory() as tmp:
        with gzip.open(kept, "rb") as src, open(os.path.join(tmp, "kept.xplane.pb"), "wb") as dst:
            shutil.copyfileobj(src, dst)
        trace = read_trace(tmp)
    return hlo, trace, int(found.group(1)) if found else 1


def report(hlo_text: str, trace: object, runs: int, top: int = 40) -> str:
    """The kernels of one kept profile, the largest first, then the time by kind."""
    hlo = parse_hlo(hlo_text)
    events = op_events(trace, hlo.module, hlo.op_names, hlo.schedule)
    ms: collections.Counter[tuple[str, str]] = collections.Counter()
    count: collections.Counter[tuple[str, str]] = collections.Counter()
    for e in events:
        ms[e.kernel, e.op] += 1e3 * e.seconds / runs
        count[e.kernel, e.op] += 1
    total = sum(ms.values())
    lines = [f"{len(events)} operations in {runs} runs, {total:.3f} ms a run", ""]
    lines.append(f"{'ms/run':>8s} {'calls':>6s}  {'kernel':48s} {'instruction':28s} op_name")
    known = {inst for insts in hlo.schedule.values() for inst, _ in insts}
    for (kernel, op), t in ms.most_common(top):
        where = hlo.op_names.get(op) or ("(no op_name)" if op in known else "(unplaced)")
        calls = count[kernel, op] / runs
        lines.append(f"{t:8.3f} {calls:6g}  {kernel[:48]:48s} {op[:28]:28s} {where[:90]}")
    kinds: collections.Counter[str] = collections.Counter()
    unplaced = 0.0
    for (kernel, op), t in ms.items():
        kinds[kind_of(kernel)] += t
        unplaced += t if op not in known else 0.0
    lines += ["", "by kind: " + ", ".join(f"{k} {t:.3f}" for k, t in kinds.most_common())]
    lines.append(f"unplaced (no instruction of the HLO): {unplaced:.3f} ms a run")
    return "\n".join(lines)


def show(hlo_text: str, instruction: str) -> str:
    """An instruction's line and the computation it calls (``calls=`` / ``to_apply=``)."""
    lines = hlo_text.splitlines()
    own = [ln for ln in lines if re.match(rf"^\s*(ROOT\s+)?%{re.escape(instruction)}\s*=", ln)]
    if not own:
        return f"no instruction {instruction!r} in the HLO"
    out = [own[0].strip()]
    called = re.search(r"(?:calls|to_apply)=%([\w.\-]+)", own[0])
    if called:
        start = next(
            (i for i, ln in enumerate(lines) if re.match(rf"^%{re.escape(called[1])}\s", ln)),
            None,
        )
        if start is not None:
            end = next((i for i in range(start, len(lines)) if lines[i].startswith("}")), start)
            out += [ln.rstrip() for ln in lines[start : end + 1]]
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", help="the --keep-trace folder")
    parser.add_argument("name", help="the implementation, e.g. fnnc")
    parser.add_argument("--top", type=int, default=40, help="kernels listed (default 40)")
    parser.add_argument("--hlo", action="append", default=[], help="an instruction to print")
    opts = parser.parse_args(argv)
    hlo, trace, runs = load(opts.folder, opts.name)
    text = "\n\n".join([report(hlo, trace, runs, opts.top), *(show(hlo, i) for i in opts.hlo)])
    print(text)
    return text


if __name__ == "__main__":
    main()
