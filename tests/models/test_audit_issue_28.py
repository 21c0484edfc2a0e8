"""Audit of issue 28 (models larger than one device) against the issue's own words.

Promises checked:

- ``Repeat(block, n, checkpoint=...)``: n blocks with stacked ``[n, ...]`` parameters
  run by one ``scan`` (the graph does not grow with depth); the stacked id is block 0's
  id with the block number written as a range (``t-blocks-0-block-[0:4]-fc-0-0``);
  values and gradients (with and without per-block checkpointing) equal the blocks run
  one after the other (NumPy / ``jax.grad`` oracles); ``stacked_ids``,
  ``stack_parameters``, ``unstack_parameters``;
- files (``Model.write``/``read``) hold NNC's per-block ids, so they read into the
  unrolled model and back; training checkpoints resume across the two, for the SQLite
  ``Checkpoints`` and for ``fnnc.io.ShardedCheckpoints`` ("checkpoints read back into
  an unrolled model and the reverse");
- ``fnnc.graph.pipeline(builder, body, carry, stacked, stages=, microbatches=)``:
  values and gradients of a GPipe schedule equal the sequential blocks;
- sharding rules as a graph pass: ``find_roles`` (Megatron roles, either weight
  layout, embeddings by vocabulary), ``parameter_specs`` with user rules (glob or
  regex on ids and layer names), ``constrain_activations`` (``sharding_constraint``
  nodes that keep values), clear errors naming the parameter, axis and fix;
- ``fnnc.io.ShardedCheckpoints(dir)``: the surface of ``Checkpoints``;
- on 4 virtual CPU devices (one shared subprocess): tensor-parallel (Megatron, user
  rules, FSDP), pipeline (stage x data, stages alone) and Repeat + tensor parallel
  training equal 1-device training to 1e-5 with the expected per-device shard shapes;
  a sharded checkpoint written on a 4-device FSDP mesh restores on 1 device and on a
  2x2 mesh with identical values and resumes the run; while saving, every split array
  reaches Orbax as a sharded ``jax.Array`` (no device holds a whole split parameter);
  ``CheckpointEvery(dir, sharded=True)`` + ``train(resume=dir)`` continue a sharded run.
"""

from __future__ import annotations

import re
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

from fnnc import ops
from fnnc.errors import CheckpointError, GraphError
from fnnc.graph import (
    GraphBuilder,
    ShardingRules,
    backward,
    compile,
    constrain_activations,
    find_roles,
    interpret,
    parameter_specs,
    pipeline,
)
from fnnc.io import Checkpoints, ShardedCheckpoints, TensorFile
from fnnc.models import (
    CheckpointEvery,
    Dense,
    Input,
    Model,
    ReLU,
    Repeat,
    Sequential,
    stack_parameters,
    stacked_ids,
    unstack_parameters,
)
from tests.helpers import BackgroundDevices

RNG = np.random.default_rng(28)
X = RNG.normal(size=(4, 8)).astype(np.float32)
Y = RNG.normal(size=(4, 8)).astype(np.float32)
N = 4


