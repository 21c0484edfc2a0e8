"""python -m fnnc inspect, run as a subprocess."""

import re
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

from fnnc.io import Checkpoints, TensorFile
from tests.helpers import subprocess_env


def run(*args):
    env = subprocess_env()
    return subprocess.run(
        [sys.executable, "-m", "fnnc", *args], capture_output=True, text=True, env=env
    )


@pytest.fixture(scope="module")
def arrays():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((3, 4, 5)).astype(np.float32)
    w[0, 0, :2] = np.nan
    return {
        "conv.w": w,
        "ids": rng.integers(-50, 50, 7).astype(np.int64),
        "half": rng.standard_normal(6).astype(np.float16),
        "bf": np.linspace(-2, 2, 5).astype(ml_dtypes.bfloat16),
    }


def test_inspect_lists_and_stats(tmp_path, arrays):
    path = str(tmp_path / "m.sqlite")
    with TensorFile(path) as f:
        for name, a in arrays.items():
            f.write(name, a)
    with Checkpoints(path) as ckpt:
        ckpt.save(5, {"x": np.ones(2, np.uint8)})
    plain = run("inspect", path)
    assert plain.returncode == 0, plain.stderr
    lines = plain.stdout.splitlines()
    assert lines[0].startswith(f"{path}: 5 tensors")
    assert lines[1].split() == ["name", "dtype", "shape", "format", "bytes"]
    assert lines[-1] == "checkpoint steps: 5"
    table = {cells[0]: cells[1:] for cells in (re.split(r"\s{2,}", x) for x in lines[2:-1])}
    assert table == {
        "__ckpt-5__[state['x']]": ["uint8", "[2]", "NHWC", "2"],
        "bf": ["bfloat16", "[5]", "NHWC", "10"],
        "conv.w": ["float32", "[3, 4, 5]", "NHWC", "240"],
        "half": ["float16", "[6]", "NHWC", "12"],
        "ids": ["int64", "[7]", "NHWC", "56"],
    }

    stats = run("inspect", "--stats", path)
    assert stats.returncode == 0, stats.stderr
    rows = {line.split()[0]: line for line in stats.stdout.splitlines()[2:-1]}
    for name, a in arrays.items():
        cells = rows[name].split()
        lo, hi, mean, nan = (float(c) for c in cells[-4:])
        v = a.astype(np.float64).reshape(-1)
        v = v[~np.isnan(v)]
        np.testing.assert_allclose([lo, hi, mean], [v.min(), v.max(), v.mean()], rtol=1e-5)
        assert nan == np.isnan(a.astype(np.float64)).sum()
    assert rows["conv.w"].split()[-1] == "2"


def test_inspect_errors(tmp_path):
    missing = run("inspect", str(tmp_path / "nope.sqlite"))
    assert missing.returncode == 1 and "no such file" in missing.stderr
    assert not (tmp_path / "nope.sqlite").exists()
    import sqlite3

    sqlite3.connect(tmp_path / "other.db").execute("CREATE TABLE t (a)").connection.close()
    other = run("inspect", str(tmp_path / "other.db"))
    assert other.returncode == 1 and "no tensors table" in other.stderr
    (tmp_path / "junk.bin").write_bytes(b"\0junk" * 100)
    junk = run("inspect", str(tmp_path / "junk.bin"))
    assert junk.returncode == 1 and "not an SQLite" in junk.stderr
    usage = run("inspect")
    assert usage.returncode == 2 and "usage" in usage.stderr


def test_checkpoint_rows_sort_by_step_number(tmp_path):
    path = str(tmp_path / "run.ckpt")
    with Checkpoints(path) as ckpt:
        for step in (12, 4, 100):
            ckpt.save(step, {"w": np.ones(2, np.float32)})
    out = run("inspect", path)
    assert out.returncode == 0, out.stderr
    names = [line.split()[0] for line in out.stdout.splitlines()[2:-1]]
    assert names == ["__ckpt-4__[state['w']]", "__ckpt-12__[state['w']]",
                     "__ckpt-100__[state['w']]"]  # fmt: skip


