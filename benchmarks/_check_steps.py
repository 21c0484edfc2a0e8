"""The GPU check's steps: a command run within a time budget, stopped cleanly at its
limit (SIGINT first, so that pytest still writes its counts), and its results read from
pytest's junit report or last line. :mod:`benchmarks.gpu_check` says what runs."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import shlex
import signal
import subprocess
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclasses.dataclass
class Step:
    """One command of the check and what it gave."""

    name: str
    argv: list[str]
    limit: float
    junit: Path | None = None
    status: str = "not run"
    passed: int | None = None
    failed: int | None = None
    skipped: int | None = None
    seconds: float = 0.0
    failures: list[str] = dataclasses.field(default_factory=list)
    output: str = ""
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    """Variables set for this step alone (``benchmarks.gpu_check.TEST_XLA_FLAGS``)."""


def junit_counts(path: Path) -> tuple[int, int, int, list[str]]:
    """(passed, failed, skipped, failing test ids) from a pytest junit XML file."""
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    total = failed = skipped = 0
    for s in suites:
        total += int(s.get("tests", 0))
        failed += int(s.get("failures", 0)) + int(s.get("errors", 0))
        skipped += int(s.get("skipped", 0))
    failures = []
    for case in root.iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            path_part = case.get("classname", "").replace(".", "/")
            failures.append(f"{path_part}.py::{case.get('name')}")
    return total - failed - skipped, failed, skipped, failures


def summary_counts(text: str) -> tuple[int, int, int]:
    """(passed, failed, skipped) from pytest's last line, for runs without a report."""
    count = lambda word: sum(int(n) for n in re.findall(rf"(\d+) {word}", text))
    return count("passed"), count("failed") + count("error"), count("skipped")


def run(step: Step, env: dict[str, str], deadline: float) -> None:
    """Runs ``step`` (output streamed to this terminal and kept), within the deadline."""
    limit = min(step.limit, deadline - time.monotonic())
    if limit < 10:
        step.status = "no time left"
        return
    print(f"\n=== {step.name}: {shlex.join(step.argv)}  (limit {limit:.0f} s)", flush=True)
    start = time.monotonic()
    proc = subprocess.Popen(
        step.argv, cwd=ROOT, env={**env, **step.env}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True, start_new_session=True,
    )  # fmt: skip
    lines: list[str] = []
    timer = _Timer(proc, limit)
    assert proc.stdout is not None
    with proc.stdout:
        for line in proc.stdout:
            print(line, end="", flush=True)
            lines.append(line)
    proc.wait()
    timer.cancel()
    step.seconds = time.monotonic() - start
    step.output = "".join(lines)
    if timer.fired:
        step.status = "TIMED OUT"
    elif proc.returncode == 0:
        step.status = "ok"
    elif step.junit is not None and proc.returncode in (1, 5):
        step.status = "FAILED" if proc.returncode == 1 else "no tests"
    else:
        step.status = f"exit {proc.returncode}"
    if step.junit is not None and step.junit.exists():
        step.passed, step.failed, step.skipped, step.failures = junit_counts(step.junit)
    elif step.junit is not None:
        step.passed, step.failed, step.skipped = summary_counts(step.output[-3000:])


class _Timer:
    """Stops a process group after ``seconds``: SIGINT first, ``grace`` seconds before
    the end, so that pytest (and its xdist workers) stop and still write their summary
    and junit report (the counts of what ran); SIGKILL at the end if it still runs."""

    GRACE = 20.0

    def __init__(self, proc: subprocess.Popen, seconds: float):
        self.fired = False
        grace = min(self.GRACE, seconds / 4)
        self._timers = [
            threading.Timer(seconds - grace, self._fire, (proc, signal.SIGINT)),
            threading.Timer(seconds, self._fire, (proc, signal.SIGKILL)),
        ]
        for timer in self._timers:
            timer.daemon = True
            timer.start()

    def _fire(self, proc: subprocess.Popen, sig: int) -> None:
        self.fired = True
        with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
            os.killpg(proc.pid, sig)

    def cancel(self) -> None:
        for timer in self._timers:
            timer.cancel()
