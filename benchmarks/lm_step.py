"""LM training step: fnnc against Flax NNX + optax and PyTorch (eager, torch.compile).

The workload of issue 24: a decoder-only transformer LM (pre-LayerNorm blocks, causal
multi-head attention with separate q/k/v/out projections, a ReLU MLP 4x wide, learned
positions, untied logits), softmax cross-entropy to the next tokens, Adam (lr 1e-4,
eps 1e-8), bfloat16 compute with float32 parameters everywhere. The same initial
weights (fnnc's) and batches go to every implementation:

- ``fnnc``: ``Model.fit`` with ``precision="bfloat16"``, default backends;
- ``fnnc-xla``: the same under ``config.override(backend="xla")`` (``FNNC_BACKEND=xla``);
- ``fnnc-tuned``: the default after ``Model.autotune`` on the batch (the table's choices
  are printed under the table);
- ``fnnc-unfused``: the default without the fused linear + cross-entropy head
  (:mod:`fnnc.graph.passes.linear_crossentropy`), which ``fnnc`` uses at this size;
- ``fnnc-blockwise``: the default with the fused head's blockwise command, which
  recomputes the logits in its backward, instead of the one that makes its gradient in
  the forward (:mod:`fnnc.graph.passes.linear_crossentropy_mean`);
- ``fnnc-bq128``, ``fnnc-split``, ``fnnc-fused``, ``fnnc-cudnn``: the default with one
  attention backend forced (forward and gradient nodes): what the step would take if measurement
  made that layout the device's default. By default on a GPU only (elsewhere the
  kernels interpret, or cuDNN is absent); ``--impls`` asks for them anywhere;
- ``nnx``: Flax NNX modules (``dtype=bfloat16``, float32 LayerNorm and loss) and
  ``optax.adam`` in one ``jax.jit`` step with donated parameters and state;
- ``torch``, ``torch-compile``: autocast bfloat16, ``F.scaled_dot_product_attention``,
  fused Adam (on CUDA), the model and its loss under ``torch.compile`` for the second;
  only where torch is installed (never a dependency of fnnc).

Each implementation runs in its own process (so each peak memory is its own): ms/step
(median of timed blocks), TFLOP/s, MFU, peak device memory and the ratio to
``torch-compile`` (else to ``nnx``) in one table. FLOPs are counted as 6 x matmul
parameters x tokens plus 12 x B x S^2 x D per block for attention (causal masking not
discounted), 9.07 TFLOP at the issue's size. MFU divides by the dense bfloat16 peak of
the device's spec sheet (:data:`PEAK_BF16`; ``--peak-tflops`` replaces it, e.g. 798 for
the H100's measured matmul peak the issue reports). Peak memory is
``memory_stats()["peak_bytes_in_use"]`` (JAX) or ``max_memory_allocated`` (torch) on a
GPU, XLA's estimate of the step (arguments + outputs + temporaries - donated) on CPU.

``--profile N`` also profiles N steps of each and reports where the device time goes, by
kind of kernel, side by side (:mod:`benchmarks._profile`), and fnnc's by command
(``Model.profile``, each backward under its forward command). ``--keep-trace DIR`` keeps
each fnnc step's profile (``<impl>.xplane.pb.gz`` and ``<impl>.hlo.txt.gz``) in DIR,
which ``benchmarks/trace_report.py`` reads on any machine, kernel by kernel: a
variant's, too, since whether it beat the default, and why (does ``fnnc-fused``'s graph
backward run the forward kernel once or twice a layer?), is what a GPU run is for.
Every implementation's result goes in ``DIR/results.json`` (its 200 largest kernels
among them).

``--tiny`` runs a small size on CPU; ``tests/test_lm_step.py`` runs it in the suite and
checks that fnnc's and NNX's losses agree step by step.

Where the code lives: this file is the command line (each implementation's process, the
table); ``benchmarks/_lm_common.py`` holds the sizes, fnnc's model and initial weights,
the batches and :class:`Result`; ``_lm_fnnc.py``, ``_lm_nnx.py`` and ``_lm_torch.py``
each implementation.

Run: python benchmarks/lm_step.py [--tiny | --size cpu | --size cpu-batch]
     [--impls fnnc,nnx,...] [--steps N] [--profile N [--keep-trace DIR]]
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax

from benchmarks import _profile
from benchmarks._lm_common import (
    SIZES,
    Result,
    Size,
    _profiled,
    batches,
    flops_per_step,
    fnnc_model,
    initial_params,
)
from benchmarks._lm_fnnc import (
    ATTENTION,
    by_command,
    commands_table,
    fnnc_commands,
    run_fnnc,
    tuned_choices,
)
from benchmarks._lm_nnx import run_nnx, xla_costs
from benchmarks._lm_torch import run_torch

__all__ = [  # the command line's names and, re-exported, those read as ``lm_step.<name>``
    "ATTENTION",
    "IMPLS",
    "PEAK_BF16",
    "SIZES",
    "Result",
    "Size",
    "_profiled",
    "available",
    "batches",
    "by_command",
    "commands_table",
    "default_impls",
    "flops_per_step",
    "fnnc_commands",
    "fnnc_model",
    "main",
    "run",
    "table",
    "tuned_choices",
    "xla_costs",
]

PEAK_BF16 = {
    "NVIDIA H100 80GB HBM3": 989.4e12,
    "NVIDIA H100 PCIe": 756.0e12,
    "NVIDIA H200": 989.4e12,
    "NVIDIA A100-SXM4-80GB": 312.0e12,
    "NVIDIA A100-SXM4-40GB": 312.0e12,
}
"""Dense bfloat16 tensor-core peaks from NVIDIA's spec sheets, by ``device_kind``."""

