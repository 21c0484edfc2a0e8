"""Fuzzes fnnc's file readers: damaged tensor files, checkpoints and graph files.

Valid files are written once (a tensor file with rows of every dtype, encoded rows (a
user codec and NNC's palettized, ezm7 and zip codecs, whose decoded bytes are the
oracle), an NNC-written row without checksum and a stored graph; a checkpoint journal of two
steps with NamedTuple, scalar and zero-size leaves; a JSON graph file). Each case copies
one, damages it with a seeded random mutation (flipped bytes, a truncated file, zeroed
pages, SQL edits of rows, columns and tables, JSON edits of manifests and graphs) and
runs every reader on it: ``TensorFile`` (names, info, read, verify), ``read_parameters``,
``Checkpoints`` (steps, restore), ``load_from`` / ``fnnc.graph.load`` and ``python -m
fnnc inspect --stats --verify`` (in-process). A case passes when

- every call returns or raises an :class:`fnnc.errors.FnncError` (nothing else: no
  ``KeyError``, ``sqlite3.Error``, ``MemoryError``, ``RecursionError``);
- a row that reads back with a matching checksum holds the bytes that were written;
- the file's bytes are unchanged and no module was imported by reading it;
- it finishes within ``--case-seconds`` (no hang), under an address-space limit
  (``RLIMIT_AS``: what the process uses after start-up plus ``--headroom-mib``), so an
  allocation sized by a damaged header fails the case instead of the machine.

Run: python benchmarks/fuzz_files.py [--cases N] [--seed S]; exit status 1 when a case
failed. tests/io/test_fuzz.py runs it with a few hundred cases.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import os
import pathlib
import random
import resource
import shutil
import signal
import sqlite3
import struct
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from typing import Any, NamedTuple

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np

import fnnc.graph
from fnnc import ops
from fnnc.errors import FnncError
from fnnc.io import (
    Checkpoints,
    Codec,
    TensorFile,
    graph_names,
    load_from,
    read_parameters,
    register_codec,
    save_to,
)
from fnnc.io.cli import main as cli_main


class State(NamedTuple):
    """A NamedTuple in the checkpoints (its module, ``__main__``, is imported)."""

    mu: np.ndarray
    count: int


ZLIB = Codec(
    0x5A1,
    encode=lambda data, dtype, shape: zlib.compress(data),
    decode=lambda data, dtype, shape: zlib.decompress(data),
    name="zlib",
)


_wave = np.sin(np.arange(600, dtype=np.float32) / 7)
CODEC_ROWS = [
    ("q4p", "q4p", _wave),
    ("q5p", "q5p", _wave.astype(np.float16)),
    ("ezm7", "ezm7", _wave.astype(np.float16)),
    ("zip", "zip", np.round(_wave * 4)),
]
"""Rows written with NNC's codecs (:mod:`fnnc.io.nnc_codecs`)."""


class Hang(Exception):
    """A case ran past its time limit."""


# -- templates -------------------------------------------------------------------------
def arrays() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "f32": rng.standard_normal((3, 5)).astype(np.float32),
        "f16": rng.standard_normal(7).astype(np.float16),
        "i64": rng.integers(-9, 9, (2, 2, 2)).astype(np.int64),
        "u8": np.arange(11, dtype=np.uint8),
        "__m__[t-fc-0-0]": rng.standard_normal((4, 3)).astype(np.float32),
        "t-fc-0-1": np.zeros(4, np.float32),
    }


def graph() -> Any:
    b = fnnc.graph.GraphBuilder()
    x = b.input((2, 3), name="x")
    w = b.input((4, 3), name="w")
    return b.build([b.exec(ops.relu(), b.exec(ops.gemm(transpose_b=True), x, w, name="fc"))])