# -- the multi-device checks: one subprocess, started with the module's first test -------
DEVICE_SCRIPT = textwrap.dedent(
    r"""
    import json, os, re, sys, tempfile, traceback
    import jax, numpy as np, optax
    from jax.sharding import PartitionSpec as P
    from fnnc.graph import ShardingRules
    from fnnc.io import ShardedCheckpoints
    from fnnc.models import (CheckpointEvery, Dense, Input, Model, Pipeline, ReLU, Repeat,
                             Sequential)

    assert jax.device_count() == 4, jax.devices()
    RESULTS = {}

    def check(fn):
        try:
            fn()
            RESULTS[fn.__name__] = "ok"
        except BaseException as e:  # reported to the parent test of the same name
            RESULTS[fn.__name__] = "".join(traceback.format_exception(e))[-3000:]
        return fn

    rng = np.random.default_rng(0)
    XS = rng.normal(size=(8, 6)).astype(np.float32)
    YS = rng.normal(size=(8, 4)).astype(np.float32)
    SGD = lambda: optax.sgd(0.05, momentum=0.9)

    def mlp():
        x = Input()
        return Model(x, Dense(4, name="fc2")(ReLU()(Dense(16, name="fc1")(x))), name="net")

    def deep(pipe=None):
        def make():
            x = Input()
            blk = lambda: Sequential([Dense(8, name="up"), ReLU(), Dense(8, name="down")],
                                     name="blk")
            h = Repeat(blk, 4, name="blocks", pipeline=pipe)(Dense(8, name="in")(x))
            return Model(x, Dense(4, name="out")(h), name="deep")
        return make

    def trained(make=mlp, steps=3, **kw):
        m = make()
        m.compile(XS, loss="mse", minimizer=SGD(), **kw)
        return m, [float(m.fit(XS, YS)) for _ in range(steps)]

    def equal(m, losses, ref):
        ref_model, ref_losses = ref
        np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
        want, got = ref_model.parameters(), m.parameters()
        assert sorted(got) == sorted(want)
        for k in want:
            np.testing.assert_allclose(np.asarray(got[k]), np.asarray(want[k]), rtol=1e-5,
                                       atol=1e-5, err_msg=k)

    def layout(m, pid):
        m.engine._sync_live()
        v = m.engine.values[pid]
        return v.sharding.spec, {tuple(s.data.shape) for s in v.addressable_shards}

    def momentum_specs(m, pid):
        return [a.sharding.spec for a in jax.tree.leaves(m.engine.store.all_states(pid))
                if a.ndim]

    def fit_hlo(m):
        return next(p for k, p in m.engine._programs.items() if k[0] == "fit"
                    ).program.compiled_text()

    REF = trained()
    DEEP = trained(deep())
    MESH22 = jax.make_mesh((2, 2), ("data", "model"))

    @check
    def megatron_2x2():
        m, losses = trained(mesh=MESH22, parameter_sharding="megatron")
        equal(m, losses, REF)
        # first dense by output features (columns), second by input features (rows)
        assert layout(m, "t-net-0-fc1-0-0") == (P("model"), {(8, 6)}), layout(m, "t-net-0-fc1-0-0")
        assert layout(m, "t-net-0-fc1-0-1") == (P("model"), {(8,)})
        assert layout(m, "t-net-0-fc2-0-0") == (P(None, "model"), {(4, 8)})
        assert layout(m, "t-net-0-fc2-0-1") == (P(), {(4,)})
        assert momentum_specs(m, "t-net-0-fc1-0-0") == [P("model")]
        assert "all-reduce" in fit_hlo(m)
        np.testing.assert_allclose(np.asarray(m.evaluate(XS)), np.asarray(REF[0].evaluate(XS)),
                                   rtol=1e-5, atol=1e-5)

    @check
    def regex_rule_on_an_id():
        m, losses = trained(mesh=MESH22, parameter_sharding={re.compile(r"fc2-0-0$"): P()})
        equal(m, losses, REF)
        assert layout(m, "t-net-0-fc2-0-0") == (P(), {(4, 16)})
        assert layout(m, "t-net-0-fc1-0-0")[0] == P("model")  # the table for the rest

    @check
    def glob_rule_on_a_layer_name():
        m, losses = trained(mesh=MESH22, parameter_sharding={"fc2": P("model")})
        equal(m, losses, REF)
        assert layout(m, "t-net-0-fc2-0-0") == (P("model"), {(2, 16)})
        assert layout(m, "t-net-0-fc2-0-1") == (P("model"), {(2,)})

    @check
    def megatron_with_fsdp_on_data():
        m, losses = trained(mesh=MESH22, parameter_sharding=ShardingRules(fsdp=True))
        equal(m, losses, REF)
        spec, shards = layout(m, "t-net-0-fc1-0-0")
        assert "model" in jax.tree.leaves(tuple(spec)) and "data" in jax.tree.leaves(tuple(spec))
        assert shards == {(8, 3)}, (spec, shards)  # a quarter of [16, 6] per device

    @check
    def a_custom_role_table():
        rules = ShardingRules(roles=(("row", "model"),))  # rows split, columns replicated
        m, losses = trained(mesh=MESH22, parameter_sharding=rules)
        equal(m, losses, REF)
        assert layout(m, "t-net-0-fc1-0-0") == (P(), {(16, 6)})
        assert layout(m, "t-net-0-fc2-0-0") == (P(None, "model"), {(4, 8)})

    @check
    def a_split_that_does_not_divide_names_the_parameter_axis_size_and_rule():
        def odd():
            x = Input()
            return Model(x, Dense(4, name="fc2")(ReLU()(Dense(6, name="fc1")(x))), name="net")
        try:
            odd().compile(XS, loss="mse", minimizer=SGD(), parameter_sharding="megatron",
                          mesh=jax.make_mesh((1, 4), ("data", "model")))
        except Exception as e:
            msg = str(e)
        else:
            raise AssertionError("no error")
        for part in ("t-net-0-fc1-0-0", "[6, 6]", "'model'", "4", "PartitionSpec()"):
            assert part in msg, (part, msg)

    STACK = "t-deep-0-blocks-0-blk-[0:4]-up-0-0"

    @check
    def pipeline_on_stage_by_data():
        m, losses = trained(deep(Pipeline(2, 2)), mesh=jax.make_mesh((2, 2), ("stage", "data")))
        equal(m, losses, DEEP)
        assert layout(m, STACK) == (P("stage"), {(2, 8, 8)}), layout(m, STACK)
        assert momentum_specs(m, STACK) == [P("stage")]
        assert "collective-permute" in fit_hlo(m)

    @check
    def pipeline_stages_alone():
        m, losses = trained(deep(Pipeline(4, 2)), mesh=jax.make_mesh((4,), ("stage",)),
                            parameter_sharding="pipeline")
        equal(m, losses, DEEP)
        assert layout(m, STACK) == (P("stage"), {(1, 8, 8)}), layout(m, STACK)

    @check
    def repeat_with_megatron_2x2():
        m, losses = trained(deep(), mesh=MESH22, parameter_sharding="megatron")
        equal(m, losses, DEEP)
        # one block's MLP: up by output features, down by input features, block axis free
        assert layout(m, STACK) == (P(None, "model"), {(4, 4, 8)}), layout(m, STACK)
        down = STACK.replace("-up-", "-down-")
        assert layout(m, down) == (P(None, None, "model"), {(4, 8, 4)}), layout(m, down)

    TMP = tempfile.mkdtemp()

    def fsdp4():
        m = mlp()
        m.compile(XS, loss="mse", minimizer=SGD(), mesh=jax.make_mesh((4,), ("data",)),
                  parameter_sharding="fsdp")
        return m

    @check
    def sharded_checkpoint_restores_on_one_device_and_on_2x2():
        saver = fsdp4()
        for _ in range(2):
            saver.fit(XS, YS)
        path = os.path.join(TMP, "fsdp")
        with ShardedCheckpoints(path) as ckpt:
            ckpt.save(2, saver)
        want = {k: np.asarray(v) for k, v in saver.parameters().items()}
        one = mlp()
        one.compile(XS, loss="mse", minimizer=SGD())
        two = mlp()
        two.compile(XS, loss="mse", minimizer=SGD(), mesh=MESH22, parameter_sharding="megatron")
        for target in (one, two):
            with ShardedCheckpoints(path) as ckpt:
                assert ckpt.restore_into(target).step == 2
            for k in want:
                np.testing.assert_array_equal(np.asarray(target.parameters()[k]), want[k],
                                              err_msg=k)
        assert layout(two, "t-net-0-fc1-0-0") == (P("model"), {(8, 6)})
        # the momentum came back too: the next steps are the saver's
        nxt = [float(saver.fit(XS, YS)) for _ in range(2)]
        for target in (one, two):
            np.testing.assert_allclose([float(target.fit(XS, YS)) for _ in range(2)], nxt,
                                       rtol=1e-5)

    @check
    def saving_hands_orbax_shards_not_whole_arrays():
        import orbax.checkpoint as ocp
        from fnnc.models import parallel
        saver = fsdp4()
        saver.fit(XS, YS)
        seen, gathered = [], []
        original, gather = ocp.args.StandardSave, parallel.Parallel.gather
        def spy(tree, *a, **k):
            seen.append(tree)
            return original(tree, *a, **k)
        ocp.args.StandardSave = spy
        parallel.Parallel.gather = lambda self, v: (gathered.append(1), gather(self, v))[1]
        try:
            with ShardedCheckpoints(os.path.join(TMP, "spy")) as ckpt:
                ckpt.save(1, saver)
        finally:
            ocp.args.StandardSave, parallel.Parallel.gather = original, gather
        assert not gathered, "Parallel.gather called while saving"
        leaves = [x for tree in seen for x in jax.tree.leaves(tree)]
        split = [x for x in leaves if isinstance(x, jax.Array) and not x.is_fully_replicated]
        # 4 parameters of the MLP and their momentum, split over "data"
        assert len(split) == 8, [getattr(x, "shape", None) for x in leaves]
        for x in split:
            quarter = (x.shape[0] // 4, *x.shape[1:])
            assert {tuple(s.data.shape) for s in x.addressable_shards} == {quarter}, x.sharding

    @check
    def checkpoint_every_and_resume_from_a_directory():
        path = os.path.join(TMP, "run")
        a = fsdp4()
        a.train((XS, YS), epochs=1, batch_size=4, verbose=False,
                callbacks=[CheckpointEvery(path, steps=1, sharded=True)])
        assert os.path.isdir(path) and ShardedCheckpoints(path).steps() == [1, 2]
        want = a.train((XS, YS), epochs=1, batch_size=4, verbose=False)["loss"]
        b = fsdp4()
        got = b.train((XS, YS), epochs=2, batch_size=4, verbose=False, resume=path)["loss"]
        assert got == want, (got, want)
        for k, v in a.parameters().items():
            np.testing.assert_array_equal(np.asarray(b.parameters()[k]), np.asarray(v), err_msg=k)

    @check
    def write_on_2x2_reads_on_one_device():
        m, _ = trained(mesh=MESH22, parameter_sharding="megatron", steps=1)
        path = os.path.join(TMP, "tp.sqlite")
        m.write(path)
        one = mlp()
        one.compile(XS, loss="mse", minimizer=SGD())
        assert one.read(path) == []
        for k, v in m.parameters().items():
            np.testing.assert_array_equal(np.asarray(one.parameters()[k]), np.asarray(v), err_msg=k)

    @check
    def a_pipelined_repeat_checkpoint_crosses_to_the_unrolled_model_and_back():
        def block():
            return Sequential([Dense(6, name="fc"), ReLU()], name="block")

        def make(piped, **options):
            x = Input()
            stack = (Repeat(block, 4, name="blocks", pipeline=Pipeline(2, 2)) if piped
                     else Sequential([block() for _ in range(4)], name="blocks"))
            m = Model(x, stack(x))
            m.compile(XS, loss="mse", minimizer=optax.adam(0.01), **options)
            return m

        for first, second in ((True, False), (False, True)):
            options = {"mesh": jax.make_mesh((2, 2), ("stage", "data"))}
            source = make(first, **(options if first else {}))
            source.fit(XS, XS)
            path = tempfile.mkdtemp(dir=TMP)
            with ShardedCheckpoints(path) as ckpt:
                ckpt.save(1, source)
            target = make(second, **(options if second else {}))
            with ShardedCheckpoints(path) as ckpt:
                ckpt.restore_into(target)
            if second:  # the stacks are laid out on the stage axis again
                specs = {v.sharding.spec for v in target.engine.values.values()}
                assert specs == {P("stage")}, specs
            # parameters and Adam's moments came back: the next steps are the source's
            want = [float(source.fit(XS, XS)) for _ in range(2)]
            got = [float(target.fit(XS, XS)) for _ in range(2)]
            np.testing.assert_allclose(got, want, rtol=1e-5)

    print("RESULTS " + json.dumps(RESULTS))
    """
)


