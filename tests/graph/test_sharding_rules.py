"""Sharding rules on graphs, in-process: roles found from structure, the Megatron table,
user rules per layer name, FSDP on top, optimizer state, activation constraints and the
errors. Layouts are checked on abstract meshes (no devices needed); values run on one
device, where the constraints are no-ops."""

from __future__ import annotations

import re

import jax
import numpy as np
import optax
import pytest
from jax.sharding import AbstractMesh
from jax.sharding import PartitionSpec as P

from fnnc import ops
from fnnc.errors import GraphError, ShapeError
from fnnc.graph import (
    GraphBuilder,
    ShardingRules,
    TensorSymbol,
    compile,
    constrain_activations,
    find_roles,
    from_data,
    interpret,
    minimize,
    parameter_specs,
    scan,
    state_specs,
    tensor_parallel,
    to_data,
)
from fnnc.models import (
    Add,
    Dense,
    Embedding,
    Input,
    LayerNorm,
    Model,
    MultiHeadAttention,
    Pipeline,
    ReLU,
    Repeat,
    Sequential,
)
from fnnc.models.layer import BuildContext
from fnnc.models.llm_layers import SwiGLU

MESH = AbstractMesh((2, 4), ("data", "model"))


def _mlp(transpose_b: bool = True):
    b = GraphBuilder()
    x = b.input((4, 8), name="x")
    w1 = b.input((32, 8) if transpose_b else (8, 32), name="fc1")
    b1 = b.input((32,), name="fc1.bias")
    w2 = b.input((8, 32) if transpose_b else (32, 8), name="fc2")
    b2 = b.input((8,), name="fc2.bias")
    gemm = ops.gemm(transpose_b=transpose_b)
    h = b.exec(ops.relu(), b.exec(gemm, x, w1, b1))
    return b.build([b.exec(gemm, h, w2, b2)])


def _roles(graph):
    return {graph.symbols[s].name: (r.name, r.dim) for s, r in find_roles(graph).items()}


def _transformer_graph(vocab: int = 16, width: int = 8):
    tok = Input(name="tokens")
    h = Embedding(vocab, width, name="embed")(tok)
    h = Add()(h, MultiHeadAttention(4, name="attn")(LayerNorm(name="ln1")(h)))
    m = Dense(width, name="mlp2")(ReLU()(Dense(4 * width, name="mlp1")(LayerNorm(name="ln2")(h))))
    model = Model([tok], [Dense(vocab, name="logits")(Add()(h, m))], name="tiny")
    ctx = BuildContext(False)
    out = model.build(ctx, ctx.b.input((4, 6), np.int32, name="tokens"), nested=False)
    names = {pid: info.owners[-1].name for pid, info in ctx.params.items()}
    return ctx.b.build([out]), list(ctx.params), names


def test_mlp_first_dense_by_columns_second_by_rows_either_weight_layout():
    assert _roles(_mlp()) == {
        "fc1": ("column", 0),
        "fc1.bias": ("column", 0),
        "fc2": ("row", 1),
    }
    assert _roles(_mlp(transpose_b=False)) == {
        "fc1": ("column", 1),
        "fc1.bias": ("column", 0),
        "fc2": ("row", 0),
    }
    specs = parameter_specs(_mlp(transpose_b=False), MESH, parameters=[1, 2, 3, 4])
    assert specs == {"fc1": P(None, "model"), "fc1.bias": P("model"), "fc2": P("model"),
                     "fc2.bias": P()}  # fmt: skip


def test_transformer_roles_attention_heads_embedding_vocabulary():
    graph, pids, names = _transformer_graph()
    specs = parameter_specs(graph, MESH, "megatron", parameters=pids, names=names)
    by_layer = {(names[p], p.rsplit("-", 1)[1]): s for p, s in specs.items()}
    assert by_layer[("embed", "0")] == P("model")  # [vocab, width]: by vocabulary
    for i in ("0", "1", "2"):  # q, k, v [width, width] and their biases: by heads
        assert by_layer[("attn", i)] == P("model"), i
        assert by_layer[("attn", str(int(i) + 4))] == P("model"), i
    assert by_layer[("attn", "3")] == P(None, "model")  # output projection: by rows
    assert by_layer[("attn", "7")] == P()
    assert by_layer[("mlp1", "0")] == P("model") and by_layer[("mlp1", "1")] == P("model")
    assert by_layer[("mlp2", "0")] == P(None, "model") and by_layer[("mlp2", "1")] == P()
    # a lone dense and the norms stay whole
    assert by_layer[("logits", "0")] == P() and by_layer[("ln1", "0")] == P()


