"""A run killed with SIGKILL and resumed from its checkpoints equals one that was not."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np

from tests.helpers import subprocess_env

RUN = textwrap.dedent(
    """
    import sys, time
    import numpy as np, optax
    from fnnc.data import DataFrame
    from fnnc.models import CheckpointEvery, Dense, Dropout, Input, Model, ReLU

    path, out, hang_at = sys.argv[1], sys.argv[2], int(sys.argv[3])
    rng = np.random.default_rng(0)
    xs = rng.standard_normal((48, 4)).astype(np.float32)
    frame = DataFrame.from_arrays(x=xs, y=np.argmax(xs[:, :3], axis=1))
    x = Input()
    h = Dropout(0.2)(ReLU()(Dense(8, name="fc1")(x)))
    model = Model(x, Dense(3, name="fc2")(h))
    model.compile(xs[:8], loss="softmax_crossentropy", minimizer=optax.adam(0.05))

    class Hang:
        def on_train_begin(self, loop): ...
        def on_epoch_end(self, loop, epoch, logs): ...
        def on_train_end(self, loop): ...
        def on_step_end(self, loop, step, loss):
            if step == hang_at:
                print("hang", flush=True)
                time.sleep(600)

    callbacks = [CheckpointEvery(path, steps=4), Hang()] if path != "-" else []
    model.train(frame, epochs=2, batch_size=8, resume=None if path == "-" else path,
                callbacks=callbacks, verbose=False)
    np.savez(out, **model.parameters())
    print("done", flush=True)
    """
)


def test_sigkill_and_resume_equals_an_uninterrupted_run(tmp_path):
    script, path = tmp_path / "run.py", str(tmp_path / "run.ckpt")
    script.write_text(RUN)
    env = subprocess_env()

    def run(ckpt, out, hang_at):
        args = [sys.executable, str(script), ckpt, str(tmp_path / out), str(hang_at)]
        return subprocess.Popen(args, stdout=subprocess.PIPE, env=env)

    child = run(path, "killed.npz", 10)  # epoch 2, batch 4; the last save was step 8
    assert child.stdout is not None
    assert child.stdout.readline() == b"hang\n"
    child.kill()
    child.communicate()
    assert child.returncode == -9 and not (tmp_path / "killed.npz").exists()

    resumed, full = run(path, "resumed.npz", -1), run("-", "full.npz", -1)
    assert resumed.communicate()[0].split()[-1] == b"done"
    assert full.communicate()[0].split()[-1] == b"done"
    a, b = np.load(tmp_path / "resumed.npz"), np.load(tmp_path / "full.npz")
    assert sorted(a.files) == sorted(b.files)
    for name in a.files:
        np.testing.assert_array_equal(a[name], b[name])
