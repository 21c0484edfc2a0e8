"""Pallas kernels vs their XLA references: forward, and forward + backward.

On a GPU (or TPU) each kernel is compiled and timed against the reference in the same
run, at transformer sizes (vocabulary 32k, width 1024, sequence 2k, 16 heads, batch
2); every backend that runs the inputs is timed (attention: the 64 x 64 kernel, its
``pallas_bq128``, ``pallas_split`` and ``pallas_fused`` layouts, cuDNN where offered),
and the table prints medians and the reference / backend ratio (> 1: the backend is
faster), the largest absolute difference of the results, and which backend is the
default there.

Anywhere else (CPU) Pallas only interprets, which says nothing about speed: the
benchmark then checks correctness only, at small sizes, and prints the largest
absolute error per kernel, forward and gradients.

Run: python benchmarks/kernels.py [--quick] [--dtype bfloat16|float32]
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks._timing import interleaved
from fnnc import ops
from fnnc.core.dispatch import as_specs
from fnnc.graph import GraphBuilder
from fnnc.ops import pallas

Case = tuple[str, Any, Callable[[dict[str, int], Any], list[Any]], tuple[int, ...]]

LARGE = dict(b=2, s=2048, d=1024, h=16, vocab=32000, ff=4096)
SMALL = dict(b=2, s=32, d=64, h=2, vocab=256, ff=128)


def _normal(shape: tuple[int, ...], dtype: Any, seed: int, scale: float = 1.0) -> Any:
    rng = np.random.default_rng(seed)
    return jnp.asarray((rng.standard_normal(shape) * scale).astype(np.float32), dtype)


def _dense_chain(z: dict[str, int], dtype: Any) -> Any:
    """``gelu(x @ wᵀ + b)`` as one fused body led by a gemm (the epilogue kernel)."""
    b = GraphBuilder()
    x = b.input((z["b"] * z["s"], z["d"]), dtype)
    w, bias = b.input((z["ff"], z["d"]), dtype), b.input((z["ff"],), dtype)
    y = b.exec(ops.gelu(approximate=True), b.exec(ops.gemm(transpose_b=True), x, w, bias))
    return ops.fused_elementwise(body=b.build([y]))


def _bias_gelu(z: dict[str, int], dtype: Any) -> Any:
    b = GraphBuilder()
    x, bias = b.input((z["b"], z["s"], z["ff"]), dtype), b.input((z["ff"],), dtype)
    y = b.exec(ops.gelu(approximate=True), b.exec(ops.add(), x, bias))
    return ops.fused_elementwise(body=b.build([y]))


def cases(z: dict[str, int], dtype: Any) -> list[tuple[str, Any, list[Any], tuple[int, ...]]]:
    """(name, command, inputs, differentiated inputs) per kernel at sizes ``z``."""
    rows, d, ff, hd = z["b"] * z["s"], z["d"], z["ff"], z["d"] // z["h"]
    n = lambda shape, seed, scale=1.0: _normal(shape, dtype, seed, scale)
    labels = jnp.asarray(np.random.default_rng(0).integers(0, z["vocab"], rows), jnp.int32)
    qkv = [n((z["b"], z["s"], z["h"], hd), i) for i in range(3)]
    return [
        (
            "softmax_crossentropy",
            ops.softmax_crossentropy(),
            [n((rows, z["vocab"]), 1), labels],
            (0,),
        ),
        (
            "layer_norm",
            ops.layer_norm(),
            [n((z["b"], z["s"], d), 2), n((d,), 3), n((d,), 4)],
            (0, 1, 2),
        ),
        ("rms_norm", ops.rms_norm(), [n((z["b"], z["s"], d), 5), n((d,), 6)], (0, 1)),
        ("attention (causal)", ops.scaled_dot_product_attention(is_causal=True), qkv, (0, 1, 2)),
        (
            "gemm + bias",
            ops.gemm(transpose_b=True),
            [n((rows, d), 7), n((ff, d), 8, 0.03), n((ff,), 9)],
            (0, 1, 2),
        ),
        (
            "fused add+gelu",
            _bias_gelu(z, dtype),
            [n((z["b"], z["s"], ff), 10), n((ff,), 11)],
            (0, 1),
        ),
        (
            "fused gemm+bias+gelu",
            _dense_chain(z, dtype),
            [n((rows, d), 12), n((ff, d), 13, 0.03), n((ff,), 14)],
            (0, 1, 2),
        ),
    ]


def rivals(cmd: Any, args: list[Any], name: str, compiled: bool) -> list[str]:
    """The backends other than XLA that run ``args`` here: compiled ones on a GPU (for
    attention, every candidate layout and cuDNN), interpreted ones elsewhere."""
    platform, specs = jax.default_backend(), as_specs(args, name)
    out = []
    for backend, b in ops.backends_of(cmd.name).items():
        where = b.platforms if compiled else b.interpret_platforms
        if backend != "xla" and platform in where and b.supports(cmd, specs) is None:
            out.append(backend)
    return out


def _functions(
    cmd: Any, args: list[Any], diff: tuple[int, ...], backends: list[str]
) -> dict[str, Callable[[], Any]]:
    """Jitted forward and forward+backward of each backend, closed over ``args``."""
    out: dict[str, Callable[[], Any]] = {}
    for backend in backends:
        fwd = ops.backends_of(cmd.name)[backend].forward

        def run(*xs: Any, fwd=fwd) -> Any:
            return fwd(*xs, **cmd.kwargs)

        def loss(*ds: Any, run=run) -> Any:
            full = list(args)
            for i, x in zip(diff, ds):
                full[i] = x
            outs = jax.tree.leaves(run(*full))
            return sum(0.5 * jnp.sum(jnp.square(o.astype(jnp.float32))) for o in outs)

        forward, grad = jax.jit(run), jax.jit(jax.grad(loss, argnums=tuple(range(len(diff)))))
        out[f"{backend} fwd"] = lambda forward=forward: forward(*args)
        out[f"{backend} fwd+bwd"] = lambda grad=grad: grad(*(args[i] for i in diff))
    return out


def _max_error(got: Any, want: Any) -> str:
    """Largest absolute difference, and the largest reference magnitude for scale."""
    err = scale = 0.0
    for x, y in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        x, y = x.astype(jnp.float32), y.astype(jnp.float32)
        err = max(err, float(jnp.max(jnp.abs(x - y))))
        scale = max(scale, float(jnp.max(jnp.abs(y))))
    return f"{err:8.2e} (|ref| <= {scale:7.1e})"


def _check(
    name: str, cmd: Any, args: list[Any], diff: tuple[int, ...], compiled: bool
) -> tuple[list[str], dict[str, Callable[[], Any]]] | None:
    """Each rival's largest error against XLA, forward and gradients; ``None`` where
    none runs these inputs (the Pallas kernel's reason printed)."""
    found = rivals(cmd, args, name, compiled)
    if not found:
        why = ops.backends_of(cmd.name)["pallas"].supports(cmd, as_specs(args, name))
        print(f"{name:22s} declined: {why}")
        return None
    fns = _functions(cmd, args, diff, ["xla", *found])
    default = ops.select_backend(cmd, as_specs(args, name), jax.default_backend())
    print(f"{name:22s} default here: {default}")
    for r in found:
        fwd_err = _max_error(fns[f"{r} fwd"](), fns["xla fwd"]())
        bwd_err = _max_error(fns[f"{r} fwd+bwd"](), fns["xla fwd+bwd"]())
        print(f"    {r:14s} max |err| forward {fwd_err}  gradients {bwd_err}")
    return found, fns


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer timing rounds")
    parser.add_argument("--dtype", default=None, help="bfloat16 (GPU default) or float32")
    flags = parser.parse_args()
    platform = jax.default_backend()
    compiled = platform in pallas.PLATFORMS
    dtype = jnp.dtype(flags.dtype or ("bfloat16" if compiled else "float32"))
    if not compiled:
        print(f"mode: INTERPRET on {platform} (Pallas runs interpreted here): correctness only,")
        print(f"      small sizes {SMALL}, {dtype.name}; no timings are meaningful in this mode")
        for name, cmd, args, diff in cases(SMALL, dtype):
            _check(name, cmd, args, diff, compiled)
        return
    device = jax.devices()[0].device_kind
    print(f"mode: COMPILED on {platform} ({device}), sizes {LARGE}, {dtype.name}")
    print("times are medians in ms; (ratio) = xla / backend (> 1: the backend is faster)")
    rounds, inner = (3, 5) if flags.quick else (7, 20)
    for name, cmd, args, diff in cases(LARGE, dtype):
        checked = _check(name, cmd, args, diff, compiled)
        if checked is None:
            continue
        found, fns = checked
        t = interleaved(fns, rounds=rounds, inner=inner)
        for what in ("fwd", "fwd+bwd"):
            x = t[f"xla {what}"] * 1e3
            shown = "".join(
                f"  {r} {t[f'{r} {what}'] * 1e3:8.3f} ({x / (t[f'{r} {what}'] * 1e3):5.2f})"
                for r in found
            )
            print(f"    {what:8s} xla {x:8.3f}{shown}")


if __name__ == "__main__":
    main()
