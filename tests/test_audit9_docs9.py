"""Prose claims of the docs (guides, README, docstrings) that their code blocks do not
print: each test checks one claim against an independent oracle."""

from __future__ import annotations

import numpy as np
import optax
import pytest

from fnnc.errors import ModelError


def _broken_loss(outputs, targets):
    return (outputs - targets) ** 2  # lists, not arrays: Python's TypeError


@pytest.fixture(scope="module")
def broken():
    """A compiled one-Dense model whose loss function raises, and a batch for it."""
    from fnnc.models import Dense, Input, Model

    x = Input()
    model = Model(x, Dense(2, name="o")(x))
    xs, ys = np.ones((4, 3), np.float32), np.ones((4, 2), np.float32)
    model.compile(xs, loss=_broken_loss, minimizer=optax.sgd(0.1))
    return model, xs, ys


def test_a_loss_function_error_in_score_is_a_model_error_caused_by_the_original(broken):
    """models guide: a loss function's error "comes back as a ModelError that restates
    this, the original as its __cause__" -- score called the function eagerly and let
    the raw TypeError out."""
    model, xs, ys = broken
    with pytest.raises(ModelError, match=r"called as fn\(outputs, targets\)") as e:
        model.score(xs, ys)
    assert isinstance(e.value.__cause__, TypeError), e.value.__cause__
    with pytest.raises(TypeError) as original:
        _broken_loss([xs], [ys])
    assert str(original.value) in str(e.value)


def test_train_keeps_the_loss_function_error_as_the_cause(broken):
    """train re-raised fit's ModelError with its batch prefix `from None`, dropping the
    original error the guide promises as __cause__."""
    model, xs, ys = broken
    with pytest.raises(ModelError, match="train: epoch 0, batch 0: the loss function") as e:
        model.train((xs, ys), batch_size=4, verbose=False)
    assert isinstance(e.value.__cause__, TypeError), e.value.__cause__


def test_train_cuts_arrays_into_full_batches_and_weighs_a_frames_short_batch_by_rows():
    """models guide: arrays give full batches only (10 rows, batch 4: 2 steps, as
    ``len(ArrayBatches)`` says), while a dataframe's own ``batch`` may end short, and
    the epoch's loss weighs that batch by its rows: with a learning rate of 0, the
    NumPy mean loss over all 10 rows."""
    from fnnc.data import DataFrame
    from fnnc.models import Dense, Input, Model

    rng = np.random.default_rng(0)
    xs = rng.standard_normal((10, 3)).astype(np.float32)
    ys = rng.integers(0, 2, 10).astype(np.int32)
    x = Input()
    model = Model(x, Dense(2, name="o")(x))
    model.compile(xs[:4], loss="softmax_crossentropy", minimizer=optax.sgd(0.0))
    model.train((xs, ys), epochs=1, batch_size=4, verbose=False)
    assert model.train_progress.step == 2  # 10 // 4: the last 2 rows sat the epoch out
    frame = DataFrame.from_arrays(x=xs, y=ys).batch(4)  # 4, 4, 2
    history = model.train(frame, epochs=1, verbose=False)
    assert model.train_progress.step == 2 + 3
    logits = np.asarray(model.evaluate(xs), np.float64)
    logsumexp = np.log(np.exp(logits).sum(1))
    want = np.mean(logsumexp - logits[np.arange(10), ys])
    assert history["loss"][0] == pytest.approx(want, rel=1e-5)


def test_node_names_show_in_the_compiled_hlo_and_the_lowered_text_with_debug_info():
    """compile's docstring and the graphs guide: node names show in the HLO. The
    lowered text has them only as locations, which ``as_text()`` leaves out:
    ``lowered_text(debug_info=True)`` keeps them (JAX's ``Lowered.as_text`` is the
    oracle of what the text holds)."""
    from fnnc import ops
    from fnnc.graph import GraphBuilder, compile

    b = GraphBuilder()
    x, w = b.input((4, 3), name="x"), b.input((2, 3), name="w")
    y = b.exec(ops.gemm(transpose_b=True), x, w, name="fc_audit9")
    program = compile(b.build([b.exec(ops.relu(), y, name="act_audit9")]))
    assert "jit(program)/fc_audit9/" not in program.lowered_text()
    for text in (program.lowered_text(debug_info=True), program.compiled_text()):
        assert "jit(program)/fc_audit9/" in text and "jit(program)/act_audit9/" in text


def test_debug_prints_each_pass_time_node_counts_and_a_diff_of_the_listing(capsys):
    """errors guide and config: ``FNNC_DEBUG=1`` prints each pass's time, node counts
    and the diff of the listing (it said "the graph"); the diff is difflib's of the two
    listings (the oracle)."""
    import difflib

    from fnnc import config, ops
    from fnnc.graph import GraphBuilder, cse, run_passes

    b = GraphBuilder()
    x = b.input((4,), name="x")
    graph = b.build([b.exec(ops.ewsum(), b.exec(ops.relu(), x), b.exec(ops.relu(), x))])
    with config.override(debug=1):
        after = run_passes(graph, (cse,))
    printed = capsys.readouterr().out
    assert printed.startswith("-- cse (round 1): 3 -> 2 nodes, ")
    for line in difflib.unified_diff(str(graph).splitlines(), str(after).splitlines(), n=0):
        if line[:1] in "+-" and line[:3] not in ("+++", "---"):
            assert line in printed.splitlines(), (line, printed)


