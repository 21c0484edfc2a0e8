"""Reading ``jax.export`` artifacts (what :meth:`fnnc.models.Model.export` writes) for
``python -m fnnc inspect``: the function's signature, platforms and calling convention.

>>> import os, tempfile
>>> import jax, jax.numpy as jnp
>>> from fnnc.io.exported import describe_exported
>>> (b,) = jax.export.symbolic_shape("b")
>>> spec = jax.ShapeDtypeStruct((b, 3), jnp.float32)
>>> exported = jax.export.export(jax.jit(lambda x: 2 * x))(spec)
>>> path = os.path.join(tempfile.mkdtemp(), "double.jax")
>>> with open(path, "wb") as f:
...     _ = f.write(exported.serialize())
>>> print("\\n".join(describe_exported(path)[1:3]))
inputs:
  [0]  float32[b,3]
"""

from __future__ import annotations

import os

import jax

from fnnc.errors import TensorFileError
from fnnc.io.sniff import looks_exported


def load_exported(path: str | os.PathLike[str]) -> jax.export.Exported:
    """The ``jax.export.Exported`` serialized in ``path``.

    Raises:
        TensorFileError: the file is missing or not a serialized ``jax.export`` module.
    """
    try:
        with open(path, "rb") as f:
            blob = bytearray(f.read())
    except OSError as e:  # missing, a folder, unreadable: not a question of format
        raise TensorFileError(
            f"{os.fspath(path)}: cannot read it ({e.strerror or e}); check the path"
        ) from None
    try:
        return jax.export.deserialize(blob)
    except Exception as e:  # flatbuffers reports damage as any of several errors
        raise TensorFileError(
            f"{os.fspath(path)}: not a jax.export artifact ({type(e).__name__}: {e})"
        ) from None


def artifact_hint(path: str | os.PathLike[str]) -> str:
    """What a reader of another kind of file (a graph file) adds to its error when
    ``path`` is a ``jax.export`` artifact, else ``""``; the file is read whole only when
    its head is a flatbuffer's."""
    try:
        if not looks_exported(path):
            return ""
        load_exported(path)
    except TensorFileError:
        return ""
    return (
        ". It is a jax.export artifact (Model.export writes these), not a graph: run it "
        "with jax.export.deserialize(bytearray(open(path, 'rb').read())).call(...)"
    )


def _argument(label: str, arg: object) -> list[str]:
    """The lines of one argument: an array, a flat dict of them (the parameters of an
    artifact that takes them), or any other pytree, one line per array at its path."""
    leaves, _ = jax.tree_util.tree_flatten_with_path(arg)
    if len(leaves) == 1 and not leaves[0][0]:
        return [f"  {label}  {_aval(arg)}"]
    if isinstance(arg, dict) and all(len(path) == 1 for path, _ in leaves):
        head = f"  {label}  parameters, a dict of {len(arg)}:"
        return [head, *(f"         {name}: {_aval(aval)}" for name, aval in arg.items())]
    head = f"  {label}  a {type(arg).__name__} of {len(leaves)} array(s):"
    rows = [f"         {jax.tree_util.keystr(path)}: {_aval(aval)}" for path, aval in leaves]
    return [head, *rows]


def _aval(aval: object) -> str:
    shape = ",".join(str(d) for d in getattr(aval, "shape", ()))
    return f"{getattr(aval, 'dtype', '?')}[{shape}]"


def describe_exported(path: str | os.PathLike[str]) -> list[str]:
    """The lines ``inspect`` prints for an artifact: name, inputs (with parameter ids
    when they are passed in; the path of each array in a nested argument; keyword
    arguments as ``name=``), outputs, platforms, symbolic dimensions.

    Raises:
        TensorFileError: the file is not a serialized ``jax.export`` module.
    """
    exported = load_exported(path)
    args, kwargs = jax.tree_util.tree_unflatten(exported.in_tree, exported.in_avals)
    lines = [
        f"{os.fspath(path)}: jax.export artifact, function {exported.fun_name}, "
        f"calling convention {exported.calling_convention_version}",
        "inputs:",
    ]
    for k, arg in enumerate(args):
        lines += _argument(f"[{k}]", arg)
    for name, arg in kwargs.items():
        lines += _argument(f"{name}=", arg)
    lines.append("outputs:")
    lines += [f"  [{k}]  {_aval(aval)}" for k, aval in enumerate(exported.out_avals)]
    symbols = sorted({str(d) for a in exported.in_avals for d in a.shape if not isinstance(d, int)})
    lines.append(f"platforms: {', '.join(exported.platforms)}")
    lines.append(f"symbolic dimensions: {', '.join(symbols) or 'none'}")
    call = "*inputs, **keyword_inputs" if kwargs else "*inputs"
    lines.append(f"run: jax.export.deserialize(bytearray(open(path, 'rb').read())).call({call})")
    return lines
