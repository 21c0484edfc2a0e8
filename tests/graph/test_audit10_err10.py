"""Audit 10 (err10): user mistakes below the model layer get an FnncError that names the
thing and says what was expected, never a raw NumPy/JAX error or a silent wrong value."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from fnnc import io, ops
from fnnc.errors import (
    CheckpointError,
    CommandError,
    DTypeError,
    GraphError,
    GraphInputError,
    ParameterError,
    ShapeError,
    TensorFileError,
)
from fnnc.graph import DynamicGraph, GraphBuilder, save, scan, to_data

F32 = np.float32


@pytest.mark.parametrize("value", [None, "abc", [1.0, "a"], {"a": 1}, object()])
def test_dynamic_write_of_no_numbers_is_an_error_not_nans(value) -> None:
    """``dg.write(x, None)`` wrote NaN (``np.asarray(None, float32)``) without a word and
    ``dg.write(x, "abc")`` was NumPy's ValueError; both are a DTypeError naming ``x`` and
    leave its value as it was (oracle: the value before the write)."""
    dg = DynamicGraph()
    x = dg.variable(F32([1.0, 2.0, 3.0]), name="x")
    with pytest.raises(
        DTypeError, match=r"write into 'x': got .* not an array of numbers.*float32"
    ):
        dg.write(x, value)
    np.testing.assert_array_equal(x.numpy(), F32([1.0, 2.0, 3.0]))


def test_dynamic_write_of_numbers_still_casts_and_broadcasts() -> None:
    dg = DynamicGraph()
    x = dg.variable(F32([1.0, 2.0, 3.0]), name="x")
    dg.write(x, np.int32([4, 5, 6]))
    np.testing.assert_array_equal(x.numpy(), F32([4.0, 5.0, 6.0]))
    dg.write(x, [True, False, True])
    np.testing.assert_array_equal(x.numpy(), F32([1.0, 0.0, 1.0]))
    dg.write(x, 2)
    np.testing.assert_array_equal(x.numpy(), F32([2.0, 2.0, 2.0]))


def test_dynamic_set_of_no_numbers_names_set_and_the_variable() -> None:
    """The message began with an empty place: `` 'x': got None``."""
    dg = DynamicGraph()
    x = dg.variable(F32([1.0]), name="x")
    with pytest.raises(DTypeError, match=r"^set: variable 'x': got None"):
        dg.set(x, None)


def test_gumbel_argmax_over_an_empty_axis_is_a_shape_error_as_argmax_is() -> None:
    """JAX's bare ``ValueError: attempt to get argmax of an empty sequence`` came from the
    forward; argmax and argmin already refused it in their shape rule."""
    x = np.zeros((3, 0), F32)
    key = jax.random.key_data(jax.random.key(0))
    with pytest.raises(ShapeError, match=r"argmax: axis 1 of float32\[3, 0\] is empty"):
        ops.argmax(axis=1)(x)
    with pytest.raises(ShapeError, match=r"gumbel_argmax: axis 1 of float32\[3, 0\] is empty"):
        ops.gumbel_argmax(axis=1)(x, key)
    b = GraphBuilder()
    with pytest.raises(ShapeError, match=r"gumbel_argmax: axis 1 of float32\[3, 0\] is empty"):
        b.exec(ops.gumbel_argmax(axis=1), b.input((3, 0)), b.input(key.shape, dtype=key.dtype))
    assert ops.gumbel_argmax(axis=1)(np.zeros((3, 1), F32), key).tolist() == [[0], [0], [0]]


def test_io_and_graph_files_given_none_or_a_bad_dtype_say_what_they_expect(tmp_path) -> None:
    """Each was a raw error: ``save(None, p)`` / ``to_data(None)`` AttributeError on
    ``.symbols``; ``write_parameters(p, None)`` AttributeError on ``.items``;
    ``read_parameters(p, {id: (shape, "float99")})`` NumPy's TypeError;
    ``Checkpoints.restore_into(None)`` AttributeError; ``ShardedCheckpoints(None)``
    ``os.fspath``'s TypeError; ``TensorFile.write(None, x)`` a bare TypeError."""
    path = str(tmp_path / "p.sqlite3")
    with pytest.raises(GraphError, match=r"^save: expected a fnnc.graph.Graph, got NoneType"):
        save(None, str(tmp_path / "g.json"))
    with pytest.raises(GraphError, match=r"^to_data: expected a fnnc.graph.Graph, got NoneType"):
        to_data(None)
    with pytest.raises(ParameterError, match=r"write_parameters: params is a NoneType; give a di"):
        io.write_parameters(path, None)
    io.write_parameters(path, {"t-a-0-0": np.ones(2, F32)})
    with pytest.raises(ParameterError, match=r"expected\['t-a-0-0'\] is \(\(2,\), 'float99'\)"):
        io.read_parameters(path, {"t-a-0-0": ((2,), "float99")})
    got = io.read_parameters(path, {"t-a-0-0": ((2,), "float32")})["t-a-0-0"]
    np.testing.assert_array_equal(got, np.ones(2, F32))
    with pytest.raises(TensorFileError, match=r"tensor names are str, got NoneType"):
        io.TensorFile(path).write(None, np.ones(2, F32))
    ckpt = io.Checkpoints(str(tmp_path / "c.ckpt"))
    with pytest.raises(CheckpointError, match=r"restore_into: expected a compiled fnnc.mod"):
        ckpt.restore_into(None)
    ckpt.close()
    with pytest.raises(CheckpointError, match=r"ShardedCheckpoints: the path is NoneType"):
        io.ShardedCheckpoints(None)


