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
(``Model.profile``, each backward under its forward command).

``--tiny`` runs a small size on CPU; ``tests/test_lm_step.py`` runs it in the suite and
checks that fnnc's and NNX's losses agree step by step.

Run: python benchmarks/lm_step.py [--tiny | --size cpu | --size cpu-batch]
     [--impls fnnc,nnx,...] [--steps N] [--profile N]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import functools
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from benchmarks import _profile
from benchmarks._timing import median_time
from fnnc import config, ops
from fnnc.graph.passes import linear_crossentropy, linear_crossentropy_mean
from fnnc.graph.profile import NO_NODE
from fnnc.models import (
    Add,
    Dense,
    Embedding,
    Input,
    LayerNorm,
    Model,
    MultiHeadAttention,
    Parameter,
    ReLU,
    minimizers,
)


@dataclasses.dataclass(frozen=True)
class Size:
    batch: int
    seq: int
    width: int
    heads: int
    blocks: int
    vocab: int


SIZES = {
    "issue": Size(batch=16, seq=1024, width=1024, heads=16, blocks=4, vocab=32768),
    "tiny": Size(batch=2, seq=16, width=32, heads=4, blocks=2, vocab=64),
    "cpu": Size(batch=4, seq=128, width=256, heads=4, blocks=2, vocab=32768),
    "cpu-batch": Size(batch=16, seq=64, width=256, heads=4, blocks=2, vocab=1024),
}
"""``issue``: the issue's step; ``tiny``: the suite's; ``cpu``: the issue's vocabulary on a
narrow model, where the logits dominate the step's memory, small enough for a CPU;
``cpu-batch``: many short sequences, where the dense layers' batch axes dominate (a
gemm that broadcast its weight per batch row ran this step at 2.9x NNX's time)."""
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
    "nnx",
    "torch",
    "torch-compile",
)
LR, EPS = 1e-4, 1e-8
MODEL = "lm"


def flops_per_step(z: Size) -> float:
    """Forward + backward FLOPs of one step (see the module doc)."""
    d = z.width
    matmul = z.blocks * 12 * d * d + z.vocab * d
    tokens = z.batch * z.seq
    return 6.0 * matmul * tokens + 12.0 * z.batch * z.seq * z.seq * d * z.blocks


