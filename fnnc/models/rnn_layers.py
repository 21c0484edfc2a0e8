"""Recurrent cnnp layers: :class:`LSTM`, NNC's ``ccv_cnnp_lstm`` as one ``lstm`` command.

>>> import numpy as np
>>> from fnnc.models import LSTM, Sequential
>>> model = Sequential([LSTM(4, num_layers=2, bidirectional=True, name="rnn")])
>>> model.compile([np.zeros((2, 5, 3), np.float32)])
>>> model.evaluate([np.ones((2, 5, 3), np.float32)]).shape
(2, 5, 8)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fnnc import ops
from fnnc.core.ir import Symbol
from fnnc.models.layer import (
    BuildContext,
    Layer,
    ModelError,
    flag,
    is_int,
    positive_int,
    uniform_init,
)
from fnnc.ops.rnn import lstm_state_shapes, lstm_weight_shapes


class LSTM(Layer):
    """An LSTM over ``[N, T, I]`` returning ``[N, T, D * P]``: the last layer's outputs,
    both directions concatenated when ``bidirectional`` (``D = 2``), ``P = proj_size or
    hidden``. Gates i, f, g, o (cuDNN's order, as NNC's); states start at zeros.

    The options are NNC's ``ccv_cnnp_lstm`` ones, passed to one :func:`fnnc.ops.lstm`:

    Args:
        hidden: the hidden size ``H``.
        num_layers: stacked layers; layer ``l > 0`` reads the ``D * P`` outputs of the
            one below.
        bidirectional: also run each layer backward in time.
        proj_size: ``0 < P < H`` projects each output through ``w_hr [P, H]`` (LSTMP);
            ``P == H`` is no projection (no ``w_hr``: NNC's and cuDNN's reading), and
            ``P > H`` a :class:`ModelError`.
        dropout: drop the outputs of every layer but the last with this probability
            while training (the identity when testing).
        bias: whether the gates have a bias.
        masked: the layer takes a second input, ``lengths`` (int32 ``[N]``, NNC's
            variable sequence lengths): steps ``t >= lengths[n]`` of sample ``n`` are
            padding, which leaves the state unchanged and outputs zeros, and the
            backward direction starts at each sample's last real step
            (:func:`fnnc.ops.lstm`'s ``masked``).
        batch_first: ``True``: inputs ``[N, T, I]``, outputs ``[N, T, D * P]``;
            ``False`` (NNC's ``batch_first=0``): time-major ``[T, N, I]`` in and
            ``[T, N, D * P]`` out (``lengths`` stays ``[N]``).

    Parameters come one layer and direction after another (layer 0 forward, layer 0
    backward, layer 1 ...), each as ``w_ih [4H, In]``, ``w_hh [4H, P]``, ``bias [4H]``
    (with ``bias``), ``w_hr [P, H]`` (with ``proj_size < hidden``): parameter ``k`` of unit
    ``u`` is index ``u * per_unit + k``, the order :func:`fnnc.ops.lstm` takes them in
    (a one-layer LSTM's ``t-<name>-0-0/1/2`` are ``w_ih``, ``w_hh``, ``bias``).
    """

    owns_parameters = True

    def __init__(
        self,
        hidden: int,
        *,
        num_layers: int = 1,
        bidirectional: bool = False,
        proj_size: int = 0,
        dropout: float = 0.0,
        bias: bool = True,
        masked: bool = False,
        batch_first: bool = True,
        **kw: Any,
    ):
        super().__init__(**kw)
        self.hidden = positive_int(self, "hidden", hidden)
        self.num_layers = positive_int(self, "num_layers", num_layers)
        if not is_int(proj_size) or proj_size < 0:
            raise ModelError(
                f"layer {self.describe()}: proj_size is {proj_size!r:.40}; expected an int "
                ">= 0 (0: no projection)"
            )
        if proj_size > self.hidden:
            raise ModelError(
                f"layer {self.describe()}: proj_size={proj_size} is larger than hidden="
                f"{self.hidden}; a projection narrows each output to proj_size features: "
                f"use a proj_size below {self.hidden}, or 0 for none"
            )
        if isinstance(dropout, bool) or not isinstance(dropout, (int, float, np.floating)):
            raise ModelError(
                f"layer {self.describe()}: dropout is {dropout!r:.40}; expected a probability "
                "in [0, 1), e.g. 0.1"
            )
        if not 0.0 <= float(dropout) < 1.0:
            raise ModelError(
                f"layer {self.describe()}: dropout={dropout!r} is outside [0, 1); expected the "
                "probability of dropping a unit, e.g. 0.1"
            )
        # NNC's ccv_cnnp_lstm takes int flags: 1 / 0 read as True / False, as Dense's do
        self.bidirectional = flag(self, "bidirectional", bidirectional)
        self.bias, self.masked = flag(self, "bias", bias), flag(self, "masked", masked)
        self.batch_first = flag(self, "batch_first", batch_first)
        self.proj_size, self.dropout = int(proj_size), float(dropout)

    def weight_shapes(self, features: int) -> list[tuple[int, ...]]:
        """The shapes of the parameters in index order, for ``features`` input features."""
        units = lstm_weight_shapes(
            features,
            self.hidden,
            num_layers=self.num_layers,
            bidirectional=self.bidirectional,
            proj_size=self.proj_size,
            bias=self.bias,
        )
        return [shape for unit in units for shape in unit.values()]

    def build(self, ctx: BuildContext, x: Symbol, *lengths: Symbol) -> Symbol:
        if len(x.shape) != 3:
            raise ModelError(
                f"layer {self.describe()}: input of shape {list(x.shape)}; expected "
                + ("[batch, time, features]" if self.batch_first else "[time, batch, features]")
            )
        batch = x.shape[0] if self.batch_first else x.shape[1]
        self._check_lengths(batch, lengths)
        # NNC's _ccv_cnnp_lstm_init_states: every weight and bias uniform in ±1/sqrt(H)
        init = uniform_init(float(1.0 / np.sqrt(self.hidden)))
        shapes = self.weight_shapes(x.shape[-1])
        weights = [ctx.param(self, k, shape, init, x.dtype) for k, shape in enumerate(shapes)]
        units = self.num_layers * (2 if self.bidirectional else 1)
        h0, c0 = (
            ctx.b.exec(ops.set(shape=shape, dtype=np.dtype(x.dtype), value=0.0))
            for shape in lstm_state_shapes(batch, self.hidden, units, self.proj_size)
        )
        keyed = ctx.training and self.dropout > 0
        cmd = ops.lstm(
            num_layers=self.num_layers,
            bidirectional=self.bidirectional,
            proj_size=self.proj_size,
            dropout=self.dropout,
            is_test=not ctx.training,
            masked=self.masked,
            batch_first=self.batch_first,
        )
        key = [ctx.key()] if keyed else []
        y, _, _ = ctx.b.exec(cmd, x, h0, c0, *weights, *lengths, *key, name=ctx.layer_id(self))
        return y

    def _check_lengths(self, batch: int, lengths: tuple[Symbol, ...]) -> None:
        if len(lengths) != int(self.masked):
            raise ModelError(
                f"layer {self.describe()}: {1 + len(lengths)} input(s) with masked="
                f"{self.masked}; expected x [batch, time, features] ([time, batch, features] "
                "with batch_first=False)"
                + (
                    " and lengths int32 [batch]"
                    if self.masked
                    else " only (masked=True takes per-sample lengths as a second input)"
                )
            )
        if lengths and (
            not np.issubdtype(np.dtype(lengths[0].dtype), np.integer)
            or tuple(lengths[0].shape) != (batch,)
        ):
            raise ModelError(
                f"layer {self.describe()}: lengths of shape {list(lengths[0].shape)} and "
                f"dtype {np.dtype(lengths[0].dtype).name}; expected int32 [{batch}], "
                "each sample's number of real (unpadded) steps"
            )
