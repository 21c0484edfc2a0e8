"""Sharded checkpoints (fnnc.io.ShardedCheckpoints, Orbax): written by 2 processes
without gathering, restored on 1 device, on a 4-device FSDP mesh, and on 2 processes.

One 2-process run (``jax.distributed`` with gloo, 2 CPU devices each, FSDP over all 4,
so every trainable parameter is split) does every 2-process check: it trains an epoch
with ``CheckpointEvery(dir)`` (which picks the sharded format for a split model), spies
on what is handed to Orbax, writes the gathered parameters and optimizer state as the
oracle (process 0), continues a second epoch, and resumes a fresh model from the
checkpoint through the same epoch. This process then restores the checkpoint on 1
device, and a subprocess on a 4-device FSDP mesh, and compares bitwise.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import time

import jax
import numpy as np
import optax
import pytest

from fnnc.errors import CheckpointError
from fnnc.io import ShardedCheckpoints
from fnnc.models import BatchNorm, Dense, Input, Model, ReLU
from fnnc.models.callbacks import CheckpointEvery
from tests.helpers import subprocess_env

COMMON = textwrap.dedent(
    """
    import json, sys, time, traceback
    import jax, numpy as np, optax
    from fnnc.models import BatchNorm, Dense, Input, Model, ReLU

    def make():
        x = Input()
        h = BatchNorm(name="bn")(ReLU()(Dense(12, name="h")(x)))
        return Model(x, Dense(4, name="out")(h), name="mlp")

    rng = np.random.default_rng(0)
    XS = rng.normal(size=(32, 8)).astype(np.float32)
    YS = rng.normal(size=(32, 4)).astype(np.float32)

    def compiled(mode=None):
        m = make()
        if mode is not None:
            m.set_data_parallel(0, parameter_sharding=mode)
        m.compile(XS[:4], loss="mse", minimizer=optax.adam(1e-2))
        return m

    def check_against(m, oracle):
        got = m.parameters()
        assert sorted(got) == sorted(k[2:] for k in oracle.files if k.startswith("p/"))
        for k, v in got.items():
            np.testing.assert_array_equal(np.asarray(v), oracle["p/" + k], err_msg=k)
        n = 0
        for pid in m.engine.trainable():
            views = list(m.engine.optimizer_state(pid).values())
            assert len(views) == 1, (pid, views)
            for i, leaf in enumerate(jax.tree.leaves(views[0])):
                np.testing.assert_array_equal(np.asarray(leaf), oracle[f"o/{pid}/{i}"])
                n += 1
        assert n == 6 * 3, n  # adam: count, mu, nu of each trainable parameter
    """
)

WORKER = COMMON + textwrap.dedent(
    """
    import orbax.checkpoint as ocp
    from jax.experimental import multihost_utils
    from fnnc.errors import CheckpointError
    from fnnc.io import Checkpoints, ShardedCheckpoints
    from fnnc.models import parallel
    from fnnc.models.callbacks import Callback, CheckpointEvery

    rank, coordinator, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=coordinator, num_processes=2,
                               process_id=rank, initialization_timeout=120)
    assert jax.device_count() == 4 and jax.local_device_count() == 2

    # the spy: what reaches Orbax, and any gather while a save runs
    handed, gathers, saving = [], [], [False]
    real_args = ocp.args.StandardSave
    def spy_args(item, *a, **k):
        handed.append(item)
        return real_args(item, *a, **k)
    ocp.args.StandardSave = spy_args
    def watched(fn):
        def run(*a, **k):
            if saving[0]:  # who called, and the shapes it would make whole
                caller = traceback.extract_stack()[-2]
                shapes = [list(np.shape(x)) for x in jax.tree.leaves(a[-1])]
                gathers.append([fn.__name__, shapes, f"{caller.filename}:{caller.name}"])
            return fn(*a, **k)
        return run
    parallel.Parallel.gather = watched(parallel.Parallel.gather)
    multihost_utils.process_allgather = watched(multihost_utils.process_allgather)
    real_save = ShardedCheckpoints.save
    def save(self, *a, **k):
        saving[0] = True
        try:
            return real_save(self, *a, **k)
        finally:
            saving[0] = False
    ShardedCheckpoints.save = save

    class Losses(Callback):
        def __init__(self):
            self.values = []
        def on_step_end(self, loop, step, loss):
            self.values.append(loss)

    local = (XS[rank * 16 : (rank + 1) * 16], YS[rank * 16 : (rank + 1) * 16])
    ckdir = out + "/ckpt"
    m = compiled("fsdp")
    started = time.perf_counter()
    m.train(local, epochs=1, batch_size=4, verbose=False,
            callbacks=[CheckpointEvery(ckdir, per_epoch=True)])   # saves step 4
    try:
        Checkpoints(out + f"/gathered{rank}.ckpt").save(4, m)
        raise AssertionError("the gathered save of a split model did not refuse")
    except CheckpointError as e:
        refusal = str(e)
    report = {"refusal": refusal, "gathers": gathers, "leaves": []}
    for item in handed:
        for path, leaf in jax.tree_util.tree_flatten_with_path(item)[0]:
            report["leaves"].append({
                "path": jax.tree_util.keystr(path), "type": type(leaf).__name__,
                "jax": isinstance(leaf, jax.Array), "shape": list(np.shape(leaf)),
                "addressable": bool(getattr(leaf, "is_fully_addressable", True)),
                "replicated": bool(getattr(leaf, "is_fully_replicated", True)),
                "shards": sorted({tuple(s.data.shape) for s in leaf.addressable_shards})
                if isinstance(leaf, jax.Array) else None,
            })
    report["layout"] = ShardedCheckpoints(ckdir).manifest(4)["layout"]

    params = m.parameters()  # the oracle: gathered (a collective: every process calls)
    opts = {pid: list(m.engine.optimizer_state(pid).values()) for pid in m.engine.trainable()}
    if rank == 0:
        arrays = {"p/" + k: np.asarray(v) for k, v in params.items()}
        for pid, views in opts.items():
            for i, leaf in enumerate(jax.tree.leaves(views[0])):
                arrays[f"o/{pid}/{i}"] = np.asarray(leaf)
        np.savez(out + "/oracle.npz", **arrays)

    go_on = Losses()  # uninterrupted: the second epoch
    m.train(local, epochs=1, batch_size=4, verbose=False, callbacks=[go_on])
    resumed, again = compiled("fsdp"), Losses()  # a fresh model resumes from step 4
    resumed.train(local, epochs=2, batch_size=4, verbose=False, callbacks=[again],
                  resume=ckdir)
    report["losses"], report["resumed"] = go_on.values, again.values
    report["seconds"] = time.perf_counter() - started
    with open(out + f"/report{rank}.json", "w") as f:
        json.dump(report, f)
    jax.distributed.shutdown()
    """
)

FOUR = COMMON + textwrap.dedent(
    """
    from fnnc.io import ShardedCheckpoints
    assert jax.device_count() == 4 and jax.process_count() == 1
    ckdir, oracle = sys.argv[1], np.load(sys.argv[2])
    m = compiled("fsdp")
    ckpt = ShardedCheckpoints(ckdir).restore_into(m)
    assert ckpt.step == 4 and m.train_progress.step == 4 and m.train_progress.epoch == 1
    w = m.engine.values["t-mlp-0-h-0-0"]  # [12, 8]: 3 rows on each of the 4 devices
    assert len(w.addressable_shards) == 4, w.sharding
    assert {s.data.shape for s in w.addressable_shards} == {(3, 8)}, w.sharding
    check_against(m, oracle)
    print("OK")
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return int(s.getsockname()[1])


