"""Rewrites ``benchmarks/gpu_first.txt`` from a GPU run's suite report.

``benchmarks/gpu_check.py`` runs first the tests listed there (``FNNC_TESTS_FIRST``,
``tests/conftest.py``): those no GPU run has reached, so that a suite stopped at its
limit still reports on them. After a GPU run, this drops from the list what that run
reached::

    python benchmarks/gpu_first.py <reports>/suite.xml [more reports ...]

It collects the suite here (``pytest --collect-only``, the ids every platform shares)
and keeps the ids none of the reports has, passed, failed or skipped alike: a test
that failed was reached, and its failure is in that run's summary.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIRST = ROOT / "benchmarks" / "gpu_first.txt"
"""The list: 221 tests after the H100 runs of 2026-11-27 and the H200 run of 2026-11-28
(each suite stopped at its limit), and the tests written since."""
HEADER = """\
# Tests the GPU check's suite runs first (FNNC_TESTS_FIRST, tests/conftest.py): those no
# GPU run has reached yet, so that a suite stopped at its limit still reports on them.
# Written by benchmarks/gpu_first.py from the runs' junit reports: {runs}.
"""


def read(path: Path) -> tuple[str, ...]:
    """The test ids (node id prefixes) a list holds: its lines, less ``#`` comments and
    blank ones. ``tests/conftest.py`` moves the tests they start to the front."""
    lines = (line.strip() for line in Path(path).read_text().splitlines())
    return tuple(line for line in lines if line and not line.startswith("#"))


def node_id(classname: str, name: str) -> str:
    """A junit test case's pytest node id: ``tests.ops.test_x`` + ``t[a]`` is
    ``tests/ops/test_x.py::t[a]``; a test class's cases keep the class
    (``tests/ops/test_x.py::TestY::t``), found as the longest module path that exists."""
    parts = classname.split(".")
    for cut in range(len(parts), 0, -1):
        module = "/".join(parts[:cut]) + ".py"
        if (ROOT / module).is_file():
            return "::".join([module, *parts[cut:], name])
    return "::".join(["/".join(parts) + ".py", name])


def reached(reports: Iterable[Path]) -> set[str]:
    """Node ids of every test case in the junit ``reports``."""
    out = set()
    for report in reports:
        for case in ET.parse(report).getroot().iter("testcase"):
            out.add(node_id(case.get("classname") or "", case.get("name") or ""))
    return out


def collected(paths: Sequence[str] = ()) -> list[str]:
    """The suite's node ids (of ``paths`` only, where given), collected on the CPU
    platform whatever the machine has: collecting needs no accelerator (``tests/helpers.py``
    asks JAX for its backend at import, which would start CUDA on a GPU machine). Ids that
    only a CPU collects (the CPU-only convolution backends of ``test_backend_sweep.py``)
    stay listed and match nothing on a GPU."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-n", "0", *paths],
        cwd=ROOT, capture_output=True, text=True, check=True,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )  # fmt: skip
    return [line.strip() for line in done.stdout.splitlines() if "::" in line]


def main(argv: Sequence[str] | None = None) -> list[str]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reports", nargs="+", type=Path, help="the suite's junit reports")
    parser.add_argument("--out", type=Path, default=FIRST, help=f"(default: {FIRST})")
    parser.add_argument("--only", nargs="*", default=[], help="collect these test paths only")
    parser.add_argument("--runs", help="what the reports are, for the header (default: paths)")
    opts = parser.parse_args(argv)
    seen = reached(opts.reports)
    left = [i for i in collected(opts.only) if i not in seen]
    runs = opts.runs or ", ".join(str(p) for p in opts.reports)
    opts.out.write_text(HEADER.format(runs=runs) + "".join(f"{i}\n" for i in left))
    print(f"{len(left)} tests no report reached -> {opts.out}")
    return left


if __name__ == "__main__":
    main()