def test_scan_blocks_take_their_slices_roles_past_the_block_axis():
    """A loop of MLP blocks: fc1 and its bias stacked ``[n, ...]`` (column on axis 1),
    fc2 a loop constant shared by every block (row on its own axis 1)."""
    body = GraphBuilder()
    h = body.input((4, 8), name="h")
    w1, b1 = body.input((32, 8), name="w1"), body.input((32,), name="b1")
    w2 = body.input((8, 32), name="w2")
    gemm = ops.gemm(transpose_b=True)
    inner = body.exec(ops.relu(), body.exec(gemm, h, w1, b1))
    block = body.build([body.exec(ops.ewsum(), h, body.exec(gemm, inner, w2))])
    b = GraphBuilder()
    x = b.input((4, 8), name="x")
    fc1, bias = b.input((3, 32, 8), name="fc1"), b.input((3, 32), name="fc1.bias")
    fc2 = b.input((8, 32), name="fc2")
    (out,) = scan(b, block, [x], [fc1, bias], [fc2], name="blocks")
    graph = b.build([out])
    assert _roles(graph) == {"fc1": ("column", 1), "fc1.bias": ("column", 1), "fc2": ("row", 1)}
    specs = parameter_specs(graph, MESH, parameters=[1, 2, 3])
    assert specs == {"fc1": P(None, "model"), "fc1.bias": P(None, "model"),
                     "fc2": P(None, "model")}  # fmt: skip


def _repeat_graph(blocks):
    def block():
        x = Input()
        h = Add()(x, MultiHeadAttention(4, name="attn")(LayerNorm(name="ln1")(x)))
        m = Dense(32, name="mlp2")(ReLU()(Dense(64, name="mlp1")(LayerNorm(name="ln2")(h))))
        return Model(x, Add()(h, m), name="block")

    tok = Input(name="tokens")
    h = blocks(block)(Embedding(16, 32, name="embed")(tok))
    model = Model([tok], [Dense(16, name="logits")(h)], name="tiny")
    ctx = BuildContext(False)
    out = model.build(ctx, ctx.b.input((4, 6), np.int32, name="tokens"), nested=False)
    specs = parameter_specs(ctx.b.build([out]), MESH, parameters=list(ctx.params))
    return specs, {pid: info.blocks for pid, info in ctx.params.items()}


@pytest.mark.parametrize("pipeline", [None, Pipeline(stages=2, microbatches=2)])
def test_repeat_stacks_take_the_unrolled_blocks_layouts_shifted(pipeline):
    """Every stacked parameter of a Repeat (a scan node; with ``pipeline``, a pipeline
    node) of attention + MLP blocks is laid out as the unrolled model lays out each of
    its blocks' copies, one axis further on."""
    unrolled, _ = _repeat_graph(lambda b: Sequential([b() for _ in range(4)], name="blocks"))
    stacked, blocks = _repeat_graph(lambda b: Repeat(b, 4, name="blocks", pipeline=pipeline))
    split = 0
    for pid, spec in stacked.items():
        if not blocks[pid]:
            assert spec == unrolled[pid], pid
            continue
        per_block = {unrolled[bid] for bid in blocks[pid]}
        assert len(per_block) == 1, (pid, per_block)
        (want,) = per_block
        assert spec == (P(None, *want) if want else P()), (pid, spec, want)
        split += bool(want)
    assert split == 10  # q, k, v and biases, out projection, mlp1 and bias, mlp2


def test_swiglu_gate_and_up_by_columns_down_by_rows():
    model = Model(x := Input(), SwiGLU(16, name="ffn")(x))
    ctx = BuildContext(False)
    out = model.build(ctx, ctx.b.input((4, 8), name="x"), nested=False)
    graph = ctx.b.build([out])
    roles = {graph.symbols[s].name.rsplit("-", 1)[1]: r.name for s, r in find_roles(graph).items()}
    assert roles == {"0": "column", "1": "column", "2": "row"}


