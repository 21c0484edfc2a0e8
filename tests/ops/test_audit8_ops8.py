"""Audit 8 of the less-covered commands (statistics, transcendental, rope, gated, data,
constant), each against an independent oracle: NumPy in float64, ``jax.nn``, or the
error a user should see."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fnnc import ops


@pytest.fixture
def rng() -> np.random.Generator:
    """A fresh generator per test: its values do not depend on which tests ran before."""
    return np.random.default_rng(8)


def _even_bins(x: np.ndarray, bins: int, lo: float, hi: float) -> np.ndarray:
    """NNC's even layout in float64: [below, bin 1 .. bin bins, at or above, NaN]."""
    idx = np.clip(np.floor((x - lo) * (bins / (hi - lo))).astype(int) + 1, 1, bins)
    idx = np.where(x < lo, 0, np.where(x >= hi, bins + 1, idx))
    return np.bincount(idx, minlength=bins + 3)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_histogram_bins_16_bit_values_as_their_exact_float_values(dtype, rng):
    """The bin of a 16-bit value is that of its exact value: (x - min) * scale had been
    rounded to bfloat16, which moved 8.6% of uniform values into a neighbouring bin of 100
    (float16 2%), and "bins" boundaries were rounded to x's type."""
    x = jnp.asarray(rng.uniform(-0.1, 1.1, 4000), dtype)
    exact = np.asarray(x, np.float64)
    counts, stats = ops.histogram(bins=100, min=0.0, max=1.0)(x)
    np.testing.assert_array_equal(counts, _even_bins(exact, 100, 0.0, 1.0))
    want = [exact.min(), exact.max(), exact.sum(), (exact * exact).sum()]
    np.testing.assert_allclose(np.asarray(stats, np.float64), want, rtol=8e-3)
    bounds = np.linspace(0.0, 1.0, 41).astype(np.float32)
    counts, _ = ops.histogram(type="bins")(x, jnp.asarray(bounds))
    slots = np.searchsorted(bounds.astype(np.float64), exact, side="right")
    np.testing.assert_array_equal(counts, np.bincount(slots, minlength=bounds.size + 2))


def test_histogram_of_an_empty_tensor_counts_nothing():
    """An empty x gives zero counts, sums of 0 and NaN min / max (no value to take them
    from, as for an all-NaN x); it had raised JAX's bare 'zero-size array' ValueError."""
    counts, stats = ops.histogram(bins=3)(jnp.zeros((0, 4)))
    np.testing.assert_array_equal(counts, np.zeros(6, np.int32))
    np.testing.assert_array_equal(np.isnan(stats), [True, True, False, False])
    np.testing.assert_array_equal(np.asarray(stats)[2:], [0.0, 0.0])


def test_reduce_logsumexp_over_an_empty_axis_is_minus_infinity(rng):
    """The log of an empty sum, as jax.nn.logsumexp gives; the forward had raised JAX's
    bare 'zero-size array to reduction operation max' ValueError. Non-empty axes of the
    same tensor keep their values (NumPy float64)."""
    cmd = ops.reduce_logsumexp(axes=(0,))
    np.testing.assert_array_equal(cmd(jnp.zeros((0, 3))), np.full((1, 3), -np.inf))
    x = rng.standard_normal((2, 0, 3)).astype(np.float32)
    assert ops.reduce_logsumexp(axes=(2,))(x).shape == (2, 0, 1)
    y = rng.standard_normal((4, 3))
    want = np.log(np.exp(y).sum(0, keepdims=True))
    np.testing.assert_allclose(cmd(y.astype(np.float32)), want, rtol=1e-6)
    (g,) = ops.lookup("reduce_logsumexp").backward(
        (jnp.ones((1, 3)),), (jnp.zeros((0, 3)),), (cmd(jnp.zeros((0, 3))),), axes=(0,)
    )
    assert g.shape == (0, 3)


def _swish(z):
    return z / (1 + np.exp(-z))


