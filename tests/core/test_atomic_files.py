"""fnnc.core.files.atomic_write, which every file fnnc writes in one piece goes through:
the old file or the new, never part of one; nothing left behind on failure; and the
permissions a file had (mkstemp's 0600 locked other users out of a regenerated,
shared table)."""

from __future__ import annotations

import json
import os
import pathlib
import stat

import numpy as np
import pytest

from fnnc.core import measured
from fnnc.core.files import atomic_write
from fnnc.errors import GraphFormatError


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_bytes_text_and_a_writer_function(tmp_path):
    path = tmp_path / "f"
    atomic_write(path, b"\x00\x01")
    assert path.read_bytes() == b"\x00\x01"
    atomic_write(path, "héllo")
    assert path.read_text(encoding="utf-8") == "héllo"

    def save(tmp):  # a library that writes to a path
        with open(tmp, "wb") as f:
            np.save(f, np.arange(3))

    atomic_write(path, save)
    assert np.load(path).tolist() == [0, 1, 2]
    assert sorted(os.listdir(tmp_path)) == ["f"]


def test_a_new_file_gets_the_umask_mode_and_an_old_one_keeps_its_own(tmp_path):
    old = os.umask(0o027)
    try:
        atomic_write(tmp_path / "new", b"x")
    finally:
        os.umask(old)
    assert _mode(tmp_path / "new") == 0o640
    os.chmod(tmp_path / "new", 0o604)
    atomic_write(tmp_path / "new", b"y")
    assert _mode(tmp_path / "new") == 0o604


