"""A damaged checkpoint manifest raises CheckpointError naming the file and the step."""

import json
import sqlite3
import sys
import types
from typing import NamedTuple

import numpy as np
import pytest

from fnnc.errors import CheckpointError
from fnnc.io import Checkpoints
from tests.helpers import fetch_rows


class Pair(NamedTuple):
    a: np.ndarray
    b: int


@pytest.fixture
def saved(tmp_path):
    path = str(tmp_path / "run.ckpt")
    with Checkpoints(path) as ckpt:
        ckpt.save(4, {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "p": Pair(np.ones(2), 1)})
    text = fetch_rows(path, "SELECT manifest FROM fnnc_checkpoints")[0][0]
    return path, json.loads(text)


def edit(path, manifest, checksum=None):
    """Replaces the manifest; the checksum too (default: none, as a step saved by an
    older fnnc has, so the manifest's own checks are what finds the damage)."""
    text = manifest if isinstance(manifest, str) else json.dumps(manifest)
    conn = sqlite3.connect(path)
    conn.execute("UPDATE fnnc_checkpoints SET manifest=?, checksum=?", (text, checksum))
    conn.commit()
    conn.close()


def with_state(manifest, state):
    return {**manifest, "state": state}


def leaf(manifest):
    return manifest["state"]["$dict"][0][1]


EDITS = {
    "truncated JSON": (lambda m: json.dumps(m)[:40], r"manifest is not JSON"),
    "nested brackets": (lambda m: "[" * 100_000 + "]" * 100_000, r"manifest is not JSON"),
    "deep containers": (
        lambda m: with_state(m, json.loads("[" * 900 + "]" * 900)),
        r"nested deeper than 200",
    ),
    "a list manifest": (lambda m: [m], r"unknown format"),
    "no state": (lambda m: {k: v for k, v in m.items() if k != "state"}, r"no 'state' entry"),
    "$dict item": (lambda m: with_state(m, {"$dict": [["a"]]}), r"\$dict items are \[key, value\]"),
    "$dict key": (lambda m: with_state(m, {"$dict": [[["k"], 1]]}), r"str or int key"),
    "$tuple": (lambda m: with_state(m, {"$tuple": 3}), r"'\$tuple' must be a list"),
    "$float": (lambda m: with_state(m, {"$float": [1]}), r"repr of a float"),
    "unknown tag": (lambda m: with_state(m, {"$what": 1}), r"unknown entry with keys"),
    "no kind": (
        lambda m: with_state(
            m, {"$dict": [["w", {k: v for k, v in leaf(m).items() if k != "kind"}]]}
        ),
        r"kind must be one of",
    ),
    "4 TiB of zeros": (
        lambda m: with_state(
            m, {"$array": None, "shape": [1 << 40], "dtype": "float32", "kind": "numpy"}
        ),
        r"without a row must have a zero-size shape",
    ),
    "2 GiB of zeros": (
        lambda m: with_state(
            m, {"$array": None, "shape": [1 << 28], "dtype": "float64", "kind": "numpy"}
        ),
        r"without a row must have a zero-size shape",
    ),
    "shape of a str": (
        lambda m: with_state(m, {**leaf(m), "shape": "23"}),
        r"shape must be a list",
    ),
    "negative dim": (lambda m: with_state(m, {**leaf(m), "shape": [-2, -3]}), r"non-negative ints"),
    "object dtype": (lambda m: with_state(m, {**leaf(m), "dtype": "O"}), r"unsupported dtype"),
    "int dtype": (lambda m: with_state(m, {**leaf(m), "dtype": 7}), r"dtype must be a dtype name"),
    "more elements than the row": (
        lambda m: with_state(m, {**leaf(m), "shape": [1 << 20]}),
        r"holds float32\[2, 3\], the manifest says float32\[1048576\]",
    ),
    "another dtype than the row": (
        lambda m: with_state(m, {**leaf(m), "dtype": "int32"}),
        r"holds float32\[2, 3\], the manifest says int32\[2, 3\]",
    ),
    "a row the file lacks": (
        lambda m: with_state(m, {**leaf(m), "$array": "__ckpt-4__[gone]"}),
        r"names tensor row '__ckpt-4__\[gone\]', which the file lacks",
    ),
    "namedtuple values": (
        lambda m: with_state(m, {"$namedtuple": "x:Y", "fields": ["a"], "values": [1, 2]}),
        r"1 fields but 2 values",
    ),
}


@pytest.mark.parametrize("name", list(EDITS))
def test_damaged_manifests(saved, name):
    path, manifest = saved
    change, message = EDITS[name]
    edit(path, change(manifest))
    with Checkpoints(path) as ckpt, pytest.raises(CheckpointError, match=message) as e:
        ckpt.restore()
    assert f"step 4 in {path}" in str(e.value)


@pytest.mark.parametrize("name", ["truncated JSON", "no state", "another dtype than the row"])
def test_damage_under_the_saved_checksum_is_named_as_such(saved, name):
    path, manifest = saved
    query = "SELECT checksum FROM fnnc_checkpoints"
    checksum = fetch_rows(path, query)[0][0]
    edit(path, EDITS[name][0](manifest), checksum)
    with Checkpoints(path) as ckpt, pytest.raises(CheckpointError, match=r"checksum") as e:
        ckpt.restore()
    assert f"step 4 in {path}: its manifest does not match" in str(e.value)


def test_a_damaged_manifest_does_not_block_later_saves(saved):
    path, _ = saved
    edit(path, "{not json")
    with Checkpoints(path, keep_last=1) as ckpt:
        ckpt.save(5, {"w": np.zeros(1)})  # step 4 expires: its rows go by their names
        assert ckpt.steps() == [5] and ckpt.file.names() == ["__ckpt-5__[state['w']]"]


def test_the_saved_time_and_the_step_column(saved):
    path, _ = saved
    conn = sqlite3.connect(path)
    conn.execute("UPDATE fnnc_checkpoints SET created='yesterday', checksum=NULL")
    conn.commit()
    conn.close()
    with pytest.raises(CheckpointError, match=r"step 4 in .*save time is 'yesterday'"):
        Checkpoints(path).restore()


def test_namedtuple_lookup_never_runs_module_getattr(saved):
    """A file naming ``module:Name`` must not make a module import or run anything:
    the lookup reads ``__dict__`` only, so a lazy ``__getattr__`` (NumPy's imports
    submodules such as ``numpy.f2py``) is never called."""
    path, manifest = saved
    calls = []
    lazy = types.ModuleType("fnnc_lazy_module")

    def getattr_hook(name):
        calls.append(name)
        raise AttributeError(name)

    lazy.__getattr__ = getattr_hook
    sys.modules["fnnc_lazy_module"] = lazy
    try:
        pair = manifest["state"]["$dict"][1][1]
        for target in ("fnnc_lazy_module:Pair", "fnnc_lazy_module:sub.Pair", "numpy:f2py.Pair"):
            edit(path, with_state(manifest, {**pair, "$namedtuple": target}))
            had_f2py = "numpy.f2py" in sys.modules
            with Checkpoints(path) as ckpt:
                with pytest.raises(CheckpointError, match=r"step 4 in .*NamedTuple .*like="):
                    ckpt.restore()
                got = ckpt.restore(like=Pair(np.zeros(2), 0)).state
            assert type(got) is Pair and got.b == 1
            assert had_f2py or "numpy.f2py" not in sys.modules
        assert calls == []
    finally:
        del sys.modules["fnnc_lazy_module"]
    edit(path, manifest)  # the real class, already imported, is found
    assert type(Checkpoints(path).restore().state["p"]) is Pair