@pytest.mark.parametrize("name", ["rmsnorm_gated", "rmsnorm_cmul"])
def test_norm_scale_that_does_not_broadcast_to_x_is_a_shape_error(name, rng):
    """rmsnorm_gated / rmsnorm_cmul checked no scale: a [3] scale for axes (1,) of
    [2, 3, 4] (it broadcasts against the last axis) reached the forward as a bare
    broadcast_in_dim TypeError, and an int32 scale was used silently. Now a ShapeError
    naming the command and the shape that works, and a DTypeError; that shape gives
    float64 NumPy's values."""
    from fnnc.errors import DTypeError, ShapeError

    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    second = rng.standard_normal((2, 3, 4)).astype(np.float32)  # gate or freqs
    cmd = getattr(ops, name)(axes=(1,), epsilon=1e-6)
    with pytest.raises(ShapeError, match=rf"{name}: scale float32\[3\].*\[1, 3, 1\]"):
        cmd(x, second, np.ones(3, np.float32))
    with pytest.raises(DTypeError, match=name):
        cmd(x, second, np.ones((1, 3, 1), np.int32))
    scale = rng.uniform(0.5, 1.5, (1, 3, 1)).astype(np.float32)
    xd = x.astype(np.float64)
    normed = xd / np.sqrt((xd * xd).mean(1, keepdims=True) + 1e-6) * scale
    if name == "rmsnorm_gated":
        want = normed * _swish(second.astype(np.float64))
    else:
        z = (normed[..., 0::2] + 1j * normed[..., 1::2]) * (
            second[..., 0::2] + 1j * second[..., 1::2]
        )
        want = np.stack([z.real, z.imag], -1).reshape(x.shape)
    np.testing.assert_allclose(cmd(x, second, scale), want, rtol=1e-5, atol=1e-5)


def test_edge_padding_of_an_empty_axis_is_a_shape_error(rng):
    """An empty axis has no edge entry to repeat (NNC would read before the tensor):
    a ShapeError from the shape rule naming the axis, where jnp.pad's bare ValueError
    had come from the forward. Zero pads of the empty axis and edge pads of the others
    still work (NumPy's np.pad)."""
    from fnnc.errors import ShapeError

    with pytest.raises(ShapeError, match=r"pad: edge padding of axis 1 of float32\[2, 0\]"):
        ops.pad(pads=((0, 0), (1, 0)), mode="edge")(jnp.zeros((2, 0)))
    x = rng.standard_normal((2, 0, 3)).astype(np.float32)
    pads = ((1, 2), (0, 0), (2, 1))
    np.testing.assert_array_equal(ops.pad(pads=pads, mode="edge")(x), np.pad(x, pads, "edge"))


@pytest.mark.parametrize(
    "value", [2**40, np.array([3, -(2**33)], np.int64), np.array([2**63], np.uint64)]
)
def test_constant_refuses_64_bit_integers_that_32_bits_would_wrap(value):
    """With x64 off a 64-bit integer constant is stored in 32 bits, and ops.constant(2**40)
    had silently become 0 (jnp.asarray(2**40) raises OverflowError): a DTypeError naming
    the value. In-range 64-bit values still convert exactly (NumPy's astype)."""
    from fnnc.errors import DTypeError

    with pytest.raises(DTypeError, match=r"constant: .* outside u?int32's range"):
        ops.constant(value)
    fits = np.array([2**31 - 1, -(2**31)], np.int64)
    got = ops.constant(fits)()
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, fits)


F32_MAX = float(np.finfo(np.float32).max)


@pytest.mark.parametrize(
    "value",
    [np.float64(1e300), np.array([1.0, -1e39]), np.complex128(1 + 1e300j), 2 * F32_MAX],
)
def test_constant_refuses_64_bit_floats_that_32_bits_would_make_infinite(value):
    """With x64 off a float64 constant is stored as float32: Literal.of(np.float64(1e300))
    had silently become inf. A DTypeError naming the value, like the integer one. Oracle
    for what still converts: NumPy's float32 cast of values within float32's range (mask
    fills -1e9 and float32's own min and max) and of infinities and NaN."""
    from fnnc.errors import DTypeError

    with pytest.raises(DTypeError, match=r"constant: .* beyond (float|complex)(32|64)'s largest"):
        ops.constant(value)
    fits = np.array([-1e9, -F32_MAX, F32_MAX, np.inf, -np.inf, np.nan, 1e-300], np.float64)
    got = ops.constant(fits)()
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, fits.astype(np.float32))


