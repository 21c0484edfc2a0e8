"""Regenerates the measured backend defaults (:mod:`fnnc.core.measured`) on this device.

For each command with a backend other than the reference that compiles on this
platform, at representative inputs of each shape class (transformer sizes for
``large``) and dtype, it times the forward and the forward + backward of every such
backend against the reference, interleaved (:func:`fnnc.ops.autotune.median_seconds`),
and records the winner: a backend replaces the reference only when it is faster at
both by :data:`MARGIN` (by :data:`FUSED_MARGIN` for a command XLA fuses with its
neighbours in a step). The entries are merged into the package's
``measured_defaults.json`` under ``jax.devices()[0].device_kind``::

    python -m fnnc.ops.measure_defaults [--out PATH] [--repeats N] [--sizes small,medium,large]
        [--commands scaled_dot_product_attention,...] [--dtypes bfloat16,...]

``--commands`` and ``--dtypes`` measure a part (a GPU session's minutes are few: the
attention candidates alone at the large size): the other entries of the device stay,
and its ``sources`` line gains the new run's.

Interpret-mode backends (Pallas on CPU) are never timed.
"""

from __future__ import annotations

import argparse
import datetime
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fnnc.core import measured
from fnnc.core.command import Command
from fnnc.core.dispatch import REFERENCE, as_specs, backends_of, why_not
from fnnc.core.platforms import platform_name
from fnnc.core.selection import platform_scope
from fnnc.ops import autotune

MARGIN = 0.97
"""A backend must take at most this fraction of the reference's time, forward and
forward + backward, to become the default (two compiled copies of one program time up
to 3% apart)."""

FUSED_MARGIN = 0.85
"""The margin for commands XLA fuses with their neighbours (:data:`FUSED_BY_XLA`): timed
alone, their XLA reference pays for reading and writing its operands, which in a step it
shares with the residual add or the cast beside it; a kernel call breaks that fusion. On
an H100, Pallas layer norm and softmax cross-entropy at about parity alone (0.94 to 1.12)
made the LM step of ``benchmarks/lm_step.py`` 18% slower (25.5 -> 30.0 ms), so such a
kernel must win alone by more than the fusion it costs."""

FUSED_BY_XLA = frozenset({"layer_norm", "rms_norm", "softmax_crossentropy"})
"""Commands whose XLA reference fuses with its neighbours in a step."""

SIZES = {
    "small": dict(b=2, s=64, d=128, h=2, vocab=256, ff=256),
    "medium": dict(b=2, s=128, d=256, h=4, vocab=1024, ff=1024),
    "large": dict(b=2, s=2048, d=1024, h=16, vocab=32000, ff=4096),
}
"""Representative sizes per shape class of :func:`fnnc.core.measured.shape_class`, named
after it: every case of a size lands in that class (``large``: the sizes of
``benchmarks/kernels.py``)."""

Case = tuple[Command, list[Any], tuple[int, ...]]


def cases(z: dict[str, int], dtype: Any, *, specs_only: bool = False) -> list[Case]:
    """(command, inputs, differentiated input positions) for each kernel-backed command;
    with ``specs_only``, the inputs are ``jax.ShapeDtypeStruct`` s (no data made: the
    large size's are gigabytes of random numbers)."""
    from fnnc import ops

    rng = np.random.default_rng(0)
    n = lambda *shape, scale=1.0: jnp.asarray(rng.standard_normal(shape) * scale, dtype)
    rows, d, hd = z["b"] * z["s"], z["d"], z["d"] // z["h"]
    if specs_only:
        n = lambda *shape, scale=1.0: jax.ShapeDtypeStruct(shape, dtype)
        labels = jax.ShapeDtypeStruct((rows,), jnp.int32)
    else:
        labels = jnp.asarray(rng.integers(0, z["vocab"], rows), jnp.int32)
    qkv = [n(z["b"], z["s"], z["h"], hd) for _ in range(3)]
    return [
        (ops.softmax_crossentropy(), [n(rows, z["vocab"]), labels], (0,)),
        (
            ops.linear_softmax_crossentropy(),
            [n(rows, d), n(z["vocab"], d, scale=0.03), labels, n(z["vocab"])],
            (0, 1, 3),
        ),
        (ops.layer_norm(), [n(z["b"], z["s"], d), n(d), n(d)], (0, 1, 2)),
        (ops.rms_norm(), [n(z["b"], z["s"], d), n(d)], (0, 1)),
        (ops.scaled_dot_product_attention(is_causal=True), qkv, (0, 1, 2)),
        (
            ops.gemm(transpose_b=True),
            [n(rows, d), n(z["ff"], d, scale=0.03), n(z["ff"])],
            (0, 1, 2),
        ),
    ]


def _timed(cmd: Command, backend: str, args: list[Any], diff: tuple[int, ...]) -> dict[str, Any]:
    """Jitted forward and forward + backward of ``cmd`` on one backend."""
    fwd = backends_of(cmd.name)[backend].forward

    def run(*xs: Any) -> Any:
        return fwd(*xs, **cmd.kwargs)

    def loss(*ds: Any) -> Any:
        full = list(args)
        for i, x in zip(diff, ds):
            full[i] = x
        outs = [o for o in jax.tree.leaves(run(*full)) if jnp.issubdtype(o.dtype, jnp.inexact)]
        return sum(0.5 * jnp.sum(jnp.square(o.astype(jnp.float32))) for o in outs)

    forward, grad = jax.jit(run), jax.jit(jax.grad(loss, argnums=tuple(range(len(diff)))))
    return {
        "fwd": lambda: forward(*args),
        "fwd+bwd": lambda: grad(*(args[i] for i in diff)),
    }


