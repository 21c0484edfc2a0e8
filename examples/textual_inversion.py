"""Textual inversion: a frozen model, and one new input embedding trained to steer it.

1. Pretrain a small classifier over token-embedding sequences ([N, T, D] -> 4 classes;
   the class is the first token mod 4).
2. Freeze it (``is_trainable=False``: no parameter gets a gradient or optimizer state).
3. Learn a *new* pseudo-token embedding: put it first in random sentences and follow the
   model's gradient w.r.t. its inputs (``evaluate(requires_grad=True)`` + ``backward``),
   until the frozen model reads the pseudo-token as class 2.

Run: python examples/textual_inversion.py [--pretrain-steps N] [--inversion-steps N]
"""

from __future__ import annotations

import argparse

import numpy as np
import optax

from fnnc.models import Dense, Flatten, ReLU, Sequential, minimizers

VOCAB, LENGTH, DIM, CLASSES, TARGET = 16, 6, 8, 4, 2


def sentences(rng: np.random.Generator, table: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    tokens = rng.integers(0, VOCAB, size=(n, LENGTH))
    return table[tokens].astype(np.float32), (tokens[:, 0] % CLASSES).astype(np.int32)


def main(pretrain_steps: int = 300, inversion_steps: int = 150, seed: int = 0) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    table = rng.normal(size=(VOCAB, DIM)).astype(np.float32)
    model = Sequential(
        [Flatten(), Dense(64, name="fc1"), ReLU(), Dense(CLASSES, name="fc2")], name="classifier"
    )
    x, _ = sentences(rng, table, 64)
    model.compile([x], loss="softmax_crossentropy", minimizer=minimizers.adam(1e-2))
    for _ in range(pretrain_steps):
        model.fit(*map(lambda a: [a], sentences(rng, table, 64)))
    xt, yt = sentences(rng, table, 512)
    pretrained = float(np.mean(np.asarray(model.evaluate([xt])).argmax(-1) == yt))
    print(f"pretrained classifier accuracy: {pretrained:.4f}")

    model.is_trainable = False  # frozen: backward computes input gradients only
    frozen = {k: np.asarray(v).copy() for k, v in model.parameters().items()}
    pseudo = rng.normal(size=(DIM,)).astype(np.float32)
    opt = optax.adam(5e-2)
    state = opt.init(pseudo)
    for _ in range(inversion_steps):
        x, _ = sentences(rng, table, 32)
        x[:, 0] = pseudo
        logits = np.asarray(model.evaluate([x], requires_grad=True))
        probs = np.exp(logits - logits.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        dlogits = (probs - np.eye(CLASSES, dtype=np.float32)[TARGET]) / len(x)
        (dx,) = model.backward([dlogits.astype(np.float32)])
        grad = np.asarray(dx)[:, 0].sum(0)
        update, state = opt.update(grad, state, pseudo)
        pseudo = np.asarray(optax.apply_updates(pseudo, update))
    x, _ = sentences(rng, table, 512)
    x[:, 0] = pseudo
    hit = float(np.mean(np.asarray(model.evaluate([x])).argmax(-1) == TARGET))
    unchanged = all(np.array_equal(frozen[k], np.asarray(v)) for k, v in model.parameters().items())
    print(f"sentences led by the learned pseudo-token read as class {TARGET}: {hit:.4f}")
    print(f"frozen model parameters unchanged: {unchanged}")
    return {"pretrained": pretrained, "hit": hit, "unchanged": float(unchanged)}


def positive_int(text: str) -> int:
    """An argparse type: a count that must be at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pretrain-steps", type=positive_int, default=300)
    parser.add_argument("--inversion-steps", type=positive_int, default=150)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    main(args.pretrain_steps, args.inversion_steps, args.seed)