def test_a_literal_error_says_where_the_value_came_from():
    """The errors said "constant:" even for a constant found by trace; trace now names
    the captured constant (Literal.of's where=)."""
    from fnnc.errors import DTypeError
    from fnnc.ops.constant import Literal

    with pytest.raises(DTypeError, match=r"^trace: captured constant 'w': a float64\[\]"):
        Literal.of(np.float64(1e300), where="trace: captured constant 'w'")
    with pytest.raises(DTypeError, match=r"^trace: captured constant 'k': a int64\[\]"):
        Literal.of(np.int64(2**40), where="trace: captured constant 'k'")


def _hadamard(n: int) -> np.ndarray:
    h = np.ones((1, 1))
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_walsh_hadamard_transform_rounds_a_16_bit_result_once(dtype, rng):
    """A 16-bit transform is the exact one (float64 NumPy, x H * scale) rounded once to
    x's type, forward and backward: the butterfly had rounded after each of its 10
    stages at n = 1024 (bfloat16: 3.4x the rms error of one rounding, 1.9x the max).
    n = 128 (7 stages) keeps the test cheap; a per-stage rounding puts over half of
    the entries past half an ulp there too."""
    n, scale = 128, 1 / 8
    wht = ops.lookup("walsh_hadamard_transform")  # its backward jitted: one compile, not 50
    x = jnp.asarray(rng.standard_normal((8, n)), dtype)
    want = np.asarray(x, np.float64) @ _hadamard(n) * scale
    half_ulp = np.spacing(np.abs(want).astype(jnp.dtype(dtype))).astype(np.float64) * 0.51
    for got in (
        ops.walsh_hadamard_transform(scale=scale)(x),
        jax.jit(lambda g: wht.backward((g,), (g,), (None,), scale=scale)[0])(x),
    ):
        assert got.dtype == dtype
        err = np.abs(np.asarray(got, np.float64) - want)
        assert np.all(err <= half_ulp + 1e-6)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_dropout_scales_16_bit_values_by_the_exact_keep_rate(dtype, rng):
    """A kept 16-bit value is x / (1 - p) rounded once (float64 NumPy), and so is its
    gradient: the scale 1 / (1 - p) had been rounded to x's type first (bfloat16
    1 / 0.9 = 1.109375, 0.16% low on every kept value)."""
    import jax

    key = jax.random.key_data(jax.random.key(8))
    x = jnp.asarray(rng.uniform(1.0, 2.0, (64, 64)), dtype)
    cmd = ops.dropout(p=0.1)
    y, mask = cmd(x, key)
    want = np.asarray(x, np.float64) * np.asarray(mask, np.float64) / 0.9
    np.testing.assert_array_equal(np.asarray(y), np.asarray(jnp.asarray(want, dtype)))
    (g, _) = ops.lookup("dropout").backward((x, None), (x, key), (y, mask), p=0.1, entirety=False)
    np.testing.assert_array_equal(np.asarray(g), np.asarray(jnp.asarray(want, dtype)))


def test_upsample_16_bit_bilinear_and_backward_round_once(rng):
    """bfloat16 bilinear upsampling is NNC's float32 result (a port of its CPU kernel)
    rounded once, where the 1/6, 5/6 weights of scale 3 and the first axis' blend had
    been rounded too (1.3 ulp off); an input pixel's gradient sums its 1024 shares at
    scale 32 in float32 (closed form: each of the 4 pixels of a symmetric 2x2 image
    gets a quarter of sum(g); bfloat16 sums gave 100 and 104 for 102.5)."""
    from tests.ops.test_data_values import _nnc_bilinear

    x = jnp.asarray(rng.standard_normal((1, 5, 7, 3)) * 10, jnp.bfloat16)
    got = ops.upsample(scale=(3, 3), mode="bilinear")(x)
    want = _nnc_bilinear(np.asarray(x, np.float64), 15, 21, False).astype(np.float64)
    half_ulp = np.spacing(np.abs(want).astype(jnp.bfloat16)).astype(np.float64) * 0.51
    assert np.all(np.abs(np.asarray(got, np.float64) - want) <= half_ulp + 1e-6)
    for mode in ("nearest", "bilinear"):
        x = jnp.ones((1, 2, 2, 1), jnp.bfloat16)
        g = jnp.full((1, 64, 64, 1), 0.1, jnp.bfloat16)
        params = dict(scale=(32, 32), mode=mode, align_corners=False)
        (gx,) = ops.lookup("upsample").backward((g,), (x,), (None,), **params)
        want = np.float64(jnp.bfloat16(0.1)) * 64 * 64 / 4
        np.testing.assert_array_equal(np.asarray(gx), np.asarray(jnp.full(x.shape, want, x.dtype)))


