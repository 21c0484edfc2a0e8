"""RNN family: lstm, NNC's LSTM with its ``num_layers``, ``bidirectional``, ``proj_size``,
``dropout``, ``masked`` and ``batch_first`` options (``CMD_LSTM_FORWARD`` in liuliu/ccv
``lib/nnc/cmd/rnn``).

Data is batch-first, ``x [B, T, I]`` (NNC's ``batch_first=1``), or time-major
``x [T, B, I]`` with ``batch_first=False`` (NNC's ``batch_first=0``; ``y`` is then
``[T, B, D*P]``; states, ``lengths`` and weights are the same either way). Weights
are packed per gate in the order input, forget, cell (g), output (cuDNN's order, which
NNC's LSTM follows) and given one layer and direction after another (layer 0 forward,
layer 0 backward, layer 1 ...),
each as ``w_ih [4H, In]``, ``w_hh [4H, P]``, optionally ``bias [4H]``, and with
``proj_size = P > 0`` the projection ``w_hr [P, H]`` (LSTMP: ``h = w_hr (σ(o)
tanh(c))``); without a projection ``P = H``. ``proj_size`` must not exceed the hidden
size ``H`` (cuDNN's rule, a ``CommandError``), and ``proj_size == H`` is no projection
(NNC's and cuDNN's reading: no ``w_hr``, the weight count of NNC's ``weight_dim``), as
is ``proj_size = 0``. Layer 0 reads ``In = I`` features, later
layers the ``D * P`` of the one below (``D = 2`` when bidirectional). Whether biases
are present follows from the number of weights.

The states are ``h0 [L*D, B, P]`` and ``c0 [L*D, B, H]`` (or ``[B, P]``/``[B, H]`` for a
single layer and direction); the outputs are ``y [B, T, D*P]`` (the last layer, the
directions concatenated) and the final states, shaped like the initial ones. With
``dropout > 0`` and ``is_test=False`` (training), every layer's output but the last
is dropped with that probability (scaled by ``1 / (1 - p)`` in float32 at least and
rounded to ``x``'s type once, as ``ops.dropout``), drawn from a trailing ``key`` input
(``uint32[2]``, as ``ops.dropout`` takes; layer ``l``'s mask from ``fold_in(key, l)``),
so equal keys give equal masks.

With ``masked=True`` (NNC's variable sequence lengths), an integer ``lengths [B]``
input follows the weights (before the key): sample ``b``'s steps ``t >= lengths[b]``
are padding. They leave the carry unchanged and output zeros, so ``h_T``/``c_T`` are
the states at each sample's last real step, and the reverse direction starts at that
step from ``h0``/``c0``; padded inputs get zero gradients. Lengths are read as clamped
to ``[0, T]`` (a length 0 sample keeps its initial states and outputs zeros).

Each direction of each layer runs as one ``lax.scan`` over time; the backward is
derived from ``jax.vjp`` of it (a reverse scan), as NNC's cuDNN LSTM differentiates
inputs, states and weights. In bfloat16 or float16 (16-bit inputs, or a model's
``precision=``) the matmuls read 16-bit operands and accumulate in float32, while the
cell state, the hidden carry and the gates' nonlinearities stay float32 (as cuDNN's
half-precision RNNs and Flax's float32 carry do); ``y``, ``h_T`` and ``c_T`` come back
in ``x``'s type, and the weights' gradients are summed over time in float32.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from fnnc.core.command import Spec, defcommand
from fnnc.errors import CommandError, DTypeError, ShapeError
from fnnc.ops._rules import fail, require_float, require_same_dtype, show, to_shape
from fnnc.ops.random import _check_key, _key, _scaled


def projection(proj_size: int, hidden: int) -> int:
    """The projection size in use: ``proj_size``, or 0 (none) when it equals ``hidden``
    (NNC and cuDNN: ``projSize == hiddenSize`` is no projection).

    Raises:
        CommandError: ``proj_size`` negative or larger than ``hidden``.
    """
    if proj_size < 0:
        raise CommandError(f"lstm: proj_size must be >= 0, got {proj_size}")
    if proj_size > hidden:
        raise CommandError(
            f"lstm: proj_size={proj_size} is larger than the hidden size {hidden}; a "
            f"projection narrows h: use a proj_size below {hidden}, or 0 for none"
        )
    return 0 if proj_size == hidden else proj_size


def _hidden(c0, rest) -> int:
    """The hidden size ``H``: ``w_hh [4H, P]``'s rows over 4 (the weights fix it, as
    NNC's ``hidden_size`` does), which ``c0``'s last axis must match."""
    w_hh = rest[1]
    if len(w_hh.shape) != 2 or w_hh.shape[0] % 4:
        fail(
            f"lstm: w_hh {show(w_hh)} should be [4H, P] (gates i, f, g, o of hidden size "
            "H stacked): the hidden size is read from it"
        )
    hidden = w_hh.shape[0] // 4
    if c0 is not None and (len(c0.shape) not in (2, 3) or c0.shape[-1] != hidden):
        fail(
            f"lstm: c0 {show(c0)} should be [L*D, B, {hidden}], or [B, {hidden}] for one "
            f"layer and direction: the hidden size {hidden} of w_hh {show(w_hh)} ([4H, P])"
        )
    return hidden


def _layout(n: int, *, hidden, num_layers, bidirectional, proj_size, dropout, is_test, masked):
    """``(units, per-unit weight count, has bias, has key, projection in use)`` from the
    input count."""
    if num_layers < 1:
        raise CommandError(f"lstm: num_layers must be at least 1, got {num_layers}")
    if not 0.0 <= dropout < 1.0:
        raise CommandError(f"lstm: dropout={dropout!r} must be in [0, 1)")
    proj_size = projection(proj_size, hidden)
    keyed = dropout > 0 and not is_test
    units = num_layers * (2 if bidirectional else 1)
    weights = n - 3 - keyed - bool(masked)
    base = 2 + (1 if proj_size else 0)
    if weights not in (units * base, units * (base + 1)):
        fail(
            f"lstm: {n} inputs do not fit {num_layers} layer(s) x {units // num_layers} "
            f"direction(s): expected x, h0, c0, then per layer and direction w_ih, w_hh, "
            f"[bias]{', w_hr' if proj_size else ''} ({units * base} or {units * (base + 1)} "
            f"weights){', then lengths' if masked else ''}"
            f"{', then the dropout key' if keyed else ''}"
        )
    per = weights // units
    return units, per, per == base + 1, keyed, proj_size


def lstm_weight_shapes(
    features: int,
    hidden: int,
    *,
    num_layers: int = 1,
    bidirectional: bool = False,
    proj_size: int = 0,
    bias: bool = True,
) -> list[dict[str, tuple[int, ...]]]:
    """Per unit (layer 0 forward, layer 0 backward, layer 1 ...), its weights' shapes by
    name in the order :func:`lstm` takes them: ``w_ih``, ``w_hh``, ``bias`` (with
    ``bias``), ``w_hr`` (with ``proj_size``, unless it equals ``hidden``: no projection),
    for ``features`` input features."""
    proj_size = projection(proj_size, hidden)
    d, p = (2 if bidirectional else 1), proj_size or hidden
    units = []
    for u in range(num_layers * d):
        shapes = {"w_ih": (4 * hidden, features if u < d else d * p), "w_hh": (4 * hidden, p)}
        shapes.update({"bias": (4 * hidden,)} if bias else {})
        shapes.update({"w_hr": (p, hidden)} if proj_size else {})
        units.append(shapes)
    return units


def lstm_state_shapes(
    batch: int, hidden: int, units: int, proj_size: int = 0, *, stacked: bool = False
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The shapes of ``h0`` and ``c0``: ``[units, B, P]`` and ``[units, B, H]``, or
    ``[B, P]`` and ``[B, H]`` for one unit (a layer and direction) unless ``stacked``."""
    lead = (units, batch) if units > 1 or stacked else (batch,)
    return (*lead, proj_size or hidden), (*lead, hidden)


