"""The main job: a small CNN on scikit-learn's bundled handwritten digits (no download).

1797 grey 8x8 images, a fixed 80/20 split and seed. The model is a cnnp functional
model compiled through fnnc's symbolic graph (forward, loss, backward and the Adam
update are one compiled program) and trained with a progress bar.

Run: python examples/digits.py [--epochs N] [--quiet]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from sklearn.datasets import load_digits

from fnnc.models import BatchNorm, Conv, Dense, Flatten, MaxPool, ReLU, Sequential, minimizers


def load(seed: int = 0) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """((x_train, y_train), (x_test, y_test)); images NHWC float32 in [0, 1]."""
    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)[..., None]
    y = digits.target.astype(np.int32)
    order = np.random.default_rng(seed).permutation(len(x))
    cut = int(0.8 * len(x))
    train, test = order[:cut], order[cut:]
    return (x[train], y[train]), (x[test], y[test])


def make_model() -> Sequential:
    return Sequential(
        [
            Conv(16, (3, 3), name="conv1"),
            BatchNorm(name="bn1"),
            ReLU(),
            MaxPool((2, 2)),
            Conv(32, (3, 3), name="conv2"),
            BatchNorm(name="bn2"),
            ReLU(),
            MaxPool((2, 2)),
            Flatten(),
            Dense(64, name="fc1"),
            ReLU(),
            Dense(10, name="logits"),
        ],
        name="digits",
    )


def main(epochs: int = 12, batch_size: int = 32, progress: bool | None = None) -> dict[str, float]:
    start = time.perf_counter()
    train_data, test_data = load()
    model = make_model()
    model.compile(
        [train_data[0][:batch_size]], loss="softmax_crossentropy", minimizer=minimizers.adam(3e-3)
    )
    history = model.train(
        train_data, epochs=epochs, batch_size=batch_size, validation=test_data, progress=progress
    )
    test_accuracy = model.score(test_data, metrics=["accuracy"])["accuracy"]
    seconds = time.perf_counter() - start
    print(f"epochs {epochs}: final training loss {history['loss'][-1]:.4f}")
    print(f"test accuracy: {test_accuracy:.4f} ({len(test_data[1])} images) in {seconds:.1f} s")
    return {"accuracy": test_accuracy, "seconds": seconds, "loss": history["loss"][-1]}


def positive_int(text: str) -> int:
    """An argparse type: a count that must be at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=positive_int, default=12)
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args()
    main(args.epochs, progress=False if args.quiet else None)
