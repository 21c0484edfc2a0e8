"""A checkpoint writer killed with SIGKILL at random moments loses nothing it committed."""

import os
import pathlib
import random
import sqlite3
import subprocess
import sys
import textwrap
import time

import numpy as np

from fnnc.io import Checkpoints, TensorFile

KILLS, KEEP = 20, 4
ROOT = pathlib.Path(__file__).parents[2]

WRITER = textwrap.dedent(
    """
    import sys
    import numpy as np
    from fnnc.io import Checkpoints

    def state(step):
        rng = np.random.default_rng(step)
        w = rng.standard_normal((600, 1000), np.float32)
        return {"w": w, "i": rng.integers(0, 9, 50_000)}

    with Checkpoints(sys.argv[1], keep_last=int(sys.argv[2])) as ckpt:
        step = (ckpt.latest or 0) + 1
        print("ready", flush=True)
        while True:
            ckpt.save(step, state(step), metadata={"step": step})
            print(step, flush=True)
            step += 1
    """
)


def state(step):
    rng = np.random.default_rng(step)
    w = rng.standard_normal((600, 1000), np.float32)
    return {"w": w, "i": rng.integers(0, 9, 50_000)}


def test_sigkill_at_random_moments(tmp_path):
    script, path = tmp_path / "writer.py", str(tmp_path / "run.ckpt")
    script.write_text(WRITER)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}
    rng = random.Random(20240611)
    committed: list[int] = []
    hot_journals = 0
    for _ in range(KILLS):
        child = subprocess.Popen(
            [sys.executable, str(script), path, str(KEEP)], stdout=subprocess.PIPE, env=env
        )
        assert child.stdout is not None
        assert child.stdout.readline() == b"ready\n"
        time.sleep(rng.uniform(0.0, 0.3))
        child.kill()
        out, _ = child.communicate()
        committed += [int(line) for line in out.split()]
        hot_journals += os.path.exists(path + "-journal")

        with TensorFile(path, readonly=True) as f:  # a reader rolls the half-written save back
            assert all(n.startswith("__ckpt-") for n in f.names())
        conn = sqlite3.connect(path)
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        conn.close()
        with Checkpoints(path) as ckpt:
            steps = ckpt.steps()
            if committed:
                assert committed[-1] in steps
                # a save may commit just before its line is printed: then one step more
                unreported = [s for s in steps if s > committed[-1]]
                assert unreported in ([], [committed[-1] + 1])
                committed += unreported
                assert steps == committed[-len(steps) :] and len(steps) == min(KEEP, len(committed))
            for step in steps:
                got = ckpt.restore(step)
                want = state(step)
                assert got.metadata == {"step": step}
                assert got.state["w"].tobytes() == want["w"].tobytes()
                assert np.array_equal(got.state["i"], want["i"])
    assert len(committed) >= KILLS // 2, committed
    print(f"{len(committed)} saves committed, {hot_journals} kills left a hot journal")