def _lstm_shape(x, h0=None, c0=None, *rest, batch_first=True, **params):
    name = "lstm"
    hidden = _hidden(c0, rest)
    units, per, has_bias, keyed, proj = _layout(3 + len(rest), hidden=hidden, **params)
    weights = rest[: units * per]
    given = [s for s in (h0, c0) if s is not None]
    require_float(name, x, *given, *weights)
    require_same_dtype(name, x, *given, *weights)
    if keyed:
        try:
            _check_key(name, rest[-1])
        except (DTypeError, ShapeError) as e:  # say why a key is read there
            raise type(e)(
                f"{e} (the last input: dropout={params['dropout']} with is_test=False drops "
                "every layer's output but the last with a mask drawn from a key given last"
                + (" (one layer has none to drop)" if params["num_layers"] == 1 else "")
                + "; is_test=True or dropout=0 takes no key)"
            ) from None
    if x.ndim != 3:
        fail(
            f"{name}: x {show(x)} must be [batch, time, features] ([time, batch, features] "
            "with batch_first=False)"
        )
    # time-major x [T, B, I] (NNC's batch_first=0) gives y [T, B, D*P]
    b, t, i = x.shape if batch_first else (x.shape[1], x.shape[0], x.shape[2])
    if params["masked"]:
        lengths = rest[units * per]
        if not np.issubdtype(np.dtype(lengths.dtype), np.integer) or lengths.shape != (b,):
            fail(
                f"{name}: lengths {show(lengths)} should be int32[{b}] (masked=True: each "
                f"sample's sequence length, after the weights; x {show(x)})"
            )
    p = proj or hidden
    d = 2 if params["bidirectional"] else 1
    stacked = any(s.ndim == 3 for s in given)
    h_shape, c_shape = lstm_state_shapes(b, hidden, units, proj, stacked=stacked)
    h0 = Spec(h_shape, x.dtype) if h0 is None else h0  # absent: zeros
    c0 = Spec(c_shape, x.dtype) if c0 is None else c0
    for label, state, want in (("h0", h0, h_shape), ("c0", c0, c_shape)):
        if tuple(state.shape) != want:
            fail(
                f"{name}: {label} {show(state)} should be {list(want)} (h0 [L*D, B, P], c0 "
                f"[L*D, B, H]; [B, P], [B, H] for one layer and direction; here L*D = "
                f"{units}, B = {b} from x {show(x)}, H = {hidden}, P = {p})"
            )
    layout = {k: params[k] for k in ("num_layers", "bidirectional")}
    want_shapes = lstm_weight_shapes(i, hidden, bias=has_bias, proj_size=proj, **layout)
    for u, want in enumerate(want_shapes):
        for (label, shape), spec in zip(want.items(), weights[u * per : (u + 1) * per]):
            if tuple(spec.shape) != shape:
                fail(
                    f"{name}: {label} {show(spec)} should be {list(shape)} (layer {u // d}"
                    f"{', reverse' if u % d else ''}; x {show(x)}, hidden {hidden}, proj "
                    f"{proj}; gates i, f, g, o)"
                )
    y = Spec((b, t, d * p) if batch_first else (t, b, d * p), x.dtype)
    return y, Spec(tuple(h0.shape), x.dtype), Spec(c0.shape, x.dtype)


