"""``model.summary()`` and ``repr(model)``: the layers of a model, Keras-style.

The table has a row per layer call of the model (a model nested in it is one row),
in the order they run: the layer, its output types (``f32[8,16]``, for the compiled
input specs or those given), and each parameter it made with its NNC id (``t-...``;
internals such as batch-norm statistics ``r-...``), type, element count and bytes.
Parameters of a :meth:`Model.from_flax <fnnc.models.Model.from_flax>` model show
their Flax path beside the id. A layer called again shares its first call's
parameters: its later rows say so. The totals count trainable parameters,
non-trainable ones (``is_trainable=False``) and internals apart.

>>> import numpy as np
>>> from fnnc.models import Dense, Input, Model, ReLU
>>> x = Input()
>>> model = Model(x, Dense(2, name="out")(ReLU()(Dense(4, name="hidden")(x))), name="mlp")
>>> print(model.summary(np.zeros((8, 3), np.float32), print_fn=None))
Model 'mlp': 1 input, 1 output
layer            output    parameter           type      count  bytes
input[0]         f32[8,3]
Dense('hidden')  f32[8,4]  t-mlp-0-hidden-0-0  f32[4,3]     12     48
                           t-mlp-0-hidden-0-1  f32[4]        4     16
relu             f32[8,4]
Dense('out')     f32[8,2]  t-mlp-0-out-0-0     f32[2,4]      8     32
                           t-mlp-0-out-0-1     f32[2]        2      8
total: 26 parameters (26 trainable), 104 bytes
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from fnnc.core.text import type_str
from fnnc.errors import ModelError
from fnnc.models import checks
from fnnc.models.layer import BuildContext, ParamInfo


@dataclasses.dataclass
class Row:
    """One layer call of the summary table."""

    layer: str
    outputs: list[str]
    params: list[ParamInfo]
    shared: bool = False


def rows(model: Any, inputs: Sequence[Any] | None = None) -> list[Row]:
    """The table's rows: the inputs, then each layer call (see the module docstring)."""
    specs = _specs(model, inputs)
    ctx = BuildContext(False)
    xs = [ctx.b.input(s.shape, s.dtype, name=f"input[{i}]") for i, s in enumerate(specs)]
    if len(xs) != len(model.inputs):
        raise ModelError(
            f"summary: model {model.describe()} takes {len(model.inputs)} inputs, got "
            f"{len(xs)} specs; pass one array or spec per input"
        )
    table = [Row(f"input[{i}]", [type_str(x)], []) for i, x in enumerate(xs)]

    def row(io: Any, outs: tuple[Any, ...], new: list[Any], made: bool) -> None:
        table.append(Row(_label(io.layer), [type_str(o) for o in outs], new, made and not new))

    # as Model.build does for the outermost model (Engine._build: nested=False)
    with ctx.inside(model, prefix=False):
        model.build_layers(ctx, xs, on_layer=row, where="summary: ")
    if model._engine is not None:  # a compiled model has its parameters: inputs must fit them
        try:
            checks.parameters(model._engine, ctx.params, specs)
        except ModelError as e:
            raise ModelError(f"summary: {e}") from None
    return table


def _label(layer: Any) -> str:
    """A layer as the table names it: a command layer by its command (``relu``)."""
    cmd = getattr(layer, "cmd", None)
    if cmd is None:
        return layer.describe()
    return f"{cmd} ({layer.name!r})" if layer.name else str(cmd)


def _specs(model: Any, inputs: Sequence[Any] | None) -> list[Any]:
    from fnnc.models.engine import _specs as specs_of

    if inputs is not None:
        return list(specs_of(inputs if isinstance(inputs, (list, tuple)) else [inputs]))
    engine = model._engine
    if engine is None or not engine.input_specs:
        raise ModelError(
            f"summary: model {model.describe()} is not compiled, so its input shapes are "
            "unknown; call model.compile(...) first or pass them: "
            "model.summary([np.zeros((batch, ...), np.float32)])"
        )
    return list(engine.input_specs)