def test_scatter_add_of_bool_rows_is_a_dtype_error():
    """scatter_add sums rows, which XLA does not do in bool: a DTypeError from the shape
    rule, as reduce_sum gives, where a bare 'add does not accept dtype bool' TypeError
    had come from the forward. int32 rows still add (np.add.at)."""
    from fnnc.errors import DTypeError

    idx = jnp.array([1, 1, 0], jnp.int32)
    with pytest.raises(DTypeError, match=r"scatter_add: expected numbers, got bool\[3\]"):
        ops.scatter_add(bincount=2)(jnp.array([True, True, False]), idx)
    want = np.zeros(2, np.int32)
    np.add.at(want, np.asarray(idx), [4, 5, 6])
    np.testing.assert_array_equal(ops.scatter_add(bincount=2)(jnp.array([4, 5, 6]), idx), want)


def test_gathers_from_an_empty_table_are_shape_errors():
    """index_select and embedding of a row from a table with none: a ShapeError from the
    shape rule, where jnp.take's bare IndexError had come from the forward. No indices
    from an empty table still give an empty result (NumPy's np.take)."""
    from fnnc.errors import ShapeError

    table = jnp.zeros((0, 3))
    with pytest.raises(
        ShapeError, match=r"index_select: axis 0 of x float32\[0, 3\] is empty.*; give x rows"
    ):
        ops.index_select()(table, jnp.array([0]))
    with pytest.raises(
        ShapeError, match=r"embedding: table float32\[0, 3\] has no row.*; give a table"
    ):
        ops.embedding()(table, jnp.array([[0]]))
    none = np.zeros((0,), np.int32)
    want = np.take(np.zeros((0, 3)), none, axis=0)
    assert ops.index_select()(table, jnp.asarray(none)).shape == want.shape
    assert ops.embedding()(table, jnp.asarray(none)).shape == want.shape


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_gumbel_argmax_samples_16_bit_logits_without_tie_bias(dtype):
    """Equal logits sample every index equally (softmax: 1/8 each, 20000 draws, a 4.5
    sigma band): the Gumbel noise had been added in bfloat16, where 100 + noise rounds
    to steps of 0.5 and argmax gave the ties to the first index (15.4% for index 0;
    float16, with steps of 0.0625, passes before and after)."""
    import jax

    key = jax.random.key_data(jax.random.key(0))
    idx = np.asarray(ops.gumbel_argmax(axis=-1)(jnp.full((20000, 8), 100.0, dtype), key))
    share = np.bincount(idx.ravel(), minlength=8) / idx.size
    np.testing.assert_allclose(share, np.full(8, 1 / 8), atol=0.0105)


def test_index_select_blends_16_bit_rows_at_float_positions_once(rng):
    """A bfloat16 row read at a float position is the float64 blend of its two rows
    (NNC's x[j] (1 - w) + x[j + 1] w) rounded once: the weight (0.3 -> 0.30078) and
    both products had been rounded too, 1.5 ulp of the rows off."""
    x = jnp.asarray(rng.standard_normal((50, 64)) * 10, jnp.bfloat16)
    pos = jnp.asarray(rng.uniform(0, 49, 200), jnp.float32)
    y = ops.index_select()(x, pos)
    assert y.dtype == jnp.bfloat16
    got = np.asarray(y, np.float64)
    xd, p = np.asarray(x, np.float64), np.asarray(pos, np.float64)
    j = p.astype(int)
    w = (p - j)[:, None]
    want = xd[j] * (1 - w) + xd[np.minimum(j + 1, 49)] * w
    half_ulp = np.spacing(np.abs(want).astype(jnp.bfloat16)).astype(np.float64) * 0.51
    assert np.all(np.abs(got - want) <= half_ulp + 1e-6)


