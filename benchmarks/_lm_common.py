"""What every implementation of ``benchmarks/lm_step.py`` shares: the sizes, the FLOPs
of a step, the batches, fnnc's model (whose initial weights every implementation starts
from) and its parameters' ids, the :class:`Result` of a run and the helpers that fill it
in (the profile, peak memory)."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import jax
import numpy as np

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
LR, EPS = 1e-4, 1e-8
MODEL = "lm"


def flops_per_step(z: Size) -> float:
    """Forward + backward FLOPs of one step (see ``benchmarks/lm_step.py``'s module doc)."""
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


# -- the model and its weights ---------------------------------------------------------


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


def _jax_peak(estimate: Callable[[], int]) -> tuple[int, str]:
    stats = jax.devices()[0].memory_stats() or {}
    if "peak_bytes_in_use" in stats:
        return int(stats["peak_bytes_in_use"]), "device"
    return estimate(), "xla est."