def _two_processes(out: str, timeout: float = 300) -> None:
    """Runs WORKER as 2 processes of 2 CPU devices; kills both at the timeout or a failure."""
    env = subprocess_env(XLA_FLAGS="--xla_force_host_platform_device_count=2")
    coordinator = f"localhost:{_free_port()}"
    with contextlib.ExitStack() as stack:
        logs = [stack.enter_context(open(f"{out}/log{r}.txt", "w+")) for r in range(2)]
        command = [sys.executable, "-c", WORKER]
        procs = [
            subprocess.Popen(
                [*command, str(r), coordinator, out], env=env, stdout=log, stderr=subprocess.STDOUT
            )
            for r, log in enumerate(logs)
        ]
        deadline = time.monotonic() + timeout
        try:
            while any(p.poll() is None for p in procs):
                if time.monotonic() > deadline or any(p.poll() not in (None, 0) for p in procs):
                    break
                time.sleep(0.1)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                p.wait()
        text = ""
        for log in logs:
            log.seek(0)
            text += log.read()[-3000:]
    assert [p.returncode for p in procs] == [0, 0], text


def test_two_processes_save_shards_and_restore_anywhere(tmp_path):
    out = str(tmp_path)
    _two_processes(out)
    reports = []
    for r in range(2):
        with open(tmp_path / f"report{r}.json") as f:
            reports.append(json.load(f))
    oracle = np.load(tmp_path / "oracle.npz")
    for rank, report in enumerate(reports):
        # nothing gathered while saving but scalars (Orbax's multihost_utils.assert_equal
        # of the step across processes); no Parallel.gather at all
        for name, shapes, caller in report["gathers"]:
            assert name == "process_allgather" and shapes == [[]], (name, shapes, caller)
        # every array reached Orbax as a jax.Array laid out on the mesh
        assert "ShardedCheckpoints" in report["refusal"] and "t-mlp-0-h-0-0" in report["refusal"]
        leaves = report["leaves"]
        assert leaves and all(leaf["jax"] for leaf in leaves), leaves
        split = [leaf for leaf in leaves if not leaf["replicated"]]
        # 6 trainable parameters, their Adam mu and nu: split over the 4 devices, each
        # process holding 2 shards of a quarter (the first axis), never the whole array
        assert len(split) == 18, [leaf["path"] for leaf in split]
        for leaf in split:
            quarter = [leaf["shape"][0] // 4, *leaf["shape"][1:]]
            assert not leaf["addressable"] and leaf["shards"] == [quarter], (rank, leaf)
        paths = {leaf["path"] for leaf in split}
        assert "['t-mlp-0-h-0-0']" in paths and "['t-mlp-0-h-0-0']['mu']" in paths, paths
        assert report["layout"]["t-mlp-0-h-0-0"] == {"mesh": {"data": 4}, "spec": ["data"]}
        # resuming a fresh model from the checkpoint = continuing without interruption
        assert len(report["losses"]) == 4
        assert report["resumed"] == report["losses"]
    assert reports[0]["losses"] == reports[1]["losses"]

    # (a) 1 process, 1 device (this one): bitwise the gathered state the run wrote
    ns: dict = {}
    exec(compile(COMMON, "common", "exec"), ns)
    one = ns["compiled"]()
    ckpt = ShardedCheckpoints(tmp_path / "ckpt").restore_into(one)
    assert ckpt.step == 4 and one.train_progress.epoch == 1
    ns["check_against"](one, oracle)
    # without a template: the saved structure, on this process's one device (the
    # 4-device mesh it was saved from is not here)
    plain = ShardedCheckpoints(tmp_path / "ckpt").restore()
    got, want = jax.tree.leaves(plain.state), jax.tree.leaves(ckpt.state)
    assert got and all(len(x.sharding.device_set) == 1 for x in got)
    assert jax.tree.structure(plain.state) == jax.tree.structure(ckpt.state)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

    # (b) 1 process, a 4-device FSDP mesh
    env = subprocess_env(XLA_FLAGS="--xla_force_host_platform_device_count=4")
    done = subprocess.run(
        [sys.executable, "-c", FOUR, str(tmp_path / "ckpt"), str(tmp_path / "oracle.npz")],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0 and "OK" in done.stdout, done.stderr[-3000:]


# -- in one process --------------------------------------------------------------------
def _mlp(units: int = 2, minimizer=None) -> Model:
    x = Input()
    m = Model(x, Dense(units, name="fc")(ReLU()(BatchNorm(name="bn")(Dense(4, name="h")(x)))))
    m.compile(np.zeros((4, 3), np.float32), loss="mse", minimizer=minimizer or optax.adam(0.1))
    return m


XS = np.random.default_rng(1).normal(size=(16, 3)).astype(np.float32)


def _trained(tmp_path, **kw):
    m = _mlp(**kw)
    path = tmp_path / "run"
    m.train((XS, XS[:, :2]), epochs=1, batch_size=4, verbose=False,
            callbacks=[CheckpointEvery(path, steps=2, sharded=True)])  # fmt: skip
    return m, path


def test_resume_from_directory_continues_the_run(tmp_path):
    m, path = _trained(tmp_path)
    assert ShardedCheckpoints(path).steps() == [2, 4]
    want = m.train((XS, XS[:, :2]), epochs=1, batch_size=4, verbose=False)["loss"]
    fresh = _mlp()
    got = fresh.train((XS, XS[:, :2]), epochs=2, batch_size=4, verbose=False, resume=path)
    assert got["loss"] == want
    for k, v in m.parameters().items():
        np.testing.assert_array_equal(v, fresh.parameters()[k], err_msg=k)


def test_keep_last_and_pytrees(tmp_path):
    tree = {
        "w": jax.numpy.arange(6.0).reshape(2, 3),
        "n": [jax.numpy.int32(3)],
        "a.b/c": np.float32(1.0),
    }
    with ShardedCheckpoints(tmp_path / "t", keep_last=2, keep_every=10) as ckpt:
        for step in (10, 11, 12, 13):
            ckpt.save(step, tree, optimizer_state=optax.sgd(0.1, 0.9).init(tree["w"]))
        assert ckpt.steps() == [10, 12, 13]
        like = optax.sgd(0.1, 0.9).init(tree["w"])
        got = ckpt.restore(12, like=tree, optimizer_like=like)
    np.testing.assert_array_equal(got.state["w"], tree["w"])
    assert got.state["n"][0] == 3 and got.state["a.b/c"] == 1.0
    assert type(got.optimizer_state[0]) is type(like[0])


def test_restore_without_a_template_keeps_the_saved_structure(tmp_path):
    """Orbax alone gives tuples back as lists, NamedTuples (Optax states) as dicts and int
    keys as str: the optimizer state could not go back into Optax. Python numbers saved
    as leaves restore with or without like=, as Checkpoints does."""
    params = {"a": jax.numpy.ones((2, 2))}
    adam = optax.adam(1e-3)
    tree = {"w": jax.numpy.ones(2), "lr": 0.5, "pair": (jax.numpy.zeros(1), 7), "i": {3: [True]}}
    with ShardedCheckpoints(tmp_path / "s") as ckpt:
        ckpt.save(1, tree, adam.init(params))
        for got in (ckpt.restore(1), ckpt.restore(1, like=tree)):
            assert jax.tree.structure(got.state) == jax.tree.structure(tree)
            assert (
                got.state["lr"] == 0.5
                and got.state["pair"][1] == 7
                and got.state["i"] == {3: [True]}
            )
            np.testing.assert_array_equal(got.state["w"], tree["w"])
        got = ckpt.restore(1)
    assert jax.tree.structure(got.optimizer_state) == jax.tree.structure(adam.init(params))
    adam.update(params, got.optimizer_state, params)  # an Optax state again


def test_a_failed_resave_keeps_the_step_and_names_the_leaf(tmp_path):
    """A save of a step already saved replaced it only after deleting it: a save Orbax
    then refused (a zero-size array) lost the step. What Orbax refuses is now refused
    first, naming the leaf."""
    with ShardedCheckpoints(tmp_path / "s") as ckpt:
        ckpt.save(5, {"w": jax.numpy.ones(3)})
        with pytest.raises(CheckpointError, match=r"leaf \['empty'\] is a zero-size array"):
            ckpt.save(5, {"w": jax.numpy.ones(3), "empty": jax.numpy.zeros((0, 2))})
        with pytest.raises(CheckpointError, match=r"all strings or all ints"):
            ckpt.save(5, {"w": jax.numpy.ones(3), 0: jax.numpy.ones(1)})
        assert ckpt.steps() == [5]
        np.testing.assert_array_equal(ckpt.restore(5).state["w"], np.ones(3))


def test_object_with_parameters_saves_by_parameter_id(tmp_path):
    """An object with only ``parameters()`` is saved as that dict, as Checkpoints does."""

    class Weights:
        def parameters(self):
            return {
                "t-fc-0-0": np.arange(6, dtype=np.float32).reshape(2, 3),
                "t-fc-0-1": np.ones(3),
            }

    with ShardedCheckpoints(tmp_path / "p") as ckpt:
        ckpt.save(3, Weights())
        got = ckpt.restore()
        assert ckpt.manifest()["source"] == "parameters"
    assert sorted(got.state) == ["t-fc-0-0", "t-fc-0-1"]
    np.testing.assert_array_equal(got.state["t-fc-0-0"], Weights().parameters()["t-fc-0-0"])


# A failed Orbax read leaves TensorStore reads in flight whose callbacks find asyncio's
# loop closed ("Event loop is closed", printed as ignored): Orbax's noise after the
# CheckpointError, drained inside this test so that it does not land in the next one.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_damaged_and_missing_steps_name_the_step(tmp_path):
    _, path = _trained(tmp_path)
    with pytest.raises(CheckpointError, match=r"no step 3 in .*run; retained steps: \[2, 4\]"):
        ShardedCheckpoints(path).restore_into(_mlp(), 3)
    with pytest.raises(CheckpointError, match=r"holds no steps .the directory does not exist"):
        ShardedCheckpoints(tmp_path / "nowhere").restore()
    for name in os.listdir(path / "4" / "state"):  # the array data of step 4, destroyed
        target = path / "4" / "state" / name
        if name.startswith("ocdbt") or name == "d":
            shutil.rmtree(target)
    with pytest.raises(CheckpointError, match=r"step 4 in .*run: its 'state' cannot be read.*"
                       r"damaged.*retained: \[2, 4\]"):  # fmt: skip
        ShardedCheckpoints(path).restore_into(_mlp(), 4)
    time.sleep(0.5)
    gc.collect()
    # a save killed before Orbax renamed its temporary directory: not a step
    shutil.copytree(path / "2", path / "6.orbax-checkpoint-tmp-1764000000000000")
    assert ShardedCheckpoints(path).steps() == [2, 4]
    (path / "2" / "fnnc" / "metadata").write_text("{not json")
    with pytest.raises(CheckpointError, match=r"step 2 in .*run: its fnnc metadata .*damaged"):
        ShardedCheckpoints(path).restore_into(_mlp(), 2)
    (path / "file").write_text("")
    with pytest.raises(
        CheckpointError, match=r"is a file .* open the file with fnnc.io.Checkpoints"
    ):
        ShardedCheckpoints(path / "file")


def test_another_model_names_the_parameter_and_both_shapes(tmp_path):
    _, path = _trained(tmp_path)
    other = _mlp(units=3)
    before = other.parameters()
    with pytest.raises(CheckpointError, match=r"t-.*fc-0-0: saved \[2, 4\], model \[3, 4\]"):
        ShardedCheckpoints(path).restore_into(other)
    for k, v in other.parameters().items():  # nothing restored
        np.testing.assert_array_equal(v, before[k])
    with ShardedCheckpoints(tmp_path / "fresh") as ckpt:  # before any step: no optimizer state
        ckpt.save(0, other)
        again = _mlp(units=3)
        ckpt.restore_into(again)
    for k, v in again.parameters().items():
        np.testing.assert_array_equal(v, before[k])
    with pytest.raises(CheckpointError, match=r"does not fit the model's minimizer .saved "
                       r"leaves \['count', 'mu', 'nu'\]"):  # fmt: skip
        ShardedCheckpoints(path).restore_into(_mlp(minimizer=optax.sgd(0.1, momentum=0.9)))


def test_optimizer_state_in_leaf_order(tmp_path):
    """MultiSteps' leaves (mini_step, gradient_step, inner state, acc_grads) are not in
    name order: each comes back to its own leaf, bitwise (oracle: the gathered state)."""
    opt = optax.MultiSteps(optax.adam(0.1), 3)
    m = _mlp(minimizer=opt)
    for _ in range(2):  # mid-accumulation: acc_grads and mini_step are not zero
        m.fit(XS[:4], XS[:4, :2])
    with ShardedCheckpoints(tmp_path / "ms") as ckpt:
        ckpt.save(2, m)
        back = _mlp(minimizer=opt)
        ckpt.restore_into(back)
    for pid in m.engine.trainable():
        (want,) = m.engine.optimizer_state(pid).values()
        (got,) = back.engine.optimizer_state(pid).values()
        assert jax.tree.structure(got) == jax.tree.structure(want)
        for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(want), jax.tree.leaves(got)):
            np.testing.assert_array_equal(b, a, err_msg=f"{pid}{jax.tree_util.keystr(path)}")
    assert int(jax.tree.leaves(want)[0]) == 2  # mini_step: the accumulation continues
