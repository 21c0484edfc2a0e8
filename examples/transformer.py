"""A small transformer that learns to reverse sequences (a generated task, no data files).

Tokens -> embedding + learned positions -> 2 pre-norm blocks (multi-head self-attention
and an MLP, residual) -> logits per position. Trained with fnnc's fused step.

Run: python examples/transformer.py [--steps N]
"""

from __future__ import annotations

import argparse

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

VOCAB, LENGTH, WIDTH = 10, 8, 64


def batch(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    x = rng.integers(0, VOCAB, size=(n, LENGTH)).astype(np.int32)
    return x, x[:, ::-1].copy()


def make_model(blocks: int = 2) -> Model:
    tokens = Input(name="tokens")
    h = Add()(
        Embedding(VOCAB, WIDTH, name="embed")(tokens),
        Parameter((LENGTH, WIDTH), init=0.0, name="positions")(),
    )
    for i in range(blocks):
        a = MultiHeadAttention(4, name=f"attn{i}")(LayerNorm(name=f"ln{i}a")(h))
        h = Add()(h, a)
        m = Dense(WIDTH, name=f"mlp{i}b")(
            ReLU()(Dense(4 * WIDTH, name=f"mlp{i}a")(LayerNorm(name=f"ln{i}b")(h)))
        )
        h = Add()(h, m)
    return Model(
        [tokens], [Dense(VOCAB, name="logits")(LayerNorm(name="ln_out")(h))], name="reverser"
    )


def main(steps: int = 600, batch_size: int = 64, seed: int = 0) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    model = make_model()
    x, y = batch(rng, batch_size)
    model.compile([x], loss="softmax_crossentropy", minimizer=minimizers.adam(2e-3))
    first = float(model.fit([x], [y]))
    loss = first
    for step in range(steps):
        x, y = batch(rng, batch_size)
        loss = float(model.fit([x], [y]))
        if (step + 1) % 200 == 0:
            print(f"step {step + 1}: loss {loss:.4f}")
    xt, yt = batch(np.random.default_rng(seed + 1), 256)
    logits = np.asarray(model.evaluate([xt]))
    token_accuracy = float(np.mean(logits.argmax(-1) == yt))
    print(f"reversal accuracy per token on fresh sequences: {token_accuracy:.4f}")
    return {"first_loss": first, "loss": loss, "accuracy": token_accuracy}


def positive_int(text: str) -> int:
    """An argparse type: a count that must be at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=positive_int, default=600)
    main(parser.parse_args().steps)
