"""CPU training vs PyTorch eager: is a ``Model.fit`` step at or ahead of torch on CPU?

Three workloads, each an fnnc ``fit`` step (forward + loss + backward + Adam, one
compiled program) against the same model in PyTorch eager (channels_last convolutions,
``torch.set_num_threads(threads)``, same batch), timed in the same process in
interleaved rounds (medians; each line ends with the XLA:CPU library set the fnnc
program compiled with, :mod:`fnnc.graph.cpu_libraries`):

(a) the CNN conv3x3(32)-ReLU-maxpool2-conv3x3(64)-ReLU-maxpool2-dense(10), 28x28x1,
    batch 64;
(b) a ResNet-style net: stem conv3x3(16)-BN-ReLU, two residual blocks (3x3 stride-2
    conv-BN-ReLU-conv3x3-BN plus a 1x1 stride-2 projection), global average pool,
    dense(10); 32x32x3, batch 64;
(c) the MLP 784-256-256-10, batch 128.

The fnnc step runs with the backends chosen by default (on CPU the ``"mixed"``
convolution backend of :mod:`fnnc.ops.conv_cpu`) and with XLA's convolutions forced
(``"fnnc/xla"``; max-pool keeps its CPU rules there, which are not a backend), each in
its own interleaved block against torch: medians, ranges, and the same-round ratios.
Then the compiled ``fit`` program before and after ``Model.autotune`` on the batch,
both in one block against torch, with their same-round ratio ``tuned/default``. Then a
per-op breakdown (ms): convolution forward, data gradient and weight gradient of each
convolution shape of the nets for XLA's reference, the backends of
:mod:`fnnc.ops.conv_cpu` and torch; batch norm forward and forward + backward
(fnnc's rule, the JAX-derived backward it replaced, torch); max-pool backward (JAX's
``select_and_scatter`` vs fnnc's rule vs torch).

Compare ratios within a line, not milliseconds across lines: each line is its own
block of rounds, and on this VM the same compiled ResNet step ran at 35 ms or at 47 ms
for spells of several seconds (also in a process that never imported torch), so two
blocks can land in different spells.

On a machine shared with other work, a multi-threaded torch loses most to the load
(its workers spin on barriers; 2-thread steps measured 5-80x slower than 1-thread ones
there), which flatters fnnc: pin the process (``taskset -c 0 ...``) with
``--threads 1`` for load-robust ratios. Which fnnc backend wins also depends on the
thread count (see :mod:`fnnc.ops.conv_cpu`), so single-core ratios are not the
two-core ones.

torch is an optional benchmark dependency: ``pip install -e ".[benchmarks]"`` (or
``pip install torch``, the CPU wheel).

Run: python benchmarks/cpu_vs_torch.py [--quick] [--threads 2] [--no-ops] [--only NAME]
[--rounds N]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

try:
    import torch
    from torch import nn
except ImportError:
    sys.exit("benchmarks/cpu_vs_torch.py needs PyTorch (CPU): pip install torch; then run again")

import jax
import jax.numpy as jnp
import numpy as np
import optax

from benchmarks._timing import interleaved, samples_of
from fnnc import config, ops
from fnnc.core.command import vjp_backward
from fnnc.graph import compile as compile_graph
from fnnc.models import (
    Add,
    AvgPool,
    BatchNorm,
    Conv,
    Dense,
    Flatten,
    Input,
    MaxPool,
    Model,
    ReLU,
    Sequential,
)
from fnnc.models.autotune import _program_call
from fnnc.ops import autotune, conv_cpu, pool

# -- the three workloads, in fnnc and in torch ---------------------------------------


def fnnc_cnn():
    layers = [Conv(32, (3, 3)), ReLU(), MaxPool(), Conv(64, (3, 3)), ReLU(), MaxPool()]
    return Sequential([*layers, Flatten(), Dense(10)])


def torch_cnn():
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(7 * 7 * 64, 10),
    )  # fmt: skip


def _fnnc_block(x, filters):
    h = ReLU()(BatchNorm()(Conv(filters, (3, 3), strides=2, no_bias=True)(x)))
    h = BatchNorm()(Conv(filters, (3, 3), no_bias=True)(h))
    short = BatchNorm()(Conv(filters, (1, 1), strides=2, no_bias=True)(x))
    return ReLU()(Add()(h, short))


def fnnc_resnet():
    x = Input()
    h = ReLU()(BatchNorm()(Conv(16, (3, 3), no_bias=True)(x)))
    h = _fnnc_block(_fnnc_block(h, 32), 64)
    return Model([x], [Dense(10)(Flatten()(AvgPool((8, 8))(h)))])


class _TorchBlock(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.c1 = nn.Conv2d(cin, cout, 3, stride=2, padding=1, bias=False)
        self.b1, self.b2, self.b3 = nn.BatchNorm2d(cout), nn.BatchNorm2d(cout), nn.BatchNorm2d(cout)
        self.c2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.proj = nn.Conv2d(cin, cout, 1, stride=2, bias=False)

    def forward(self, x):
        h = self.b2(self.c2(torch.relu(self.b1(self.c1(x)))))
        return torch.relu(h + self.b3(self.proj(x)))


def torch_resnet():
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
        _TorchBlock(16, 32), _TorchBlock(32, 64),
        nn.AvgPool2d(8), nn.Flatten(), nn.Linear(64, 10),
    )  # fmt: skip


def fnnc_mlp():
    return Sequential([Dense(256), ReLU(), Dense(256), ReLU(), Dense(10)])


def torch_mlp():
    return nn.Sequential(
        nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)
    )


WORKLOADS = {
    "CNN": (fnnc_cnn, torch_cnn, (64, 28, 28, 1)),
    "ResNet": (fnnc_resnet, torch_resnet, (64, 32, 32, 3)),
    "MLP": (fnnc_mlp, torch_mlp, (128, 784)),
}

# -- steps ---------------------------------------------------------------------------


def fnnc_step(make, x, y):
    """A compiled ``fit`` step of a fresh model, as a thunk (compiled on the first call)."""
    model = make()
    model.compile([x], loss="softmax_crossentropy", minimizer=optax.adam(1e-3))
    model.fit([x], [y])

    def step():
        return model.fit([x], [y])

    step.libraries = model.engine._last_fit.program.cpu_libraries  # type: ignore[attr-defined]
    return step


def torch_step(make, x, y):
    model = make()
    xt = torch.from_numpy(np.array(x))
    if xt.ndim == 4:
        model = model.to(memory_format=torch.channels_last)
        xt = xt.permute(0, 3, 1, 2).contiguous(memory_format=torch.channels_last)
    yt = torch.from_numpy(np.array(y)).long()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(xt), yt)
        loss.backward()
        opt.step()
        return loss

    return step


def _spread(values: list[float], scale: float = 1.0) -> str:
    """``median [min-max]``."""
    med = statistics.median(values) * scale
    return f"{med:.2f} [{min(values) * scale:.2f}-{max(values) * scale:.2f}]"


VARIANTS = {
    "fnnc": contextlib.nullcontext,
    "fnnc/xla": lambda: config.override(backend_per_command={"convolution": "xla"}),
}
"""The ``fit`` steps timed against torch: the default backends, and XLA's own
convolutions forced (max-pool keeps its CPU rules there: not a backend)."""


def _line(label: str, t: dict[str, list[float]], libraries: str) -> None:
    ratio = [a / b for a, b in zip(t[label], t["torch"])]
    ms = f"{_spread(t[label], 1e3):>24}   torch {_spread(t['torch'], 1e3):>24}"
    print(f"  {label:<15}{ms}   ratio {_spread(ratio)}   ({libraries})")


def _tuned_block(ours, x, y, theirs_step, rounds: int, inner: int) -> None:
    """The compiled ``fit`` program before and after ``Model.autotune``, both timed in
    the same rounds against torch (a model's next step would compile with the table's
    winners, so the two programs are compiled from the captured graph and called
    directly: the step without the model's Python around it)."""
    model = ours()
    model.compile([x], loss="softmax_crossentropy", minimizer=optax.adam(1e-3))
    graph, args = _program_call(model.engine, lambda: model.engine.fit([x], [y]))
    default = compile_graph(graph)
    model.autotune([x], [y])
    tuned = compile_graph(graph)
    fns = {"default program": lambda: default(*args), "tuned program": lambda: tuned(*args)}
    t = samples_of({**fns, "torch": theirs_step}, rounds=rounds, inner=inner)
    _line("default program", t, default.cpu_libraries)
    _line("tuned program", t, tuned.cpu_libraries)
    gain = [a / b for a, b in zip(t["tuned program"], t["default program"])]
    print(f"  {'tuned/default':<15}{'':>55}ratio {_spread(gain)}")


def workloads(rounds: int, inner: int, only: str | None = None) -> None:
    """Per workload and fnnc variant (:data:`VARIANTS`; the MLP has no backend choice, so
    only the default), one interleaved block of that fnnc step against torch: ms per
    step (median [range]) and the same-round ratio fnnc / torch. Each variant has a
    block of its own because leaving a backend override makes the engine's next step
    compile anew. Then the default and the autotuned ``fit`` programs in one block
    (:func:`_tuned_block`)."""
    rng = np.random.default_rng(0)
    for name, (ours, theirs, shape) in WORKLOADS.items():
        if only and name != only:
            continue
        x = rng.standard_normal(shape).astype(np.float32)
        y = rng.integers(0, 10, shape[0]).astype(np.int32)
        theirs_step = torch_step(theirs, x, y)
        saved = dict(autotune.TABLE)
        print(f"{name}: ms per step, median [range] of {rounds} rounds; ratio per round")
        for label, context in VARIANTS.items():
            if label != "fnnc" and len(shape) != 4:
                continue
            with context():
                ours_step = fnnc_step(ours, x, y)
                t = samples_of({label: ours_step, "torch": theirs_step}, rounds=rounds, inner=inner)
            _line(label, t, ours_step.libraries)
        _tuned_block(ours, x, y, theirs_step, rounds, inner)
        autotune.TABLE.clear()
        autotune.TABLE.update(saved)


# -- per-op breakdown ----------------------------------------------------------------

CONV_SHAPES = [  # (x shape NHWC, out channels, kernel, stride): the CNN's, then the ResNet's
    ((64, 28, 28, 1), 32, 3, 1),
    ((64, 14, 14, 32), 64, 3, 1),
    ((64, 32, 32, 3), 16, 3, 1),
    ((64, 32, 32, 16), 32, 3, 2),
    ((64, 32, 32, 16), 32, 1, 2),
    ((64, 16, 16, 32), 32, 3, 1),
    ((64, 16, 16, 32), 64, 3, 2),
    ((64, 16, 16, 32), 64, 1, 2),
    ((64, 8, 8, 64), 64, 3, 1),
]


def _conv_fns(xs, o, k, s):
    """{variant: (fwd, dx, dw)} of one convolution shape, each a thunk."""
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.standard_normal(xs), jnp.float32)
    w = jnp.asarray(rng.standard_normal((o, k, k, xs[-1])) * 0.1, jnp.float32)
    params = dict(strides=s, padding="SAME", dilation=1, groups=1)
    cmd = ops.convolution(**params)
    ref = cmd.definition
    g = jnp.ones(cmd.shape(x, w)[0].shape, jnp.float32)

    def grads(rule, which):
        if rule is None:  # the reference: the command's backward rule (XLA's convolutions)
            return jax.jit(lambda g, x, w: ref.backward((g,), (x, w), (None,), **params)[which])
        return jax.jit(lambda g, x, w: rule((g,), (x, w), (None,), (which,), **params)[which])

    def thunks(forward, rule):
        fwd = jax.jit(lambda x, w: forward(x, w, **params))
        dx, dw = grads(rule, 0), grads(rule, 1)
        return (lambda: fwd(x, w)), (lambda: dx(g, x, w)), (lambda: dw(g, x, w))

    xt = torch.from_numpy(np.array(x)).permute(0, 3, 1, 2)
    xt = xt.contiguous(memory_format=torch.channels_last)
    wt = torch.from_numpy(np.array(w)).permute(0, 3, 1, 2)
    wt = wt.contiguous(memory_format=torch.channels_last)
    gt = torch.from_numpy(np.array(g)).permute(0, 3, 1, 2)
    gt = gt.contiguous(memory_format=torch.channels_last)
    pad = [k // 2] * 2

    def tback(mask):
        return lambda: torch.ops.aten.convolution_backward(
            gt, xt, wt, None, [s, s], pad, [1, 1], False, [0, 0], 1, mask
        )

    ours = {n: thunks(conv_cpu.BY_NAME[n].forward, conv_cpu.backward_of(n)) for n in CPU_NAMES}
    return {
        "xla": thunks(ref.forward, None),
        **ours,
        "torch": (
            lambda: nn.functional.conv2d(xt, wt, stride=s, padding=k // 2),
            tback([True, False, False]),
            tback([False, True, False]),
        ),
    }


CPU_NAMES = ("mixed", "dilated", "chunked", "im2col")


def conv_ops(rounds: int, inner: int) -> None:
    names = ["xla", *CPU_NAMES, "torch"]
    print("\nconvolution per op (ms, SAME padding; 'mixed' is the default on CPU):")
    print(f"{'x NHWC -> out, kxk/s':<30} {'product':<12}" + "".join(f"{n:>9}" for n in names))
    for xs, o, k, s in CONV_SHAPES:
        fns = _conv_fns(xs, o, k, s)
        label = f"{list(xs)}->{o}, {k}x{k}/{s}"
        for part, what in enumerate(("forward", "data grad", "weight grad")):
            t = interleaved({n: fns[n][part] for n in names}, rounds=rounds, inner=inner)
            print(f"{label:<30} {what:<12}" + "".join(f"{t[n] * 1e3:9.2f}" for n in names))
            label = ""


def _pool_fns(xs):
    """{variant: thunk} of max-pool 2x2/2 backward on ``x`` of shape ``xs`` (NHWC)."""
    rng = np.random.default_rng(2)
    x = jnp.asarray(rng.standard_normal(xs), jnp.float32)
    g = jnp.ones((xs[0], xs[1] // 2, xs[2] // 2, xs[3]), jnp.float32)
    params = dict(window=(2, 2), strides=None, padding=0)
    definition = pool.max_pool.definition

    def reduce(x):  # what max_pool ran before: reduce_window, differentiated by JAX
        return jax.lax.reduce_window(
            x, np.array(-np.inf, x.dtype), jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID"
        )

    vjp = jax.jit(lambda g, x: jax.vjp(reduce, x)[1](g)[0])
    ours = jax.jit(lambda g, x: definition.backward((g,), (x,), (None,), **params)[0])
    xt = torch.from_numpy(np.array(x)).permute(0, 3, 1, 2)
    xt = xt.contiguous(memory_format=torch.channels_last)
    _, idx = nn.functional.max_pool2d(xt, 2, return_indices=True)
    gt = torch.ones(idx.shape).contiguous(memory_format=torch.channels_last)
    return {
        "xla": lambda: vjp(g, x),
        "fnnc": lambda: ours(g, x),
        "torch": lambda: torch.ops.aten.max_pool2d_with_indices_backward(
            gt, xt, [2, 2], [2, 2], [0, 0], [1, 1], False, idx
        ),
    }


def pool_ops(rounds: int, inner: int) -> None:
    print("\nmax-pool 2x2/2 backward (ms): select_and_scatter (jax.vjp) / fnnc rule / torch")
    for xs in [(64, 28, 28, 32), (64, 14, 14, 64)]:
        t = interleaved(_pool_fns(xs), rounds=rounds, inner=inner)
        print(f"{list(xs)!s:<20} " + " / ".join(f"{v * 1e3:6.2f}" for v in t.values()))


def _norm_fns(xs):
    """{variant: thunk} of batch-norm (training) forward, and forward + backward, on
    ``x`` of shape ``xs`` (NHWC): fnnc's rule, the reference differentiated by JAX (what
    fnnc ran before it had the rule) and torch (channels_last)."""
    rng = np.random.default_rng(3)
    x = jnp.asarray(rng.standard_normal(xs), jnp.float32)
    g = jnp.asarray(rng.standard_normal(xs), jnp.float32)
    c = xs[-1]
    stats = (jnp.ones(c), jnp.zeros(c), jnp.zeros(c), jnp.ones(c))
    definition = ops.batch_norm.definition
    params = dict(axes=(0, 1, 2), epsilon=1e-5, momentum=0.9, is_test=False)

    def forward(x, *stats):
        return definition.forward(x, *stats, **params)

    def step(rule):
        def run(x, g, *stats):
            outs = forward(x, *stats)
            grads = (g, None, None, None, None)
            return outs[0], rule(grads, (x, *stats), outs)[:3]

        return jax.jit(run)

    ours = step(lambda grads, ins, outs: definition.backward(grads, ins, outs, **params))
    derived = step(lambda grads, ins, outs: vjp_backward(definition.forward, grads, ins, **params))
    fwd = jax.jit(forward)
    xt = torch.from_numpy(np.array(x)).permute(0, 3, 1, 2)
    xt = xt.contiguous(memory_format=torch.channels_last).requires_grad_(True)
    gt = torch.from_numpy(np.array(g)).permute(0, 3, 1, 2)
    gt = gt.contiguous(memory_format=torch.channels_last)
    bn = nn.BatchNorm2d(c).to(memory_format=torch.channels_last)

    def torch_forward():
        with torch.no_grad():
            return bn(xt)

    def torch_step():
        xt.grad = None
        bn.zero_grad(set_to_none=True)
        out = bn(xt)
        out.backward(gt)
        return out

    return {
        "fwd": lambda: fwd(x, *stats),
        "torch fwd": torch_forward,
        "fwd+bwd": lambda: ours(x, g, *stats),
        "derived": lambda: derived(x, g, *stats),
        "torch f+b": torch_step,
    }


def norm_ops(rounds: int, inner: int) -> None:
    print("\nbatch norm, training (ms): forward and forward + backward; 'derived' = the")
    print("reference differentiated by JAX (before the hand-written backward)")
    for xs in [(64, 32, 32, 16), (64, 16, 16, 32), (64, 8, 8, 64)]:
        t = interleaved(_norm_fns(xs), rounds=rounds, inner=inner)
        print(f"{list(xs)!s:<20} " + "".join(f"{k} {v * 1e3:6.2f}  " for k, v in t.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    parser.add_argument("--no-ops", action="store_true", help="skip the per-op breakdown")
    parser.add_argument("--only", choices=list(WORKLOADS), help="time one workload only")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default 9; 3 quick)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rounds, inner = (3, 3) if args.quick else (9, 5)
    rounds = args.rounds or rounds
    print(f"jax {jax.__version__} on {jax.default_backend()}, torch {torch.__version__} "
          f"with {torch.get_num_threads()} threads")  # fmt: skip
    workloads(rounds, inner, args.only)
    if not args.no_ops:
        conv_ops(rounds, inner)
        norm_ops(rounds, inner)
        pool_ops(rounds, inner)


if __name__ == "__main__":
    main()