@pytest.fixture(scope="module", autouse=True)
def devices():
    """Starts the 4-device script before the first test, so it runs beside the others."""
    d = BackgroundDevices(DEVICE_SCRIPT)
    yield d
    d.close()


DEVICE_CHECKS = [
    "megatron_2x2",
    "regex_rule_on_an_id",
    "glob_rule_on_a_layer_name",
    "megatron_with_fsdp_on_data",
    "a_custom_role_table",
    "a_split_that_does_not_divide_names_the_parameter_axis_size_and_rule",
    "pipeline_on_stage_by_data",
    "pipeline_stages_alone",
    "repeat_with_megatron_2x2",
    "sharded_checkpoint_restores_on_one_device_and_on_2x2",
    "saving_hands_orbax_shards_not_whole_arrays",
    "checkpoint_every_and_resume_from_a_directory",
    "write_on_2x2_reads_on_one_device",
    "a_pipelined_repeat_checkpoint_crosses_to_the_unrolled_model_and_back",
]


# -- Repeat ------------------------------------------------------------------------------
def _block() -> Model:
    return Sequential([Dense(8, name="fc"), ReLU()], name="block")


def _compiled(m: Model, minimizer=None) -> Model:
    m.compile(X, loss="mse", minimizer=minimizer or optax.sgd(0.1, momentum=0.9))
    return m