@pytest.mark.parametrize(
    ("cmd", "kind"),
    [
        (lambda: ops.gemm(transpose_a=None), "a bool"),
        (lambda: ops.layer_norm(epsilon=None), "a number"),
        (lambda: ops.masked_fill(fill=None), "a number"),
        (lambda: ops.softmax(axis=None), "an int"),
        (lambda: ops.moe_routing(kth=2, normalize=None), "a bool"),
    ],
)
def test_none_for_a_bool_or_number_hyper_parameter_is_refused_where_made(cmd, kind) -> None:
    """``None`` fitted every hyper-parameter: ``gemm(transpose_a=None)`` raised
    ``KeyError: None`` in its forward, ``layer_norm(epsilon=None)`` a TypeError on a
    tracer, ``masked_fill(fill=None)`` filled NaN and ``moe_routing(normalize=None)`` read
    as ``False`` though its default is ``True`` (44 parameters of 40 commands)."""
    with pytest.raises(CommandError, match=r"hyper-parameter '\w+' is None \(NoneType\); expe"):
        cmd()
    with pytest.raises(CommandError, match=rf"expected {kind}\. Pass e\.g\."):
        cmd()


def test_none_still_fits_where_a_tuple_or_a_name_is_taken() -> None:
    """A tuple- or str-defaulted parameter still takes ``None`` to its shape rule (some
    give it a meaning); masked_fill with a number fills as ``np.where`` does."""
    x, mask = np.arange(4, dtype=F32), np.array([0, 1, 0, 1], np.int32)
    got = ops.masked_fill(eq=0, fill=-1.0)(x, mask)
    np.testing.assert_array_equal(np.asarray(got), np.where(mask == 0, F32(-1.0), x))
    assert ops.group_norm(groups=1, reduce_axes=None).kwargs["reduce_axes"] is None
    with pytest.raises(CommandError, match=r"reduce_sum\[axes=None\]: the shape rule"):
        ops.reduce_sum(axes=None)(x)


@pytest.mark.parametrize("shape", [("a",), (3.0, 2), (True, 6)])
def test_dynamic_reshape_to_sizes_that_are_not_ints_names_the_variable(shape) -> None:
    """``x.reshape("a")`` was ``int()``'s bare ValueError; ``x.reshape(3.0, 2)`` was taken
    as ``(3, 2)`` though NumPy refuses a float size (oracle: ``np.reshape`` raises)."""
    dg = DynamicGraph()
    x = dg.variable(np.arange(6, dtype=F32), name="x")
    with pytest.raises(TypeError):
        np.arange(6).reshape(*shape)
    with pytest.raises(ShapeError, match=r"variable 'x': reshape takes ints .* e\.g\. x\.reshape"):
        x.reshape(*shape)
    np.testing.assert_array_equal(x.reshape(np.int64(3), -1).numpy(), np.arange(6).reshape(3, 2))


