"""Dynamic graph overheads: per-command eager cost and a training step, against baselines.

1. Per command, eager: ``DynamicGraph.exec`` (recording, trainable inputs) against
   plain JAX eager (``jnp`` ops) and PyTorch eager on CPU (autograd recording), for
   small (16x16) and medium (512x512) tensors. Memoisation is off so every call
   computes. Beside them, the *dispatch*: the jitted forward ``exec`` runs, called
   bare. For ``jnp.tanh`` and ``jnp.matmul`` JAX eager is exactly such a call, so
   ``dg - dispatch`` is the cost of recording a command, and it is the whole gap.
   Also ``jax.vjp`` op by op: JAX eager that keeps what a later gradient needs; and
   lazy mode's cost per command (recording only: it runs at the next sync point).
2. One training step of an MLP 784-256-256-10 (batch 128, Adam): forward, backward and
   apply_gradients in eager and lazy mode (and ``minimize``, backward + update in one
   program) against the same step as one ``jax.jit`` (and PyTorch eager).

Medians over repeats; ratios to the baseline measured in the same run. PyTorch is
optional: skipped (with a note) when it is not installed.

    python benchmarks/dynamic_graph.py [--quick]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fnnc import ops
from fnnc.core.dispatch import compiled_forward, select_backend
from fnnc.graph import DynamicGraph

try:
    import torch
except ImportError:  # optional baseline
    torch = None


def _median_us(
    run: Callable[[], Any], sync: Callable[[Any], Any], inner: int, repeats: int
) -> float:
    sync(run())
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = None
        for _ in range(inner):
            out = run()
        sync(out)
        times.append((time.perf_counter() - start) / inner * 1e6)
    return statistics.median(times)


def _jax_sync(x: Any) -> Any:
    return jax.block_until_ready(x)


def _dg_sync(v: Any) -> Any:
    return jax.block_until_ready(v.value)


def per_command(n: int, inner: int, repeats: int) -> None:
    rng = np.random.default_rng(0)
    a = (rng.normal(size=(n, n)) / np.sqrt(n)).astype(np.float32)
    b = (rng.normal(size=(n, n)) / np.sqrt(n)).astype(np.float32)
    dg = DynamicGraph(memo=False)
    jargs, dargs = (jnp.asarray(a), jnp.asarray(b)), (dg.variable(a), dg.variable(b))
    dg_lazy = DynamicGraph(memo=False, lazy=True)
    lazy_args = (dg_lazy.variable(a), dg_lazy.variable(b))
    spec = jax.ShapeDtypeStruct(a.shape, a.dtype)
    table = {  # name: (JAX eager op, command, arity, PyTorch op name)
        "ewsum": (jnp.add, ops.ewsum(), 2, "add"),
        "gemm": (jnp.matmul, ops.gemm(), 2, "matmul"),
        "tanh": (jnp.tanh, ops.tanh(), 1, "tanh"),
    }
    k = inner if n <= 64 else max(5, inner // 50)
    for name, (jax_op, cmd, arity, torch_name) in table.items():
        xs, vs = jargs[:arity], dargs[:arity]
        # The dispatch: the very jitted forward dg.exec calls, called bare. JAX eager
        # is this same kind of call (jnp.tanh and jnp.matmul are jitted functions),
        # so dg - dispatch is what recording costs per command.
        bare = compiled_forward(cmd, select_backend(cmd, [spec] * arity))
        t_jax = _median_us(lambda op=jax_op, xs=xs: op(*xs), _jax_sync, k, repeats)
        t_bare = _median_us(lambda fn=bare, xs=xs: fn(*xs), _jax_sync, k, repeats)
        t_dg = _median_us(lambda c=cmd, vs=vs: dg.exec(c, *vs), _dg_sync, k, repeats)
        # JAX eager that keeps what a later gradient needs: jax.vjp, op by op.
        t_vjp = _median_us(
            lambda op=jax_op, xs=xs: jax.vjp(op, *xs)[0], _jax_sync, max(5, k // 50), repeats
        )
        # Lazy mode records only; the work runs at the next sync point, as one program.
        lvs = lazy_args[:arity]
        t_lazy = _median_us(lambda c=cmd, vs=lvs: dg_lazy.exec(c, *vs), lambda x: x, k, repeats)
        line = f"  {name:6s} {n:4d}x{n:<4d} jax {t_jax:8.1f} us  dg {t_dg:8.1f} us"
        line += f" ({t_dg / t_jax:4.2f}x jax; dispatch {t_bare:6.1f} us,"
        line += f" recording {t_dg - t_bare:+5.1f} us)  lazy record {t_lazy:4.1f} us"
        line += f"  jax.vjp {t_vjp:7.1f} us"
        if torch is not None:
            tx = [torch.tensor(x, requires_grad=True) for x in (a, b)[:arity]]
            op = getattr(torch, torch_name)
            t_torch = _median_us(lambda op=op, tx=tx: op(*tx), lambda x: x, k, repeats)
            line += f"  torch {t_torch:8.1f} us ({t_dg / t_torch:4.2f}x torch)"
        print(line)
        dg.collect()


SIZES = (784, 256, 256, 10)
BATCH = 128
DENSE, RELU = ops.gemm(transpose_b=True), ops.relu()
LOSS, MEAN = ops.softmax_crossentropy(), ops.reduce_mean(axes=(0, 1))


def _init(seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    params = []
    for n_in, n_out in itertools.pairwise(SIZES):
        params.append((rng.normal(size=(n_out, n_in)) / np.sqrt(n_in)).astype(np.float32))
        params.append(np.zeros(n_out, np.float32))
    return params


def _data(seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(BATCH, SIZES[0])).astype(np.float32)
    return x, rng.integers(0, SIZES[-1], size=BATCH).astype(np.int32)


def _dg_step(dg: DynamicGraph, params: list[Any], opt: Any, x: Any, y: Any, fused: bool) -> Any:
    h = dg.constant(x)
    for i in range(0, len(params) - 2, 2):
        h = dg.exec(RELU, dg.exec(DENSE, h, params[i], params[i + 1]))
    loss, _ = dg.exec(LOSS, dg.exec(DENSE, h, params[-2], params[-1]), dg.constant(y))
    loss = dg.exec(MEAN, loss)
    if fused:
        dg.minimize(opt, loss, params)
    else:
        dg.backward(loss, params)
        dg.apply_gradients(opt, params)
    return params[0]


def _jit_step(opt: Any) -> Callable[..., Any]:
    def loss_fn(params, x, y):
        h = x
        for i in range(0, len(params) - 2, 2):
            h = jax.nn.relu(h @ params[i].T + params[i + 1])
        logits = h @ params[-2].T + params[-1]
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    @jax.jit
    def step(params, state, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state, loss

    return step


def training_step(inner: int, repeats: int) -> None:
    """Every variant runs ``inner`` steps per round, rounds interleaved, so that a
    machine getting slower or faster mid-run moves all of them alike; the ratio is the
    median over rounds of (variant / jit step of the same round)."""
    x, y = (jnp.asarray(a) for a in _data())  # the batch is on the device for every variant
    opt = optax.adam(1e-3)
    params = [jnp.asarray(p) for p in _init()]
    carry = [params, opt.init(params)]
    step = _jit_step(opt)

    def jit_run() -> Any:
        carry[0], carry[1], loss = step(carry[0], carry[1], x, y)
        return loss

    variants: dict[str, tuple[Callable[[], Any], Callable[[Any], Any]]] = {
        "jax.jit step": (jit_run, _jax_sync)
    }
    for label, lazy, fused in (
        ("eager: backward + apply", False, False),
        ("eager: minimize", False, True),
        ("lazy: backward + apply", True, False),
        ("lazy: minimize", True, True),
    ):
        dg = DynamicGraph(lazy=lazy)
        ps = [dg.variable(p) for p in _init()]
        run = lambda dg=dg, ps=ps, fused=fused: _dg_step(dg, ps, opt, x, y, fused)
        variants[label] = (run, _dg_sync)
    if torch is not None:
        variants["torch eager step"] = (_torch_step(x, y), lambda v: v)
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(repeats):
        for name, (run, sync) in variants.items():
            times[name].append(_median_us(run, sync, inner, 1) / 1e3)
    base = times["jax.jit step"]
    for name, ts in times.items():
        line = f"  {name:28s} {statistics.median(ts):8.2f} ms"
        if name != "jax.jit step":
            ratios = [t / b for t, b in zip(ts, base)]
            line += f" ({statistics.median(ratios):4.2f}x jit; rounds {min(ratios):.2f}"
            line += f"-{max(ratios):.2f})"
        print(line)


def _torch_step(x: Any, y: Any) -> Callable[[], Any]:
    tp = [torch.tensor(p, requires_grad=True) for p in _init()]
    topt = torch.optim.Adam(tp, lr=1e-3)
    tx, ty = torch.tensor(np.asarray(x)), torch.tensor(np.asarray(y), dtype=torch.long)

    def run() -> Any:
        h = tx
        for i in range(0, len(tp) - 2, 2):
            h = torch.relu(h @ tp[i].T + tp[i + 1])
        loss = torch.nn.functional.cross_entropy(h @ tp[-2].T + tp[-1], ty)
        topt.zero_grad()
        loss.backward()
        topt.step()
        return loss

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats (smoke run)")
    args = parser.parse_args()
    inner, repeats = (50, 3) if args.quick else (1000, 7)
    print(
        f"jax {jax.__version__} on {jax.default_backend()}; torch: "
        + (torch.__version__ if torch is not None else "not installed, skipped")
    )
    print("per-command eager time (median):")
    for n in (16, 512):
        per_command(n, inner, repeats)
    print(f"training step, MLP {'-'.join(map(str, SIZES))}, batch {BATCH}, Adam (median):")
    training_step(max(5, inner // 50), 3 * repeats)


if __name__ == "__main__":
    main()