@pytest.mark.parametrize(
    "cmd, args, match",
    [
        (lambda: ops.partition(kth=1.5), ((2, 3),), r"partition: kth must be an int, got 1\.5"),
        (lambda: ops.partition(kth=True), ((2, 3),), r"partition: kth must be an int, got True"),
        (lambda: ops.unique_consecutive(bincount=2.5), ((3,),), r"unique_consecutive: bincount"),
        (lambda: ops.pad(pads=((1.5, 1),)), ((3,),), r"pad: pads must be ints"),
        (lambda: ops.slice(start=(0.5,), limit=(2,)), ((3,),), r"slice: start, limit and strides"),
        (lambda: ops.reshape(shape=(1.5, 4)), ((4,),), r"reshape: shape must be ints"),
        (lambda: ops.transpose(perm=(1.5, 0)), ((2, 3),), r"transpose: perm must be ints"),
        (lambda: ops.broadcast_to(shape=(2.5, 3)), ((3,),), r"broadcast_to: shape must be ints"),
        (lambda: ops.reshape(shape=(float("nan"), 4)), ((4,),), r"reshape: shape must be ints"),
        (lambda: ops.reshape(shape=(True, 4)), ((4,),), r"give whole numbers as Python ints"),
        (lambda: ops.set(shape=(float("inf"),)), None, r"set: shape must be ints, got \(inf,\)"),
    ],
)
def test_int_attributes_without_defaults_refuse_floats(cmd, args, match):
    """Attributes without a default are left to the shape rules, which took floats: a
    bare TypeError from JAX (partition's kth, unique_consecutive's bincount, pad, slice)
    or a silent truncation (reshape(shape=(1.5, 4)) of 4 values gave [1, 4]). Now a
    CommandError naming the command and the attribute; NumPy ints still pass."""
    from fnnc.errors import CommandError

    with pytest.raises(CommandError, match=match):
        cmd()() if args is None else cmd()(jnp.zeros(args[0]))
    np.testing.assert_array_equal(
        ops.reshape(shape=(np.int64(2), 2))(jnp.arange(4.0)), [[0, 1], [2, 3]]
    )


def _x(shape):
    return np.arange(float(np.prod(shape))).reshape(shape).astype(np.float32)


@pytest.mark.parametrize(
    "name, given, ints, shape",
    [
        ("reshape", {"shape": (2.0, 3)}, {"shape": (2, 3)}, (6,)),
        ("transpose", {"perm": (1.0, np.float32(0))}, {"perm": (1, 0)}, (2, 3)),
        (
            "pad",
            {"pads": ((1.0, 2.0),), "mode": "constant", "value": 0.0},
            {"pads": ((1, 2),), "mode": "constant", "value": 0.0},
            (3,),
        ),
        (
            "slice",
            {"start": (1.0,), "limit": (5.0,), "strides": (2.0,)},
            {"start": (1,), "limit": (5,), "strides": (2,)},
            (6,),
        ),
        ("broadcast_to", {"shape": (2.0, np.int64(3))}, {"shape": (2, 3)}, (3,)),
        ("partition", {"kth": 2.0}, {"kth": 2}, (2, 3)),
        ("unique_consecutive", {"bincount": np.float64(3)}, {"bincount": 3}, (4,)),
        ("set", {"shape": (2.0, 3.0)}, {"shape": (2, 3)}, None),
    ],
)
def test_int_attributes_take_whole_floats_as_their_ints(name, given, ints, shape):
    """Whole finite floats (2.0) worked before the int check (reshape(shape=(2.0, 3))
    gave (2, 3)) and the check had refused them; they are converted, so a command given
    2.0 gives what it gives for 2: forward (and backward where it has one) against the
    same command with Python ints, and NumPy for reshape / transpose / slice / pad."""
    make, opdef = getattr(ops, name), ops.lookup(name)
    args = () if shape is None else (jnp.asarray(_x(shape)),)
    got, want = make(**given)(*args), make(**ints)(*args)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_array_equal(g, w)
    numpy = {
        "reshape": lambda x: x.reshape(2, 3),
        "transpose": lambda x: x.T,
        "slice": lambda x: x[1:5:2],
        "pad": lambda x: np.pad(x, ((1, 2),)),
    }
    if name in numpy:
        np.testing.assert_array_equal(got, numpy[name](_x(shape)))
    if name in ("reshape", "transpose", "pad", "slice", "broadcast_to"):
        cot = (jnp.ones_like(got),)
        back = opdef.backward(cot, args, (got,), **given)[0]
        np.testing.assert_array_equal(back, opdef.backward(cot, args, (got,), **ints)[0])