def templates(work: str) -> dict[str, tuple[str, dict[str, bytes]]]:
    """kind -> (path of a valid file, row name -> bytes written)."""
    tensors = os.path.join(work, "tensors.sqlite")
    written = {name: a.tobytes() for name, a in arrays().items()}
    with TensorFile(tensors) as f:
        for name, a in arrays().items():
            f.write(name, a)
        f.write("zlib", np.ones(64, np.float32), encoder=ZLIB)
        for name, codec, value in CODEC_ROWS:  # NNC's codecs: decoded bytes are the oracle
            f.write(name, value, encoder=codec)
            assert f.info(name).encoder, name
            written[name] = f.read(name).tobytes()
    written["zlib"] = np.ones(64, np.float32).tobytes()
    nnc = np.arange(6, dtype=np.int32)
    conn = sqlite3.connect(tensors)  # a row as NNC writes it: no checksum
    dim = struct.pack("<12i", 6, *[0] * 11)
    conn.execute(
        "REPLACE INTO tensors VALUES ('nnc', 1044225, 2, 8192, ?, ?)", (dim, nnc.tobytes())
    )
    conn.commit()
    conn.close()
    save_to(tensors, graph(), "forward")

    ckpt = os.path.join(work, "run.ckpt")
    with Checkpoints(ckpt) as c:
        for step in (1, 2):
            state = {
                "w": np.full((2, 3), step, np.float32),
                "s": State(np.arange(3, dtype=np.float64), step),
                "t": (np.int64(step), [1, 2.5, "x", None], np.array([True, False])),
                "e": np.zeros((2, 0), np.float32),
                7: float("inf"),
            }
            c.save(step, state, optimizer_state=[np.ones(2, np.int32)], metadata={"loss": 0.5})

    graph_file = os.path.join(work, "graph.json")
    fnnc.graph.save(graph(), graph_file)
    return {"tensors": (tensors, written), "checkpoint": (ckpt, {}), "graph": (graph_file, {})}


# -- mutations ---------------------------------------------------------------------------
def flip_bytes(path: str, rng: random.Random) -> str:
    data = bytearray(pathlib.Path(path).read_bytes())
    used = [i for i in range(0, len(data), 7) if data[i]] or [0]
    for _ in range(rng.randint(1, 8)):
        at = (
            rng.choice(used) + rng.randint(0, 6) if rng.random() < 0.8 else rng.randrange(len(data))
        )
        data[min(at, len(data) - 1)] ^= 1 << rng.randrange(8)
    pathlib.Path(path).write_bytes(data)
    return "flip bytes"


def flip_blob(path: str, rng: random.Random, written: dict[str, bytes]) -> str:
    data = bytearray(pathlib.Path(path).read_bytes())
    name, blob = rng.choice(sorted(written.items()))
    at = data.find(blob) if blob else -1
    if at < 0:
        return flip_bytes(path, rng)
    data[at + rng.randrange(len(blob))] ^= 1 << rng.randrange(8)
    pathlib.Path(path).write_bytes(data)
    return f"flip a byte of row {name}"