def _direction(x, h0, c0, w_ih, w_hh, bias, w_hr, reverse, valid=None):
    """One layer, one direction over ``x [B, T, In]``: ``(ys [B, T, P], h_T, c_T)``;
    ``valid [T, B, 1]`` (masked) marks real steps: the others keep the carry, output 0.

    With 16-bit ``x`` the matmuls read 16-bit operands and accumulate in float32, and
    the carry (``h``, ``c``) and the gates' nonlinearities stay float32 (cuDNN's half
    RNNs, Flax's float32 carry): a bfloat16 ``c`` rounded at every step drifts 12x
    further from the exact recurrence over 200 steps. Outputs come back in ``x.dtype``.
    The loop-invariant weights enter the scan in float32 and are converted down inside
    it, so their gradients, summed over every step by the reverse scan, sum in float32.
    """
    low, acc = x.dtype, jnp.promote_types(x.dtype, jnp.float32)
    mm = lambda a, w: jnp.matmul(a.astype(low), w.astype(low).T, preferred_element_type=acc)
    xw = jnp.einsum("bti,gi->tbg", x, w_ih, preferred_element_type=acc)
    if bias is not None:
        xw = xw + to_shape(bias.astype(acc), xw.shape)
    w_hh = w_hh.astype(acc)
    w_hr = None if w_hr is None else w_hr.astype(acc)

    def step(carry, inputs):
        (h_in, c_in), (xw_t, valid_t) = carry, inputs
        gates = xw_t + mm(h_in, w_hh)
        i, f, g, o = jnp.split(gates, 4, axis=-1)
        c = jax.nn.sigmoid(f) * c_in + jax.nn.sigmoid(i) * jnp.tanh(g)
        h = jax.nn.sigmoid(o) * jnp.tanh(c)
        if w_hr is not None:
            h = mm(h, w_hr)
        if valid_t is None:
            return (h, c), h.astype(low)
        y = jnp.where(valid_t, h, jnp.zeros_like(h))
        return (jnp.where(valid_t, h, h_in), jnp.where(valid_t, c, c_in)), y.astype(low)

    carry = (h0.astype(acc), c0.astype(acc))
    (h, c), ys = lax.scan(step, carry, (xw, valid), reverse=reverse)
    return jnp.swapaxes(ys, 0, 1), h.astype(low), c.astype(low)


