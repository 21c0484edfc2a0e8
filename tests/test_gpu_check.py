"""benchmarks/gpu_check.py, the GPU check, on what a CPU can check quickly: the commands
it plans (``--dry-run``), the counts it reads back from pytest, and the packages it
finds missing. Its CPU mode (``benchmarks/gpu_check.sh --cpu``, about 45 s on a busy
2-core machine) runs the whole script on a small subset; too slow for the suite."""

import subprocess
import sys
import textwrap
from pathlib import Path

from benchmarks import gpu_check
from tests.helpers import ROOT, subprocess_env


def _dry_run(*flags):
    done = subprocess.run(
        [str(ROOT / "benchmarks" / "gpu_check.sh"), "--dry-run", *flags],
        env=subprocess_env(PYTHON=sys.executable), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return dict(line.split(": ", 1) if ": " in line else line.split("=", 1)
                for line in done.stdout.splitlines() if ":" in line or "=" in line)  # fmt: skip


def test_dry_run_plans_the_gpu_tests_the_suite_and_the_kernels():
    plan = _dry_run("--workers", "7")
    assert plan["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    assert plan["PYTHONPATH"].split(":")[0] == str(ROOT)  # fnnc from this checkout
    gpu = plan["gpu tests"]
    assert "-o addopts= -n 4 -m gpu" in gpu and gpu.endswith("tests/ops/pallas/test_gpu.py")
    suite = plan["suite"]
    assert " -n 7 " in suite and "-m gpu" not in suite and "addopts" not in suite
    assert plan["kernels"].endswith("benchmarks/kernels.py --quick --dtype bfloat16")
    assert "lm step" not in plan


def test_lm_flag_adds_the_lm_step_against_torch_compile():
    lm = _dry_run("--lm")["lm step"]
    assert "benchmarks/lm_step.py --impls " in lm and "--tiny" not in lm
    impls = lm.split("--impls ")[1].split()[0]
    assert {"fnnc", "fnnc-blockwise", "nnx", "torch-compile"} <= set(impls.split(","))
    assert "--profile 3 " in lm  # where the device time goes, beside the times
    assert lm.endswith("--keep-trace '<reports>/trace'")  # benchmarks/trace_report.py reads it
    assert "--tiny" in _dry_run("--lm", "--cpu")["lm step"]


def test_perf_only_skips_the_tests_and_measure_writes_to_the_reports():
    plan = _dry_run("--perf-only", "--measure")
    assert plan["gpu tests"].startswith("skipped") and plan["suite"].startswith("skipped")
    measure = plan["measure"]
    assert "-m fnnc.ops.measure_defaults --sizes small,medium,large" in measure
    assert measure.endswith("<reports>/measured_defaults.json'")


def test_cpu_mode_forces_cpu_and_leaves_the_kernels_out():
    plan = _dry_run("--cpu")
    assert plan["JAX_PLATFORMS"] == "cpu"
    assert plan["suite"].endswith(" ".join(gpu_check.CPU_SUBSET))
    assert plan["kernels"].startswith("skipped")


def test_counts_come_from_pytest_s_own_report(tmp_path):
    (tmp_path / "test_three.py").write_text(
        textwrap.dedent(
            """
            import pytest
            def test_ok(): pass
            def test_bad(): assert 1 == 2
            @pytest.mark.skip(reason="no")
            def test_skipped(): pass
            """
        )
    )
    report = tmp_path / "r.xml"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
         "-p", "no:randomly", f"--junitxml={report}", "test_three.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout
    passed, failed, skipped, failures = gpu_check.junit_counts(report)
    assert (passed, failed, skipped) == (1, 1, 1)
    assert failures == ["test_three.py::test_bad"]
    assert gpu_check.summary_counts(done.stdout) == (1, 1, 1)


def test_a_suite_stopped_at_its_limit_still_reports_what_ran(tmp_path):
    """The H100 run of 2026-11-27 lost the counts of 300 s of suite to a SIGKILL: the
    limit now interrupts pytest first, which writes its report of the tests that ran."""
    (tmp_path / "test_slow.py").write_text(
        textwrap.dedent(
            """
            import time
            def test_a_fast_one(): pass
            def test_z_hangs(): time.sleep(120)
            """
        )
    )
    report = tmp_path / "r.xml"
    slow = str(tmp_path / "test_slow.py")
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
            "-p", "no:randomly", f"--junitxml={report}", slow]  # fmt: skip
    step = gpu_check.Step("suite", argv, 12.0, report)
    gpu_check.run(step, subprocess_env(), gpu_check.time.monotonic() + 600)
    assert step.status == "TIMED OUT" and step.seconds < 12.0 + 5
    assert (step.passed, step.failed) == (1, 0), step.output[-2000:]


def test_missing_packages_are_named_with_the_commands_that_install_them():
    assert gpu_check.missing({"json": "json", "no_such_module_here": "no-such-dist"}) == [
        "no-such-dist"
    ]
    text = gpu_check.how_to_install(["grain", "portpicker"])
    assert "pip install grain portpicker" in text and "FNNC_WHEELS" in text


def _wheel(folder, name="fnnc_probe_pkg"):
    """A minimal pure-Python wheel, written by hand (no build backend needed)."""
    import zipfile

    dist = name.replace("_", "-")
    info = f"{name}-0.1.dist-info"
    with zipfile.ZipFile(folder / f"{name}-0.1-py3-none-any.whl", "w") as z:
        z.writestr(f"{name}/__init__.py", "ANSWER = 42\n")
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
        z.writestr(
            f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        z.writestr(f"{info}/RECORD", "")
    return name, dist


def test_missing_packages_install_from_a_folder_of_wheels(tmp_path, monkeypatch):
    wheels, target = tmp_path / "wheels", tmp_path / "deps"
    wheels.mkdir()
    module, dist = _wheel(wheels)
    assert gpu_check.missing({module: dist}) == [dist]
    gpu_check.install([dist], wheels, target)
    monkeypatch.syspath_prepend(str(target))
    assert gpu_check.missing({module: dist}) == []


def test_a_missing_docs_tool_deselects_its_test_and_the_summary_says_so(monkeypatch):
    """A GPU image lacks mkdocs: the suite leaves out the site build (a test of the docs
    tooling, not of the platform) by name, and the table lists it; nothing is skipped."""
    monkeypatch.setattr(gpu_check, "DOCS_TOOLS", {"no_such_module_here": ("x", "tests/t.py::t")})
    left_out = gpu_check.docs_tests_left_out()
    assert left_out == ["tests/t.py::t"]
    text = gpu_check.table([], [], {}, left_out)
    assert "deselected   tests/t.py::t (its package is not installed)" in text
    assert gpu_check.SITE_BUILD.split("::")[1] in (ROOT / "tests" / "test_docs.py").read_text()


def test_a_budget_above_the_default_goes_to_the_suite():
    """The suite is the step that ran out of time on the H100; the others keep theirs."""
    from benchmarks import gpu_check

    default = _dry_run()["limits"]
    assert f"suite {gpu_check.SUITE_SECONDS:.0f} s" in default
    more = _dry_run("--budget", "560")["limits"]
    assert f"suite {gpu_check.SUITE_SECONDS + 90:.0f} s" in more
    assert more.replace("suite 490", "suite 400") == default


def test_the_suite_runs_first_the_tests_no_gpu_run_has_reached(tmp_path):
    """gpu_first.txt's tests go to the front of the suite's list, dealt out first."""
    from benchmarks import gpu_first

    plan = _dry_run()
    assert plan["FNNC_TESTS_FIRST"] == f"{gpu_first.FIRST} (suite)"
    assert "--dist load" in plan["suite"]
    first = tmp_path / "first.txt"
    first.write_text("# a comment\ntests/test_subprocess_env.py::\n\n")
    env = subprocess_env(FNNC_TESTS_FIRST=str(first))
    listed = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-n", "0",
         "tests/ops/test_backends.py", "tests/test_subprocess_env.py"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    ids = [ln for ln in listed.stdout.splitlines() if "::" in ln]
    moved = [i for i in ids if i.startswith("tests/test_subprocess_env.py::")]
    assert moved and ids[: len(moved)] == moved and len(ids) > len(moved)
    ids = gpu_first.read(gpu_first.FIRST)
    assert ids and all(i.startswith("tests/") for i in ids)


def test_gpu_first_keeps_what_no_report_reached(tmp_path):
    """benchmarks/gpu_first.py: the collected ids less the junit report's, passed or
    failed alike, a test class's cases named with their class."""
    from benchmarks import gpu_first

    report = tmp_path / "suite.xml"
    report.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.test_subprocess_env" '
        'name="test_a_child_finds_this_checkout_and_the_parents_pythonpath" time="1"/>'
        '<testcase classname="tests.ops.test_backends" name="test_x" time="1">'
        "<failure message='m'/></testcase>"
        "</testsuite></testsuites>"
    )
    out = tmp_path / "first.txt"
    left = gpu_first.main(
        [str(report), "--out", str(out), "--only", "tests/test_subprocess_env.py"]
    )
    everything = gpu_first.collected(["tests/test_subprocess_env.py"])
    reached = (
        "tests/test_subprocess_env.py::test_a_child_finds_this_checkout_and_the_parents_pythonpath"
    )
    assert reached in everything and reached not in left
    assert left == [i for i in everything if i != reached]
    assert list(gpu_first.read(out)) == left
    assert gpu_first.node_id("tests.ops.test_backends", "t[a.b]") == (
        "tests/ops/test_backends.py::t[a.b]"
    )
    assert gpu_first.node_id("tests.ops.test_backends.TestSome", "t") == (
        "tests/ops/test_backends.py::TestSome::t"
    )


def test_the_lm_step_it_plans_names_implementations_lm_step_has():
    from benchmarks import lm_step

    assert set(gpu_check.LM_IMPLS.split(",")) <= set(lm_step.IMPLS)


def test_the_test_steps_skip_the_autotuner_where_xla_takes_the_flag(monkeypatch):
    """The flags go to the two test steps only, after a probe; a flag XLA rejects (it
    would abort every process) is dropped and the summary says so."""
    from benchmarks import gpu_check

    assert _dry_run()["test XLA_FLAGS"].startswith(gpu_check.TEST_XLA_FLAGS)
    tests = {"gpu tests": Path("gpu.xml"), "suite": Path("suite.xml")}  # pytest's steps
    steps = [
        gpu_check.Step(n, ["x"], 1, tests.get(n))
        for n in ("versions", "gpu tests", "suite", "kernels")
    ]
    env = {**subprocess_env(), "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    done = gpu_check.test_flags(steps, env)
    assert done == f"--xla_force_host_platform_device_count=2 {gpu_check.TEST_XLA_FLAGS}"
    assert [s.env.get("XLA_FLAGS") for s in steps] == [None, done, done, None]
    fresh = [gpu_check.Step("suite", ["x"], 1, Path("suite.xml"))]
    monkeypatch.setattr(gpu_check, "TEST_XLA_FLAGS", "--xla_no_such_flag_here=1")
    rejected = gpu_check.test_flags(fresh, subprocess_env())
    assert rejected.startswith("- (--xla_no_such_flag_here=1 rejected") and fresh[0].env == {}