def test_random_uniform_with_low_above_high_samples_between_them():
    """NNC's RANDOM_UNIFORM(l, u) is r * u + (1 - r) * l, between the two bounds in
    either order; low=2, high=1 had given 2.0 everywhere (jax.random.uniform clamps to
    minval). Now uniform in [1, 2): its mean within 4 sigma of 1.5 and no value outside."""
    import jax

    key = jax.random.key_data(jax.random.key(8))
    got = np.asarray(ops.random_uniform(shape=(10000,), low=2.0, high=1.0)(key), np.float64)
    assert got.min() >= 1.0 and got.max() < 2.0
    assert abs(got.mean() - 1.5) < 4 * np.sqrt(1 / 12 / got.size)
    assert abs(got.var() - 1 / 12) < 0.005


def _softmax64(z):
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_sparse_attentions_compute_16_bit_inputs_in_float32(rng):
    """bfloat16 sparse_indexed_attention and sol_attention are the float64 attention of
    their (rounded) inputs rounded once, as the dense attention is: logits,
    exponentials and products in bfloat16 had left 3x that error (0.0071 for 0.0024).
    Oracles: NumPy softmax over the dense rows and the indexed sparse rows; sol_attention
    with no approximated span is dense attention."""
    t, h, d, rd, rs, k = 4, 2, 16, 64, 64, 16
    bf = jnp.bfloat16
    q, dk, dv, sk, sv = (
        jnp.asarray(rng.standard_normal(s) * m, bf)
        for s, m in (((t, h, d), 2), ((rd, d), 1), ((rd, d), 1), ((rs, d), 1), ((rs, d), 1))
    )
    idx = rng.integers(0, rs, (t, k)).astype(np.int32)
    got = ops.sparse_indexed_attention(scale=0.25)(q, dk, dv, sk, sv, jnp.asarray(idx))
    q64, dk64, dv64, sk64, sv64 = (np.asarray(a, np.float64) for a in (q, dk, dv, sk, sv))
    want = np.empty((t, h, d))
    for i in range(t):
        keys, values = np.concatenate([dk64, sk64[idx[i]]]), np.concatenate([dv64, sv64[idx[i]]])
        want[i] = _softmax64(q64[i] @ keys.T * 0.25) @ values
    x = [jnp.asarray(rng.standard_normal((1, 8, 2, 16)), bf) for _ in range(3)]
    got_sol = ops.sol_attention(scale=0.25, block_size=4)(*x)
    a, b, c = (np.asarray(v, np.float64)[0].transpose(1, 0, 2) for v in x)  # [H, T, D]
    want_sol = (_softmax64(a @ b.transpose(0, 2, 1) * 0.25) @ c).transpose(1, 0, 2)[None]
    for y, w in ((got, want), (got_sol, want_sol)):
        assert y.dtype == bf
        half_ulp = np.spacing(np.abs(w).astype(bf)).astype(np.float64) * 0.51
        assert np.all(np.abs(np.asarray(y, np.float64) - w) <= half_ulp + 1e-5)


def _complex(x):
    x = np.asarray(x, np.float64)
    return x[..., 0::2] + 1j * x[..., 1::2]


def _pairs64(z):
    return np.stack([z.real, z.imag], -1).reshape(*z.shape[:-1], -1)


