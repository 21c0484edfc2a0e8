"""Two local processes (``jax.distributed`` with gloo CPU collectives) train the digits
CNN as one device does on the same global batches (``examples/data_parallel.py``).

Both sides run as CPU processes of the example (``--devices 1`` is its single-device
reference), so on a GPU machine too the test compares process counts, not platforms."""

from __future__ import annotations

import importlib.util
import re
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import subprocess_env

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "data_parallel.py"


def _example():
    spec = importlib.util.spec_from_file_location("data_parallel_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(EXAMPLE.parent))
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("fsdp", [False, True], ids=["replicated", "fsdp"])
def test_two_processes_match_one_device(tmp_path, capfd, fsdp):
    example = _example()
    flags = ["--epochs", "2", "--steps", "3", "--batch", "32", "--sgd", "--timeout", "240"]
    flags += ["--fsdp"] if fsdp else []
    two_path, one_path = tmp_path / "two.npz", tmp_path / "one.npz"
    # launches 2 workers on a free localhost port, kills them at the timeout
    assert example.main([*flags, "--processes", "2", "--save", str(two_path)]) == 0
    printed = capfd.readouterr().out
    # one device, the whole global batch (a CPU process, as the workers are)
    assert example.main([*flags, "--devices", "1", "--save", str(one_path)]) == 0
    alone = capfd.readouterr().out
    losses, want = (
        [float(x) for x in re.findall(r"epoch \d+: loss (\S+)", out)] for out in (printed, alone)
    )
    assert len(losses) == len(want) == 2, (printed, alone)
    np.testing.assert_allclose(losses, want, rtol=1e-5, atol=1e-5, err_msg=printed + alone)
    two, ref = np.load(two_path), np.load(one_path)
    assert sorted(two.files) == sorted(ref.files) and len(ref.files) == 16
    for key in ref.files:
        assert two[key].dtype == np.float32
        np.testing.assert_allclose(two[key], ref[key], rtol=1e-5, atol=1e-5, err_msg=key)


# -- predict, score and validation over processes: one run of 2 workers ----------------
WORKER = textwrap.dedent(
    """
    import sys
    import jax, numpy as np, optax
    rank, coordinator = int(sys.argv[1]), sys.argv[2]
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=coordinator, num_processes=2,
                               process_id=rank, initialization_timeout=60)
    from fnnc.errors import ShapeError
    from fnnc.models import Dense, Input, Model

    rng = np.random.default_rng(0)
    X = rng.standard_normal((16, 5)).astype(np.float32)
    Y = rng.integers(0, 3, 16).astype(np.int32)
    W = rng.standard_normal((3, 5)).astype(np.float32)
    B = rng.standard_normal(3).astype(np.float32)

    def oracle(w, b):  # NumPy over the union of both processes' rows, in process order
        z = X @ w.T + b
        z = z - z.max(-1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
        return X @ w.T + b, -logp[np.arange(16), Y].mean(), (z.argmax(-1) == Y).mean()

    from jax.sharding import Mesh
    from fnnc.errors import ModelError
    from fnnc.models.parallel import Parallel
    grid = np.array(jax.devices()).reshape(2, 2)  # a batch axis of process 1 first, or mixed
    for mesh in (Mesh(grid.ravel()[::-1], ("data",)), Mesh(grid.T, ("data", "model"))):
        try:
            Parallel.of(mesh, "replicated")
            raise AssertionError(f"no error: {mesh}")
        except ModelError as e:
            assert "in that order" in str(e), e
    x = Input()
    m = Model(x, Dense(3, name="fc")(x))
    m.set_data_parallel(0)  # 2 processes x 2 devices
    m.compile(X[:4], loss="softmax_crossentropy", minimizer=optax.sgd(0.1))
    m.set_parameters({"t-fc-0-0": W, "t-fc-0-1": B})
    mine = slice(8 * rank, 8 * rank + 8)
    logits, loss, acc = oracle(W, B)
    # batches of 3 local rows (padded to 4: 2 devices each), the last of 2
    np.testing.assert_allclose(m.predict(X[mine], batch_size=3), logits, rtol=1e-5, atol=1e-5)
    got = m.score(X[mine], Y[mine], batch_size=3)
    np.testing.assert_allclose([got["loss"], got["accuracy"]], [loss, acc], rtol=1e-5)
    # backward: the output gradients of every process's rows, shaped as evaluate's outputs
    out = m.evaluate(X[mine], is_test=False, requires_grad=True)
    G = np.cos(np.arange(48, dtype=np.float32)).reshape(16, 3)
    try:  # this process's rows alone: a fnnc error saying which rows, not a Program's
        m.backward([G[mine]])
        raise AssertionError("no error")
    except ShapeError as e:
        assert "ingrads 0 is [8, 3]" in str(e) and "every process's rows" in str(e), e
    (dx,) = m.backward([G])
    np.testing.assert_allclose(out, logits, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dx, G @ W, rtol=1e-5, atol=1e-5)
    m.apply_gradients()
    p = m.parameters()
    np.testing.assert_allclose(p["t-fc-0-0"], W - 0.1 * G.T @ X, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(p["t-fc-0-1"], B - 0.1 * G.sum(0), rtol=1e-5, atol=1e-5)
    h = m.train((X[mine], Y[mine]), batch_size=4, validation=(X[mine], Y[mine]), verbose=False)
    p = m.parameters()
    _, loss, acc = oracle(np.asarray(p["t-fc-0-0"]), np.asarray(p["t-fc-0-1"]))
    np.testing.assert_allclose([h["val_loss"][0], h["val_accuracy"][0]], [loss, acc], rtol=1e-5)
    # a process with other rows: the same fnnc error on both, no hang
    n = 8 if rank == 0 else 6
    disagree = [
        (lambda: m.evaluate(X[: 4 if rank == 0 else 2]),
         "the rows of each input (process 0: 4; process 1: 2)"),
        (lambda: m.train((X[:n], Y[:n]), batch_size=2, verbose=False),
         "the number of batches per epoch (process 0: 4; process 1: 3)"),
        (lambda: m.predict(X[:n], batch_size=4),
         "the number of rows to predict (process 0: 8; process 1: 6)"),
        (lambda: m.score(X[:n], Y[:n], batch_size=4),
         "the rows of batch 1 of the set (process 0: 4 rows; process 1: 2 rows)"),
    ]
    for call, want in disagree:
        try:
            call()
            raise AssertionError(f"no error: {want}")
        except ShapeError as e:
            assert "the processes disagree on " + want in str(e), e
    print("OK", flush=True)
    """
)


def test_two_processes_predict_score_and_validate_the_union_of_their_rows():
    """Each process passes its 8 rows: predict gives all 16 in process order, score and
    train(validation=) the NumPy loss and accuracy of all 16 on both, backward takes and
    gives the gradients of all 16 (NumPy's); a process passing
    other rows or batches gets the same ShapeError as the other, within the timeout."""
    with socket.socket() as s:
        s.bind(("localhost", 0))
        coordinator = f"localhost:{s.getsockname()[1]}"
    env = subprocess_env(XLA_FLAGS="--xla_force_host_platform_device_count=2")
    procs = [
        subprocess.Popen([sys.executable, "-c", WORKER, str(r), coordinator], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for r in range(2)
    ]  # fmt: skip
    deadline, outs = time.monotonic() + 180, []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=max(1.0, deadline - time.monotonic()))[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    text = "\n".join(o[-3000:] for o in outs)
    assert [p.returncode for p in procs] == [0, 0], text
    assert all(o.rstrip().endswith("OK") for o in outs), text
