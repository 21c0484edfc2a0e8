"""Memory benchmark: what checkpointing, remat budgets, compression and reduction save.

On a 16-block residual MLP and a 12-block residual CNN (cnnp models whose blocks are
sub-models; batch and widths chosen so activations dominate parameters), for the fused
training step (``Model.fit``'s program):

1. plain vs every block ``set_gradient_checkpointing(True)``: the NNC-style plan's peak
   (:func:`fnnc.graph.memory_plan`), the activation bytes kept for the backward, XLA's
   own temporaries (``Program.memory()``) and the step time (interleaved medians in the
   same run; target <= 1.4x);
2. ``remat(budget_bytes=B)`` on the plain step for budgets between the checkpointed and
   the plain peak: the peak reached and the FLOPs recomputed
   (:func:`~fnnc.graph.passes.remat_cost.recomputed_flops`), against checkpointing
   every block;
3. the CNN with ``set_memory_compression(True)`` (LSSC) and a mixed-precision MLP
   (float16 activations widened to float32 per block) with
   ``set_memory_reduction(True)``: peak and kept bytes;
4. XLA's own figure: a 16-block residual MLP (blocks ``h + relu(h W1ᵀ) W2ᵀ``, inner
   width 4x) as one :func:`fnnc.graph.scan` over stacked parameters, plain and
   checkpointed, against the unrolled graph: ``Program.memory()`` temporaries, the
   plan's peak, the step time and the gradients' largest difference to the unrolled
   backward. On XLA:CPU the unrolled net hides what checkpointing saves; the loop shows it.

Plans are of the programs as they run: with the parameters and optimizer state the fit
step donates (``Program.memory_plan()``).

Run: python benchmarks/memory.py [--quick]
"""

from __future__ import annotations

import argparse
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np
import optax

from benchmarks._timing import interleaved
from fnnc import ops
from fnnc.graph import GraphBuilder, backward, compile, memory_plan, remat, scan
from fnnc.graph.passes.remat_cost import recomputed_flops
from fnnc.models import Add, AvgPool, Conv, Dense, Flatten, Input, Model, ReLU
from fnnc.models.layers import CommandLayer
from fnnc.models.memory import saved_activation_bytes

MB = 1 << 20


def residual_mlp(blocks: int, width: int, widen: bool = False) -> tuple[Model, list[Model]]:
    """``blocks`` sub-models ``y + relu(W2 relu(W1 y))``; with ``widen`` each block reads
    float16 activations widened to float32 (mixed precision)."""
    x = Input()
    h = Dense(width, name="stem")(x)
    subs = []
    for i in range(blocks):
        y = Input()
        z = CommandLayer(ops.datatype_conversion(dtype=np.float32))(y) if widen else y
        z = Dense(width, name="b")(ReLU()(Dense(width, name="a")(z)))
        out = (
            Add()(y, CommandLayer(ops.datatype_conversion(dtype=np.float16))(z))
            if widen
            else (Add()(y, ReLU()(z)))
        )
        subs.append(Model([y], [out], name=f"block{i}"))
        h = subs[-1](h)
    if widen:
        h = CommandLayer(ops.datatype_conversion(dtype=np.float32))(h)
    return Model([x], [Dense(10, name="head")(h)], name="mlp"), subs


def residual_cnn(blocks: int, channels: int) -> tuple[Model, list[Model]]:
    """``blocks`` sub-models ``y + conv(relu(conv(y)))`` then global average pooling."""
    x = Input()
    h = Conv(channels, (3, 3), padding="SAME", name="stem")(x)
    subs = []
    for i in range(blocks):
        y = Input()
        z = Conv(channels, (3, 3), padding="SAME", name="b")(
            ReLU()(Conv(channels, (3, 3), padding="SAME", name="a")(y))
        )
        subs.append(Model([y], [ReLU()(Add()(y, z))], name=f"block{i}"))
        h = subs[-1](h)
    h = Flatten()(AvgPool((16, 16))(h))
    return Model([x], [Dense(10, name="head")(h)], name="cnn"), subs


def compiled(make, x, y, **flags) -> Model:
    model, subs = make()
    if flags.get("checkpoint"):
        for sub in subs:
            sub.set_gradient_checkpointing(True)
    model.set_memory_compression(flags.get("compression", False))
    model.set_memory_reduction(flags.get("reduction", False))
    model.compile([x], loss="softmax_crossentropy", minimizer=optax.sgd(0.01))
    model.memory_plan([x], [y])
    return model


