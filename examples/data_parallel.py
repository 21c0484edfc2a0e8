"""The digits CNN trained data-parallel: over N devices of one process, or N processes.

Both runs feed the same global batches (``--batch`` images per step, a fixed shuffle
per epoch), so they print the same losses as one device does:

    python examples/data_parallel.py --devices 4      # 4 virtual CPU devices, 1 process
    python examples/data_parallel.py --processes 2    # 2 local processes (gloo on CPU)
    python examples/data_parallel.py --devices 1      # the single-device reference

``--devices N`` re-executes this script with
``XLA_FLAGS=--xla_force_host_platform_device_count=N`` (JAX fixes the device count
when it starts) and calls ``model.set_data_parallel(N)``. ``--processes N`` picks a
free port, starts N workers of this script on localhost (one CPU device each) and
waits for them (``--timeout`` seconds, then they are killed). Each worker calls
``jax.distributed.initialize`` and ``model.set_data_parallel(0)`` (every device of
every process) and feeds only its slice of each global batch; fnnc assembles the
global array (``jax.make_array_from_process_local_data``). Only process 0 prints and
writes files (``--save``).

On a real cluster, start one worker per host with the coordinator's address (host 0
listens on it), the process count and each host's rank, e.g. on host ``k`` of 4::

    python examples/data_parallel.py --worker k --processes 4 \\
        --coordinator host0.example.com:12355

(on GPUs drop ``JAX_PLATFORMS=cpu``; under SLURM or on Cloud TPU
``jax.distributed.initialize()`` finds all three by itself).
Add ``--fsdp`` to split parameters and Adam state over the devices instead of
replicating them.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # examples/digits.py


def free_port() -> int:
    """A TCP port nothing listens on now (for the local coordinator)."""
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return int(s.getsockname()[1])


def train(args: argparse.Namespace, rank: int = 0, processes: int = 1) -> dict:
    """Trains with ``args``; returns ``{"losses": [...], "accuracy": ...}`` (every rank)."""
    import numpy as np
    from digits import load, make_model

    from fnnc.models import minimizers

    (xs, ys), (xt, yt) = load()
    model = make_model()
    model.set_data_parallel(0, parameter_sharding="fsdp" if args.fsdp else "replicated")
    local = args.batch // processes
    opt = minimizers.sgd(0.05, momentum=0.9) if args.sgd else minimizers.adam(3e-3)
    model.compile([xs[:local]], loss="softmax_crossentropy", minimizer=opt)
    steps = args.steps or len(xs) // args.batch
    losses = []
    for epoch in range(args.epochs):
        order = np.random.default_rng((0, epoch)).permutation(len(xs))
        total = 0.0
        for k in range(steps):
            idx = order[k * args.batch : (k + 1) * args.batch][rank * local : (rank + 1) * local]
            total += float(model.fit(xs[idx], ys[idx]))
        losses.append(total / steps)
        if rank == 0:
            print(f"epoch {epoch + 1}: loss {losses[-1]:.6f}", flush=True)
    part = len(xt) // processes  # each process evaluates its share; outputs are gathered
    outputs = np.asarray(model.evaluate(xt[rank * part : (rank + 1) * part]))
    accuracy = float(np.mean(outputs.argmax(-1) == yt[: part * processes]))
    params = model.parameters()  # every process: gathering FSDP slices is a collective
    if rank == 0:
        print(f"test accuracy: {accuracy:.4f}", flush=True)
        if args.save:
            np.savez(args.save, **{k: np.asarray(v) for k, v in params.items()})
    return {"losses": losses, "accuracy": accuracy}


def worker(args: argparse.Namespace) -> None:
    """One process of a multi-process run."""
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=args.coordinator,
        num_processes=args.processes,
        process_id=args.worker,
        initialization_timeout=args.timeout,
    )
    try:
        train(args, jax.process_index(), jax.process_count())
    finally:
        jax.distributed.shutdown()


def cpu_environment(devices: int) -> dict[str, str]:
    """This environment on ``devices`` CPU devices, the other XLA flags set here kept."""
    count = "--xla_force_host_platform_device_count"
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith(count)]
    flags.append(f"{count}={devices}")
    return dict(os.environ, XLA_FLAGS=" ".join(flags), JAX_PLATFORMS="cpu")


def launch(args: argparse.Namespace, argv: list[str]) -> int:
    """Starts ``args.processes`` local workers; kills them all at the timeout or a failure."""
    coordinator = f"localhost:{free_port()}"
    env = cpu_environment(1)  # one CPU device per process
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, *argv, "--worker", str(r), "--coordinator", coordinator],
            env=env,
        )
        for r in range(args.processes)
    ]
    deadline = time.monotonic() + args.timeout
    try:
        while any(p.poll() is None for p in procs):
            if time.monotonic() > deadline or any(p.poll() not in (None, 0) for p in procs):
                break
            time.sleep(0.1)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    codes = [p.returncode for p in procs]
    if any(codes):
        print(f"workers exited with {codes} (timeout {args.timeout} s)", file=sys.stderr)
        return 1
    return 0


def positive_int(text: str) -> int:
    """An argparse type: a count that must be at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


def natural_int(text: str) -> int:
    """An argparse type: a count that may be 0 (its default meaning) but not negative."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text}")
    return value


def check_batches(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuses (``parser.error``) global batches that the processes cannot split evenly
    or that the training images cannot fill: each step must feed ``--batch`` images."""
    from digits import load

    n = len(load()[0][0])
    if args.processes and args.batch % args.processes:
        parser.error(
            f"--batch {args.batch} does not split over {args.processes} processes (each "
            f"feeds batch / processes images per step); give a multiple of {args.processes}"
        )
    if args.batch > n:
        parser.error(f"--batch {args.batch} is larger than the {n} training images")
    if args.steps * args.batch > n:
        parser.error(
            f"--steps {args.steps} x --batch {args.batch} = {args.steps * args.batch} images "
            f"per epoch, more than the {n} training images; give --steps <= "
            f"{n // args.batch} (or 0: all of them)"
        )


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--devices", type=natural_int, default=0, help="virtual devices, one process"
    )
    parser.add_argument("--processes", type=natural_int, default=0, help="local processes")
    parser.add_argument("--epochs", type=positive_int, default=3)
    parser.add_argument("--steps", type=natural_int, default=0, help="steps per epoch (0: all)")
    parser.add_argument("--batch", type=positive_int, default=32, help="global batch size")
    parser.add_argument("--fsdp", action="store_true", help="shard parameters and state")
    parser.add_argument("--sgd", action="store_true", help="SGD with momentum, not Adam")
    parser.add_argument("--save", default="", help="write the parameters (.npz), process 0")
    parser.add_argument("--timeout", type=positive_int, default=300, help="seconds for a run")
    parser.add_argument("--worker", type=int, default=-1, help=argparse.SUPPRESS)
    parser.add_argument("--coordinator", default="", help="host:port of process 0")
    args = parser.parse_args(argv)
    check_batches(parser, args)
    if args.worker >= 0:
        worker(args)
        return 0
    if args.processes:
        return launch(args, argv)
    n = args.devices or 1
    flag = f"--xla_force_host_platform_device_count={n}"
    if flag not in os.environ.get("XLA_FLAGS", "").split():
        return subprocess.run([sys.executable, __file__, *argv], env=cpu_environment(n)).returncode
    train(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