def test_help_is_plain_text():
    for args in (["--help"], ["inspect", "--help"]):
        out = run(*args)
        assert out.returncode == 0 and "usage: python -m fnnc" in out.stdout
        assert "``" not in out.stdout and ":mod:" not in out.stdout, out.stdout
    assert "checkpoint steps" in " ".join(run("inspect", "--help").stdout.split())


def test_a_reader_that_stops_early_ends_inspect_quietly(tmp_path):
    # more rows than a pipe buffers (64 KiB), so inspect is still writing when head exits
    path = str(tmp_path / "many.sqlite")
    with TensorFile(path) as f, f.transaction():
        for i in range(1500):
            f.write(f"layer-{i}.weight-with-a-long-name", np.zeros(1, np.float32))
    proc = subprocess.Popen(
        [sys.executable, "-m", "fnnc", "inspect", path], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, env=subprocess_env(),
    )  # fmt: skip
    first = [proc.stdout.readline() for _ in range(2)]
    proc.stdout.close()  # as `| head -2` does
    err = proc.stderr.read().decode()
    proc.stderr.close()
    status = proc.wait(timeout=120)
    assert first[0].decode().endswith("1500 tensors, 5.9 KiB of data\n")
    assert "Traceback" not in err and "BrokenPipeError" not in err and err == "", err
    assert status == 141


def test_inspect_shows_nested_pytree_arguments_and_keywords(tmp_path, capsys):
    """Nested arguments printed as '?[]' and keyword arguments were left out. The oracle
    is jax's own flattening of the signature: one line per array, at its key path."""
    import jax
    import jax.numpy as jnp

    from fnnc.io.cli import main

    f32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32)
    params = {"dense": {"w": f32(3, 2), "b": f32(2)}}
    xs = (f32(4, 3), jax.ShapeDtypeStruct((4,), jnp.int32))

    def fn(p, xs, scale=1.0):
        return (xs[0] @ p["dense"]["w"] + p["dense"]["b"][None]) * scale

    exported = jax.export.export(jax.jit(fn))(params, xs, scale=f32())
    (path := tmp_path / "nested.jax").write_bytes(exported.serialize())
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    for arg in (params, xs):
        for key, spec in jax.tree_util.tree_flatten_with_path(arg)[0]:
            shape = ",".join(map(str, spec.shape))
            assert f"{jax.tree_util.keystr(key)}: {spec.dtype}[{shape}]" in out
    assert "[0]  a dict of 2 array(s):" in out and "[1]  a tuple of 2 array(s):" in out
    assert "['dense']['w']: float32[3,2]" in out and "[1]: int32[4]" in out
    assert "scale=  float32[]" in out and ".call(*inputs, **keyword_inputs)" in out
    assert "?[" not in out


def test_inspect_lists_a_json_graph_file_and_verifies_it(tmp_path, capsys):
    """In-process (fnnc.io.cli.main, as python -m fnnc runs it): a subprocess per file
    cost 2 s of imports each."""
    from fnnc import ops
    from fnnc.graph import GraphBuilder, load, save
    from fnnc.io.cli import main

    b = GraphBuilder()
    x = b.input((3,), name="x")
    path = tmp_path / "g.json"
    save(b.build([b.exec(ops.relu(), x, name="act")]), path)
    assert main(["inspect", str(path), "--verify"]) == 0
    listing = str(load(path)).splitlines()  # the oracle: the graph as load reads it
    lines = capsys.readouterr().out.splitlines()
    assert "format 'fnnc.graph', version 1" in lines[0]
    assert lines[1 : 1 + len(listing)] == listing
    assert "it reads" in lines[-1]
    (tmp_path / "bad.json").write_text(path.read_text().replace('"relu"', '"no_such_command"'))
    (tmp_path / "other.json").write_text('{"a": 1}')
    (tmp_path / "cut.json").write_text(path.read_text()[:40])
    for name, said in [
        ("bad.json", "no_such_command"),
        ("other.json", 'without a "format"'),
        ("cut.json", "starts as JSON but is not"),
    ]:
        assert main(["inspect", str(tmp_path / name)]) == 1
        err = capsys.readouterr().err
        assert "Traceback" not in err and said in err and name in err