def step_graph(model: Model):
    return model.engine._last_fit.program


def row(name: str, model: Model) -> dict[str, float]:
    prog = step_graph(model)
    plan = prog.memory_plan()
    return {
        "name": name,
        "peak": plan.peak_bytes / MB,
        "kept": saved_activation_bytes(prog.graph) / MB,
        "xla_temp": prog.memory().temp_bytes / MB,
        "recomputed": recomputed_flops(prog.graph) / 1e9,
    }


def mb(value: float, width: int) -> str:
    """``value`` MB in ``width`` digits, or ``-`` in its place when it was not measured
    (NaN: remat budgets are planned, not compiled, so XLA gives no temp figure)."""
    if math.isnan(value):
        return f"{'-':>{width + 2}}"
    return f"{value:>{width}.2f}MB"


def show(rows: list[dict], times: dict[str, float] | None = None) -> None:
    print(
        f"{'variant':<34} {'plan peak':>10} {'kept':>8} {'XLA temp':>9} {'recomp':>8} {'step':>9}"
    )
    for r in rows:
        t = f"{times[r['name']] * 1e3:7.1f}ms" if times and r["name"] in times else ""
        print(
            f"{r['name']:<34} {r['peak']:>8.2f}MB {r['kept']:>6.2f}MB {mb(r['xla_temp'], 7)} "
            f"{r['recomputed']:>6.3f}GF {t:>9}"
        )


def checkpoint_and_budgets(label: str, make, x, y, rounds: int) -> None:
    plain, ckpt = compiled(make, x, y), compiled(make, x, y, checkpoint=True)
    times = interleaved(
        {
            "plain": lambda: plain.fit([x], [y]),
            "checkpoint every block": lambda: ckpt.fit([x], [y]),
        },
        rounds=rounds,
        inner=3,
    )
    rows = [row("plain", plain), row("checkpoint every block", ckpt)]
    graph, donate = step_graph(plain).graph, step_graph(plain).donate
    lo, hi = step_graph(ckpt).memory_plan().peak_bytes, step_graph(plain).memory_plan().peak_bytes
    for frac in (0.0, 0.25, 0.5, 0.75):
        budget = int(lo + frac * (hi - lo))
        try:
            g = remat(graph, budget_bytes=budget, donate=donate)
        except Exception as e:  # a budget below what remat reaches
            print(f"  remat(budget={budget / MB:.2f}MB): {e}")
            continue
        p = memory_plan(g, donate=donate)
        rows.append(
            {
                "name": f"remat(budget={budget / MB:.2f}MB)",
                "peak": p.peak_bytes / MB,
                "kept": saved_activation_bytes(g) / MB,
                "xla_temp": float("nan"),
                "recomputed": recomputed_flops(g) / 1e9,
            }
        )
    print(f"\n== {label}: checkpointing and remat budgets")
    show(rows, times)
    print(
        f"step time ratio checkpoint/plain: {times['checkpoint every block'] / times['plain']:.2f}x"
    )


def _expanding_block(b: GraphBuilder, h, w1, w2, tag: str = ""):
    up = b.exec(ops.relu(), b.exec(ops.gemm(transpose_b=True), h, w1, name=f"up{tag}"))
    return b.exec(ops.ewsum(), h, b.exec(ops.gemm(transpose_b=True), up, w2), name=f"res{tag}")


def scan_mlp(blocks: int, batch: int, width: int, checkpoint=None):
    """The gradient graph of ``sum(h_n^2)``: unrolled (``checkpoint=None``, one weight
    input per block) or one scan over weights stacked ``[blocks, ...]``."""
    shapes = ((4 * width, width), (width, 4 * width))
    b = GraphBuilder()
    h = b.input((batch, width), name="x")
    if checkpoint is None:
        params = []
        for i in range(blocks):
            params += [b.input(s, name=f"w{i}.{k}") for k, s in enumerate(shapes)]
            h = _expanding_block(b, h, *params[-2:], tag=str(i))
    else:
        body = GraphBuilder()
        carry = body.input((batch, width), name="h")
        block = body.build([_expanding_block(body, carry, *(body.input(s) for s in shapes))])
        params = [b.input((blocks, *s), name=f"w.{k}") for k, s in enumerate(shapes)]
        (h,) = scan(b, block, [h], params, checkpoint=checkpoint, name="blocks")
    loss = b.exec(ops.reduce_sum(axes=(0, 1)), b.exec(ops.ewprod(), h, h))
    return backward(b.build([loss]), loss, params)[0]