IMPLS = (
    "fnnc",
    "fnnc-xla",
    "fnnc-tuned",
    "fnnc-unfused",
    "fnnc-blockwise",
    "fnnc-bq128",
    "fnnc-split",
    "fnnc-fused",
    "fnnc-cudnn",
    "nnx",
    "torch",
    "torch-compile",
)


# -- one implementation, all of them, the table -----------------------------------------


def run(
    impl: str,
    z: Size,
    steps: int,
    precision: str,
    timed: bool = True,
    profile: int = 0,
    keep: str | None = None,
) -> Result:
    """Losses of ``steps`` steps on fresh batches, then ms/step on one batch, then, if
    ``profile``, the kernels of that many more steps (an fnnc step's trace kept in ``keep``)."""
    if impl not in IMPLS:
        raise ValueError(f"lm_step: no implementation {impl!r}; expected one of {IMPLS}")
    data, params = batches(z, steps), initial_params(z)
    gc.collect()  # the model that made the weights holds no device memory from here on
    if impl.startswith("fnnc"):
        result = run_fnnc(z, data, params, impl, precision, timed, profile, keep)
    elif impl == "nnx":
        result = run_nnx(z, data, params, precision, timed, profile)
    else:
        result = run_torch(z, data, params, impl == "torch-compile", precision, timed, profile)
    result.device = result.device or jax.devices()[0].device_kind
    return result


def _in_subprocess(impl: str, argv: Sequence[str]) -> Result:
    """One implementation in its own process (its own peak memory, its own compiles)."""
    cmd = [sys.executable, os.path.abspath(__file__), *argv, "--impls", impl, "--one"]
    env = dict(os.environ)
    if impl.startswith("torch"):  # JAX only makes the weights there: keep it off the GPU
        env["JAX_PLATFORMS"] = "cpu"
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode or not lines:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        return Result(impl, note=f"failed: {tail[0][:100]}")
    return Result(**json.loads(lines[-1]))


def table(results: Sequence[Result], z: Size, peak_flops: float | None, peak_note: str) -> str:
    """The report: ms/step, TFLOP/s, MFU, peak memory, ratio to the baseline."""
    flops = flops_per_step(z)
    times = {r.impl: r.ms for r in results if r.ms}
    base = next((b for b in ("torch-compile", "nnx") if b in times), None)
    lines = [
        f"{z}: {flops / 1e12:.3f} TFLOP/step; MFU against {peak_note}",
        f"{'implementation':15s} {'ms/step':>9s} {'TFLOP/s':>8s} {'MFU':>6s} "
        f"{'peak GiB':>10s} {'ratio to ' + (base or '-'):>22s}  first/last loss",
    ]
    for r in results:
        if r.ms is None:
            lines.append(f"{r.impl:15s} {r.note or 'not run'}")
            continue
        tflops = flops / (r.ms / 1e3) / 1e12
        mfu = f"{100 * tflops * 1e12 / peak_flops:5.1f}%" if peak_flops else "     -"
        mem = "         -" if r.peak_bytes is None else f"{r.peak_bytes / 2**30:9.3f}"
        mem += "*" if r.peak_kind == "xla est." else " "
        ratio = f"{r.ms / times[base]:22.2f}" if base else f"{'-':>22s}"
        loss = f"{r.losses[0]:.4f}/{r.losses[-1]:.4f}" if r.losses else ""
        lines.append(f"{r.impl:15s} {r.ms:9.2f} {tflops:8.3g} {mfu} {mem} {ratio}  {loss}")
    if any(r.peak_kind == "xla est." for r in results):
        lines.append("* XLA's estimate of the step (no device memory statistics here)")
    return "\n".join(lines)


def default_impls() -> list[str]:
    """Every implementation on a GPU; elsewhere none that forces an attention kernel
    (Pallas interprets off a GPU, slowly; cuDNN is not there)."""
    if jax.default_backend() == "gpu":
        return list(IMPLS)
    return [i for i in IMPLS if i not in ATTENTION]


def available(impls: Sequence[str]) -> list[str]:
    """``impls`` without the torch ones where torch is not installed."""
    try:
        import torch  # noqa: F401
    except ImportError:
        return [i for i in impls if not i.startswith("torch")]
    return list(impls)