def _repeat(n: int = N, **kw) -> Model:
    x = Input()
    return _compiled(Model(x, Repeat(_block, n, name="blocks", **kw)(x)))


def _unrolled(n: int = N) -> Model:
    x = Input()
    return _compiled(Model(x, Sequential([_block() for _ in range(n)], name="blocks")(x)))


def _blocks_numpy(per_block: dict, n: int, x: np.ndarray) -> np.ndarray:
    h = x.astype(np.float64)
    for i in range(n):
        w = np.asarray(per_block[f"t-blocks-0-block-{i}-fc-0-0"], np.float64)
        b = np.asarray(per_block[f"t-blocks-0-block-{i}-fc-0-1"], np.float64)
        h = np.maximum(h @ w.T + b, 0.0)
    return h


@pytest.fixture(scope="module")
def rep() -> Model:
    """A compiled 4-block Repeat model, read but never trained by the tests using it."""
    return _repeat()


def test_stacked_id_is_block_zeros_id_with_the_block_range(rep):
    """The issue's example: ``t-blocks-0-block-[0:4]-fc-0-0`` stacks blocks 0..3."""
    m = rep
    shapes = {k: tuple(v.shape) for k, v in m.parameters().items()}
    assert shapes == {
        "t-blocks-0-block-[0:4]-fc-0-0": (4, 8, 8),
        "t-blocks-0-block-[0:4]-fc-0-1": (4, 8),
    }
    assert stacked_ids(m)["t-blocks-0-block-[0:4]-fc-0-0"] == tuple(
        f"t-blocks-0-block-{i}-fc-0-0" for i in range(4)
    )