def test_a_failing_writer_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "keep"
    path.write_text("old")

    def fails(tmp):
        with open(tmp, "w") as f:
            f.write("half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        atomic_write(path, fails)
    assert path.read_text() == "old"
    assert os.listdir(tmp_path) == ["keep"]
    with pytest.raises(OSError):
        atomic_write(tmp_path / "missing" / "f", b"x")


def test_a_regenerated_defaults_table_stays_readable_and_an_unreadable_one_says_so(tmp_path):
    path = tmp_path / "measured_defaults.json"
    measured.write("Some GPU", {"gemm": {"*": "xla"}}, "a test", path)
    os.chmod(path, 0o644)
    measured.write("Some GPU", {"layer_norm": {"*": "pallas"}}, "a test", path)
    assert _mode(path) == 0o644
    assert json.loads(path.read_text())["devices"]["Some GPU"] == {
        "gemm": {"*": "xla"},
        "layer_norm": {"*": "pallas"},
    }
    # a folder where the table should be: unreadable as a file for every user, root too
    with pytest.raises(GraphFormatError, match=r"cannot be read.*chmod a\+r"):
        measured.read(tmp_path)


def test_a_missing_folder_names_the_file_the_user_gave(tmp_path):
    """The error named the temporary file (/x/.g.json.rr5w7n5w.tmp); it names the target
    and its missing folder, and stays a FileNotFoundError (what callers catch). A
    failure after the temporary exists names the target too, keeping its errno."""
    from fnnc.graph import GraphBuilder, save

    b = GraphBuilder()
    graph = b.build([b.input((2,), name="x")])
    target = tmp_path / "missing" / "g.json"
    for write in (lambda: atomic_write(target, b"x"), lambda: save(graph, str(target))):
        with pytest.raises(FileNotFoundError) as info:
            write()
        assert info.value.filename == str(target)
        assert f"its folder {tmp_path / 'missing'} does not exist; create it first" in str(
            info.value
        )
        assert ".tmp" not in str(info.value)
    assert os.listdir(tmp_path) == []

    def full(temporary):
        raise OSError(28, "No space left on device", temporary)

    with pytest.raises(OSError) as info:
        atomic_write(tmp_path / "t.json", full)
    assert (info.value.errno, info.value.filename) == (28, str(tmp_path / "t.json"))
    assert str(info.value) == f"[Errno 28] No space left on device: '{tmp_path / 't.json'}'"
    assert os.listdir(tmp_path) == []


def _writers():
    """Every kind of atomic writer, each ``write(path, n)``: bytes, a writer function, a
    graph (save), a safetensors file (a writer function given by the io layer)."""
    from fnnc.graph import GraphBuilder, save
    from fnnc.io.safetensors_io import SafetensorsFile

    def graph(path, n):
        b = GraphBuilder()
        save(b.build([b.input((n,), name="x")]), str(path))

    def tensors(path, n):
        with SafetensorsFile(path) as f:
            f.write("w", np.arange(n, dtype=np.float32))

    return {
        "bytes": lambda p, n: atomic_write(p, b"x" * n),
        "function": lambda p, n: atomic_write(p, lambda t: pathlib.Path(t).write_text("x" * n)),
        "graph": graph,
        "safetensors": tensors,
    }


@pytest.mark.parametrize("kind", list(_writers()))
def test_a_symlink_stays_a_link_and_its_target_is_replaced(tmp_path, kind):
    """Saving through a link replaced the link with a regular file and left the file it
    pointed to (the one its other readers see) unchanged; ``open(link, "w")``, the oracle,
    writes the target and keeps the link."""
    write = _writers()[kind]
    (real_dir := tmp_path / "real").mkdir()
    real, link, oracle = real_dir / "v1", tmp_path / "current", tmp_path / "oracle"
    write(real, 2)
    os.chmod(real, 0o640)
    os.symlink(os.path.relpath(real, tmp_path), link)  # relative, as `ln -s` often makes
    write(link, 5)
    write(oracle, 5)
    assert os.path.islink(link) and os.readlink(link) == os.path.relpath(real, tmp_path)
    assert real.read_bytes() == oracle.read_bytes()
    assert _mode(real) == 0o640
    assert sorted(os.listdir(real_dir)) == ["v1"]  # no temporary left beside the target


def test_a_folder_at_the_path_is_refused_naming_it(tmp_path):
    with pytest.raises(IsADirectoryError, match="is a folder; give the path of a file") as info:
        atomic_write(tmp_path, b"x")
    assert info.value.filename == str(tmp_path)


def _merge_many(path, keys) -> None:
    from fnnc.core.files import locked

    for key in keys:
        with locked(path):
            data = json.loads(path.read_text()) if path.exists() else {}
            data[key] = key
            atomic_write(path, json.dumps(data))


def test_locked_read_merge_writes_lose_nothing(tmp_path):
    import threading

    path = tmp_path / "table.json"
    workers = [
        threading.Thread(target=_merge_many, args=(path, [f"{w}-{i}" for i in range(60)]))
        for w in range(4)
    ]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    assert sorted(json.loads(path.read_text())) == sorted(
        f"{w}-{i}" for w in range(4) for i in range(60)
    )
    assert [p.name for p in tmp_path.iterdir()] == ["table.json"]  # nothing left behind


# What fnnc.ops.autotune.save does (read, merge, write under the lock), in a child that
# loads fnnc/core/files.py by its path: importing it through the fnnc package imports
# JAX, which had made two children cost 10 s. The module imports the standard library only.
_SAVER = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("fnnc_files", sys.argv[3])
files = importlib.util.module_from_spec(spec)
spec.loader.exec_module(files)
assert "jax" not in sys.modules
path, table = sys.argv[1], {}
for i in range(40):
    table[f"{sys.argv[2]}-{i}"] = "xla"
    with files.locked(path):
        try:
            with open(path) as f:
                on_disk = json.load(f)["entries"]
        except FileNotFoundError:
            on_disk = {}
        data = {"format": "fnnc.autotune", "version": 2, "entries": {**on_disk, **table}}
        files.atomic_write(path, json.dumps(data, indent=1, sort_keys=True))
"""


def test_autotune_saves_from_two_processes_at_once_keep_every_entry(tmp_path):
    """Two processes saving one table at once each keep every entry (a lost update would
    drop some); then autotune.save itself merges with what they wrote."""
    import subprocess
    import sys

    import fnnc.core.files
    from fnnc.ops import autotune

    path = tmp_path / "tuned.json"
    module = fnnc.core.files.__file__
    procs = [
        subprocess.Popen([sys.executable, "-c", _SAVER, str(path), tag, module])
        for tag in ("a", "b")
    ]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    expected = {f"{tag}-{i}": "xla" for tag in "ab" for i in range(40)}
    # autotune's table file (version 2: the entries under a format and version)
    assert json.loads(path.read_text())["entries"] == expected  # a lost update drops some
    saved = dict(autotune.TABLE)
    try:
        autotune.TABLE.clear()
        autotune.TABLE["c-0"] = "xla"
        autotune.save(path)
    finally:
        autotune.TABLE.clear()
        autotune.TABLE.update(saved)
    assert json.loads(path.read_text())["entries"] == {**expected, "c-0": "xla"}
