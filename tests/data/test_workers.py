"""Worker processes (Grain's mp_prefetch): the same stream, and positions that carry over.

One test on purpose: each worker process imports JAX and Grain, seconds on a small
machine.
"""

import json

import numpy as np

from fnnc.data import DataFrame


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