def test_unstacked_ids_are_the_unrolled_models_ids(rep):
    unr = _unrolled()
    assert sorted(unstack_parameters(rep.parameters(), rep)) == sorted(unr.parameters())


def test_repeat_forward_equals_the_blocks_one_after_another(rep):
    """NumPy oracle on the per-block slices of the stacks."""
    m = rep
    per_block = unstack_parameters(m.parameters(), m)
    np.testing.assert_allclose(
        np.asarray(m.evaluate(X)), _blocks_numpy(per_block, N, X), rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize("checkpoint", [False, True])
def test_one_sgd_step_moves_each_slice_by_its_blocks_gradient(checkpoint):
    """``Repeat(checkpoint=...)``: slice i of a stack moves by -lr * d loss / d W_i."""
    x = Input()
    m = Model(x, Repeat(_block, N, name="blocks", checkpoint=checkpoint)(x))
    m.compile(X, loss="mse", minimizer=optax.sgd(1.0))
    before = {k: jnp.asarray(v) for k, v in unstack_parameters(m.parameters(), m).items()}

    def loss(p):
        h = jnp.asarray(X)
        for i in range(N):
            pre = f"t-blocks-0-block-{i}-fc-0-"
            h = jnp.maximum(h @ p[pre + "0"].T + p[pre + "1"][None], 0.0)
        return jnp.mean((h - Y) ** 2)

    want = jax.grad(loss)(before)
    m.fit(X, Y)
    after = unstack_parameters(m.parameters(), m)
    for k in before:
        np.testing.assert_allclose(
            np.asarray(before[k]) - np.asarray(after[k]), want[k], rtol=1e-5, atol=1e-6, err_msg=k
        )


def test_a_layer_instance_as_the_block():
    """``block`` may be a layer itself (built once as block 0), not only a factory."""
    x = Input()
    m = _compiled(Model(x, Repeat(Dense(8, name="fc"), N, name="r")(x)))
    params = m.parameters()
    assert sorted(params) == ["t-r-0-fc-[0:4]-0", "t-r-0-fc-[0:4]-1"]
    w, b = (np.asarray(params[f"t-r-0-fc-[0:4]-{k}"], np.float64) for k in (0, 1))
    h = X.astype(np.float64)
    for i in range(N):
        h = h @ w[i].T + b[i]
    np.testing.assert_allclose(np.asarray(m.evaluate(X)), h, rtol=1e-5, atol=1e-5)


def test_graph_size_does_not_grow_with_depth():
    """A 48-block Repeat builds the same forward graph as a 4-block one: one scan."""
    sizes = []
    for n in (4, 48):
        x = Input()
        m = Model(x, Repeat(_block, n, name="blocks")(x))
        m.compile(X, loss="mse", minimizer=optax.sgd(0.1))
        graph, _ = m.forward_graph([X])
        assert [nd.cmd.name for nd in graph.nodes].count("scan") == 1
        sizes.append(len(graph.nodes))
    assert sizes[0] == sizes[1]


def test_model_file_holds_nncs_per_block_ids(tmp_path, rep):
    m = rep
    m.write(tmp_path / "rep.sqlite")
    names = sorted(TensorFile(tmp_path / "rep.sqlite").names())
    assert names == sorted(unstack_parameters(m.parameters(), m))
    assert not any("[" in n for n in names)


def test_an_unrolled_models_file_reads_into_the_stacks(tmp_path):
    unr = _unrolled()
    theirs = {k: np.asarray(v) + 0.5 for k, v in unr.parameters().items()}
    unr.set_parameters(theirs)
    unr.write(tmp_path / "unr.sqlite")
    rep = _repeat()
    assert rep.read(tmp_path / "unr.sqlite") == []
    for k in (0, 1):
        stacked = np.stack([theirs[f"t-blocks-0-block-{i}-fc-0-{k}"] for i in range(N)])
        np.testing.assert_array_equal(
            np.asarray(rep.parameters()[f"t-blocks-0-block-[0:4]-fc-0-{k}"]), stacked
        )


def test_stack_and_unstack_parameters_are_inverse(rep):
    m = rep
    stack = np.asarray(m.parameters()["t-blocks-0-block-[0:4]-fc-0-0"])
    per_block = unstack_parameters(m.parameters(), m)
    for i in range(N):
        np.testing.assert_array_equal(
            np.asarray(per_block[f"t-blocks-0-block-{i}-fc-0-0"]), stack[i]
        )
    again = stack_parameters(per_block, m)
    for k, v in m.parameters().items():
        np.testing.assert_array_equal(np.asarray(again[k]), np.asarray(v))


def test_a_sqlite_checkpoint_of_the_unrolled_run_resumes_in_the_repeat_model(tmp_path):
    """``train(resume=)`` of a run saved by the unrolled model, in the Repeat model:
    the same losses and parameters as the unrolled run continued."""
    xs = RNG.normal(size=(8, 8)).astype(np.float32)
    ys = RNG.normal(size=(8, 8)).astype(np.float32)
    path = tmp_path / "run.ckpt"
    unr = _unrolled()
    unr.train((xs, ys), epochs=1, batch_size=4, verbose=False,
              callbacks=[CheckpointEvery(path, steps=2)])  # fmt: skip
    want = unr.train((xs, ys), epochs=1, batch_size=4, verbose=False)["loss"]
    rep = _repeat()
    got = rep.train((xs, ys), epochs=2, batch_size=4, verbose=False, resume=path)["loss"]
    np.testing.assert_allclose(got, want, rtol=1e-5)
    per_block = unstack_parameters(rep.parameters(), rep)
    for k, v in unr.parameters().items():
        np.testing.assert_allclose(np.asarray(per_block[k]), np.asarray(v), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("direction", ["repeat_to_unrolled", "unrolled_to_repeat"])
def test_a_sharded_checkpoint_crosses_between_repeat_and_unrolled(tmp_path, direction):
    rep, unr = _repeat(), _unrolled()
    source, target = (rep, unr) if direction == "repeat_to_unrolled" else (unr, rep)
    source.fit(X, Y)
    with ShardedCheckpoints(tmp_path / "run") as ckpt:
        ckpt.save(1, source)
        ckpt.restore_into(target)
    a = unstack_parameters(rep.parameters(), rep)
    b = unr.parameters()
    for k in b:
        np.testing.assert_array_equal(np.asarray(a[k]), np.asarray(b[k]), err_msg=k)
    np.testing.assert_allclose(float(source.fit(X, Y)), float(target.fit(X, Y)), rtol=1e-5)


# -- fnnc.graph.pipeline -------------------------------------------------------------------
def test_graph_pipeline_values_and_gradients_equal_the_sequential_blocks():
    """GPipe over 2 stages and 2 microbatches of 4 tanh blocks, against ``jax.grad``."""
    body = GraphBuilder()
    h, w = body.input((2, 6), name="h"), body.input((6, 6), name="w")
    block = body.build([body.exec(ops.tanh(), body.exec(ops.gemm(), h, w))])
    b = GraphBuilder()
    x, ws = b.input((4, 6), name="x"), b.input((4, 6, 6), name="ws")
    (y,) = pipeline(b, block, [x], [ws], stages=2, microbatches=2, name="blocks")
    loss = b.exec(ops.reduce_sum(axes=(0, 1)), b.exec(ops.ewprod(), y, y))
    g, _ = backward(b.build([loss]), loss, [x, ws])
    xv = RNG.normal(size=(4, 6)).astype(np.float32)
    wv = RNG.normal(scale=0.4, size=(4, 6, 6)).astype(np.float32)

    def oracle(xa, wa):
        for k in range(4):
            xa = jnp.tanh(xa @ wa[k])
        return jnp.sum(xa * xa)

    got = compile(g)(xv, wv)
    want_loss = oracle(xv, wv)
    want_gx, want_gw = jax.grad(oracle, argnums=(0, 1))(xv, wv)
    flat = [np.asarray(a) for a in (got if isinstance(got, tuple) else (got,))]
    np.testing.assert_allclose(flat[0].reshape(()), want_loss, rtol=1e-5)
    np.testing.assert_allclose(flat[1], want_gx, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(flat[2], want_gw, rtol=1e-4, atol=1e-5)


# -- sharding rules as a graph pass --------------------------------------------------------
def _mlp_graph(transpose: bool):
    b = GraphBuilder()
    x = b.input((4, 8), name="x")
    s1, s2 = ((16, 8), (8, 16)) if transpose else ((8, 16), (16, 8))
    w1, w2 = b.input(s1, name="fc1"), b.input(s2, name="fc2")
    h = b.exec(ops.relu(), b.exec(ops.gemm(transpose_b=transpose), x, w1, name="fc1"))
    return b.build([b.exec(ops.gemm(transpose_b=transpose), h, w2, name="fc2")])


@pytest.mark.parametrize("transpose", [True, False])
def test_roles_first_dense_by_columns_second_by_rows(transpose):
    """Both weight layouts: ``[out, in]`` (NNC/Dense) and ``[in, out]``."""
    g = _mlp_graph(transpose)
    roles = {g.symbols[s].name: (r.name, r.dim) for s, r in find_roles(g).items()}
    out_dim, in_dim = (0, 1) if transpose else (1, 0)
    assert roles == {"fc1": ("column", out_dim), "fc2": ("row", in_dim)}
    specs = parameter_specs(g, jax.make_mesh((1, 1), ("data", "model")), "megatron",
                            parameters=["fc1", "fc2"])  # fmt: skip
    split = lambda d: P(*([None] * d), "model")
    assert specs == {"fc1": split(out_dim), "fc2": split(in_dim)}


def test_embedding_tables_are_split_by_vocabulary():
    b = GraphBuilder()
    table, idx = b.input((32, 8), name="table"), b.input((4,), np.int32, name="idx")
    g = b.build([b.exec(ops.index_select(), table, idx)])
    roles = {g.symbols[s].name: (r.name, r.dim) for s, r in find_roles(g).items()}
    assert roles == {"table": ("vocab", 0)}


def test_user_rules_glob_and_regex_override_the_table():
    g = _mlp_graph(True)
    mesh = jax.make_mesh((1, 1), ("data", "model"))
    by_glob = parameter_specs(g, mesh, {"fc*": P()}, parameters=["fc1", "fc2"])
    assert by_glob == {"fc1": P(), "fc2": P()}
    by_regex = parameter_specs(g, mesh, {re.compile("2$"): P("model")}, parameters=["fc1", "fc2"])
    assert by_regex == {"fc1": P("model"), "fc2": P("model")}
    rules = ShardingRules.of({"fc1": P(None, "model")})
    assert parameter_specs(g, mesh, rules, parameters=["fc1", "fc2"])["fc1"] == P(None, "model")


def test_a_rule_naming_an_axis_the_mesh_lacks_names_the_parameter_and_the_fix():
    g = _mlp_graph(True)
    with pytest.raises(GraphError, match=r"fc1 \[16, 8\].*'model'.*PartitionSpec\(\)"):
        parameter_specs(g, jax.make_mesh((1,), ("data",)), "megatron", parameters=["fc1", "fc2"])
    with pytest.raises(GraphError, match="PartitionSpec"):
        ShardingRules.of({"fc1": "model"})


def test_constrain_activations_adds_constraints_and_keeps_values():
    g = _mlp_graph(True)
    specs = {"fc1": P("model"), "fc2": P(None, "model")}
    pinned = constrain_activations(g, specs, sizes={"data": 1, "model": 1})
    names = [n.cmd.name for n in pinned.nodes]
    assert names.count("sharding_constraint") >= 2
    args = [RNG.normal(size=(4, 8)).astype(np.float32), RNG.normal(size=(16, 8)).astype(np.float32),
            RNG.normal(size=(8, 16)).astype(np.float32)]  # fmt: skip
    np.testing.assert_array_equal(
        np.asarray(interpret(pinned, *args)), np.asarray(interpret(g, *args))
    )


# -- ShardedCheckpoints has the surface of Checkpoints --------------------------------------
def test_sharded_checkpoints_surface(tmp_path):
    with ShardedCheckpoints(tmp_path / "ckpt", keep_last=2) as ckpt:
        assert ckpt.steps() == [] and ckpt.latest is None
        for step in (1, 2, 3):
            ckpt.save(step, {"w": jnp.full((3,), step, jnp.float32)}, metadata={"step": step})
        assert ckpt.steps() == [2, 3] and ckpt.latest == 3
        got = ckpt.restore()
        assert got.step == 3 and got.metadata == {"step": 3}
        np.testing.assert_array_equal(np.asarray(got.state["w"]), [3, 3, 3])
        opt = optax.adam(0.1)
        state = opt.init({"w": jnp.ones(3)})
        ckpt.save(4, {"w": jnp.ones(3)}, optimizer_state=state)
        back = ckpt.restore(4, optimizer_like=state).optimizer_state
        assert jax.tree.structure(back) == jax.tree.structure(state)
        ckpt.delete(4)
        assert ckpt.steps() == [3]
        with pytest.raises(CheckpointError, match="no step 7"):
            ckpt.restore(7)


def test_sharded_checkpoint_of_a_model_resumes_the_run(tmp_path):
    """One device: save a model, restore into a fresh one, the next steps agree."""
    a, b = _repeat(), _repeat()
    a.fit(X, Y)
    with ShardedCheckpoints(tmp_path / "m") as ckpt:
        ckpt.save(1, a)
        assert ckpt.restore_into(b).step == 1
    for _ in range(2):
        np.testing.assert_allclose(float(a.fit(X, Y)), float(b.fit(X, Y)), rtol=1e-6)


def test_sharded_checkpoints_refuse_a_sqlite_file(tmp_path):
    path = tmp_path / "run.ckpt"
    with Checkpoints(path) as ckpt:
        ckpt.save(1, {"w": np.ones(2, np.float32)})
    with pytest.raises(CheckpointError, match="is a file"):
        ShardedCheckpoints(path)


# -- 4 virtual CPU devices ------------------------------------------------------------------
@pytest.mark.parametrize("name", DEVICE_CHECKS)
def test_on_four_devices(devices, name):
    """Each check of DEVICE_SCRIPT (tensor parallel, pipeline, sharded checkpoints)."""
    results = devices.results()
    assert results.get(name) == "ok", results.get(name, f"{name} did not run")
