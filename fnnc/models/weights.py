"""A model's parameters in files: :meth:`Model.write <fnnc.models.Model.write>` and
:meth:`Model.read <fnnc.models.Model.read>` on NNC tensor files and safetensors files.

Rows are named as NNC's ``ccv_cnnp_model_write`` names them in both formats
(:mod:`fnnc.io.parameters`): ``<id>`` or ``__<name>__[<id>]``, internals ``<id>(0)``.
A ``.safetensors`` path (or ``format="safetensors"``) is a safetensors file, any other
path an NNC tensor file. Reading takes a name map (``rename=``) from the file's names
to those, e.g. from a Hugging Face checkpoint's ``"fc.weight"`` to ``"t-fc-0-0"``.

>>> import os, tempfile
>>> import numpy as np, optax
>>> from fnnc.models import Dense, Input, Model
>>> x = Input()
>>> model = Model(x, Dense(2, name="fc")(x))
>>> model.compile(np.zeros((1, 3), np.float32), loss="mse", minimizer=optax.sgd(0.1))
>>> path = os.path.join(tempfile.mkdtemp(), "fc.safetensors")
>>> model.write(path)
>>> from safetensors.numpy import save_file, load_file
>>> weights = load_file(path)
>>> save_file({"fc.weight": weights["t-fc-0-0"], "fc.bias": weights["t-fc-0-1"]}, path)
>>> model.read(path, rename={"fc.weight": "t-fc-0-0", "fc.bias": "t-fc-0-1"})
[]
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

from fnnc.errors import TensorFileError
from fnnc.io import SafetensorsFile, TensorFile, read_parameters, write_parameters
from fnnc.io.convert import Rename, Renamed, open_tensors
from fnnc.io.exported import load_exported
from fnnc.io.sniff import looks_exported
from fnnc.models.stacks import stack_parameters, unstack_parameters


def write_model(
    model: Any,
    target: Any,
    *,
    name: str | None = None,
    format: str | None = None,  # noqa: A002 (the file format)
    encoder: Any = None,
) -> None:
    """Writes ``model``'s parameters and internals in one transaction (see
    :meth:`fnnc.models.Model.write`)."""
    values = model.parameters()
    infos = model.engine.infos
    # a Repeat's stacks (statistics too) are written per block, under the unrolled
    # model's (NNC's) ids
    params = unstack_parameters({k: v for k, v in values.items() if not infos[k].internal}, model)
    internals = unstack_parameters({k: v for k, v in values.items() if infos[k].internal}, model)
    _check_format(target, format)
    with contextlib.ExitStack() as stack:
        if format is not None and isinstance(target, (str, os.PathLike)):
            target = stack.enter_context(open_tensors(target, format=format))
        write_parameters(target, params, name=name, internals=internals, encoder=encoder)


def read_model(
    model: Any,
    source: Any,
    *,
    name: str | None = None,
    strict: bool = True,
    format: str | None = None,  # noqa: A002 (the file format)
    rename: Rename | None = None,
) -> list[str]:
    """Reads parameters into ``model``; returns what did not match (see
    :meth:`fnnc.models.Model.read`)."""
    infos = model.engine.infos
    expected: dict[str, Any] = {}
    internals: dict[str, Any] = {}
    for k, i in infos.items():  # a Repeat's stack is read per block, under NNC's ids
        wanted = internals if i.internal else expected
        wanted.update({b: (i.shape[1:], i.dtype) for b in i.blocks} or {k: (i.shape, i.dtype)})
    _check_format(source, format)
    with contextlib.ExitStack() as stack:
        if isinstance(source, (str, os.PathLike)):
            source = stack.enter_context(_open_for_reading(source, format))
        if callable(getattr(source, "snapshot", None)):  # an NNC file: every row read from
            stack.enter_context(source.snapshot())  # one commit, not half of another write
        if rename is not None:
            source = Renamed(source, rename)
        found = read_parameters(source, expected, name=name, internals=internals, strict=strict)
    model.set_parameters(
        {
            **stack_parameters(found, model, strict=False),
            **stack_parameters(found.internals, model, strict=False),
        }
    )
    return [*found.missing, *(m if isinstance(m, str) else str(m) for m in found.mismatched)]


def _check_format(target: Any, format: str | None) -> None:  # noqa: A002 (the file format)
    """Raises :class:`TensorFileError` when ``format`` names another kind of file than the
    open ``target`` is (it would be ignored: an open file is written as what it is)."""
    kinds = {TensorFile: "nnc", SafetensorsFile: "safetensors"}
    kind = next((k for cls, k in kinds.items() if isinstance(target, cls)), None)
    if format is not None and kind is not None and kind != format:
        raise TensorFileError(
            f"{target.path}: format={format!r}, but the file given is an open "
            f"{type(target).__name__} ({kind!r}); drop format= or pass the path"
        )


def _open_for_reading(path: Any, format: str | None) -> Any:  # noqa: A002 (the file format)
    """:func:`open_tensors` for reading; a ``jax.export`` artifact (what
    :meth:`~fnnc.models.Model.export` writes) is said to be one."""
    try:
        return open_tensors(path, readonly=True, format=format)
    except TensorFileError as e:
        try:  # read whole only when its head is a flatbuffer's
            if not looks_exported(path):
                raise
            load_exported(path)
        except TensorFileError:
            raise e from None
        raise TensorFileError(
            f"{e}. It is a jax.export artifact (Model.export writes these: a model's "
            "inference, not its weights): run it with jax.export.deserialize, or read the "
            "weights from a file Model.write wrote"
        ) from None
