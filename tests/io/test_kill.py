"""A checkpoint writer killed with SIGKILL at random moments loses nothing it committed."""

import os
import random
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time

import numpy as np

from fnnc.io import Checkpoints, TensorFile
from tests.helpers import subprocess_env

KILLS, KEEP = 20, 4

# A fork server: it imports fnnc once, then forks one writer per kill, so twenty kills
# cost twenty forks instead of twenty interpreter starts (about a second each). The
# writers use NumPy and SQLite only; nothing JAX starts crosses the fork. Each line is
# one os.write of a few bytes, which a pipe delivers whole: print() is two writes when
# stdout is unbuffered (PYTHONUNBUFFERED, as some CI machines set), and a kill between
# them left a step without its newline ("75killed").
SERVER = textwrap.dedent(
    """
    import os, sys
    import numpy as np
    from fnnc.io import Checkpoints

    def state(step):
        rng = np.random.default_rng(step)
        w = rng.standard_normal((600, 1000), np.float32)
        return {"w": w, "i": rng.integers(0, 9, 50_000)}

    def write(path, keep):
        with Checkpoints(path, keep_last=keep) as ckpt:
            step = (ckpt.latest or 0) + 1
            say(f"ready {os.getpid()}")
            while True:
                ckpt.save(step, state(step), metadata={"step": step})
                say(str(step))
                step += 1

    def say(line):
        os.write(1, (line + "\\n").encode())

    for line in sys.stdin:
        pid = os.fork()
        if pid == 0:
            write(sys.argv[1], int(sys.argv[2]))
        os.waitpid(pid, 0)
        say("killed")
    """
)


def state(step):
    rng = np.random.default_rng(step)
    w = rng.standard_normal((600, 1000), np.float32)
    return {"w": w, "i": rng.integers(0, 9, 50_000)}


def test_sigkill_at_random_moments(tmp_path):
    script, path = tmp_path / "server.py", str(tmp_path / "run.ckpt")
    script.write_text(SERVER)
    env = subprocess_env()
    rng = random.Random(20240611)
    committed: list[int] = []
    hot_journals = 0
    server = subprocess.Popen(
        [sys.executable, str(script), path, str(KEEP)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
    )
    assert server.stdin is not None and server.stdout is not None
    try:
        for _ in range(KILLS):
            server.stdin.write(b"go\n")
            server.stdin.flush()
            ready, pid = server.stdout.readline().split()
            assert ready == b"ready"
            # let 0-2 saves commit (so the test progresses however loaded the machine
            # is), then kill at a random moment, most often in the middle of a save
            for _ in range(rng.randint(0, 2)):
                committed.append(int(server.stdout.readline()))
            time.sleep(rng.uniform(0.0, 0.3))
            os.kill(int(pid), signal.SIGKILL)
            while (line := server.stdout.readline()) != b"killed\n":
                assert line, "the fork server died"
                committed.append(int(line))
            _check_after_kill(path, committed)
            hot_journals += os.path.exists(path + "-journal")
    finally:
        server.kill()
        server.communicate()
    assert len(committed) >= KILLS // 2, committed
    print(f"{len(committed)} saves committed, {hot_journals} kills left a hot journal")


def _check_after_kill(path: str, committed: list[int]) -> None:
    """Every committed step restores bit-exactly and nothing else is in the file."""
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