def truncate(path: str, rng: random.Random) -> str:
    size = os.path.getsize(path)
    cut = rng.choice([rng.randrange(size), size // 2, 100, 0, size - 1])
    with open(path, "r+b") as f:
        f.truncate(cut)
    return f"truncate to {cut}"


def zero_page(path: str, rng: random.Random) -> str:
    data = bytearray(pathlib.Path(path).read_bytes())
    page = struct.unpack(">H", data[16:18])[0] or 65536
    pages = max(1, len(data) // page)
    n = rng.randrange(pages)
    start = n * page + (100 if n == 0 and rng.random() < 0.5 else 0)
    data[start : (n + 1) * page] = bytes(len(data[start : (n + 1) * page]))
    pathlib.Path(path).write_bytes(data)
    return f"zero page {n}"


HUGE_DIMS = [
    struct.pack("<12i", 65536, 65536, 65536, 65536, *[0] * 8),
    struct.pack("<12i", 2**31 - 1, 2**31 - 1, 2**31 - 1, *[0] * 9),
    struct.pack("<12i", -1, *[0] * 11),
    struct.pack("<12i", *[0] * 12),
    b"\x01" * 48,
    b"\x02\0\0\0" * 5,
]
ODD_VALUES: list[Any] = [None, "text", 3.5, -1, 2**62, -(2**63), b"", b"\0" * 3, "x" * 1000]


def sql_edit(path: str, rng: random.Random) -> str:
    conn = sqlite3.connect(path)
    try:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        edits: list[tuple[str, tuple[Any, ...]]] = []
        if "tensors" in tables:
            names = [r[0] for r in conn.execute("SELECT name FROM tensors")] or ["none"]
            name = rng.choice(names)
            column = rng.choice(["type", "format", "datatype", "dim", "data", "name"])
            value = rng.choice(ODD_VALUES + (HUGE_DIMS if column == "dim" else []))
            if column == "data" and rng.random() < 0.5:
                got = conn.execute("SELECT data FROM tensors WHERE name=?", (name,)).fetchone()
                blob = got[0] if got and isinstance(got[0], bytes) else b""
                value = blob[: rng.randrange(len(blob) + 1)] + bytes(rng.choice([0, 1, 64, 5000]))
            edits += [
                (f"UPDATE tensors SET {column}=? WHERE name=?", (value, name)),
                ("DROP TABLE tensors", ()),
                ("ALTER TABLE tensors RENAME COLUMN data TO payload", ()),
                ("ALTER TABLE tensors DROP COLUMN dim", ()),
                (
                    "CREATE TABLE t2 (name TEXT, type TEXT, format INTEGER, datatype INTEGER, "
                    "dim BLOB, data TEXT)",
                    (),
                ),
                ("UPDATE tensors SET data=CAST(data AS TEXT) WHERE name=?", (name,)),
                ("UPDATE tensors SET datatype=262144 WHERE name=?", (name,)),  # QX
                ("UPDATE tensors SET type=type | (1 << 40) WHERE name=?", (name,)),  # an encoder
            ]
        for table in ("fnnc_checksums", "fnnc_checkpoints", "fnnc_graphs"):
            if table in tables:
                edits.append((f"DROP TABLE {table}", ()))
        if "fnnc_checksums" in tables:
            edits.append(
                (
                    "UPDATE fnnc_checksums SET digest=?, algo=?",
                    (rng.choice(ODD_VALUES), rng.choice(["crc32", "sha256", "md7", None])),
                )
            )
            edits.append(("UPDATE fnnc_checksums SET row=?", (rng.choice(ODD_VALUES),)))
        if "fnnc_checkpoints" in tables:
            edits.append(("UPDATE fnnc_checkpoints SET created=?", (rng.choice(ODD_VALUES),)))
            edits.append(
                ("UPDATE fnnc_checkpoints SET step=? WHERE step=1", (rng.choice([2**62, -5, 0]),))
            )
            edits.append(("ALTER TABLE fnnc_checkpoints DROP COLUMN created", ()))
        if "fnnc_graphs" in tables:
            edits.append(("UPDATE fnnc_graphs SET data=?", (rng.choice(ODD_VALUES),)))
        statement, args = rng.choice(edits) if edits else ("SELECT 1", ())
        if statement.startswith("CREATE TABLE t2"):
            conn.execute("DROP TABLE tensors")
            conn.execute(statement)
            conn.execute("ALTER TABLE t2 RENAME TO tensors")
            conn.execute(
                "INSERT INTO tensors VALUES ('x', 'a', 2, 16384, ?, 'abcd')", (HUGE_DIMS[3],)
            )
        else:
            conn.execute(statement, args)
        conn.commit()
        return f"sql: {statement[:60]} {str(args)[:40]}"
    except sqlite3.Error as e:
        return f"sql edit failed ({e}); file as it was"
    finally:
        conn.close()


def json_value(rng: random.Random) -> Any:
    return rng.choice(
        [
            None,
            True,
            -1,
            1 << 40,
            2.5,
            "x",
            "numpy:f2py.x",
            "os:path",
            [],
            [["a"]],
            {},
            {"$array": None, "shape": [1 << 40], "dtype": "float64", "kind": "numpy"},
            {"$array": None, "shape": [1 << 28], "dtype": "float64", "kind": "numpy"},
            {
                "$array": "__ckpt-1__[state['w']]",
                "shape": [1 << 20],
                "dtype": "float32",
                "kind": "numpy",
            },
            {"$array": "nope", "shape": [2], "dtype": "float32", "kind": "jax"},
            {"$array": None, "shape": [0], "dtype": "O", "kind": "numpy"},
            {"$dict": [["a"]]},
            {"$dict": [[["k"], 1]]},
            {"$tuple": 3},
            {"$float": "1e999999"},
            {"$namedtuple": "numpy:f2py.x", "fields": ["a"], "values": [1]},
            {"$namedtuple": "json:decoder.JSONDecoder", "fields": [], "values": []},
            {"$namedtuple": "__main__:State", "fields": ["mu", "count"], "values": [1]},
            {"$unknown": 1},
            {"kind": "jax"},
        ]
    )


def mutate_json(value: Any, rng: random.Random, depth: int = 0) -> Any:
    """``value`` with one random node replaced (or a key removed)."""
    if depth > 12 or not isinstance(value, (dict, list)) or not value or rng.random() < 0.15:
        return json_value(rng)
    value = dict(value) if isinstance(value, dict) else list(value)
    keys = list(value) if isinstance(value, dict) else list(range(len(value)))
    key = rng.choice(keys)
    if isinstance(value, dict) and rng.random() < 0.2:
        del value[key]
    else:
        value[key] = mutate_json(value[key], rng, depth + 1)
    return value


def json_text(text: str, rng: random.Random) -> str:
    choice = rng.random()
    if choice < 0.15:
        return text[: rng.randrange(len(text))]
    if choice < 0.25:
        return "[" * 100_000 + "]" * 100_000
    if choice < 0.3:
        return (
            '{"format": "fnnc.checkpoint", "version": 1, "state": ' + "[" * 5000 + "]" * 5000 + "}"
        )
    try:
        return json.dumps(mutate_json(json.loads(text), rng))
    except ValueError:
        return text[::-1]


def edit_manifest(path: str, rng: random.Random) -> str:
    conn = sqlite3.connect(path)
    try:
        rows = conn.execute("SELECT step, manifest FROM fnnc_checkpoints").fetchall()
        step, text = rng.choice(rows)
        conn.execute(
            "UPDATE fnnc_checkpoints SET manifest=? WHERE step=?", (json_text(text, rng), step)
        )
        conn.commit()
        return f"manifest of step {step}"
    except (sqlite3.Error, IndexError) as e:
        return f"manifest edit failed ({e})"
    finally:
        conn.close()


def edit_graph_row(path: str, rng: random.Random) -> str:
    conn = sqlite3.connect(path)
    try:
        text = conn.execute("SELECT data FROM fnnc_graphs WHERE name='forward'").fetchone()[0]
        conn.execute("UPDATE fnnc_graphs SET data=? WHERE name='forward'", (json_text(text, rng),))
        conn.commit()
        return "stored graph JSON"
    except (sqlite3.Error, TypeError) as e:
        return f"graph edit failed ({e})"
    finally:
        conn.close()


def edit_graph_file(path: str, rng: random.Random) -> str:
    if rng.random() < 0.2:
        return flip_bytes(path, rng)
    file = pathlib.Path(path)
    file.write_text(json_text(file.read_text(encoding="utf-8"), rng), encoding="utf-8")
    return "graph file JSON"


def mutate(kind: str, path: str, written: dict[str, bytes], rng: random.Random) -> str:
    if kind == "graph":
        return edit_graph_file(path, rng)
    options: list[Callable[[], str]] = [
        lambda: flip_bytes(path, rng),
        lambda: flip_blob(path, rng, written) if written else flip_bytes(path, rng),
        lambda: truncate(path, rng),
        lambda: zero_page(path, rng),
        lambda: sql_edit(path, rng),
        lambda: sql_edit(path, rng),
        lambda: edit_manifest(path, rng) if kind == "checkpoint" else edit_graph_row(path, rng),
        lambda: edit_manifest(path, rng) if kind == "checkpoint" else sql_edit(path, rng),
    ]
    return rng.choice(options)()


# -- readers -----------------------------------------------------------------------------
RAISED: dict[str, int] = {}
"""How often each FnncError class was raised, over all cases."""


def guarded(problems: list[str], what: str, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``, or ``None`` after an FnncError; any other exception is a problem."""
    try:
        return fn(*args)
    except FnncError as e:
        RAISED[type(e).__name__] = RAISED.get(type(e).__name__, 0) + 1
        return None
    except Hang:
        raise
    except BaseException as e:  # the point of the fuzzer: anything else is a bug
        problems.append(f"{what}: {type(e).__name__}: {str(e)[:200]}")
        return None


def read_everything(kind: str, path: str, written: dict[str, bytes]) -> list[str]:
    """Runs every reader; returns what went wrong (an empty list when nothing did)."""
    problems: list[str] = []
    call = lambda what, fn, *args: guarded(problems, what, fn, *args)

    if kind == "graph":
        call("fnnc.graph.load", fnnc.graph.load, path)
        return problems

    def tensor_file() -> None:
        with TensorFile(path, readonly=True) as f:
            for name in f.names():
                call(f"info({name!r})", f.info, name)
                row = call(f"load_row({name!r})", f.load_row, name)
                value = call(f"read({name!r})", f.read, name)
                checked = row is not None and row[2] == "checked" and name in written
                if checked and row[1] != written[name]:
                    problems.append(f"row {name!r}: checksum matched but the bytes changed")
                if value is not None and not isinstance(value, np.ndarray):
                    problems.append(f"read({name!r}) returned a {type(value).__name__}")
            call("infos()", f.infos)
            call("verify()", f.verify)

    call("TensorFile", tensor_file)
    call("read_parameters", lambda: read_parameters(path, strict=False))
    call("read_parameters(name)", lambda: read_parameters(path, name="m", strict=False))

    def checkpoints() -> None:
        with Checkpoints(path) as c:
            for step in c.steps():
                call(f"restore({step})", c.restore, step)
            call("restore()", c.restore)
            call("latest", lambda: c.latest)

    call("Checkpoints", checkpoints)
    if kind == "tensors":
        call("graph_names", lambda: graph_names(path))
        call("load_from", lambda: load_from(path, "forward"))
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = call("inspect", lambda: cli_main(["inspect", "--stats", "--verify", path]))
    if "Traceback" in err.getvalue() or status not in (0, 1):
        problems.append(f"inspect: status {status}, stderr {err.getvalue()[:200]!r}")
    return problems


# -- driver ------------------------------------------------------------------------------
def digest(path: str) -> str:
    return (
        hashlib.sha256(pathlib.Path(path).read_bytes()).hexdigest() if os.path.exists(path) else ""
    )


def self_check(headroom_mib: int) -> None:
    """The harness can fail: a non-FnncError is a problem, and the memory limit holds."""
    problems: list[str] = []
    guarded(problems, "probe", lambda: {}["missing"])
    assert problems == ["probe: KeyError: 'missing'"], problems
    try:
        np.empty(2 * headroom_mib * 2**20, np.uint8)
    except MemoryError:
        return
    raise AssertionError("RLIMIT_AS is not enforced: a big allocation succeeded")


def run(cases: int, seed: int, case_seconds: float, headroom_mib: int, verbose: bool) -> int:
    register_codec(ZLIB, replace=True)
    work = tempfile.mkdtemp(prefix="fnnc-fuzz-")
    try:
        kinds = templates(work)
        for kind, (path, written) in kinds.items():  # valid files read cleanly (and warm up)
            problems = read_everything(kind, path, written)
            assert not problems, (kind, problems)
        RAISED.clear()
        status = pathlib.Path("/proc/self/status").read_text().splitlines()
        vm = int(next(x for x in status if x.startswith("VmSize")).split()[1])
        limit = vm * 1024 + headroom_mib * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))
        self_check(headroom_mib)

        def alarm(*_: Any) -> None:
            raise Hang(f"a case ran past {case_seconds} s")

        signal.signal(signal.SIGALRM, alarm)
        failures: list[str] = []
        counts: dict[str, int] = {}
        started = time.perf_counter()
        for case in range(cases):
            rng = random.Random(seed * 1_000_003 + case)
            kind = rng.choice(sorted(kinds))
            template, written = kinds[kind]
            path = os.path.join(work, f"case-{kind}{os.path.splitext(template)[1]}")
            shutil.copyfile(template, path)
            what = mutate(kind, path, written, rng)
            counts[kind] = counts.get(kind, 0) + 1
            before, modules = digest(path), set(sys.modules)
            signal.setitimer(signal.ITIMER_REAL, case_seconds)
            try:
                problems = read_everything(kind, path, written)
            except Hang as e:
                problems = [str(e)]
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            if digest(path) != before:
                problems.append("reading changed the file's bytes")
            imported = sorted(set(sys.modules) - modules)
            if imported:
                problems.append(f"reading imported {imported}")
            for problem in problems:
                failures.append(f"case {case} ({kind}, {what}): {problem}")
                if verbose:
                    print(failures[-1], flush=True)
            for side in ("-journal", "-wal", "-shm"):
                with contextlib.suppress(OSError):
                    os.remove(path + side)
        seconds = time.perf_counter() - started
    finally:
        shutil.rmtree(work, ignore_errors=True)
    tried = ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
    print(f"fuzzed {cases} damaged files ({tried}) in {seconds:.1f} s: {len(failures)} failures")
    raised = ", ".join(f"{k} {n}" for k, n in sorted(RAISED.items(), key=lambda kv: -kv[1]))
    print(f"errors raised by the readers (as they should be): {raised}")
    for failure in failures[:50]:
        print("  " + failure)
    return 1 if failures else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--case-seconds", type=float, default=10.0, help="per-case time limit")
    parser.add_argument("--headroom-mib", type=int, default=1024, help="RLIMIT_AS above start-up")
    parser.add_argument("--verbose", action="store_true", help="print failures as they happen")
    args = parser.parse_args()
    sys.exit(run(args.cases, args.seed, args.case_seconds, args.headroom_mib, args.verbose))


if __name__ == "__main__":
    main()