def test_cmul_rounds_a_16_bit_complex_product_once(rng):
    """bfloat16 cmul (RoPE) is the float64 complex product of its inputs rounded once,
    and the gradient of a broadcast b the float64 sum of g conj(a) rounded once: the
    products a0 b0 and a1 b1 had been rounded before their difference cancelled (up to
    740 half-ulps off)."""
    bf = jnp.bfloat16
    a = jnp.asarray(rng.standard_normal((16, 8, 64)) * 3, bf)
    b = jnp.asarray(rng.standard_normal((8, 64)) * 3, bf)
    g = jnp.asarray(rng.standard_normal((16, 8, 64)), bf)
    got = ops.cmul()(a, b)
    _, gb = ops.lookup("cmul").backward((g,), (a, b), (got,))
    want = _pairs64(_complex(a) * _complex(b))
    want_gb = _pairs64((_complex(g) * np.conj(_complex(a))).sum(0))
    for y, w in ((got, want), (gb, want_gb)):
        assert y.dtype == bf
        half_ulp = np.spacing(np.abs(w).astype(bf)).astype(np.float64) * 0.51
        assert np.all(np.abs(np.asarray(y, np.float64) - w) <= half_ulp + 1e-5)


def test_swish_mul_and_swiglu_round_a_16_bit_result_once(rng):
    """bfloat16 swish_mul and swiglu are their float64 formulas on the rounded inputs
    rounded once: the gate, the up projection and each product had been rounded in
    bfloat16 (2.3x the rms error of one rounding; swish_mul up to 29 half-ulps)."""
    bf = jnp.bfloat16
    a = jnp.asarray(rng.standard_normal((64, 64)) * 3, bf)
    b = jnp.asarray(rng.standard_normal((64, 64)) * 3, bf)
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
    got = ops.swish_mul(scale=1.7, beta=1.3)(a, b)
    want = 1.7 * a64 * b64 / (1 + np.exp(-1.3 * b64))
    x = jnp.asarray(rng.standard_normal((8, 64)), bf)
    gw, uw = (jnp.asarray(rng.standard_normal((32, 64)) * 0.2, bf) for _ in range(2))
    gate = np.asarray(x, np.float64) @ np.asarray(gw, np.float64).T
    up = np.asarray(x, np.float64) @ np.asarray(uw, np.float64).T
    for y, w in ((got, want), (ops.swiglu()(x, gw, uw), up * _swish(gate))):
        assert y.dtype == bf
        half_ulp = np.spacing(np.abs(w).astype(bf)).astype(np.float64) * 0.51
        assert np.all(np.abs(np.asarray(y, np.float64) - w) <= half_ulp + 1e-5)


def test_segmented_swiglu_rounds_a_16_bit_result_once(rng):
    """bfloat16 segmented_swiglu is the float64 SwiGLU of each row with its segment's
    expert weights, times its route weight, rounded once (float32 products, as swiglu)."""
    bf = jnp.bfloat16
    experts, rows, n, k = 3, 12, 16, 32
    x = jnp.asarray(rng.standard_normal((rows, k)), bf)
    gw, uw = (jnp.asarray(rng.standard_normal((experts, n, k)) * 0.3, bf) for _ in range(2))
    route = jnp.asarray(rng.uniform(0.5, 1.5, rows), bf)
    indices, counts = jnp.array([2, 0, 1], jnp.int32), jnp.array([5, 4, 3], jnp.int32)
    got = ops.segmented_swiglu()(x, indices, counts, gw, uw, route)
    expert = np.repeat([2, 0, 1], [5, 4, 3])
    x64, g64, u64 = (np.asarray(v, np.float64) for v in (x, gw, uw))
    gate = np.einsum("rk,rnk->rn", x64, g64[expert])
    up = np.einsum("rk,rnk->rn", x64, u64[expert])
    want = np.asarray(route, np.float64)[:, None] * up * _swish(gate)
    assert got.dtype == bf
    half_ulp = np.spacing(np.abs(want).astype(bf)).astype(np.float64) * 0.51
    assert np.all(np.abs(np.asarray(got, np.float64) - want) <= half_ulp + 1e-5)