@defcommand(family="rnn", shape=_lstm_shape, min_inputs=5)
def lstm(
    x,
    h0=None,
    c0=None,
    *rest,
    num_layers=1,
    bidirectional=False,
    proj_size=0,
    dropout=0.0,
    is_test=False,
    masked=False,
    batch_first=True,
):
    """NNC's LSTM over ``x [B, T, I]``: ``(y [B, T, D*P], h_T, c_T)`` (see the module doc);
    with ``batch_first=False`` over ``x [T, B, I]``, giving ``y [T, B, D*P]``.
    ``h0``/``c0`` given as ``None`` start from zeros (NNC's absent hx, cx).

    Per step, ``i, f, g, o = split(x_t w_ihᵀ + h w_hhᵀ + bias)``;
    ``c = σ(f) c + σ(i) tanh(g)`` and ``h = σ(o) tanh(c)`` (times ``w_hrᵀ`` with a
    projection, unless ``proj_size`` equals the hidden size); ``y`` stacks every ``h``.
    With ``masked``, an int ``lengths [B]`` after the weights marks each sample's real
    steps; padded ones keep the state and output zeros.

    >>> import jax.numpy as jnp
    >>> from fnnc import ops
    >>> y, h, c = ops.lstm()(jnp.ones((2, 5, 3)), jnp.zeros((2, 4)), jnp.zeros((2, 4)),
    ...                      jnp.ones((16, 3)), jnp.ones((16, 4)))
    >>> y.shape, h.shape
    ((2, 5, 4), (2, 4))
    >>> two = ops.lstm(num_layers=2, bidirectional=True, proj_size=2)
    >>> w = [jnp.ones(s) for _ in range(2) for s in ((16, 3), (16, 2), (2, 4))]
    >>> w += [jnp.ones(s) for _ in range(2) for s in ((16, 4), (16, 2), (2, 4))]
    >>> two(jnp.ones((2, 5, 3)), jnp.zeros((4, 2, 2)), jnp.zeros((4, 2, 4)), *w)[0].shape
    (2, 5, 4)
    """
    x = x if batch_first else jnp.swapaxes(x, 0, 1)  # NNC's time-major: run batch-first
    params = dict(
        num_layers=num_layers,
        bidirectional=bidirectional,
        proj_size=proj_size,
        dropout=dropout,
        is_test=is_test,
        masked=masked,
    )
    units, per, has_bias, keyed, proj = _layout(3 + len(rest), hidden=_hidden(c0, rest), **params)
    d = 2 if bidirectional else 1
    if h0 is None or c0 is None:  # absent initial states are zeros
        _, h_spec, c_spec = _lstm_shape(x, h0, c0, *rest, **params)
        h0 = jnp.zeros(h_spec.shape, x.dtype) if h0 is None else h0
        c0 = jnp.zeros(c_spec.shape, x.dtype) if c0 is None else c0
    stacked = h0.ndim == 3
    hs = h0 if stacked else h0[None]
    cs = c0 if stacked else c0[None]
    valid = None
    if masked:  # [T, B, 1]: step t of sample b is real
        steps = jnp.arange(x.shape[1], dtype=jnp.int32)[:, None]
        # clamped in its own type first: a uint32 or int64 length above 2**31 - 1 cast
        # to int32 wraps negative (a whole sequence read as padding); the bound T itself
        # is capped to the type (an int8 300 wraps to 44)
        lengths = jnp.asarray(rest[units * per])
        top = min(x.shape[1], int(jnp.iinfo(lengths.dtype).max))
        lengths = jnp.clip(lengths, 0, top).astype(jnp.int32)
        valid = (steps < lengths[None, :])[:, :, None]
    layer_in, h_out, c_out = x, [], []
    for layer in range(num_layers):
        outs = []
        for direction in range(d):
            u = layer * d + direction
            w = list(rest[u * per : (u + 1) * per])
            w_ih, w_hh = w[0], w[1]
            bias = w[2] if has_bias else None
            w_hr = w[-1] if proj else None
            args = (layer_in, hs[u], cs[u], w_ih, w_hh, bias, w_hr, direction == 1, valid)
            ys, h, c = _direction(*args)
            outs.append(ys)
            h_out.append(h)
            c_out.append(c)
        layer_in = outs[0] if d == 1 else jnp.concatenate(outs, axis=-1)
        if keyed and layer < num_layers - 1:
            key = jax.random.fold_in(_key(rest[-1]), layer)
            keep = jax.random.bernoulli(key, np.float32(1.0 - dropout), layer_in.shape)
            layer_in = _scaled(layer_in, keep, dropout)  # float32, rounded once
    h_t, c_t = jnp.stack(h_out), jnp.stack(c_out)
    y = layer_in if batch_first else jnp.swapaxes(layer_in, 0, 1)
    return y, (h_t if stacked else h_t[0]), (c_t if stacked else c_t[0])
