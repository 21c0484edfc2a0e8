"""The cnnp layers: each emits fnnc commands with NNC's parameter layouts.

Dense weights are ``[out, in]`` (``y = x Wᵀ + b``), data NHWC; weight is parameter 0,
bias parameter 1. The layers over spatial axes (convolution, pooling) are in
:mod:`fnnc.models.spatial_layers`, the normalisations in :mod:`fnnc.models.norm_layers`,
:class:`Parameter` in :mod:`fnnc.models.parameter_of`.

>>> import numpy as np
>>> from fnnc.models import Input, Dense, Model
>>> x = Input()
>>> model = Model([x], [Dense(2, name="linear")(x)])
>>> model.compile([np.zeros((1, 3), np.float32)])
>>> sorted(model.parameters())
['t-linear-0-0', 't-linear-0-1']
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np

from fnnc import ops
from fnnc.core.dtypes import is_floating
from fnnc.core.ir import Symbol
from fnnc.errors import CommandError
from fnnc.models.attention_layers import MultiHeadAttention as MultiHeadAttention
from fnnc.models.layer import (
    BuildContext,
    Layer,
    ModelError,
    flag,
    glorot_uniform,
    is_int,
    normal_init,
    positive_int,
    real_in,
    shape_of,
    zeros,
)
from fnnc.models.norm_layers import BatchNorm as BatchNorm
from fnnc.models.norm_layers import GroupNorm as GroupNorm
from fnnc.models.norm_layers import LayerNorm as LayerNorm
from fnnc.models.norm_layers import RMSNorm as RMSNorm
from fnnc.models.parameter_of import Parameter as Parameter
from fnnc.ops import Command


class Dense(Layer):
    """``y = x Wᵀ + b`` over the last axis; weight ``[count, in]``."""

    owns_parameters = True

    def __init__(self, count: int, *, no_bias: bool = False, **kw: Any):
        super().__init__(**kw)
        self.count = positive_int(self, "count", count)
        self.no_bias = flag(self, "no_bias", no_bias)

    def build(self, ctx: BuildContext, x: Symbol) -> Symbol:
        w = ctx.param(self, 0, (self.count, x.shape[-1]), glorot_uniform([1], [0]), x.dtype)
        args = [x, w] if self.no_bias else [x, w, ctx.param(self, 1, (self.count,), zeros, x.dtype)]
        return ctx.b.exec(ops.gemm(transpose_b=True), *args, name=ctx.layer_id(self))


class Dropout(Layer):
    """Drops with probability ``p`` while training; the identity when testing.

    Kept values are scaled by ``1 / (1 - p)``. ``entirety=True`` (NNC's
    ``ccv_cnnp_dropout(p, entirety)``) keeps or drops the whole input at once: one
    draw per call, the output all zeros with probability ``p``, else ``x / (1 - p)``
    (stochastic depth on a residual branch). A non-bool ``entirety`` is a
    :class:`ModelError` naming the layer.
    """

    def __init__(self, p: float = 0.5, *, entirety: bool = False, **kw: Any):
        super().__init__(**kw)
        self.p = real_in(
            self, "p", p, 0.0, 1.0, open_high=True, hint="the probability of dropping a unit"
        )
        self.entirety = flag(self, "entirety", entirety)

    def build(self, ctx: BuildContext, x: Symbol) -> Symbol:
        if not ctx.training or self.p == 0:
            return x
        cmd = ops.dropout(p=self.p, entirety=self.entirety)
        return ctx.b.exec(cmd, x, ctx.key(), name=ctx.layer_id(self))[0]


class Flatten(Layer):
    """``[N, ...] -> [N, prod(...)]``."""

    def build(self, ctx: BuildContext, x: Symbol) -> Symbol:
        shape = (x.shape[0], int(np.prod(x.shape[1:])))
        return ctx.b.exec(ops.reshape(shape=shape), x, name=ctx.layer_id(self))


class Reshape(Layer):
    """Reshapes the non-batch axes to ``shape`` (``-1`` allowed once).

    With ``ofs`` or ``stride`` (NNC's ``ccv_cnnp_reshape(format, dim, ofs, stride)``) it
    is a view of each sample: entry ``i`` reads the sample's flat (row-major) element
    ``sum((ofs[k] + i[k]) * stride[k])``, ``stride`` defaulting to the contiguous strides
    of ``shape`` and ``ofs`` to zeros, one entry per axis of ``shape``. NNC's ``dim`` /
    ``ofs`` / ``stride`` also hold the batch axis; here it is kept whole (NNC's batch
    offset 0, stride the sample's size). NNC's default strides come from its ``dim``,
    batch included, so a smaller view of ``ofs`` without ``stride`` would step its batch
    by the view's size, not the sample's: such a view must give ``stride``. A view
    reaching outside the sample, or a ``-1`` in a view's shape, is a
    :class:`ModelError` naming the layer. The second half of the
    channels of ``[N, 2, 2, 4]``:

    >>> import numpy as np
    >>> from fnnc.models import Reshape, Sequential
    >>> model = Sequential([Reshape((2, 2, 2), ofs=(0, 0, 2), stride=(8, 4, 1))])
    >>> model.compile([np.zeros((1, 2, 2, 4), np.float32)])
    >>> x = np.arange(16, dtype=np.float32).reshape(1, 2, 2, 4)
    >>> model.evaluate([x])[0, :, :, 0].tolist()
    [[2.0, 6.0], [10.0, 14.0]]
    """

    def __init__(self, shape: Sequence[int], *, ofs: Any = None, stride: Any = None, **kw: Any):
        super().__init__(**kw)
        self.shape = shape_of(self, "shape", shape, "Reshape((4, 4)) or Reshape((-1,))", True)
        n, example = len(self.shape), "Reshape((2, 2), ofs=(0, 1), stride=(4, 1))"
        self.ofs = None if ofs is None else shape_of(self, "ofs", ofs, example)
        self.stride = None if stride is None else shape_of(self, "stride", stride, example)
        view = [v for v in (self.ofs, self.stride) if v is not None]
        if view and (-1 in self.shape or any(len(v) != n for v in view)):
            raise ModelError(
                f"layer {self.describe()}: a view takes shape, ofs and stride with one entry "
                f"per axis and no -1; got shape={shape!r:.40}, ofs={ofs!r:.40}, "
                f"stride={stride!r:.40}, e.g. {example}"
            )

    def build(self, ctx: BuildContext, x: Symbol) -> Symbol:
        # the -1 from one sample's size, not the batch's: 0 rows hold no count to divide
        shape, size = self.shape, int(np.prod(x.shape[1:]))
        if self.ofs is not None or self.stride is not None:
            return self._view(ctx, x, size)
        if all(is_int(n) for n in shape) and shape.count(-1) == 1:
            known = int(np.prod([n for n in shape if n != -1]))
            if known > 0 and size % known == 0:
                shape = tuple(size // known if n == -1 else n for n in shape)
        return ctx.b.exec(ops.reshape(shape=(x.shape[0], *shape)), x, name=ctx.layer_id(self))

    def _view(self, ctx: BuildContext, x: Symbol, size: int) -> Symbol:
        """NNC's alias of each sample, as a gather of its flat elements."""
        shape, n = self.shape, len(self.shape)
        if self.stride is None and int(np.prod(shape)) != size:
            raise ModelError(
                f"layer {self.describe()}: a view of shape {list(shape)} of a sample of "
                f"{size} (input {list(x.shape)}) needs stride=: NNC's default strides "
                "come from the view's own dim, batch included, which would step the batch "
                f"by {int(np.prod(shape))}, not {size}; give stride= (shape's contiguous "
                f"strides, {tuple(int(np.prod(shape[k + 1 :])) for k in range(len(shape)))}, "
                "read from each sample's start)"
            )
        stride = self.stride or tuple(int(np.prod(shape[k + 1 :])) for k in range(n))
        ofs = self.ofs or (0,) * n
        grids = np.meshgrid(*[np.arange(o, o + m) for o, m in zip(ofs, shape)], indexing="ij")
        flat = sum((g * s for g, s in zip(grids, stride)), np.zeros(shape, np.int64))
        if flat.size and int(flat.max()) >= size:
            raise ModelError(
                f"layer {self.describe()}: the view shape {list(shape)}, ofs {list(ofs)}, "
                f"stride {list(stride)} reads element {int(flat.max())} of a sample of "
                f"{size} (input {list(x.shape)}); keep sum((ofs + shape - 1) * stride) "
                f"below {size}"
            )
        name = ctx.layer_id(self)
        rows = ctx.b.exec(ops.reshape(shape=(x.shape[0], size)), x, name=f"{name}/flat")
        idx = ctx.b.constant(flat.reshape(-1).astype(np.int32), name=f"{name}/index")
        y = ctx.b.exec(ops.index_select(axis=1), rows, idx, name=f"{name}/view")
        return ctx.b.exec(ops.reshape(shape=(x.shape[0], *shape)), y, name=name)


class Embedding(Layer):
    """Rows of a ``[vocab, dim]`` table (parameter 0) for integer indices.

    ``dtype`` is the table's type (NNC's ``ccv_cnnp_embedding(datatype, ...)``, which
    takes float32 or float16): float32 by default, or float16 / bfloat16 for a 16-bit
    table and output. A non-floating or unknown ``dtype`` is a :class:`ModelError`
    naming the layer.
    """

    owns_parameters = True

    def __init__(self, vocab: int, dim: int, *, dtype: Any = np.float32, **kw: Any):
        super().__init__(**kw)
        self.vocab = positive_int(self, "vocab", vocab)
        self.dim = positive_int(self, "dim", dim)
        try:
            self.dtype = np.dtype(jnp.dtype(dtype))
        except TypeError:
            self.dtype = None
        if self.dtype is None or not is_floating(self.dtype):
            raise ModelError(
                f"layer {self.describe()}: dtype is {dtype!r:.40}; expected a floating type "
                "for the table, e.g. np.float32 (the default), np.float16 or jnp.bfloat16"
            )

    def build(self, ctx: BuildContext, idx: Symbol) -> Symbol:
        table = ctx.param(self, 0, (self.vocab, self.dim), normal_init(0.02), self.dtype)
        return ctx.b.exec(ops.embedding(), table, idx, name=ctx.layer_id(self))


class CommandLayer(Layer):
    """Runs any fnnc command on its inputs (no parameters).

    Args:
        cmd: the command, e.g. ``ops.softmax(axis=-1)``.
        outputs: how many outputs the command has (a tuple is returned when > 1); a
            command that gives another count on its inputs is a :class:`ModelError`
            naming the layer, at build.
    """

    def __init__(self, cmd: Command, *, outputs: int = 1, **kw: Any):
        super().__init__(**kw)
        self.cmd, self.outputs = cmd, positive_int(self, "outputs", outputs)

    def num_outputs(self, num_inputs: int) -> int:
        return self.outputs

    def _node_label(self) -> str:
        # its command's name (as summary labels it), so a profile times ReLU and Add apart
        return self.cmd.name

    def build(self, ctx: BuildContext, *xs: Symbol) -> Any:
        out = ctx.b.exec(self.cmd, *xs, name=ctx.layer_id(self))
        n = len(out) if isinstance(out, tuple) else 1
        if n != self.outputs:  # the model wires self.outputs values: one would be missing
            raise ModelError(
                f"layer {self.describe()}: outputs={self.outputs}, but {self.cmd.name} gives "
                f"{n} output(s) on {len(xs)} input(s); pass CommandLayer(..., outputs={n})"
            )
        return out


def Activation(
    kind: str, *, name: str = "", is_trainable: bool | None = None, **options: Any
) -> CommandLayer:
    """An activation layer: "relu", "sigmoid", "tanh", "swish", "gelu", "mish", "softmax",
    "leaky_relu".

    ``options`` are the command's own, as NNC's constructors take them:
    ``Activation("gelu", approximate=True)`` is ``ccv_cnnp_gelu(tanh=1)``,
    ``Activation("leaky_relu", negative_slope=0.2)`` is ``ccv_cnnp_leaky_relu(0.2)``;
    also ``swish``'s ``beta`` and ``softmax``'s ``axis``. An option the command does not
    take, or a bad value, is a :class:`ModelError` naming the layer.
    """
    factories = {
        "relu": ops.relu,
        "sigmoid": ops.sigmoid,
        "tanh": ops.tanh,
        "swish": ops.swish,
        "gelu": ops.gelu,
        "mish": ops.mish,
        "softmax": ops.softmax,
        "leaky_relu": ops.leaky_relu,
    }
    if kind not in factories:
        raise ModelError(f"Activation: unknown kind {kind!r}; expected one of {sorted(factories)}")
    label = f"Activation({kind!r}{f', name={name!r}' if name else ''})"
    cmd = _command(label, factories[kind], **options)
    return CommandLayer(cmd, name=name, is_trainable=is_trainable)


def _command(label: str, factory: Any, **options: Any) -> Command:
    """``factory(**options)``; a bad option is a :class:`ModelError` naming the layer
    ``label`` (the command's own message says which option and what it takes)."""
    bad = [
        k for k, v in options.items()
        if isinstance(v, numbers.Real) and not isinstance(v, bool) and not np.isfinite(v)
    ]  # fmt: skip
    if bad:
        raise ModelError(f"layer {label}: {bad[0]}={options[bad[0]]!r}; expected a finite number")
    try:
        return factory(**options)
    except CommandError as e:
        raise ModelError(f"layer {label}: {e}") from e


def ReLU(**kw: Any) -> CommandLayer:
    """``max(x, 0)``."""
    return Activation("relu", **kw)


def Add(*, p: float = 1.0, q: float = 1.0, **kw: Any) -> CommandLayer:
    """Sum of the inputs (broadcasting). ``p`` and ``q`` weigh two inputs, ``p a + q b``
    (NNC's ``ccv_cnnp_add(p, q)``); with either not 1 the layer takes exactly two."""
    if p == 1 and q == 1:
        return CommandLayer(ops.ewsum(), **kw)
    return CommandLayer(_command("Add", ops.add, p=p, q=q), **kw)


def Mul(*, p: float = 1.0, **kw: Any) -> CommandLayer:
    """Product of the inputs (broadcasting). ``p`` scales the product of two inputs,
    ``p a b`` (NNC's ``ccv_cnnp_mul(p)``); with ``p`` not 1 the layer takes exactly two."""
    if p == 1:
        return CommandLayer(ops.ewprod(), **kw)
    return CommandLayer(_command("Mul", ops.mul, p=p), **kw)


def Concat(axis: int = -1, **kw: Any) -> CommandLayer:
    """Concatenation along ``axis`` (NNC's ``ccv_cnnp_concat(axis)``); an axis that is not
    an int is a :class:`ModelError` naming the layer."""
    return CommandLayer(_command("Concat", ops.concat, axis=axis), **kw)


class Chunk(Layer):
    """Splits its input into ``n`` equal pieces along ``axis`` (NNC's ``ccv_cnnp_chunk(n,
    axis)``): ``n`` outputs, each ``size / n`` wide on ``axis``, in order (``q, k, v =
    Chunk(3)(qkv)``). A size that ``n`` does not divide, or an axis out of range, is a
    :class:`ModelError` naming the layer."""

    def __init__(self, n: int, axis: int = -1, **kw: Any):
        super().__init__(**kw)
        self.n = positive_int(self, "n", n)
        if not is_int(axis):
            raise ModelError(
                f"layer {self.describe()}: axis is {axis!r:.40} ({type(axis).__name__}); "
                "expected one int axis, e.g. -1"
            )
        self.axis = int(axis)

    def num_outputs(self, num_inputs: int) -> int:
        return self.n

    def build(self, ctx: BuildContext, x: Symbol) -> Any:
        shape, rank = list(x.shape), len(x.shape)
        if not -rank <= self.axis < rank or shape[self.axis] % self.n:
            raise ModelError(
                f"layer {self.describe()}: cannot cut axis {self.axis} of its input {shape} "
                f"into {self.n} equal pieces; expected an axis in [{-rank}, {rank}) whose "
                f"size {self.n} divides"
            )
        axis, name = self.axis % rank, ctx.layer_id(self)
        step = shape[axis] // self.n
        outs = []
        for i in range(self.n):
            start = [0] * rank
            start[axis] = i * step
            limit = list(shape)
            limit[axis] = (i + 1) * step
            cmd = ops.slice(start=tuple(start), limit=tuple(limit))
            outs.append(ctx.b.exec(cmd, x, name=f"{name}/{i}" if name else ""))
        return tuple(outs) if self.n > 1 else outs[0]