def _ratios(
    cmd: Command, args: list[Any], diff: tuple[int, ...], platform: str, repeats: int
) -> dict[str, float]:
    """Per compiled rival of the reference: its time over the reference's, the worse of
    forward and forward + backward (timed interleaved)."""
    specs = as_specs(args, str(cmd))
    rivals = [
        name
        for name, b in backends_of(cmd.name).items()
        if name != REFERENCE
        and platform in b.platforms
        and why_not(b, cmd, specs, platform) is None
    ]
    if not rivals:
        return {}
    fns = {}
    for name in (REFERENCE, *rivals):
        for part, fn in _timed(cmd, name, args, diff).items():
            fns[f"{name} {part}"] = fn
    # traced (at their first timed call) choosing for platform: a forward that calls other
    # commands chose their backends for JAX's default backend
    with platform_scope(platform):
        times = autotune.median_seconds(fns, repeats=repeats)
    parts = ("fwd", "fwd+bwd")
    return {
        name: max(times[f"{name} {p}"] / times[f"{REFERENCE} {p}"] for p in parts)
        for name in rivals
    }


def margin(command: str) -> float:
    """The largest time ratio (kernel / XLA, alone) at which ``command``'s kernel wins."""
    return FUSED_MARGIN if command in FUSED_BY_XLA else MARGIN


def measure(
    platform: str | None = None,
    sizes: Sequence[str] = tuple(SIZES),
    dtypes: Sequence[Any] = (jnp.float32, jnp.bfloat16),
    repeats: int = 10,
    make_cases: Callable[[dict[str, int], Any], list[Case]] = cases,
    log: Callable[[str], None] = print,
    commands: Sequence[str] | None = None,
) -> dict[str, dict[str, str]]:
    """Times every compiled backend of each case (of ``commands`` only, where given);
    returns ``{command: {class: winner}}``; ``repeats`` below 1 is a
    :class:`~fnnc.errors.BackendError` before anything is timed. ``platform`` is spelt
    as ``compile`` takes it (``"cuda"`` is ``"gpu"``; default JAX's default backend; an
    unknown name is a :class:`~fnnc.errors.ConfigError`)."""
    autotune.check_repeats(repeats, "measure_defaults")
    platform = platform_name(platform, "measure_defaults")  # 'cuda' matched no backend
    entries: dict[str, dict[str, str]] = {}
    for size in sizes:
        for dtype in dtypes:
            for cmd, args, diff in make_cases(SIZES[size], dtype):
                if commands is not None and cmd.name not in commands:
                    continue
                ratios = _ratios(cmd, args, diff, platform, repeats)
                if not ratios:
                    continue
                best = min(ratios, key=ratios.__getitem__)
                winner = best if ratios[best] <= margin(cmd.name) else REFERENCE
                cls = measured.shape_class(as_specs(args, str(cmd)))
                entries.setdefault(cmd.name, {})[cls] = winner
                shown = ", ".join(f"{k} {v:.2f}" for k, v in ratios.items())
                log(f"{cmd.name:30s} {cls:16s} time/xla, worse of fwd and fwd+bwd: {shown}")
    return entries


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(measured.PATH), help="defaults file to update")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--sizes", default=",".join(SIZES), help=f"some of {list(SIZES)}")
    parser.add_argument("--commands", default=None, help="only these commands (commas)")
    parser.add_argument("--dtypes", default="float32,bfloat16", help="some of float32,bfloat16")
    opts = parser.parse_args(argv)
    if opts.repeats < 1:  # else every case compiles, then the median of no runs fails
        parser.error(f"--repeats must be an int >= 1, got {opts.repeats}")
    commands = _names(opts.commands, "--commands", _case_commands())
    dtypes = [jnp.dtype(d) for d in _names(opts.dtypes, "--dtypes", ("float32", "bfloat16"))]
    sizes = _names(opts.sizes, "--sizes", tuple(SIZES))
    platform = jax.default_backend()
    kind = measured.device_kind(platform) or platform
    entries = measure(platform, sizes, dtypes, repeats=opts.repeats, commands=commands)
    if not entries:
        print(f"no backend other than the reference compiles on {platform}: nothing to record")
        return
    stamp = datetime.date.today().isoformat()
    source = f"python -m fnnc.ops.measure_defaults on {kind}, jax {jax.__version__}, {stamp}"
    if commands is not None or len(dtypes) < 2:
        parts = ", ".join([*(commands or ["all commands"]), *(d.name for d in dtypes), *sizes])
        earlier = measured.read(opts.out).get("sources", {}).get(kind)
        source = f"{earlier + ' | ' if earlier else ''}{source} ({parts} only)"
    measured.write(kind, entries, source, opts.out)
    print(f"wrote {sum(map(len, entries.values()))} entries for {kind!r} to {opts.out}")


def _case_commands() -> tuple[str, ...]:
    """The commands :func:`cases` measures."""
    return tuple(cmd.name for cmd, _, _ in cases(SIZES["small"], jnp.float32, specs_only=True))


def _names(text: str | None, flag: str, known: Sequence[str]) -> list[str] | None:
    """The comma-separated names of ``flag`` (``None`` where it was not given), each one
    of ``known``; a clear error (SystemExit) for another."""
    if text is None:
        return None
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise SystemExit(f"measure_defaults: {flag} {text!r}: expected some of {list(known)}")
    return names


if __name__ == "__main__":
    main()