def test_only_flash_attention_and_cpu_convolutions_mixed_are_defaults_by_priority():
    """commands and autotune guides, ``fnnc.core.selection``: fnnc's own backends
    register priority 0 but for flash attention (with its ``wins``) and CPU
    convolution's ``"mixed"``; a registered ``Backend`` has priority 1 and so runs
    instead of the reference (the guide said a priority never makes a default)."""
    import jax
    import jax.numpy as jnp

    from fnnc import ops

    own = {
        (name, backend)
        for name in ops.registry()
        if name != "gradient"  # gradient nodes take their forward command's priority
        for backend, b in ops.backends_of(name).items()
        if b.priority > 0 and getattr(b.forward, "__module__", "").startswith("fnnc.")
    }
    assert own == {("scaled_dot_product_attention", "pallas"), ("convolution", "mixed")}
    assert ops.backends_of("scaled_dot_product_attention")["pallas"].wins is not None
    assert ops.backends_of("convolution")["mixed"].platforms == ("cpu",)
    assert ops.Backend("b", lambda x: x, ("cpu",)).priority == 1
    spec = [jax.ShapeDtypeStruct((2, 64, 64, 32), jnp.float32)]  # 8192 output rows
    conv = ops.convolution(padding="SAME")
    kernel = jax.ShapeDtypeStruct((32, 3, 3, 32), jnp.float32)
    assert ops.select_backend(conv, [*spec, kernel], "cpu") == "mixed"


def test_keep_every_alone_keeps_its_multiples_and_the_newest(tmp_path):
    """Checkpoints' docstring: given keep_every alone, a save deletes the other steps
    (ShardedCheckpoints kept every step then; tests/io/test_audit8_ckpt8.py compares
    the two). The oracle is the set by its definition."""
    from fnnc.io import Checkpoints

    with Checkpoints(tmp_path / "k.ckpt", keep_every=3) as ckpt:
        for step in range(1, 9):
            ckpt.save(step, {"w": np.zeros(1, np.float32)})
            assert ckpt.steps() == sorted({s for s in range(1, step + 1) if s % 3 == 0} | {step})


def test_fsdp_splits_the_named_parameters_and_refuses_to_split_nothing():
    """multi-device guide: with parameter_sharding="fsdp" the parameters split along
    their first axis that divides. Without parameters= or layout= no input was one,
    and FSDP silently replicated everything; it is now a GraphError. The oracle for
    the split is the first axis whose size divides by the mesh axis."""
    from jax.sharding import AbstractMesh, PartitionSpec

    from fnnc import ops
    from fnnc.errors import GraphError
    from fnnc.graph import GraphBuilder, data_parallel

    b = GraphBuilder()
    x, w, v = b.input((8, 3), name="x"), b.input((3, 4), name="w"), b.input((3, 5), name="v")
    graph = b.build([b.exec(ops.gemm(), x, w), b.exec(ops.gemm(), x, v)])
    mesh = AbstractMesh((2,), ("data",))
    with pytest.raises(GraphError, match=r"name them with parameters=\[\.\.\.\]"):
        data_parallel(graph, mesh, batch=["x"], parameter_sharding="fsdp")
    plan = data_parallel(graph, mesh, parameters=["w", "v"], parameter_sharding="fsdp")
    want = []
    for shape in ((8, 3), (3, 4), (3, 5)):
        axis = next((k for k, n in enumerate(shape) if n % 2 == 0), None)
        want.append(PartitionSpec() if axis is None else PartitionSpec(*[None] * axis, "data"))
    assert plan.inputs == tuple(want)


def test_which_error_a_wrong_feed_raises():
    """errors guide's table: GraphInputError is the wrong number of arrays; a wrong
    shape or dtype is the ShapeError / DTypeError its own example prints (the table
    said GraphInputError for all three)."""
    from fnnc import ops
    from fnnc.errors import DTypeError, GraphInputError, ShapeError
    from fnnc.graph import GraphBuilder, interpret

    b = GraphBuilder()
    graph = b.build([b.exec(ops.relu(), b.input((4,), name="x"))])
    with pytest.raises(GraphInputError, match="takes 1 array"):
        interpret(graph, np.ones(4, np.float32), np.ones(4, np.float32))
    for bad, kind in ((np.ones(3, np.float32), ShapeError), (np.ones(4, np.int32), DTypeError)):
        with pytest.raises(kind, match=r"input %0 \(x\) expects float32\[4\]") as e:
            interpret(graph, bad)
        assert not isinstance(e.value, GraphInputError)


def test_a_graph_saved_to_an_open_tensor_file_is_named_graph(tmp_path):
    """save/load docstrings: a TensorFile without name= stores and reads the graph
    named "graph" (load_from with that name is the oracle), beside the tensors."""
    from fnnc import ops
    from fnnc.graph import GraphBuilder, load, save
    from fnnc.io import TensorFile, load_from

    b = GraphBuilder()
    graph = b.build([b.exec(ops.relu(), b.input((3,), name="x"))])
    path = tmp_path / "t.sqlite3"
    with TensorFile(path) as f:
        f.write("w", np.ones(2, np.float32))
        save(graph, f)
        assert load(f) == graph
    assert load_from(path, "graph") == graph == load(path, name="graph")
    assert TensorFile(path).names() == ["w"]
