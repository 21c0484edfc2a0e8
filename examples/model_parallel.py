"""A transformer trained on a 2x2 ("data", "model") mesh of 4 virtual CPU devices:
tensor parallelism (Megatron's layout) on one axis, data parallelism on the other.

The batch is split over "data"; each MLP's first dense is split by output features over
"model" and its second by input features, attention's q/k/v projections by heads and
its output projection by input features, the embedding by vocabulary
(``Model.compile(mesh=..., parameter_sharding="megatron")``, see
``fnnc.graph.sharding_rules``). XLA inserts the collectives. The script prints each
parameter's layout, the parameter bytes each device holds, and the loss per step;
``--compare`` also trains on one device and prints the largest loss difference.

Run: python examples/model_parallel.py [--steps N] [--compare]

JAX fixes the device count when it starts, so this script sets
``--xla_force_host_platform_device_count=4`` in ``XLA_FLAGS`` before importing it (added
to flags already set, unless they name a device count of their own).
"""

from __future__ import annotations

import argparse
import os

if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    flags = [os.environ.get("XLA_FLAGS", ""), "--xla_force_host_platform_device_count=4"]
    os.environ["XLA_FLAGS"] = " ".join(filter(None, flags))

VOCAB, LENGTH, WIDTH, HEADS = 16, 8, 32, 4


def make_model():
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
    )

    tokens = Input(name="tokens")
    h = Add()(
        Embedding(VOCAB, WIDTH, name="embed")(tokens),
        Parameter((LENGTH, WIDTH), init=0.0, name="positions")(),
    )
    for i in range(2):
        h = Add()(h, MultiHeadAttention(HEADS, name=f"attn{i}")(LayerNorm(name=f"ln{i}a")(h)))
        up = Dense(4 * WIDTH, name=f"mlp{i}a")(LayerNorm(name=f"ln{i}b")(h))
        h = Add()(h, Dense(WIDTH, name=f"mlp{i}b")(ReLU()(up)))
    logits = Dense(VOCAB, name="logits")(LayerNorm(name="ln_out")(h))
    return Model([tokens], [logits], name="reverser")


def batches(steps: int, size: int, seed: int = 0) -> list:
    """Sequences and their reversals (the task of examples/transformer.py)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(steps):
        x = rng.integers(0, VOCAB, size=(size, LENGTH)).astype(np.int32)
        out.append((x, x[:, ::-1].copy()))
    return out


def train(data: list, mesh=None, verbose: bool = False) -> tuple:
    """Trains a fresh model on ``data`` (on ``mesh`` with Megatron's rules if given)."""
    from fnnc.models import minimizers

    model = make_model()
    sharding = "megatron" if mesh is not None else None
    model.compile(
        [data[0][0]], loss="softmax_crossentropy", minimizer=minimizers.adam(3e-3),
        mesh=mesh, parameter_sharding=sharding,
    )  # fmt: skip
    if verbose:
        report_layout(model)
    losses = []
    for step, (x, y) in enumerate(data):
        losses.append(float(model.fit([x], [y])))
        if verbose:
            print(f"step {step + 1}: loss {losses[-1]:.4f}")
    return model, losses


def device_bytes(model) -> dict:
    """Device id -> bytes of the parameter shards it holds."""
    held: dict = {}
    for v in model.engine.values.values():
        for shard in v.addressable_shards:
            held[shard.device.id] = held.get(shard.device.id, 0) + shard.data.nbytes
    return dict(sorted(held.items()))


def report_layout(model) -> None:
    """Prints each split parameter's layout and the parameter bytes per device."""
    values = model.engine.values
    for pid, v in values.items():
        if any(v.sharding.spec):
            shard = list(v.addressable_shards[0].data.shape)
            print(f"  {pid:28s} {list(v.shape)!s:10s} {v.sharding.spec!s:20s} {shard}")
    total = sum(v.nbytes for v in values.values())
    print(f"parameters: {total} bytes in all")
    for device, n in device_bytes(model).items():
        print(f"  device {device}: {n} bytes ({n / total:.0%})")


def main(steps: int = 10, batch_size: int = 16, compare: bool = False) -> dict:
    import jax

    if jax.device_count() < 4:
        raise SystemExit(
            f"model_parallel: {jax.device_count()} device(s); run with "
            "--xla_force_host_platform_device_count=4 in XLA_FLAGS (or none there)"
        )
    mesh = jax.make_mesh((2, 2), ("data", "model"))
    data = batches(steps, batch_size)
    print("layouts on the 2x2 (data, model) mesh: parameter, shape, spec, shard")
    model, losses = train(data, mesh, verbose=True)
    result = {"losses": losses, "bytes": device_bytes(model)}
    result["total"] = sum(v.nbytes for v in model.engine.values.values())
    if compare:
        _, one = train(data)
        gap = max(abs(a - b) for a, b in zip(losses, one))
        print(f"largest loss difference to one device: {gap:.2e}")
        result["one_device"] = one
    return result


def positive_int(text: str) -> int:
    """An argparse type: a count that must be at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=positive_int, default=10)
    parser.add_argument("--batch", type=positive_int, default=16)
    parser.add_argument("--compare", action="store_true", help="also train on one device")
    args = parser.parse_args()
    main(args.steps, args.batch, args.compare)
