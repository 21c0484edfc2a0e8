"""The GPU check: versions and device, the GPU tests, the whole suite, the kernel table.

Run it whenever a GPU is at hand, on a bare machine, from the checkout (fnnc runs from
source through ``PYTHONPATH``; nothing is installed but missing packages)::

    benchmarks/gpu_check.sh                # or: python benchmarks/gpu_check.py

Steps, in one budget (``--budget``, default 470 s, so the whole check ends in under
8 minutes; what a larger one adds goes to the suite's limit; a step that would pass the
budget is stopped and reported as timed out, with the counts of the tests that ran
before it was stopped):

1. ``versions``: Python, jax, jaxlib, the CUDA plugin, flax, optax, grain, numpy, and
   the device JAX sees (a check whose default platform is not ``gpu`` fails here);
2. ``gpu tests``: ``pytest -m gpu tests/ops/pallas/test_gpu.py`` on 4 workers (compiled
   kernels against the reference);
3. ``suite``: every other test (the ``-m 'not gpu'`` of ``pyproject.toml``) on the GPU,
   with pytest-xdist (``--workers``) and ``XLA_PYTHON_CLIENT_PREALLOCATE=false`` so the
   workers share the GPU's memory, the tests no GPU run has reached first
   (``benchmarks/gpu_first.txt``);
4. ``kernels``: ``benchmarks/kernels.py --quick --dtype bfloat16`` (each kernel backend vs XLA
   timings at transformer sizes);
5. with ``--lm`` (+330 s of budget): ``benchmarks/lm_step.py`` at issue 24's size,
   fnnc's default step against ``torch.compile``, the default with the other attention
   layouts forced, its other loss head, Flax NNX and
   the step after ``Model.autotune`` (:data:`LM_IMPLS`), with ``--profile 3``: each
   one's device time by kind of kernel, and fnnc's by command; the default step's
   trace and HLO kept in ``trace/`` of the reports folder (``benchmarks/trace_report.py``)
   with every implementation's result (``results.json``);
6. with ``--measure`` (+150 s): ``python -m fnnc.ops.measure_defaults`` (small,
   medium and large sizes) into the reports folder (``measured_defaults.json``, to
   merge into the package's).

``--perf-only`` skips steps 2 and 3: ``--perf-only --lm --measure`` is a GPU session's
speed check in about 5 minutes, beside a plain check for the suite.

Then one table: passed / failed / skipped and seconds per step, the failing tests, and
the kernel table. The exit status is 0 only if nothing failed.

**Missing packages.** GPU images come with jax and its CUDA plugin, flax and optax, but
often without grain and what it needs (array-record, portpicker) or fpzip. The check
looks for every package the suite imports before it runs anything. Missing ones are installed
from a folder of wheels when ``FNNC_WHEELS`` names one (or ``.whl/`` exists in the
checkout: git ignores it, so a device runner can carry it), with
``pip install --no-index --no-deps --target $FNNC_DEPS`` (default
``/tmp/fnnc-gpu-check/deps``, put on ``PYTHONPATH`` for every step); otherwise the
check prints the commands that fetch them and runs anyway, so the table shows what
they break.

``--cpu`` runs the same steps on CPU with a small subset (the script's own check, a few
seconds of tests; kernels only with ``--kernels``); ``--dry-run`` prints the commands.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: the checkout's packages come first
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._check_steps import Step, junit_counts, run, summary_counts
from benchmarks.gpu_first import FIRST  # the tests no GPU run has reached: run first

__all__ = ["Step", "junit_counts", "main", "run", "summary_counts"]

ROOT = Path(__file__).resolve().parents[1]

# module -> distribution: what the suite imports (fnnc, its tests, grain's own needs)
REQUIRED = {
    "jax": "jax",
    "jaxlib": "jaxlib",
    "flax": "flax",
    "optax": "optax",
    "numpy": "numpy",
    "ml_dtypes": "ml_dtypes",
    "flatbuffers": "flatbuffers",
    "grain": "grain",
    "array_record": "array-record",
    "portpicker": "portpicker",
    "absl": "absl-py",
    "cloudpickle": "cloudpickle",
    "etils": "etils",
    "google.protobuf": "protobuf",
    "pytest": "pytest",
    "xdist": "pytest-xdist",
    "hypothesis": "hypothesis",
    "fpzip": "fpzip",  # NNC's fpzip codec (the test extra; tests/io use it)
}

SITE_BUILD = "tests/test_docs.py::test_site_builds_strict_offline_with_every_public_name"
DOCS_TOOLS = {"mkdocs": ("mkdocs", SITE_BUILD)}
"""module -> (distribution, test): tests of the documentation tooling, not of a platform.
A GPU image lacks mkdocs and its plugins (a dozen wheels); there the suite deselects the
site build, and the summary names what it left out."""

GPU_TESTS = ["tests/ops/pallas/test_gpu.py"]
LM_IMPLS = "fnnc,torch-compile,fnnc-fused,fnnc-cudnn,fnnc-blockwise,nnx,fnnc-tuned"
"""What ``--lm`` times, the must-haves first (a step stopped at its limit keeps those
that finished): the default and the target; the default with the fused flash-attention
backward forced, then cuDNN's attention (torch's 2.0 ms of attention on the H100
against fnnc's 2.7 is cuDNN's, whose backward is one kernel; fnnc's cuDNN backward
recomputes cuDNN's forward, which XLA may merge with the forward's own call);
then the other loss head, the JAX baseline and the default after ``Model.autotune``
(its choices printed). The forced Pallas layouts (``fnnc-split``, ``fnnc-bq128``:
22.79 and 22.49 ms against the default's 22.46 on the H100 of 2026-11-27), ``fnnc-xla``
and torch eager (33.6 and 27.7 ms on the H200 that day) and ``fnnc-unfused`` are left
to ``lm_step.py`` itself: a GPU session's minutes are few."""
MEASURE_SECONDS = 150.0
"""``--measure``: ``python -m fnnc.ops.measure_defaults`` (its large sizes alone took 40 s
on an H200)."""
LM_SECONDS = 330.0
"""``--lm``: the implementations ``benchmarks/lm_step.py`` times at the issue's size, in
about 150 s on an H200 (each in its own process, compiles included), and profiles 3
steps of each: where the device time goes, by kind of kernel (``benchmarks/_profile.py``)."""
SUITE_SECONDS = 400.0
"""The suite's limit. On an H100 (2026-11-27, second run) 15 workers ran 4,858 of its
tests (1 failed) in 391 s under XLA's autotuner and were stopped there. The 381 tests
they did not reach (``benchmarks/gpu_first.txt``) took 516 of the suite's 2,393 s of
worker time on 2 CPU cores: about 1,400 s of GPU workers' time at the ratio of those
that ran, so the whole suite needed about 440 s then. Without the autotuner
(:data:`TEST_XLA_FLAGS`) it may fit (unmeasured). A suite stopped at its limit still
reports what ran (see ``benchmarks._check_steps._Timer``); a ``--budget`` above the
default gives the suite the difference (``--budget 560``: a limit of 490 s)."""
CPU_SUBSET = ["tests/test_subprocess_env.py", "tests/ops/test_backends.py"]
TEST_XLA_FLAGS = "--xla_gpu_autotune_level=0"
"""XLA flags of the two test steps (never of the timed ones): they check results, not
speed, and XLA:GPU's autotuner compiles and times candidate kernels for every new dot
it meets, where level 0 takes its heuristic choice. The suite is compiles: its 972
registry cases took 450 s of worker time on the H100, 102 s on 2 CPU cores. The flags
are tried on a small program first and dropped (the summary says so) if XLA rejects
them, since an unknown XLA flag aborts every process."""
PROBE = "import jax, jax.numpy as jnp; print(jax.jit(lambda x: x @ x)(jnp.ones((64, 64))).sum())"

VERSIONS = r"""
import importlib.metadata as m, json, platform, re
def v(name):
    try:
        return m.version(name)
    except m.PackageNotFoundError:
        return "-"
names = ["jax", "jaxlib", "flax", "optax", "grain", "numpy"]
plugins = sorted(d.metadata["Name"] for d in m.distributions()
                 if re.match(r"jax[-_]cuda\d+[-_](plugin|pjrt)", d.metadata["Name"] or ""))
import jax
info = {"python": platform.python_version(), **{n: v(n) for n in names},
        "cuda plugin": ", ".join(f"{p} {v(p)}" for p in plugins) or "-",
        "platform": jax.default_backend(),
        "devices": ", ".join(sorted({d.device_kind for d in jax.devices()}))
                   + f" x{jax.device_count()}"}
print("VERSIONS " + json.dumps(info))
"""


def missing(modules: dict[str, str]) -> list[str]:
    """Distributions of ``modules`` this interpreter cannot import."""
    out = []
    for module, dist in modules.items():
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            out.append(dist)
    return out


def install(dists: list[str], wheels: Path, target: Path) -> str:
    """``pip install`` of ``dists`` from the folder ``wheels`` into ``target``."""
    argv = [sys.executable, "-m", "pip", "install", "--no-index", "--no-deps"]
    argv += ["--find-links", str(wheels), "--target", str(target), *dists]
    done = subprocess.run(argv, capture_output=True, text=True)
    return done.stdout[-2000:] + done.stderr[-2000:]


def docs_tests_left_out() -> list[str]:
    """The tests of :data:`DOCS_TOOLS` whose package this interpreter lacks."""
    return [test for module, (dist, test) in DOCS_TOOLS.items() if missing({module: dist})]


def how_to_install(dists: list[str]) -> str:
    names = " ".join(dists)
    return (
        f"missing: {names}\n"
        f"  online:  {sys.executable} -m pip install {names}\n"
        "  offline: on a machine online, fetch the wheels\n"
        f"    pip download --only-binary=:all: --no-deps --python-version "
        f"{sys.version_info.major}.{sys.version_info.minor} --platform manylinux2014_x86_64 "
        f"-d .whl {names}\n"
        "  (benchmarks/gpu_wheels.sh does this for the suite's usual four)\n"
        "  then rerun here with the folder in FNNC_WHEELS (or as .whl/ in the checkout)"
    )


def steps(flags: argparse.Namespace, work: Path) -> list[Step]:
    py = sys.executable
    pytest = [py, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:benchmark", "-q", "-rfE"]
    if importlib.util.find_spec("pytest_timeout") is not None:
        pytest += ["--timeout", "300"]  # one hung test must not eat the whole budget
    # -o addopts= drops the -m 'not gpu' (and -n 2) of pyproject.toml
    # 4 workers: one at a time took 78 s of compiling for 11 tests on an H100; the times
    # these tests print are indicative only (benchmarks/kernels.py is the timing)
    workers = "0" if flags.cpu else "4"
    only_gpu = ["-o", "addopts=", "-n", workers, "-m", "gpu", "--junitxml", str(work / "gpu.xml")]
    gpu = Step("gpu tests", [*pytest, *only_gpu, *GPU_TESTS], 120, work / "gpu.xml")
    suite_paths = CPU_SUBSET if flags.cpu else []  # none: pyproject's testpaths
    report = ["--junitxml", str(work / "suite.xml")]
    suite = Step(
        "suite",
        [*pytest, "-n", str(flags.workers), "--dist", "load", *report, *suite_paths],
        getattr(flags, "suite_seconds", SUITE_SECONDS),
        work / "suite.xml",
    )
    # --dist load deals the front of the list out first; worksteal's queues are
    # contiguous slices of it, so the first worker or two would get them all
    if FIRST.is_file():
        suite.env["FNNC_TESTS_FIRST"] = str(FIRST)
    # 150 s: it times every backend that runs a case, four flash-attention layouts and
    # cuDNN among them
    kernels = Step("kernels", [py, "benchmarks/kernels.py", "--quick", "--dtype", "bfloat16"], 150)
    if flags.cpu:
        kernels.argv[-1] = "float32"
    out = [Step("versions", [py, "-c", VERSIONS], 90), gpu, suite, kernels]
    if flags.cpu and not flags.kernels:
        kernels.status = "skipped (--cpu; --kernels runs it)"
        kernels.argv = []
    if flags.perf_only:
        for step in (gpu, suite):
            step.status, step.argv = "skipped (--perf-only)", []
    if flags.lm:  # issue 24's measurement: fnnc's default step against torch.compile
        size = ["--tiny"] if flags.cpu else []
        lm = [py, "benchmarks/lm_step.py", *size, "--impls", LM_IMPLS, "--profile", "3"]
        lm += ["--keep-trace", str(work / "trace")]  # benchmarks/trace_report.py reads it
        out.append(Step("lm step", lm, LM_SECONDS))
    if flags.measure:  # this device's measured defaults, to merge into the package's
        table = str(work / "measured_defaults.json")
        sizes = "small" if flags.cpu else "small,medium,large"
        measure = [py, "-m", "fnnc.ops.measure_defaults", "--sizes", sizes, "--repeats", "5"]
        out.append(Step("measure", [*measure, "--out", table], MEASURE_SECONDS))
    return out


def test_flags(all_steps: list[Step], env: dict[str, str]) -> str:
    """Gives the test steps (those with a junit report: pytest's) :data:`TEST_XLA_FLAGS`
    where XLA takes them; what was done."""
    flags = " ".join(filter(None, [env.get("XLA_FLAGS", ""), TEST_XLA_FLAGS]))
    probe = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, env={**env, "XLA_FLAGS": flags},
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    if probe.returncode:
        last = (probe.stderr.strip().splitlines() or ["no output"])[-1]
        return f"- ({TEST_XLA_FLAGS} rejected: {last[:120]})"
    for s in all_steps:
        if s.junit is not None:
            s.env["XLA_FLAGS"] = flags
    return flags


def environment(flags: argparse.Namespace, deps: Path) -> dict[str, str]:
    paths = [str(ROOT), str(deps), *os.environ.get("PYTHONPATH", "").split(os.pathsep)]
    unique = list(dict.fromkeys(p for p in paths if p))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(unique)}
    env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"  # xdist workers share the GPU
    if flags.cpu:
        env["JAX_PLATFORMS"] = "cpu"
    return env


def table(
    all_steps: list[Step], lacking: list[str], versions: dict[str, str], left_out: list[str]
) -> str:
    rows = [f"{k:12s} {v}" for k, v in versions.items()]
    if lacking:
        rows.append(f"{'missing':12s} {' '.join(lacking)}")
    rows += [f"{'deselected':12s} {t} (its package is not installed)" for t in left_out]
    rows += ["", f"{'step':10s} {'result':14s} {'passed':>7s} {'failed':>7s} {'skipped':>8s} "
             f"{'seconds':>8s}"]  # fmt: skip
    show = lambda n: "-" if n is None else str(n)
    for s in all_steps:
        rows.append(
            f"{s.name:10s} {s.status:14.14s} {show(s.passed):>7s} {show(s.failed):>7s} "
            f"{show(s.skipped):>8s} {s.seconds:8.1f}"
        )
    total = sum(s.seconds for s in all_steps)
    rows.append(f"{'total':10s} {'':14s} {'':>7s} {'':>7s} {'':>8s} {total:8.1f}")
    for s in all_steps:
        if s.failures:
            rows += ["", f"failed in {s.name} ({len(s.failures)}):"]
            rows += [f"  {f}" for f in s.failures[:60]]
    for name in ("kernels", "lm step"):
        step = next((s for s in all_steps if s.name == name), None)
        if step is not None and step.output:
            rows += ["", f"{name}:", step.output.rstrip()]
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="CPU, a small subset (self-check)")
    parser.add_argument("--kernels", action="store_true", help="with --cpu: run kernels.py")
    parser.add_argument("--dry-run", action="store_true", help="print the commands only")
    parser.add_argument(
        "--workers", type=int, default=0, help="xdist workers (default: cores - 1, <= 16)"
    )
    parser.add_argument("--lm", action="store_true", help="also time the LM step (lm_step.py)")
    parser.add_argument(
        "--measure", action="store_true", help="also measure backend defaults (to the reports)"
    )
    parser.add_argument("--perf-only", action="store_true", help="skip the GPU tests and the suite")
    parser.add_argument(
        "--budget", type=float, default=0.0, help="seconds for all steps (default: 470 + extras)"
    )
    parser.add_argument("--out", default="", help="folder for the reports (default: a tmp one)")
    flags = parser.parse_args(argv)
    # one worker a core but one: 15 ran the suite in 340 s on a 16-core H200 machine and
    # 3,766 of its tests in 234 s on a 16-core H100 one
    cores = os.cpu_count() or 3
    flags.workers = flags.workers or (2 if flags.cpu else max(2, min(16, cores - 1)))
    extra = (LM_SECONDS if flags.lm else 0.0) + (MEASURE_SECONDS if flags.measure else 0.0)
    default_budget = (110.0 if flags.perf_only else 470.0) + extra
    flags.budget = flags.budget or default_budget
    # a larger budget is the suite's: it is the step that ran out (2026-11-27)
    flags.suite_seconds = SUITE_SECONDS + max(0.0, flags.budget - default_budget)
    deadline = time.monotonic() + flags.budget
    if flags.dry_run:
        work = Path(flags.out or "<reports>")
    else:
        work = Path(flags.out or tempfile.mkdtemp(prefix="fnnc-gpu-check-"))
        work.mkdir(parents=True, exist_ok=True)
    deps = Path(os.environ.get("FNNC_DEPS", "/tmp/fnnc-gpu-check/deps"))
    env = environment(flags, deps)
    all_steps = steps(flags, work)
    if flags.dry_run:
        for key in ("PYTHONPATH", "XLA_PYTHON_CLIENT_PREALLOCATE", "JAX_PLATFORMS"):
            if key in env:
                print(f"{key}={env[key]}")
        if not flags.cpu:
            print(f"test XLA_FLAGS={TEST_XLA_FLAGS} (where XLA takes them)")
        for s in all_steps:
            argv = ["<script>" if "\n" in a else a for a in s.argv]
            print(f"{s.name}: {shlex.join(argv) if argv else s.status}")
        print("limits=" + ", ".join(f"{s.name} {s.limit:.0f} s" for s in all_steps))
        for s in all_steps:
            for key, value in s.env.items():
                print(f"{key}={value} ({s.name})")
        return 0

    sys.path[:0] = [str(deps)]
    lacking = missing(REQUIRED)
    wheels = os.environ.get("FNNC_WHEELS") or (
        str(ROOT / ".whl") if (ROOT / ".whl").is_dir() else ""
    )
    if lacking and wheels:
        print(f"installing {' '.join(lacking)} from {wheels} into {deps}", flush=True)
        print(install(lacking, Path(wheels), deps), flush=True)
        importlib.invalidate_caches()
        lacking = missing(REQUIRED)
    if lacking:
        print(how_to_install(lacking), flush=True)
    left_out = docs_tests_left_out()
    suite = next(s for s in all_steps if s.name == "suite")
    if suite.argv:
        suite.argv += [a for test in left_out for a in ("--deselect", test)]

    first, *rest = all_steps
    run(first, env, deadline)
    found = re.search(r"^VERSIONS (\{.*\})$", first.output, re.M)
    versions: dict[str, str] = json.loads(found.group(1)) if found else {}
    wanted = "cpu" if flags.cpu else "gpu"
    if versions.get("platform") != wanted:  # the suite on the wrong platform says nothing
        first.status = f"NOT ON {wanted.upper()}"
        for s in rest:
            s.status, s.argv = "not run", []
    elif not flags.cpu and not flags.perf_only:
        versions["test XLA_FLAGS"] = test_flags(all_steps, env)
    for s in rest:
        if s.argv:
            run(s, env, deadline)
    report = table(all_steps, lacking, versions, left_out)
    (work / "summary.txt").write_text(report + "\n")
    print("\n" + "=" * 78 + "\n" + report + f"\n(reports in {work})")
    bad = [s for s in all_steps if s.status not in ("ok",) and not s.status.startswith("skipped")]
    return 1 if bad or lacking else 0


if __name__ == "__main__":
    sys.exit(main())
