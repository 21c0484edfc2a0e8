"""Worker processes (Grain's mp_prefetch): the same stream, and positions that carry over.

Few tests on purpose: each worker process imports JAX and Grain, seconds on a small
machine.
"""

import json

import numpy as np

from fnnc.data import DataFrame, release_workers


def square(v):
    return v * v


def test_two_workers_give_the_stream_of_none_and_states_carry_over(tmp_path):
    mm = np.memmap(tmp_path / "x.dat", np.float32, "w+", shape=(300, 2))
    mm[:] = np.arange(600, dtype=np.float32).reshape(300, 2)
    mm.flush()
    data = np.memmap(tmp_path / "x.dat", np.float32, "r", shape=(300, 2))
    df = DataFrame.from_arrays(x=data[:250], i=np.arange(250)).map(square, "i", "i2")
    df = df.shuffle().batch(16)

    def plain(batches):  # copies out of Grain's shared memory, which is freed on drop
        return [(b["x"].tolist(), b["i2"].tolist()) for b in batches]

    reference = plain(df.iterator(epochs=2, workers=0, threads=0))
    assert len(reference) == 32
    with df.iterator(epochs=2, workers=2) as it:
        head = plain(it.take(20))  # into the second epoch
        state = json.loads(json.dumps(it.get_state()))
        tail = plain(it)
    assert head + tail == reference

    without = df.iterator(epochs=2)  # no workers: restarted at the saved position
    without.set_state(state)
    assert plain(without) == reference[20:]


def test_set_state_to_another_seed_never_takes_or_parks_the_other_seeds_workers():
    df = DataFrame.from_arrays(x=np.arange(8)).shuffle().batch(4)
    n = len(df)

    def plain(it):
        return [b.tolist() for b in it]

    ref = {s: plain(df.iterator("x", seed=s, epochs=2, workers=0)) for s in (0, 5)}
    assert ref[0][n:] != ref[5][n:]
    at_epoch_1 = df.iterator("x", seed=5, epochs=2)
    at_epoch_1.take(n)
    state5 = at_epoch_1.get_state()
    try:
        # seed 0 parks its workers at epoch 1; a seed-0 iterator moved to seed 5 by
        # set_state must read seed 5, not take them
        assert plain(df.iterator("x", seed=0, workers=2)) == ref[0][:n]
        moved = df.iterator("x", seed=0, workers=2)
        moved.set_state(state5)
        assert plain(moved) == ref[5][n:]
        # the other way: moved to seed 5, it parks under seed 5, and a genuine seed-0
        # iterator at epoch 1 reads seed 0
        moved = df.iterator("x", seed=0, workers=2)
        moved.set_state(df.iterator("x", seed=5).get_state())
        assert plain(moved) == ref[5][:n]
        assert plain(df.iterator("x", seed=0, epoch=1, workers=2)) == ref[0][n:]
    finally:
        release_workers()
