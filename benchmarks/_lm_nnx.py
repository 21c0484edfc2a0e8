"""The Flax NNX + optax implementation of ``benchmarks/lm_step.py`` (``nnx``): NNX
modules of the same LM loaded with fnnc's weights, one jitted step, and XLA's cost
analysis of that step against fnnc's."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from benchmarks import _profile
from benchmarks._lm_common import (
    EPS,
    LR,
    Result,
    Size,
    _jax_peak,
    _profiled,
    batches,
    fnnc_model,
    initial_params,
    pid,
)
from benchmarks._timing import median_time
from fnnc import config
from fnnc.models import minimizers


class NNXBlock(nnx.Module):
    def __init__(self, z: Size, dtype: Any, rngs: nnx.Rngs):
        d, f32 = z.width, jnp.float32
        self.heads = z.heads
        self.ln1 = nnx.LayerNorm(d, epsilon=1e-5, dtype=f32, rngs=rngs)
        self.q, self.k, self.v, self.o = (nnx.Linear(d, d, dtype=dtype, rngs=rngs) for _ in "qkvo")
        self.ln2 = nnx.LayerNorm(d, epsilon=1e-5, dtype=f32, rngs=rngs)
        self.up = nnx.Linear(d, 4 * d, dtype=dtype, rngs=rngs)
        self.down = nnx.Linear(4 * d, d, dtype=dtype, rngs=rngs)

    def __call__(self, h: Any) -> Any:
        b, s, d = h.shape
        a = self.ln1(h)
        q, k, v = (
            jnp.reshape(p(a), (b, s, self.heads, d // self.heads)) for p in (self.q, self.k, self.v)
        )
        o = jax.nn.dot_product_attention(q, k, v, is_causal=True)
        h = h + self.o(jnp.reshape(o, (b, s, d)))
        return h + self.down(jax.nn.relu(self.up(self.ln2(h))))


class NNXLM(nnx.Module):
    def __init__(self, z: Size, dtype: Any, rngs: nnx.Rngs):
        self.dtype = dtype
        self.embed = nnx.Embed(z.vocab, z.width, dtype=dtype, rngs=rngs)
        self.positions = nnx.Param(jnp.zeros((z.seq, z.width)))
        self.blocks = nnx.List([NNXBlock(z, dtype, rngs) for _ in range(z.blocks)])
        self.ln_out = nnx.LayerNorm(z.width, epsilon=1e-5, dtype=jnp.float32, rngs=rngs)
        self.logits = nnx.Linear(z.width, z.vocab, dtype=dtype, rngs=rngs)

    def __call__(self, tokens: Any) -> Any:
        h = self.embed(tokens) + self.positions[...].astype(self.dtype)[None]
        for block in self.blocks:
            h = block(h)
        return self.logits(self.ln_out(h))


def load_nnx(model: NNXLM, z: Size, params: dict[str, np.ndarray]) -> None:
    """fnnc's weights into the NNX model (Linear kernels are fnnc's weights transposed)."""

    def dense(layer: nnx.Linear, name: str, w: int = 0, b: int = 1) -> None:
        layer.kernel.value = jnp.asarray(params[pid(name, w)].T)
        layer.bias.value = jnp.asarray(params[pid(name, b)])

    def norm(layer: nnx.LayerNorm, name: str) -> None:
        layer.scale.value = jnp.asarray(params[pid(name, 0)])
        layer.bias.value = jnp.asarray(params[pid(name, 1)])

    model.embed.embedding.value = jnp.asarray(params[pid("embed", 0)])
    model.positions.value = jnp.asarray(params[pid("positions", 0)])
    for i, block in enumerate(model.blocks):
        norm(block.ln1, f"ln{i}a")
        norm(block.ln2, f"ln{i}b")
        for j, proj in enumerate((block.q, block.k, block.v, block.o)):
            dense(proj, f"attn{i}", j, 4 + j)
        dense(block.up, f"mlp{i}a")
        dense(block.down, f"mlp{i}b")
    norm(model.ln_out, "ln_out")
    dense(model.logits, "logits")


def nnx_step(z: Size, params, precision: str) -> tuple[Any, Any, Any]:
    """``(step, state, optimizer state)``: NNX's jitted training step (parameters and
    state donated) and where it starts."""
    dtype = jnp.bfloat16 if precision == "bfloat16" else jnp.float32
    model = NNXLM(z, dtype, nnx.Rngs(0))
    load_nnx(model, z, params)
    graphdef, state = nnx.split(model, nnx.Param)
    tx = optax.adam(LR, eps=EPS)

    @functools.partial(jax.jit, donate_argnums=(0, 1))
    def step(state, opt_state, x, y):
        def loss_fn(state):
            logits = nnx.merge(graphdef, state)(x).astype(jnp.float32)
            return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

        loss, grads = jax.value_and_grad(loss_fn)(state)
        updates, opt_state = tx.update(grads, opt_state, state)
        return optax.apply_updates(state, updates), opt_state, loss

    return step, state, tx.init(state)


def xla_costs(z: Size, precision: str) -> dict[str, tuple[float, float]]:
    """XLA's static cost analysis of the compiled step, ``{impl: (flops, bytes
    accessed)}`` for ``fnnc`` (``Model.fit``'s program, XLA backends throughout: a
    Pallas kernel is an opaque call to the analysis) and ``nnx``: a check of the step's
    structure that no timing noise moves (``tests/test_lm_step.py``)."""
    params = initial_params(z)
    x, y = (jnp.asarray(a) for a in batches(z, 1)[0])
    with config.override(backend="xla"):
        model = fnnc_model(z)
        model.compile(
            [x], loss="softmax_crossentropy", minimizer=minimizers.adam(LR), precision=precision
        )
        model.set_parameters(params)
        model.fit([x], [y])
    ours = model.engine._last_fit.program._compiled.cost_analysis()
    step, state, opt_state = nnx_step(z, params, precision)
    theirs = step.lower(state, opt_state, x, y).compile().cost_analysis()
    return {
        name: (float(c["flops"]), float(c["bytes accessed"]))
        for name, c in (("fnnc", ours), ("nnx", theirs))
    }


def run_nnx(z: Size, data, params, precision: str, timed: bool, profile: int = 0) -> Result:
    step, state, opt_state = nnx_step(z, params, precision)
    box = {"state": state, "opt": opt_state}

    def fit(x: Any, y: Any) -> Any:
        box["state"], box["opt"], loss = step(box["state"], box["opt"], x, y)
        return loss

    losses = [float(fit(jnp.asarray(a), jnp.asarray(b))) for a, b in data]
    x, y = (jnp.asarray(a) for a in data[0])
    ms = 1e3 * median_time(lambda: fit(x, y), repeats=5, inner=5) if timed else None

    def estimate() -> int:
        m = step.lower(box["state"], box["opt"], x, y).compile().memory_analysis()
        return (
            m.argument_size_in_bytes
            + m.output_size_in_bytes
            + m.temp_size_in_bytes
            - (m.alias_size_in_bytes)
        )

    peak, kind = _jax_peak(estimate) if timed else (None, "")
    result = Result("nnx", ms, peak, kind, losses)
    return _profiled(result, profile, lambda: _profile.jax_kernels(lambda: fit(x, y), profile))