def scan_blocks(quick: bool, rounds: int) -> None:
    blocks, batch, width = 16, 512 if quick else 2048, 128
    rng = np.random.default_rng(0)
    x = rng.normal(size=(batch, width)).astype(np.float32)
    stacked = [
        rng.normal(scale=0.05, size=(blocks, *s)).astype(np.float32)
        for s in ((4 * width, width), (width, 4 * width))
    ]
    per_block = [w[i] for i in range(blocks) for w in stacked]
    programs = {
        "unrolled, plain backward": (compile(scan_mlp(blocks, batch, width)), [x, *per_block]),
        "scan, plain": (compile(scan_mlp(blocks, batch, width, False)), [x, *stacked]),
        "scan, checkpoint every block": (
            compile(scan_mlp(blocks, batch, width, True)),
            [x, *stacked],
        ),
    }
    times = interleaved(
        {k: (lambda p=p, a=a: p(*a)) for k, (p, a) in programs.items()}, rounds=rounds, inner=3
    )
    ref = programs["unrolled, plain backward"][0](x, *per_block)
    ref_grads = [np.stack([ref[1 + 2 * i + k] for i in range(blocks)]) for k in range(2)]
    print(f"\n== XLA's own figure: {blocks}-block residual MLP ({batch}x{width}, inner 4x)")
    print(f"{'variant':<30} {'XLA temp':>10} {'plan peak':>10} {'step':>9} {'grad rel diff':>14}")
    base = programs["unrolled, plain backward"][0].memory().temp_bytes
    for name, (program, args) in programs.items():
        temp = program.memory().temp_bytes
        out = program(*args)
        grads = ref_grads if name.startswith("unrolled") else [np.asarray(g) for g in out[1:]]
        diff = max(np.abs(g - r).max() / np.abs(r).max() for g, r in zip(grads, ref_grads))
        print(
            f"{name:<30} {temp / MB:>8.2f}MB {program.memory_plan().peak_bytes / MB:>8.2f}MB "
            f"{times[name] * 1e3:>7.1f}ms {diff:>14.1e}   temp {temp / base:.2f}x unrolled"
        )
    ratio = programs["scan, checkpoint every block"][0].memory().temp_bytes / (
        programs["scan, plain"][0].memory().temp_bytes
    )
    slow = times["scan, checkpoint every block"] / times["scan, plain"]
    print(f"scan checkpoint / plain: XLA temp {ratio:.2f}x, step time {slow:.2f}x")


def main(quick: bool = False) -> None:
    rounds = 3 if quick else 7
    rng = np.random.default_rng(0)
    n = 1024 if quick else 2048
    x = rng.normal(size=(n, 64)).astype(np.float32)
    y = (np.arange(n) % 10).astype(np.int32)
    checkpoint_and_budgets(
        "residual MLP, 16 blocks x 128", lambda: residual_mlp(16, 128), x, y, rounds
    )

    xc = rng.normal(size=(8 if quick else 16, 16, 16, 3)).astype(np.float32)
    yc = (np.arange(len(xc)) % 10).astype(np.int32)
    checkpoint_and_budgets(
        "residual CNN, 12 blocks x 32ch", lambda: residual_cnn(12, 32), xc, yc, rounds
    )

    print("\n== compression (CNN) and reduction (mixed-precision MLP)")
    cnn = lambda: residual_cnn(12, 32)
    rows = [
        row("CNN plain", compiled(cnn, xc, yc)),
        row("CNN memory_compression", compiled(cnn, xc, yc, compression=True)),
    ]
    mixed = lambda: residual_mlp(16, 128, widen=True)
    x16 = x.astype(np.float16)
    rows += [
        row("mixed MLP plain", compiled(mixed, x16, y)),
        row("mixed MLP memory_reduction", compiled(mixed, x16, y, reduction=True)),
    ]
    show(rows)

    scan_blocks(quick, rounds)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    main(parser.parse_args().quick)
