"""Damaged tensor files, checkpoints and graph files: every read returns the data written
or raises an FnncError (benchmarks/fuzz_files.py, a bounded seeded run)."""

import pathlib
import subprocess
import sys

from tests.helpers import subprocess_env

ROOT = pathlib.Path(__file__).parents[2]
CASES = 200


def test_damaged_files_raise_only_fnnc_errors():
    """One subprocess: it limits its own address space (RLIMIT_AS, start-up plus 1 GiB)
    after checking the limit holds, so an allocation sized by a damaged header fails a
    case instead of the machine, and each case has a time limit (no hang)."""
    env = subprocess_env()
    command = [sys.executable, str(ROOT / "benchmarks" / "fuzz_files.py")]
    command += ["--cases", str(CASES), "--seed", "0", "--case-seconds", "5"]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    report = done.stdout + done.stderr
    assert done.returncode == 0, report
    assert f"fuzzed {CASES} damaged files" in report and ": 0 failures" in report, report
    assert "TensorFileError" in report and "CheckpointError" in report  # damage was seen
