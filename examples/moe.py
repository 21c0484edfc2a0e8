"""A small mixture-of-experts transformer that learns to reverse sequences (a generated
task, no data files), printing its loss and how many token rows each expert received.

Tokens -> embedding + learned positions -> pre-norm blocks of multi-head self-attention
and a top-2 mixture of 4 SwiGLU experts (router -> moe_routing -> the experts as
segmented GEMMs -> weighted combine), residual -> logits per position. The model's
extra outputs are each MoE layer's expert load; the loss reads the logits only.

Run: python examples/moe.py [--steps N]
"""

from __future__ import annotations

import argparse

import numpy as np

from fnnc.models import (
    Add,
    Dense,
    Embedding,
    Input,
    Model,
    MoE,
    MultiHeadAttention,
    Parameter,
    RMSNorm,
    minimizers,
)

VOCAB, LENGTH, WIDTH, EXPERTS = 10, 8, 32, 4


def batch(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    x = rng.integers(0, VOCAB, size=(n, LENGTH)).astype(np.int32)
    return x, x[:, ::-1].copy()


def make_model(blocks: int = 2) -> Model:
    tokens = Input(name="tokens")
    h = Add()(
        Embedding(VOCAB, WIDTH, name="embed")(tokens),
        Parameter((LENGTH, WIDTH), init=0.0, name="positions")(),
    )
    loads = []
    for i in range(blocks):
        h = Add()(h, MultiHeadAttention(4, name=f"attn{i}")(RMSNorm(name=f"norm{i}a")(h)))
        moe = MoE(EXPERTS, 2 * WIDTH, k=2, return_load=True, name=f"moe{i}")
        m, load = moe(RMSNorm(name=f"norm{i}b")(h))
        h = Add()(h, m)
        loads.append(load)
    logits = Dense(VOCAB, name="logits")(RMSNorm(name="norm_out")(h))
    return Model([tokens], [logits, *loads], name="moe_reverser")


def main(steps: int = 400, batch_size: int = 64, seed: int = 0) -> dict[str, object]:
    rng = np.random.default_rng(seed)
    model = make_model()
    x, y = batch(rng, batch_size)
    model.compile([x], loss="softmax_crossentropy", minimizer=minimizers.adam(3e-3))
    first = float(model.fit([x], [y]))
    loss = first
    for step in range(steps):
        x, y = batch(rng, batch_size)
        loss = float(model.fit([x], [y]))
        if (step + 1) % 100 == 0:
            print(f"step {step + 1}: loss {loss:.4f}")
    xt, yt = batch(np.random.default_rng(seed + 1), 256)
    logits, *loads = model.evaluate([xt])
    accuracy = float(np.mean(np.asarray(logits).argmax(-1) == yt))
    print(f"first loss {first:.4f}, final loss {loss:.4f}, reversal accuracy {accuracy:.4f}")
    shares = []
    for i, load in enumerate(loads):
        share = np.asarray(load) / np.sum(load)
        shares.append(share)
        print(f"expert load, layer {i}: " + " ".join(f"{s:.2f}" for s in share))
    return {"first_loss": first, "loss": loss, "accuracy": accuracy, "load": shares}


def positive_int(text: str) -> int:
    """An argparse type: a count that must be at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=positive_int, default=400)
    main(parser.parse_args().steps)
