"""XLA flags that make the suite's compiles cheap on CPU.

The suite's cost is XLA compiles (the 982 cases of ``tests/ops/test_registry.py`` spend
two thirds of their time in ``backend_compile``), and each is a few small programs that
run once. On CPU two flags of XLA's halve that time:

- ``--xla_backend_optimization_level=0``: LLVM compiles the kernels without its
  optimization passes;
- ``--xla_cpu_use_fusion_emitters=false``: XLA:CPU emits its fusions with its elemental
  emitters instead of the newer fusion emitters, whose MLIR pipeline is slower to run
  (jaxlib 0.10 has the flag, jaxlib 0.11 does not: it is dropped there).

Neither changes what a program computes: the HLO passes (fusion, layout, buffer
assignment, what ``cost_analysis`` and ``memory_analysis`` read) run as before and
XLA:CPU uses no fast math at any level; the machine code differs, and with it the last
bits where the two emitters approximate ``tanh`` or ``exp`` differently or sum in another
order (``tests/test_compile_flags.py`` compares a training step's values both ways). What
they give up is the speed of that code, which no test measures: ``benchmarks/`` do, with
XLA's defaults. On this project's 2-core CI machine the suite went from 21 to about 11
minutes (5,593 tests in 11:14). One test failed under the flags: an NNC batch-norm
gradient compared to 128 ULPs at an entry that cancels (103 ULPs under XLA's defaults,
238 under the flags); it now compares such entries at the scale of what cancelled. (A
profile test that times a gemm, a library call either way, against an elementwise ReLU,
now slower, got a larger gemm.)

Where they apply: a process that runs on CPU (``JAX_PLATFORMS=cpu``, or no accelerator
plugin installed). On a GPU machine only the CPU-only flag is added, so GPU kernels
compile as users get them. ``FNNC_TESTS_XLA_DEFAULTS=1`` runs the suite with XLA's
defaults. The flags are probed in a child process first (XLA aborts every process on a
flag it does not know) and only those it takes are kept; the result is passed on in the
environment, so pytest-xdist's workers and the child processes tests start inherit it
without probing again. :func:`merged` gives a child that sets its own ``XLA_FLAGS`` (the
multi-device tests do) these flags as well.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys

OPT_LEVEL = "--xla_backend_optimization_level=0"
CPU_ONLY = ("--xla_cpu_use_fusion_emitters=false",)
ADDED = "FNNC_TESTS_XLA_FLAGS"
"""The environment variable that holds the flags this module added (empty: none)."""
DEFAULTS = "FNNC_TESTS_XLA_DEFAULTS"
PROBE = "import jax, jax.numpy as jnp; print(jax.jit(lambda x: jnp.tanh(x @ x))(jnp.ones((4, 4))))"
PLUGINS = ("jax_cuda12_plugin", "jax_cuda13_plugin", "jax_rocm7_plugin", "libtpu")


def _on_cpu_only(environ: os._Environ | dict[str, str]) -> bool:
    platforms = environ.get("JAX_PLATFORMS", "")
    if platforms:
        return platforms.split(",") == ["cpu"]
    return not any(importlib.util.find_spec(name) for name in PLUGINS)


def _accepted(flags: list[str], environ: os._Environ | dict[str, str]) -> list[str]:
    """The subset of ``flags`` XLA takes beside the flags already in ``environ``."""
    for _ in range(2):
        if not flags:
            return []
        own = environ.get("XLA_FLAGS", "")
        env = {**environ, "XLA_FLAGS": " ".join(filter(None, [own, *flags]))}
        env["JAX_PLATFORMS"] = "cpu"
        done = subprocess.run(
            [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120
        )
        if done.returncode == 0:
            return flags
        unknown = re.search(r"Unknown flags? in XLA_FLAGS: (.*)", done.stderr)
        if unknown is None:
            return []
        rejected = set(unknown.group(1).split())
        flags = [f for f in flags if f not in rejected]
    return []


def apply(environ: os._Environ | dict[str, str] = os.environ) -> str:
    """Adds the flags to ``environ["XLA_FLAGS"]`` (once per process tree; before JAX
    starts its backend) and returns those added."""
    if ADDED in environ:
        return environ[ADDED]
    if environ.get(DEFAULTS, "") not in ("", "0"):
        environ[ADDED] = ""
        return ""
    wanted = [*([OPT_LEVEL] if _on_cpu_only(environ) else []), *CPU_ONLY]
    present = environ.get("XLA_FLAGS", "")
    wanted = [f for f in wanted if f.split("=")[0] not in present]
    added = " ".join(_accepted(wanted, environ))
    environ["XLA_FLAGS"] = " ".join(filter(None, [present, added]))
    environ[ADDED] = added
    return added


def merged(flags: str) -> str:
    """``flags`` (a child's own ``XLA_FLAGS``) after the flags :func:`apply` added."""
    return " ".join(filter(None, [os.environ.get(ADDED, ""), flags]))