def _paths(model: Any) -> dict[str, str]:
    """Flax paths of the parameters of ``model``'s Flax layers (if compiled)."""
    if model._engine is None:
        return {}
    from fnnc.models.flax_bridge import parameter_paths

    return parameter_paths(model)


def _table(lines: list[list[str]]) -> list[str]:
    """Left-aligned text columns, numbers (the last two) right-aligned."""
    widths = [max(len(line[c]) for line in lines) for c in range(6)]
    out = []
    for line in lines:
        cells = [
            cell.rjust(widths[c]) if c >= 4 else cell.ljust(widths[c])
            for c, cell in enumerate(line)
        ]
        out.append("  ".join(cells).rstrip())
    return out


def summary(
    model: Any,
    inputs: Sequence[Any] | None = None,
    *,
    print_fn: Callable[[str], Any] | None = print,
) -> str:
    """The summary table of ``model`` (see the module docstring), printed with
    ``print_fn`` unless it is ``None``, and returned."""
    table = rows(model, inputs)
    paths = _paths(model)
    lines = [["layer", "output", "parameter", "type", "count", "bytes"]]
    for row in table:
        first = [row.layer, ", ".join(row.outputs)]
        if not row.params:
            lines.append([*first, "(shared)" if row.shared else ""])
        for k, info in enumerate(row.params):
            pid = f"{info.id} ({paths[info.id]})" if info.id in paths else info.id
            count = int(np.prod(info.shape, dtype=np.int64))
            nbytes = count * np.dtype(info.dtype).itemsize
            lead = first if k == 0 else ["", ""]
            lines.append([*lead, pid, type_str(info), str(count), str(nbytes)])
    n_in, n_out = len(model.inputs), len(model.outputs)
    name = f" {model.name!r}" if model.name else ""
    head = f"Model{name}: {n_in} input{'s' * (n_in != 1)}, {n_out} output{'s' * (n_out != 1)}"
    params = [info for row in table for info in row.params]
    full = [line + [""] * (6 - len(line)) for line in lines]
    text = "\n".join([head, *_table(full), _totals(params)])
    if print_fn is not None:
        print_fn(text)
    return text


def _totals(params: list[ParamInfo]) -> str:
    def count(infos: list[ParamInfo]) -> int:
        return sum(int(np.prod(i.shape, dtype=np.int64)) for i in infos)

    nbytes = sum(count([i]) * np.dtype(i.dtype).itemsize for i in params)
    weights = [i for i in params if not i.internal]
    trainable = [i for i in weights if i.trainable]
    parts = [f"{count(trainable)} trainable"]
    frozen = count(weights) - count(trainable)
    if frozen:
        parts.append(f"{frozen} non-trainable")
    internals = count([i for i in params if i.internal])
    if internals:
        parts.append(f"{internals} in internals")
    return f"total: {count(params)} parameters ({', '.join(parts)}), {nbytes} bytes"


def describe_model(model: Any) -> str:
    """``repr(model)``: its name, inputs and outputs, layer calls, and, once compiled,
    its input specs, parameter count, loss and minimizer."""
    name = f"{model.name!r}, " if model.name else ""
    layers = len({(id(io.layer), id(io.args)) for io in model._order})
    text = f"Model({name}{len(model.inputs)} in, {len(model.outputs)} out, {layers} layer calls"
    engine = model._engine
    if engine is None:
        return text + ", not compiled)"
    specs = ", ".join(type_str(s) for s in engine.input_specs)
    count = sum(int(np.prod(i.shape, dtype=np.int64)) for i in engine.infos.values())
    loss = engine.loss if isinstance(engine.loss, str) or engine.loss is None else "custom"
    return f"{text}, inputs {specs}, {count} parameters, loss {loss})"