def test_fused_attention_weights_split_by_joined_heads():
    b = GraphBuilder()
    q = b.input((2, 5, 4, 8), name="q")
    w = b.input((6, 32), name="wo")
    mask = b.input((1, 1, 5, 5), name="mask")
    y, _ = b.exec(ops.scaled_dot_product_attention(), q, q, q, mask, w)
    assert _roles(b.build([y])) == {"wo": ("heads_out", 1)}


def test_user_rules_by_layer_name_and_id_override_the_table():
    graph, pids, names = _transformer_graph()
    rules = ShardingRules.of(
        {"embed": P(None, "model"), re.compile(r"mlp2-0-0$"): P("model", None), "ln*": P()}
    )
    specs = parameter_specs(graph, MESH, rules, parameters=pids, names=names)
    embed = next(p for p in pids if names[p] == "embed")
    mlp2 = next(p for p in pids if p.endswith("mlp2-0-0"))
    mlp1 = next(p for p in pids if p.endswith("mlp1-0-0"))
    assert specs[embed] == P(None, "model")  # glob on the layer name
    assert specs[mlp2] == P("model", None)  # regex on the parameter id
    assert specs[mlp1] == P("model")  # untouched: the default table
    off = ShardingRules(roles=(("column", "model"), ("row", "model"), ("vocab", None)))
    assert parameter_specs(graph, MESH, off, parameters=pids, names=names)[embed] == P()


def test_a_user_rule_matching_no_parameter_names_the_layers_and_ids():
    """A typo ("mlpp1" for "mlp1") would leave the parameters it meant replicated, the
    table's layout silently taken instead: every user rule must match a parameter."""
    graph, pids, names = _transformer_graph()
    typo = ShardingRules.of({"embed": P(None, "model"), "mlpp1": P(None, "model")})
    want = r"the rule\(s\) 'mlpp1' match no parameter; .*the layers are \[.*embed.*mlp1.*\]"
    with pytest.raises(GraphError, match=want + r" and the parameter ids \[t-"):
        parameter_specs(graph, MESH, typo, parameters=pids, names=names)
    with pytest.raises(GraphError, match=r"'fc3\$' match no parameter"):
        parameter_specs(_mlp(), MESH, {re.compile("fc3$"): P()}, parameters=[1, 2, 3, 4])


def test_fsdp_splits_the_other_axis_over_data():
    specs = parameter_specs(_mlp(), MESH, ShardingRules(fsdp=True), parameters=[1, 2, 3, 4])
    assert specs == {"fc1": P("model", "data"), "fc1.bias": P("model"), "fc2": P("data", "model"),
                     "fc2.bias": P("data")}  # fmt: skip


def test_optimizer_state_takes_its_parameters_layout():
    params = [jax.ShapeDtypeStruct((32, 8), np.float32), jax.ShapeDtypeStruct((8,), np.float32)]
    specs = [P("model"), P()]
    got = state_specs(optax.adam(1e-3), params, specs)
    shapes = [x.shape for x in jax.tree.leaves(jax.eval_shape(optax.adam(1e-3).init, params))]
    assert list(zip(shapes, got)) == [
        ((), P()), ((32, 8), P("model")), ((8,), P()), ((32, 8), P("model")), ((8,), P()),
    ]  # fmt: skip
    chained = optax.chain(optax.clip_by_global_norm(1.0), optax.sgd(0.1, momentum=0.9))
    assert state_specs(chained, params, specs) == [P("model"), P()]
    # a transformation that regroups the list by parameter name (as the model's
    # partitioned minimizers do): leaves under a parameter's key take its layout
    named = [TensorSymbol(0, (32, 8), np.dtype(np.float32), "w"),
             TensorSymbol(1, (8,), np.dtype(np.float32), "b")]  # fmt: skip
    adam = optax.adam(1e-3)
    regroup = optax.GradientTransformation(lambda ps: adam.init({"w": ps[0], "b": ps[1]}), None)
    got = state_specs(regroup, named, specs)  # dict keys flatten sorted: b before w
    assert got == [P(), P(), P("model"), P(), P("model")]


