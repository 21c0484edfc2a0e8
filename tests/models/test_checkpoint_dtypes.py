"""A checkpoint restored into a model whose parameters have another float dtype: the
parameters are converted, and the optimizer state with them, not dropped."""

from __future__ import annotations

import jax
import numpy as np
import optax
import pytest

from fnnc.errors import CheckpointError
from fnnc.io import Checkpoints
from fnnc.models import Dense, Input, Model
from fnnc.models.checkpoint_state import current_states

rng = np.random.default_rng(0)
XS = rng.standard_normal((8, 5)).astype(np.float32)
YS = (XS[:, 0] > 0).astype(np.int32)


def _model(dtype) -> Model:
    x = Input()
    m = Model(x, Dense(2, name="fc")(x))
    m.compile(XS.astype(dtype), loss="softmax_crossentropy", minimizer=optax.adam(1e-2))
    return m


@pytest.mark.parametrize("saved, restored", [(np.float32, np.float16), (np.float16, np.float32)])
def test_optimizer_state_is_converted_with_the_parameters(tmp_path, saved, restored):
    a = _model(saved)
    for _ in range(5):
        a.fit(XS.astype(saved), YS)
    b = _model(restored)
    with Checkpoints(str(tmp_path / "run.ckpt")) as ckpt:
        ckpt.save(5, a)
        ckpt.restore_into(b)
        want = ckpt.restore().optimizer_state  # the saved values, as written
    got = current_states(b.engine)
    assert sorted(got) == sorted(want) == ["t-fc-0-0", "t-fc-0-1"]
    for pid in got:
        (count, mu, nu) = jax.tree.leaves(got[pid])
        (s_count, s_mu, s_nu) = jax.tree.leaves(want[pid])
        assert int(count) == int(s_count) == 5
        assert mu.dtype == nu.dtype == b.parameters()[pid].dtype == restored
        np.testing.assert_array_equal(mu, np.asarray(s_mu).astype(restored))
        np.testing.assert_array_equal(nu, np.asarray(s_nu).astype(restored))
    b.fit(XS.astype(restored), YS)
    assert [int(jax.tree.leaves(s)[0]) for s in current_states(b.engine).values()] == [6, 6]


def test_a_leaf_of_another_kind_of_dtype_is_refused(tmp_path):
    a, b = _model(np.float32), _model(np.float32)
    a.fit(XS, YS)
    with Checkpoints(str(tmp_path / "run.ckpt")) as ckpt:
        ckpt.save(1, a)
        opt = ckpt.restore().optimizer_state
        for pid in opt:  # the step count saved as a float
            count, mu, nu = opt[pid][0]
            opt[pid] = (type(opt[pid][0])(count.astype(np.float32), mu, nu), *opt[pid][1:])
        ckpt.save(2, ckpt.restore().state, optimizer_state=opt, metadata={})
        with pytest.raises(CheckpointError, match=r"t-fc-0-\d.*count.*float32.*int32"):
            ckpt.restore_into(b, 2)