def test_an_exported_node_checks_its_inputs_against_its_module() -> None:
    """Its shape rule returned the output specs whatever came, so a wrong count, rank or
    dtype reached ``Exported.call`` and JAX's bare ValueError ("Rank mismatch for
    args[0]") came back with no node named."""
    from jax import lax

    from fnnc.core.command import Spec
    from fnnc.ops.primitive import export_command, primitive_command

    spec = Spec((3, 4), np.dtype(F32))
    cmd = export_command(primitive_command(lax.erf_p, {}, [((3, 4), F32)]), [spec])
    x = np.linspace(-1, 1, 12, dtype=F32).reshape(3, 4)
    np.testing.assert_allclose(np.asarray(cmd(x)), np.asarray(lax.erf(x)), rtol=1e-6)
    with pytest.raises(CommandError, match=r"module takes 1 input\(s\) \(float32\[3, 4\]\), got 2"):
        cmd(x, x)
    with pytest.raises(DTypeError, match=r"input 0 is int32\[3, 4\], its module takes float32\["):
        cmd(x.astype(np.int32))
    b = GraphBuilder()
    with pytest.raises(
        ShapeError, match=r"node 'e' \(exported\): exported: input 0 is float32\[12\]"
    ):
        b.exec(cmd, b.input((12,)), name="e")


@pytest.mark.parametrize("axes", [(1.0,), (True,)])
def test_an_axis_that_is_not_an_int_is_a_rule_error_not_jax_s(axes) -> None:
    """``reduce_sum(axes=(1.0,))`` passed the range check and failed in the forward with
    jnp's "'float' object cannot be interpreted as an integer"; ``(True,)`` summed axis
    1. Both are now the RuleError ``axes=("a",)`` already gave."""
    x = np.ones((2, 3), F32)
    with pytest.raises(CommandError, match=r"reduce_sum.*\(TypeError: axis .* is not an int"):
        ops.reduce_sum(axes=axes)(x)
    np.testing.assert_array_equal(np.asarray(ops.reduce_sum(axes=(1,))(x)), x.sum(1, keepdims=True))


def test_scan_of_a_body_that_is_no_graph_says_so() -> None:
    """``scan(b, None, [x], length=2)`` was ``AttributeError: 'NoneType' object has no
    attribute 'inputs'``; while_loop and case_of already named a missing graph."""
    b = GraphBuilder()
    x = b.input((2,))
    with pytest.raises(GraphError, match=r"^scan: body: expected a fnnc.graph.Graph, got NoneType"):
        scan(b, None, [x], length=2)


def test_sharding_planners_and_compile_given_none_say_what_they_take() -> None:
    """``data_parallel(g, None)`` / ``tensor_parallel(g, None)`` / ``parameter_specs(g, None)``
    were AttributeErrors on ``mesh.axis_names``, ``data_parallel(None, mesh)`` one on
    ``graph.inputs`` and ``compile(g, shardings=3)`` one on ``.inputs`` at the first call."""
    from jax.sharding import AbstractMesh

    from fnnc.graph import compile, data_parallel, parameter_specs, tensor_parallel

    b = GraphBuilder()
    g = b.build([b.exec(ops.relu(), b.input((4, 3), name="x"))])
    mesh = AbstractMesh((1,), ("data",))
    for plan in (data_parallel, tensor_parallel, parameter_specs):
        with pytest.raises(GraphError, match=r"mesh is NoneType None; expected a jax.sharding.Mes"):
            plan(g, None)
    with pytest.raises(GraphError, match=r"^data_parallel: expected a fnnc.graph.Graph, got None"):
        data_parallel(None, mesh)
    with pytest.raises(GraphInputError, match=r"compile: shardings is int 3; expected a fnnc.gra"):
        compile(g, shardings=3)
    assert data_parallel(g, mesh).mesh is mesh  # an AbstractMesh still plans layouts