def test_tensor_parallel_plan_of_a_training_step():
    b = GraphBuilder()
    x = b.input((4, 8), name="x")
    w1, w2 = b.input((32, 8), name="fc1"), b.input((8, 32), name="fc2")
    h = b.exec(ops.relu(), b.exec(ops.gemm(transpose_b=True), x, w1))
    y = b.exec(ops.gemm(transpose_b=True), h, w2)
    graph = b.build([b.exec(ops.reduce_sum(axes=(0, 1)), b.exec(ops.mul(), y, y))])
    step, layout = minimize(graph, graph.outputs[0], [w1, w2], optax.sgd(0.1, momentum=0.9))
    plan = tensor_parallel(step, jax.make_mesh((1, 1), ("data", "model")), layout=layout)
    by_name = {step.symbols[s].name: spec for s, spec in zip(step.inputs, plan.inputs)}
    assert by_name["fc1"] == P("model") and by_name["fc2"] == P(None, "model")
    assert by_name["x"] == P("data")
    assert plan.inputs[:4] == (P("model"), P(None, "model"), P("model"), P(None, "model"))
    assert plan.outputs[:4] == plan.inputs[:4]  # momentum as its parameter, kept after


def test_constraints_pin_layers_keep_values_and_save():
    graph = _mlp()
    specs = parameter_specs(graph, MESH, parameters=[1, 2, 3, 4])
    pinned = constrain_activations(graph, specs, sizes=dict(MESH.shape))
    added = [n for n in pinned.nodes if n.cmd.name == "sharding_constraint"]
    assert [n.cmd.param("spec") for n in added] == [("data", "model"), ("data", None)]
    assert pinned.inputs == graph.inputs and pinned.outputs == graph.outputs
    assert from_data(to_data(pinned)) == pinned
    rng = np.random.default_rng(0)
    args = [rng.normal(size=graph.symbols[s].shape).astype(np.float32) for s in graph.inputs]
    want = interpret(graph, *args)
    np.testing.assert_allclose(interpret(pinned, *args), want, rtol=1e-6)
    np.testing.assert_allclose(compile(pinned)(*args), want, rtol=1e-5)  # no mesh: no-op
    none = dict.fromkeys(specs, P())
    assert constrain_activations(graph, none, sizes=dict(MESH.shape)) is graph


def test_errors_name_the_parameter_the_axis_and_the_fix():
    graph = _mlp()
    one_axis = AbstractMesh((4,), ("data",))
    with pytest.raises(GraphError, match=r"parameter fc1 \[32, 8\].*mesh axis 'model'.*"
                       r"jax\.make_mesh\(\(2, 2\), \('data', 'model'\)\)"):  # fmt: skip
        parameter_specs(graph, one_axis, parameters=[1, 3])
    wide = AbstractMesh((1, 3), ("data", "model"))
    split = r"fc1 \[32, 8\] is split along axis 0 \(32\) over mesh axis 'model' of size 3"
    with pytest.raises(ShapeError, match=split + r".*'fc1': PartitionSpec\(\)"):
        parameter_specs(graph, wide, parameters=[1, 3])
    with pytest.raises(GraphError, match=r"fc2 \[8, 32\] gets .* names 3 axes"):
        parameter_specs(graph, MESH, {"fc2": P(None, None, "model")}, parameters=[1, 3])
    with pytest.raises(GraphError, match="expected a ShardingRules"):
        ShardingRules.of("zero")
    with pytest.raises(GraphError, match=r"gives 'model'; expected a\s+jax\.sharding"):
        ShardingRules.of({"fc1": "model"})


def test_fsdp_leaves_a_parameter_a_rule_already_split_over_data():
    """A rule that splits fc2 over "data" keeps its layout under fsdp=True (adding
    "data" again would split one mesh axis twice, which JAX refuses)."""
    rules = ShardingRules(layers=(("fc2", P("data")),), fsdp=True)
    specs = parameter_specs(_mlp(), MESH, rules, parameters=[1, 3])
    assert specs == {"fc1": P("model", "data"), "fc2": P("data")}


def test_a_mesh_axis_used_twice_or_missing_from_specs_is_named():
    graph = _mlp()
    with pytest.raises(GraphError, match=r"fc1 \[32, 8\] gets .* splits over mesh axis "
                       r"'model' twice.*'fc1': PartitionSpec\('model'\)"):  # fmt: skip
        parameter_specs(graph, MESH, {"fc1": P("model", "model")}, parameters=[1])
    mesh = jax.make_mesh((1, 1), ("data", "model"))
    with pytest.raises(GraphError, match=r"fc1 \[32, 8\] is split over mesh axis 'nope' by "
                       r"specs=, but the mesh has axes \['data', 'model'\]"):  # fmt: skip
        tensor_parallel(graph, mesh, parameters=["fc1"], specs={"fc1": P("nope")})
