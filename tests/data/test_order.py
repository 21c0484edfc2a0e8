"""Order: seeds, epochs, shards, and iterator positions that survive a checkpoint."""

import json

import numpy as np
import pytest

from fnnc.data import DataError, DataFrame


def concat(lists):
    return [v for part in lists for v in part]


def frame(n=50):
    return DataFrame.from_arrays(x=np.arange(n))


def xs(it):
    return [np.asarray(b).tolist() for b in it]


def test_same_seed_same_order_other_seed_other_order():
    df = frame().shuffle().batch(8)
    a, b = xs(df.iterator("x", seed=3)), xs(df.iterator("x", seed=3))
    assert a == b
    assert a != xs(df.iterator("x", seed=4))
    assert sorted(concat(a)) == list(range(50))


def test_a_shuffle_with_its_own_seed_ignores_the_iterator_seed():
    df = frame().shuffle(seed=11)
    assert xs(df.iterator("x", seed=0)) == xs(df.iterator("x", seed=99))


def test_epochs_differ_and_replay():
    df = frame().shuffle()
    e0, e1 = xs(df.iterator("x", epoch=0)), xs(df.iterator("x", epoch=1))
    assert e0 != e1 and sorted(e0) == sorted(e1) == list(range(50))
    assert xs(df.iterator("x", epoch=1)) == e1
    # seeds are hashed before the epoch is mixed in: (seed 0, epoch 1) != (seed 1, epoch 0)
    assert xs(df.iterator("x", seed=1, epoch=0)) != e1


def test_one_iterator_over_epochs_continues_the_per_epoch_sequence():
    df = frame(10).shuffle().batch(4)
    per_epoch = [xs(df.iterator("x", epoch=e)) for e in range(3)]
    together = df.iterator("x", epoch=0, epochs=3)
    assert xs(together) == concat(per_epoch)
    endless = df.iterator("x", epoch=1, epochs=None)
    assert xs(endless.take(6)) == per_epoch[1] + per_epoch[2]
    assert (endless.epoch, endless.step) == (3, 0)


def test_random_maps_replay_per_epoch_and_differ_between_epochs():
    df = frame(6).map(lambda x, rng: x + rng.random(), "x", "noisy", random=True)
    e0 = xs(df.iterator("noisy", epoch=0))
    assert xs(df.iterator("noisy", epoch=0)) == e0
    assert xs(df.iterator("noisy", epoch=1)) != e0
    assert [int(v) for v in e0] == list(range(6))


@pytest.mark.parametrize("rows", [50, 53])
def test_shards_are_disjoint_and_cover(rows):
    df = frame(rows).shuffle()
    shards = [xs(df.shard(i, 4, drop_remainder=False).iterator("x", epoch=2)) for i in range(4)]
    flat = concat(shards)
    assert sorted(flat) == list(range(rows))
    assert xs(df.iterator("x", epoch=2))[1::4] == shards[1]


def test_shards_drop_remainder_are_equal_and_disjoint():
    df = frame(53).shuffle()
    shards = [xs(df.shard(i, 4).batch(5).iterator("x")) for i in range(4)]
    assert {len(s) for s in shards} == {3}  # 52 rows dealt out: 13 each, 3 batches
    flat = concat(concat(shards))
    assert len(flat) == len(set(flat)) == 52


def test_shard_defaults_to_this_jax_process():
    assert xs(frame(7).shard().iterator("x")) == list(range(7))  # one process: everything


@pytest.mark.parametrize("threads, prefetch", [(0, 0), (0, 3), (2, None)])
def test_state_round_trips_through_json_mid_epoch(threads, prefetch):
    df = frame(40).shuffle().batch(6)
    full = xs(df.iterator("x", epochs=2))
    it = df.iterator("x", epochs=2, threads=threads, prefetch=prefetch)
    head = xs(it.take(9))  # into the second epoch (7 batches an epoch)
    state = json.loads(json.dumps(it.get_state()))
    resumed = df.iterator("x", epochs=2, threads=threads, prefetch=prefetch)
    resumed.set_state(state)
    assert head + xs(resumed) == full
    fresh_settings = df.iterator("x")  # other threads, other epochs: the state decides
    fresh_settings.set_state(state)
    assert xs(fresh_settings) == full[9:]
    assert xs(it) == full[9:]


def test_state_before_the_first_element_and_at_the_end():
    df = frame(10).batch(4)
    it = df.iterator("x")
    start = it.get_state()
    assert start["grain"] is None
    done = xs(it)
    again = df.iterator("x")
    again.set_state(start)
    assert xs(again) == done
    again.set_state(it.get_state())
    assert xs(again) == []


def test_state_carries_the_seed():
    df = frame(20).shuffle()
    it = df.iterator("x", seed=5)
    it.take(3)
    other = df.iterator("x", seed=0)
    other.set_state(it.get_state())
    assert xs(other) == xs(df.iterator("x", seed=5))[3:]


def test_state_from_another_dataframe_is_refused():
    it = frame(20).batch(4).iterator()
    it.take(1)
    with pytest.raises(DataError, match="different dataframe"):
        frame(20).batch(5).iterator().set_state(it.get_state())
    with pytest.raises(DataError, match="not a DataIterator state"):
        frame(20).iterator().set_state({"next_index": 3})


def test_iterator_options_are_checked():
    with pytest.raises(DataError, match="workers"):
        frame().iterator(workers=-1)
    with pytest.raises(DataError, match="seed"):
        frame().shuffle(seed=-1)


def test_a_trimmed_or_edited_state_is_refused_saying_what_is_wrong():
    it = frame(20).batch(4).iterator()
    it.take(1)
    state = it.get_state()
    trimmed = {k: v for k, v in state.items() if k != "signature"}
    with pytest.raises(DataError, match=r"lacks \['signature'\]; pass the dict get_state"):
        frame(20).batch(4).iterator().set_state(trimmed)
    for key, value in (("position", "one"), ("position", -1), ("stop", 2.5), ("seed", None)):
        with pytest.raises(DataError, match=rf"'{key}' must be an integer >= 0"):
            frame(20).batch(4).iterator().set_state({**state, key: value})
    resumed = frame(20).batch(4).iterator("x")
    resumed.set_state({**state, "position": np.int64(1)})  # NumPy integers are integers
    assert xs(resumed) == xs(frame(20).batch(4).iterator("x"))[1:]