def batches(z: Size, n: int, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """``n`` (tokens, next tokens) batches of random text."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        text = rng.integers(0, z.vocab, (z.batch, z.seq + 1)).astype(np.int32)
        out.append((text[:, :-1], text[:, 1:]))
    return out


# -- fnnc ------------------------------------------------------------------------------


def fnnc_model(z: Size) -> Model:
    tokens = Input(name="tokens")
    h = Add()(
        Embedding(z.vocab, z.width, name="embed")(tokens),
        Parameter((z.seq, z.width), init=0.0, name="positions")(),
    )
    for i in range(z.blocks):
        a = MultiHeadAttention(z.heads, is_causal=True, name=f"attn{i}")
        h = Add()(h, a(LayerNorm(name=f"ln{i}a")(h)))
        up = Dense(4 * z.width, name=f"mlp{i}a")(LayerNorm(name=f"ln{i}b")(h))
        h = Add()(h, Dense(z.width, name=f"mlp{i}b")(ReLU()(up)))
    logits = Dense(z.vocab, name="logits")(LayerNorm(name="ln_out")(h))
    return Model([tokens], [logits], name=MODEL)


def pid(layer: str, i: int) -> str:
    """fnnc's id of parameter ``i`` of layer ``layer`` in :func:`fnnc_model`."""
    return f"t-{MODEL}-0-{layer}-0-{i}"


@functools.cache
def initial_params(z: Size) -> dict[str, np.ndarray]:
    """fnnc's initial weights, which every implementation starts from (read-only)."""
    model = fnnc_model(z)
    x, _ = batches(z, 1)[0]
    model.compile([x], loss="softmax_crossentropy", minimizer=minimizers.adam(LR))
    return {k: np.asarray(v) for k, v in model.parameters().items()}


@dataclasses.dataclass
class Result:
    impl: str
    ms: float | None = None
    peak_bytes: int | None = None
    peak_kind: str = ""
    losses: list[float] = dataclasses.field(default_factory=list)
    device: str = ""
    note: str = ""
    kernels: dict[str, float] = dataclasses.field(default_factory=dict)
    """Milliseconds per step of each kernel, where ``--profile`` asked (:mod:`_profile`)."""
    commands: dict[str, float] = dataclasses.field(default_factory=dict)
    """fnnc's: milliseconds per step of each command's nodes (``Model.profile``), where
    ``--profile`` asked; a gradient node's under its forward command + ``backward``."""
    profile_error: str = ""
    unplaced: list[str] = dataclasses.field(default_factory=list)
    """fnnc's: operations of the profile's ``(no node)`` row, where it holds over a
    quarter of the time (what the next GPU run should show if attribution fails)."""
    trace: str = ""
    """fnnc's: a sample of the profile's trace (:func:`_profile.trace_sample`), where
    its nodes hold under half of the kernels' time."""


def _profiled(
    result: Result,
    profile: int,
    kernels: Callable[[], dict[str, float]],
    commands: Callable[[], dict[str, float]] | None = None,
) -> Result:
    """``result`` with the kernels (and commands) of ``profile`` more steps, if asked: a
    profiler that fails (no CUPTI on the machine, say) costs the breakdown, never the
    timings."""
    if profile:
        try:
            result.kernels = kernels()
            result.commands = commands() if commands is not None else {}
        except Exception as e:  # reported in the table instead
            result.profile_error = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
    return result


def by_command(report: Any, result: Result | None = None) -> dict[str, float]:
    """Milliseconds per step per command from a :class:`fnnc.graph.profile.Profile`;
    a gradient node ``<name>.backward`` counts under ``<its forward command> backward``
    (the profile's own per-command table lumps every backward under ``gradient``).
    Where ``(no node)`` holds over a quarter of the time, its first operations go to
    ``result.unplaced``."""
    forward = {r.name: r.command for r in report.nodes}
    out: dict[str, float] = {}
    for r in report.nodes:
        unplaced = r.name == NO_NODE  # XLA's copies, say; or a trace read wrongly
        if unplaced and result is not None and r.seconds > report.seconds / 4:
            result.unplaced = list(r.ops[:12])
        command = NO_NODE if unplaced else r.command
        if command == "gradient" and r.name.endswith(".backward"):
            command = f"{forward.get(r.name.removesuffix('.backward'), '?')} backward"
        out[command] = out.get(command, 0.0) + 1e3 * r.seconds
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def commands_table(results: Sequence[Result], top: int = 16) -> str:
    """fnnc's implementations side by side: ms/step of their largest commands."""
    rows = [r for r in results if r.commands]
    if not rows:
        return ""
    names = list(dict.fromkeys(c for r in rows for c in list(r.commands)[:top]))
    head = f"{'fnnc ms/step by command':40s}" + "".join(f"{r.impl:>15s}" for r in rows)
    lines = [head]
    for c in names:
        lines.append(f"{c[:40]:40s}" + "".join(f"{r.commands.get(c, 0.0):15.3f}" for r in rows))
    total = "".join(f"{sum(r.commands.values()):15.3f}" for r in rows)
    return "\n".join([*lines, f"{'all commands':40s}" + total])


@contextlib.contextmanager
def _restored(min_logits: int, mean_in_fit: bool):
    try:
        yield
    finally:
        linear_crossentropy.MIN_LOGITS = min_logits
        linear_crossentropy_mean.IN_FIT = mean_in_fit


def _jax_peak(estimate: Callable[[], int]) -> tuple[int, str]:
    stats = jax.devices()[0].memory_stats() or {}
    if "peak_bytes_in_use" in stats:
        return int(stats["peak_bytes_in_use"]), "device"
    return estimate(), "xla est."


def run_fnnc(
    z: Size, data, params, variant: str, precision: str, timed: bool, profile: int = 0
) -> Result:
    """``Model.fit`` losses on ``data`` then, if ``timed``, ms per step."""
    forced = config.override(backend="xla") if variant == "fnnc-xla" else contextlib.nullcontext()
    restored = _restored(linear_crossentropy.MIN_LOGITS, linear_crossentropy_mean.IN_FIT)
    if variant == "fnnc-unfused":
        linear_crossentropy.MIN_LOGITS = 2**62
    if variant == "fnnc-blockwise":
        linear_crossentropy_mean.IN_FIT = False
    with forced, restored:  # choices are cached per configuration: stay inside
        model = fnnc_model(z)
        x, y = (jnp.asarray(a) for a in data[0])
        model.compile(
            [x], loss="softmax_crossentropy", minimizer=minimizers.adam(LR), precision=precision
        )
        model.set_parameters(params)
        if variant == "fnnc-tuned":
            model.autotune([x], [y])
        losses = [float(model.fit([jnp.asarray(a)], [jnp.asarray(b)])) for a, b in data]
        ms = 1e3 * median_time(lambda: model.fit([x], [y]), repeats=5, inner=5) if timed else None

        def estimate() -> int:
            m = model.engine._last_fit.program.memory()
            return m.argument_bytes + m.output_bytes + m.temp_bytes - m.alias_bytes

        peak, kind = _jax_peak(estimate) if timed else (None, "")
        result = Result(variant, ms, peak, kind, losses)
        if variant == "fnnc-tuned":
            result.note = "tuned: " + tuned_choices(ops.autotune.TABLE)
        return _profiled(
            result,
            profile,
            lambda: _profile.jax_kernels(lambda: model.fit([x], [y]), profile),
            lambda: fnnc_commands(model, x, y, profile, result),
        )


def fnnc_commands(model: Any, x: Any, y: Any, runs: int, result: Result) -> dict[str, float]:
    """:func:`by_command` of ``Model.profile``; where the nodes hold under half of the
    kernels' time (``result.kernels``, measured first), ``result.trace`` gets a sample
    of the trace, so that a GPU run shows why attribution failed."""
    with tempfile.TemporaryDirectory(prefix="lm-step-profile-") as folder:
        commands = by_command(model.profile([x], [y], runs=runs, log_dir=folder), result)
        placed = sum(ms for c, ms in commands.items() if c != NO_NODE)
        if placed < sum(result.kernels.values()) / 2:
            hlo = model.engine._last_fit.program.compiled_text()
            result.trace = _profile.trace_sample(folder, hlo)
    return commands


def tuned_choices(table: Mapping[str, str]) -> str:
    """The autotune table's entries (what later compiles read: ``Model.autotune`` tunes
    the fit and evaluate programs, keyed by command, parameters and shapes), counted by
    command and backend: ``gemm:xla x24, scaled_dot_product_attention:cudnn x2``."""
    counts = collections.Counter(f"{k.split('|', 1)[0]}:{v}" for k, v in table.items())
    return ", ".join(f"{k} x{n}" for k, n in sorted(counts.items())) or "nothing to choose"


# -- Flax NNX + optax ------------------------------------------------------------------


class NNXBlock(nnx.Module):
    def __init__(self, z: Size, dtype: Any, rngs: nnx.Rngs):
        d, f32 = z.width, jnp.float32
        self.heads = z.heads
        self.ln1 = nnx.LayerNorm(d, epsilon=1e-5, dtype=f32, rngs=rngs)
        self.q, self.k, self.v, self.o = (nnx.Linear(d, d, dtype=dtype, rngs=rngs) for _ in "qkvo")
        self.ln2 = nnx.LayerNorm(d, epsilon=1e-5, dtype=f32, rngs=rngs)
        self.up = nnx.Linear(d, 4 * d, dtype=dtype, rngs=rngs)
        self.down = nnx.Linear(4 * d, d, dtype=dtype, rngs=rngs)

    def __call__(self, h: Any) -> Any:
        b, s, d = h.shape
        a = self.ln1(h)
        q, k, v = (
            jnp.reshape(p(a), (b, s, self.heads, d // self.heads)) for p in (self.q, self.k, self.v)
        )
        o = jax.nn.dot_product_attention(q, k, v, is_causal=True)
        h = h + self.o(jnp.reshape(o, (b, s, d)))
        return h + self.down(jax.nn.relu(self.up(self.ln2(h))))


class NNXLM(nnx.Module):
    def __init__(self, z: Size, dtype: Any, rngs: nnx.Rngs):
        self.dtype = dtype
        self.embed = nnx.Embed(z.vocab, z.width, dtype=dtype, rngs=rngs)
        self.positions = nnx.Param(jnp.zeros((z.seq, z.width)))
        self.blocks = nnx.List([NNXBlock(z, dtype, rngs) for _ in range(z.blocks)])
        self.ln_out = nnx.LayerNorm(z.width, epsilon=1e-5, dtype=jnp.float32, rngs=rngs)
        self.logits = nnx.Linear(z.width, z.vocab, dtype=dtype, rngs=rngs)

    def __call__(self, tokens: Any) -> Any:
        h = self.embed(tokens) + self.positions[...].astype(self.dtype)[None]
        for block in self.blocks:
            h = block(h)
        return self.logits(self.ln_out(h))


def load_nnx(model: NNXLM, z: Size, params: dict[str, np.ndarray]) -> None:
    """fnnc's weights into the NNX model (Linear kernels are fnnc's weights transposed)."""

    def dense(layer: nnx.Linear, name: str, w: int = 0, b: int = 1) -> None:
        layer.kernel.value = jnp.asarray(params[pid(name, w)].T)
        layer.bias.value = jnp.asarray(params[pid(name, b)])

    def norm(layer: nnx.LayerNorm, name: str) -> None:
        layer.scale.value = jnp.asarray(params[pid(name, 0)])
        layer.bias.value = jnp.asarray(params[pid(name, 1)])

    model.embed.embedding.value = jnp.asarray(params[pid("embed", 0)])
    model.positions.value = jnp.asarray(params[pid("positions", 0)])
    for i, block in enumerate(model.blocks):
        norm(block.ln1, f"ln{i}a")
        norm(block.ln2, f"ln{i}b")
        for j, proj in enumerate((block.q, block.k, block.v, block.o)):
            dense(proj, f"attn{i}", j, 4 + j)
        dense(block.up, f"mlp{i}a")
        dense(block.down, f"mlp{i}b")
    norm(model.ln_out, "ln_out")
    dense(model.logits, "logits")


def nnx_step(z: Size, params, precision: str) -> tuple[Any, Any, Any]:
    """``(step, state, optimizer state)``: NNX's jitted training step (parameters and
    state donated) and where it starts."""
    dtype = jnp.bfloat16 if precision == "bfloat16" else jnp.float32
    model = NNXLM(z, dtype, nnx.Rngs(0))
    load_nnx(model, z, params)
    graphdef, state = nnx.split(model, nnx.Param)
    tx = optax.adam(LR, eps=EPS)

    @functools.partial(jax.jit, donate_argnums=(0, 1))
    def step(state, opt_state, x, y):
        def loss_fn(state):
            logits = nnx.merge(graphdef, state)(x).astype(jnp.float32)
            return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

        loss, grads = jax.value_and_grad(loss_fn)(state)
        updates, opt_state = tx.update(grads, opt_state, state)
        return optax.apply_updates(state, updates), opt_state, loss

    return step, state, tx.init(state)


def xla_costs(z: Size, precision: str) -> dict[str, tuple[float, float]]:
    """XLA's static cost analysis of the compiled step, ``{impl: (flops, bytes
    accessed)}`` for ``fnnc`` (``Model.fit``'s program, XLA backends throughout: a
    Pallas kernel is an opaque call to the analysis) and ``nnx``: a check of the step's
    structure that no timing noise moves (``tests/test_lm_step.py``)."""
    params = initial_params(z)
    x, y = (jnp.asarray(a) for a in batches(z, 1)[0])
    with config.override(backend="xla"):
        model = fnnc_model(z)
        model.compile(
            [x], loss="softmax_crossentropy", minimizer=minimizers.adam(LR), precision=precision
        )
        model.set_parameters(params)
        model.fit([x], [y])
    ours = model.engine._last_fit.program._compiled.cost_analysis()
    step, state, opt_state = nnx_step(z, params, precision)
    theirs = step.lower(state, opt_state, x, y).compile().cost_analysis()
    return {
        name: (float(c["flops"]), float(c["bytes accessed"]))
        for name, c in (("fnnc", ours), ("nnx", theirs))
    }


def run_nnx(z: Size, data, params, precision: str, timed: bool, profile: int = 0) -> Result:
    step, state, opt_state = nnx_step(z, params, precision)
    box = {"state": state, "opt": opt_state}

    def fit(x: Any, y: Any) -> Any:
        box["state"], box["opt"], loss = step(box["state"], box["opt"], x, y)
        return loss

    losses = [float(fit(jnp.asarray(a), jnp.asarray(b))) for a, b in data]
    x, y = (jnp.asarray(a) for a in data[0])
    ms = 1e3 * median_time(lambda: fit(x, y), repeats=5, inner=5) if timed else None

    def estimate() -> int:
        m = step.lower(box["state"], box["opt"], x, y).compile().memory_analysis()
        return (
            m.argument_size_in_bytes
            + m.output_size_in_bytes
            + m.temp_size_in_bytes
            - (m.alias_size_in_bytes)
        )

    peak, kind = _jax_peak(estimate) if timed else (None, "")
    result = Result("nnx", ms, peak, kind, losses)
    return _profiled(result, profile, lambda: _profile.jax_kernels(lambda: fit(x, y), profile))


# -- PyTorch (optional) ----------------------------------------------------------------


def run_torch(
    z: Size, data, params, compiled: bool, precision: str, timed: bool, profile: int = 0
) -> Result:
    """Autocast bfloat16, SDPA, fused Adam; the model under ``torch.compile`` if asked."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    dev = "cuda" if torch.cuda.is_available() else "cpu"

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            d = z.width
            self.ln1, self.ln2 = nn.LayerNorm(d, eps=1e-5), nn.LayerNorm(d, eps=1e-5)
            self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in "qkvo")
            self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def forward(self, h):
            b, s, d = h.shape
            a = self.ln1(h)
            q, k, v = (
                p(a).view(b, s, z.heads, -1).transpose(1, 2) for p in (self.q, self.k, self.v)
            )
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            h = h + self.o(o.transpose(1, 2).reshape(b, s, d))
            return h + self.down(torch.relu(self.up(self.ln2(h))))

    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(z.vocab, z.width)
            self.positions = nn.Parameter(torch.zeros(z.seq, z.width))
            self.blocks = nn.ModuleList(Block() for _ in range(z.blocks))
            self.ln_out, self.logits = nn.LayerNorm(z.width, eps=1e-5), nn.Linear(z.width, z.vocab)

        def forward(self, tokens):
            h = self.embed(tokens) + self.positions
            for block in self.blocks:
                h = block(h)
            return self.logits(self.ln_out(h))

    model = LM()
    with torch.no_grad():  # fnnc's weights; torch's Linear has fnnc's [out, in] layout
        t = lambda name, i: torch.from_numpy(np.array(params[pid(name, i)]))
        pairs = [(model.embed.weight, ("embed", 0)), (model.positions, ("positions", 0))]
        for i, blk in enumerate(model.blocks):
            for j, p in enumerate((blk.q, blk.k, blk.v, blk.o)):
                pairs += [(p.weight, (f"attn{i}", j)), (p.bias, (f"attn{i}", 4 + j))]
            for p, name in ((blk.ln1, f"ln{i}a"), (blk.ln2, f"ln{i}b"), (blk.up, f"mlp{i}a"),
                            (blk.down, f"mlp{i}b")):  # fmt: skip
                pairs += [(p.weight, (name, 0)), (p.bias, (name, 1))]
        for p, name in ((model.ln_out, "ln_out"), (model.logits, "logits")):
            pairs += [(p.weight, (name, 0)), (p.bias, (name, 1))]
        for param, key in pairs:
            param.copy_(t(*key))
    model = model.to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=LR, eps=EPS, fused=dev == "cuda")
    low = precision == "bfloat16"

    def loss_of(x, y):
        with torch.autocast(dev, dtype=torch.bfloat16, enabled=low):
            logits = model(x)
        return F.cross_entropy(logits.float().reshape(-1, z.vocab), y.reshape(-1))

    # the loss under torch.compile too, as a torch user compiles a step: Inductor then
    # fuses the float32 upcast into the cross-entropy. (Until 2026-11-27 only the model
    # was compiled, and the eager float32 cross-entropy cost torch 5.6 ms of copies and
    # softmax kernels a step on an H100: a weaker baseline than torch.compile is.)
    loss_fn = torch.compile(loss_of) if compiled else loss_of

    def fit(x, y):
        loss = loss_fn(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    tensors = [
        (torch.from_numpy(a).long().to(dev), torch.from_numpy(b).long().to(dev)) for a, b in data
    ]
    if dev == "cuda":
        torch.cuda.reset_peak_memory_stats()
    losses = [float(fit(x, y)) for x, y in tensors]
    ms = None
    if timed:
        x, y = tensors[0]
        samples = []
        for _ in range(5):
            sync()
            start = time.perf_counter()
            for _ in range(5):
                fit(x, y)
            sync()
            samples.append((time.perf_counter() - start) / 5)
        ms = 1e3 * float(np.median(samples))
    peak = int(torch.cuda.max_memory_allocated()) if dev == "cuda" else None
    name = "torch-compile" if compiled else "torch"
    kind = torch.cuda.get_device_name() if dev == "cuda" else ""
    x, y = tensors[0]
    result = Result(name, ms, peak, "device" if peak else "", losses, device=kind)
    return _profiled(
        result, profile, lambda: _profile.torch_kernels(lambda: fit(x, y), profile, sync)
    )


# -- one implementation, all of them, the table -----------------------------------------


def run(
    impl: str, z: Size, steps: int, precision: str, timed: bool = True, profile: int = 0
) -> Result:
    """Losses of ``steps`` steps on fresh batches, then ms/step on one batch, then, if
    ``profile``, the kernels of that many more steps."""
    data, params = batches(z, steps), initial_params(z)
    gc.collect()  # the model that made the weights holds no device memory from here on
    if impl.startswith("fnnc"):
        result = run_fnnc(z, data, params, impl, precision, timed, profile)
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


def available(impls: Sequence[str]) -> list[str]:
    """``impls`` without the torch ones where torch is not installed."""
    try:
        import torch  # noqa: F401
    except ImportError:
        return [i for i in impls if not i.startswith("torch")]
    return list(impls)


def main(argv: Sequence[str] | None = None) -> list[Result]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help=f"size {SIZES['tiny']} (CPU)")
    parser.add_argument("--size", choices=list(SIZES), default="issue")
    parser.add_argument("--impls", default=",".join(IMPLS), help=f"some of {IMPLS}")
    parser.add_argument("--steps", type=int, default=3, help="steps whose losses are compared")
    parser.add_argument("--precision", default="bfloat16", choices=("bfloat16", "float32"))
    parser.add_argument("--peak-tflops", type=float, help="bf16 peak for MFU (default: table)")
    parser.add_argument(
        "--profile", type=int, default=0, metavar="N",
        help="also profile N steps and report kernel time by kind (benchmarks/_profile.py)",
    )  # fmt: skip
    parser.add_argument("--in-process", action="store_true", help="no process per implementation")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    opts = parser.parse_args(argv)
    z = SIZES["tiny" if opts.tiny else opts.size]
    impls = available(opts.impls.split(","))
    if opts.one:
        result = run(impls[0], z, opts.steps, opts.precision, profile=opts.profile)
        print(json.dumps(dataclasses.asdict(result)))
        return []
    if opts.in_process:
        results = [run(i, z, opts.steps, opts.precision, profile=opts.profile) for i in impls]
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