def positive_int(text: str) -> int:
    """An argparse type: a count of at least 1 (``--steps 0`` has no loss to compare)."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


def natural_int(text: str) -> int:
    """An argparse type: a count that may be 0 (off) but not negative."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text}")
    return value


def positive_float(text: str) -> float:
    """An argparse type: a number above 0 (a peak to divide by)."""
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a number above 0, got {text}")
    return value


def main(argv: Sequence[str] | None = None) -> list[Result]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help=f"size {SIZES['tiny']} (CPU)")
    parser.add_argument("--size", choices=list(SIZES), default="issue")
    parser.add_argument(
        "--impls", default=None, help=f"some of {IMPLS} (default: all that run fast here)"
    )
    parser.add_argument(
        "--steps", type=positive_int, default=3, help="steps whose losses are compared"
    )
    parser.add_argument("--precision", default="bfloat16", choices=("bfloat16", "float32"))
    parser.add_argument(
        "--peak-tflops", type=positive_float, help="bf16 peak for MFU (default: table)"
    )
    parser.add_argument(
        "--profile", type=natural_int, default=0, metavar="N",
        help="also profile N steps and report kernel time by kind (benchmarks/_profile.py)",
    )  # fmt: skip
    parser.add_argument(
        "--keep-trace", metavar="DIR",
        help="with --profile: keep each fnnc step's profile (trace, HLO) in DIR "
        "(benchmarks/trace_report.py reads them)",
    )  # fmt: skip
    parser.add_argument("--in-process", action="store_true", help="no process per implementation")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    opts = parser.parse_args(argv)
    z = SIZES["tiny" if opts.tiny else opts.size]
    asked = [i.strip() for i in opts.impls.split(",")] if opts.impls else default_impls()
    unknown = [i for i in asked if i not in IMPLS]
    if unknown:  # a misspelt fnnc variant would otherwise time the default under its name
        parser.error(f"--impls: unknown {', '.join(unknown)}; expected some of {', '.join(IMPLS)}")
    impls = available(asked)
    if opts.one:
        result = run(
            impls[0], z, opts.steps, opts.precision, profile=opts.profile, keep=opts.keep_trace
        )
        print(json.dumps(dataclasses.asdict(result)))
        return []
    if opts.in_process:
        results = [
            run(i, z, opts.steps, opts.precision, profile=opts.profile, keep=opts.keep_trace)
            for i in impls
        ]
    else:
        forwarded = [a for a in (argv if argv is not None else sys.argv[1:]) if a != "--in-process"]
        results = _each_in_subprocess(impls, _without_impls(forwarded))
    kind = next((r.device for r in results if r.device), jax.devices()[0].device_kind)
    peak = opts.peak_tflops * 1e12 if opts.peak_tflops else PEAK_BF16.get(kind)
    note = (
        f"--peak-tflops {opts.peak_tflops:g}"
        if opts.peak_tflops
        else (
            f"{kind}'s dense bf16 spec, {peak / 1e12:.0f} TFLOP/s"
            if peak
            else f"no peak for {kind}"
        )
    )
    print(table(results, z, peak, note))
    if opts.keep_trace:  # every implementation's kernels (200 largest each), for later
        os.makedirs(opts.keep_trace, exist_ok=True)
        with open(os.path.join(opts.keep_trace, "results.json"), "w") as f:
            json.dump([dataclasses.asdict(r) for r in results], f, indent=1)
    for r in results:
        if r.ms is not None and r.note:
            print(f"{r.impl}: {r.note}")
    if opts.profile:
        print()
        print(_profile.breakdown([(r.impl, r.ms, r.kernels) for r in results]))
        print()
        print(commands_table(results))
        for r in results:
            if r.unplaced:
                print(f"{r.impl}: (no node) holds operations {', '.join(r.unplaced)}")
            if r.trace:
                print(f"{r.impl}: its nodes hold under half the kernel time; the trace:")
                print(r.trace)
        for r in results:
            if r.profile_error:
                print(f"{r.impl}: no profile: {r.profile_error}")
    return results


def _each_in_subprocess(impls: Sequence[str], argv: Sequence[str]) -> list[Result]:
    """Each implementation in its own process, a line as each ends; an interrupt (the
    GPU check's limit sends SIGINT) stops the walk, and the table shows what finished."""
    results = []
    for impl in impls:
        start = time.perf_counter()
        try:
            r = _in_subprocess(impl, argv)
        except KeyboardInterrupt:
            print(f"interrupted during {impl}: the table has what finished", flush=True)
            break
        done = f"{r.ms:.2f} ms/step" if r.ms is not None else (r.note or "no time")
        print(f"{impl}: {done} ({time.perf_counter() - start:.0f} s)", flush=True)
        results.append(r)
    return results


def _without_impls(argv: Sequence[str]) -> list[str]:
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == "--impls":
            skip = True
        elif not a.startswith("--impls="):
            out.append(a)
    return out


if __name__ == "__main__":
    main()
