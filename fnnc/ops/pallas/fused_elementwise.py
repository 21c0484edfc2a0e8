"""Pallas ``fused_elementwise``: a kernel generated from the fused command's body.

Nothing here is written per pattern. The kernel body *traces the body graph's
reference forwards* over one block: each program loads its tiles of the inputs, runs
every body node's forward on them in order, and stores the outputs. The backward
kernel recomputes that forward on its tiles and runs the members' own backwards in
reverse order, so every chain the fusion pass produces gets a forward and a backward
kernel.

Layout: the output ``[..., L]`` is viewed as ``[R, L]`` rows and blocked
``(br, bl)``; each input is a full, row (a bias), column or scalar tile of it (see
:func:`~fnnc.ops.pallas._common.operand_kind`). The backward writes per-program
partial gradients of broadcast inputs, which XLA sums.

Bias + activation epilogue: a body whose *first* node is a ``gemm`` (its inputs body
inputs that nothing else reads) and whose other nodes are elementwise becomes one
:func:`fnnc.ops.pallas.gemm.matmul` call with the rest of the body as its epilogue,
e.g. ``gelu(x @ wᵀ + b)`` with no round trip of the pre-activation through memory.
The fusion pass does not build such bodies today (it fuses elementwise chains, so a
dense layer is ``gemm`` + ``fused_elementwise[add, gelu]``, two kernels); a pass or a
user that puts the gemm inside the body gets the single kernel. The forward used for
gradients also saves the gemm's result, whose epilogue VJP is an elementwise kernel.

The body runs in float32 inside the kernel (16-bit tiles are widened on load, outputs
rounded once on store): Triton cannot compare 16-bit floats, and XLA's own GPU fusions
widen the same way; float32 bodies are unchanged.

Supported: bodies without views whose nodes are elementwise (the command attribute),
optionally led by a gemm; float outputs of one non-empty shape of rank >= 1 (any last
axis: a ragged last lane block is masked, see :mod:`~fnnc.ops.pallas._blockwise`);
float or bool inputs that are full/row/column/scalar tiles; and, in the body and its
VJP, only primitives the installed JAX's Pallas Triton lowering implements or fnnc has a
rule for (:mod:`~fnnc.ops.pallas._triton`: exact ``gelu``'s ``erf`` runs as XLA's own
float32 expansion). That is decided in ``supports``, at selection, for the GPU whatever
the host: a body with any other primitive (``erfc``) selects the reference there, and
forcing the kernel on it raises :class:`~fnnc.errors.BackendError` naming the primitive.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fnnc.core.command import Command, Spec
from fnnc.ops._rules import show, unbroadcast
from fnnc.ops.fused import fused_elementwise as _command
from fnnc.ops.pallas import _blockwise, _derivatives, _triton
from fnnc.ops.pallas import gemm as _gemm
from fnnc.ops.pallas._common import (
    FLOATS,
    FULL,
    as_operand,
    lane_block,
    operand_kind,
    reduce_partials,
    row_block,
)

NAME = "fused_elementwise"
LANE_BLOCK = 1024

fused_elementwise_reference = _command.definition.forward
"""The command's reference forward (the ``"xla"`` backend), which the kernel matches."""


@dataclasses.dataclass(frozen=True)
class Plan:
    """How one body runs as a kernel: its ``[rows, lanes]`` view and input layouts."""

    rows: int
    lanes: int
    kinds: tuple[str, ...]  # per body input; "" for the leading gemm's own inputs
    gemm: Command | None = None  # the leading gemm's command, if the body starts with one
    gemm_inputs: tuple[int, ...] = ()  # positions of its inputs among the body inputs

    @property
    def blocks(self) -> tuple[int, int]:
        bl = lane_block(self.lanes, LANE_BLOCK)
        return row_block(self.rows, bl), bl


def _kinds(body: Any, out: tuple[int, ...], skip: Sequence[int]) -> tuple[str, ...] | str:
    kinds = []
    for i, spec in enumerate(body.input_specs):
        kind = "" if i in skip else operand_kind(spec.shape, out)
        if kind is None:
            where = f"input {i} {list(spec.shape)}"
            return f"{where} is not a full, row, column or scalar tile of {list(out)}"
        if kind and not (np.dtype(spec.dtype) in FLOATS or spec.dtype == jnp.bool_):
            return f"input {i} {show(spec)} is not float32/bfloat16/float16 or bool"
        kinds.append(kind)
    return tuple(kinds)


def _leading_gemm(body: Any) -> tuple[int, ...] | str:
    """Positions of the leading gemm's inputs among the body inputs, or why it cannot lead."""
    node = body.nodes[0]
    pos = [body.inputs.index(s) if s in body.inputs else -1 for s in node.inputs]
    private = all(body.consumers.get(s) == [0] and s not in body.outputs for s in node.inputs)
    if -1 in pos or not private or len(set(node.inputs)) != len(node.inputs):
        return "the leading gemm must read body inputs that nothing else reads"
    if body.spec(node.outputs[0]).shape != body.output_specs[0].shape:
        return "the leading gemm's result must have the body's output shape"
    specs = [body.spec(s) for s in node.inputs]
    why = _gemm.support_reason(
        *specs[:2],
        specs[2] if len(specs) > 2 else None,
        *(node.cmd.param(p) for p in ("transpose_a", "transpose_b")),
    )
    return why if why is not None else tuple(pos)


def _elementwise(node: Any) -> bool:
    return node.cmd.definition.attributes.elementwise and len(node.outputs) == 1


@functools.lru_cache(maxsize=512)
def plan(body: Any) -> Plan | str:
    """The kernel plan of ``body``, or why there is none."""
    if not body.nodes or any(s.is_alias for s in body.symbols):
        return "the body is empty or has views"
    gemm = body.nodes[0].cmd if body.nodes[0].cmd.name == "gemm" else None
    rest = body.nodes[1:] if gemm is not None else body.nodes
    odd = [str(n.cmd) for n in rest if not _elementwise(n)]
    if odd:
        return f"body commands {odd} are not elementwise"
    outs = body.output_specs
    out = tuple(outs[0].shape)
    if any(tuple(s.shape) != out or np.dtype(s.dtype) not in FLOATS for s in outs):
        return f"body outputs {[show(s) for s in outs]} are not float tensors of one shape"
    skip = _leading_gemm(body) if gemm is not None else ()
    if isinstance(skip, str):
        return skip
    kinds = _kinds(body, out, skip)
    if isinstance(kinds, str):
        return kinds
    if not out or math.prod(out) == 0:
        return f"outputs {list(out)} are scalars or empty"
    return _plan_primitives(body, Plan(math.prod(out[:-1]), out[-1], kinds, gemm, skip))


def _evaluate(body: Any, env: dict[int, Any], start: int) -> tuple[Any, ...]:
    """Runs body nodes ``start...`` with their reference forwards on the values in ``env``."""
    for node in body.nodes[start:]:
        out = node.cmd.definition.forward(*(env[s] for s in node.inputs), **node.cmd.kwargs)
        env[node.outputs[0]] = out
    return tuple(env[s] for s in body.outputs)


def _tile_env(body: Any, p: Plan) -> tuple[list[int], Callable[..., dict[int, Any]]]:
    """The symbols the tiles hold (the leading gemm's result first, then the kinded
    inputs) and ``env(tiles)``: their values by symbol, floats in float32 and bool inputs
    as booleans, as the block functions run the body."""
    kinded = [i for i, k in enumerate(p.kinds) if k]
    head = [body.nodes[0].outputs[0]] if p.gemm is not None else []
    sids = head + [body.inputs[i] for i in kinded]
    bools = [False] * len(head) + [body.input_specs[i].dtype == jnp.bool_ for i in kinded]

    def env(tiles: Sequence[Any]) -> dict[int, Any]:
        return {
            sid: (t != 0) if b else (t.astype(jnp.float32) if t.dtype in FLOATS else t)
            for sid, t, b in zip(sids, tiles, bools)
        }

    return sids, env


def _block_fn(body: Any, p: Plan) -> Callable[..., tuple[Any, ...]]:
    """The body on tiles: ``fn(*tiles)`` over the kinded inputs (after ``z`` for a gemm)."""
    _, env = _tile_env(body, p)
    head = 1 if p.gemm is not None else 0
    return lambda *tiles: _evaluate(body, env(tiles), head)


def _block_pull(body: Any, p: Plan) -> _blockwise.Pull:
    """The tiles' gradients through the body with each member's own backward, as the
    reference's backward takes them (relu's 0 at 0, a user's straight-through rule): the
    forward recomputed, then the members' backwards in reverse order, traced straight
    into the kernel (``jax.vjp`` of the block function would differentiate the members'
    JAX code instead, and Triton has no lowering for a ``custom_vjp``)."""
    sids, tile_env = _tile_env(body, p)
    head = 1 if p.gemm is not None else 0

    def pull(tiles: list[Any], cts: Sequence[Any]) -> list[Any]:
        env = tile_env(tiles)
        _evaluate(body, env, head)
        grads: dict[int, Any] = {}

        def add(sid: int, g: Any) -> None:
            g = unbroadcast(g.astype(jnp.float32), env[sid].shape)
            grads[sid] = g if sid not in grads else grads[sid] + g

        for sid, c in zip(body.outputs, cts):
            add(sid, c)
        for node in reversed(body.nodes[head:]):
            g = grads.get(node.outputs[0])
            if g is None:
                continue
            ins = tuple(env[s] for s in node.inputs)
            outs = (env[node.outputs[0]],)
            back = node.cmd.definition.backward((g,), ins, outs, **node.cmd.kwargs)
            for sid, gi in zip(node.inputs, back):
                if gi is not None and jnp.issubdtype(env[sid].dtype, jnp.floating):
                    add(sid, gi)
        # float32, rounded to the operand's type once, after the partials are summed
        # (rounding each program's partial sum of a 16-bit bias first moved its gradient
        # by up to half an ulp of the partials, which cancel)
        return [
            (grads[s] if s in grads else jnp.zeros(t.shape, jnp.float32))
            if jnp.issubdtype(t.dtype, jnp.floating)
            else None
            for s, t in zip(sids, tiles)
        ]

    return pull


def _plan_primitives(body: Any, p: Plan) -> Plan | str:
    """``p`` if the block function and its backward lower to Triton (with fnnc's rules)."""
    fn, pull = _block_fn(body, p), _block_pull(body, p)
    z = [Spec((1, 1), body.output_specs[0].dtype)] if p.gemm is not None else []
    tiles = z + [Spec((1, 1), body.input_specs[i].dtype) for i, k in enumerate(p.kinds) if k]
    cts = [Spec((1, 1), o.dtype) for o in body.output_specs]
    vjp = lambda *tc: pull(list(tc[: len(tiles)]), tc[len(tiles) :])
    missing = sorted({*_triton.missing(fn, *tiles), *_triton.missing(vjp, *tiles, *cts)})
    return f"primitives {missing} have no Pallas Triton lowering" if missing else p


def supports(cmd: Command, specs: Sequence[Spec]) -> str | None:
    """``None`` when a kernel can be generated for this body, else the reason."""
    found = plan(cmd.param("body"))
    return f"{NAME}: {found}" if isinstance(found, str) else None


# --- chains of elementwise commands --------------------------------------------------


def _kinded(p: Plan) -> list[str]:
    return [k for k in p.kinds if k]


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _chain(body: Any, p: Plan, *operands: Any) -> tuple[Any, ...]:
    dtypes = [s.dtype for s in body.output_specs]
    fn, ops = _block_fn(body, p), list(zip(operands, _kinded(p)))
    return _blockwise.call(fn, ops, (p.rows, p.lanes), p.blocks, dtypes)


def _chain_fwd(body, p, *operands):
    return _chain(body, p, *operands), operands


def _chain_bwd(body, p, operands, cts):
    ops = list(zip(operands, _kinded(p)))
    return tuple(_blockwise.vjp_call(_block_pull(body, p), ops, (p.rows, p.lanes), p.blocks, cts))


def _reference(body: Any, p: Plan, operands: Sequence[Any]) -> tuple[Any, ...]:
    """The command's reference on the kernel operands (the gemm's ``a``, ``b``, bias,
    then the kinded inputs) back in the body's input shapes; outputs as ``[R, L]``."""
    ins: list[Any] = [None] * len(body.inputs)
    given = iter(operands)
    for i in (*p.gemm_inputs, *(i for i, k in enumerate(p.kinds) if k)):
        spec, x = body.input_specs[i], next(given)
        ins[i] = jnp.reshape(x, spec.shape).astype(spec.dtype)
    outs = _command.definition.forward(*ins, body=body)
    outs = outs if isinstance(outs, tuple) else (outs,)
    return tuple(jnp.reshape(o, (p.rows, p.lanes)) for o in outs)


_derivatives.defvjp(_chain, _chain_fwd, _chain_bwd, lambda body, p, *ops: _reference(body, p, ops))


# --- a leading gemm with the rest of the body as its epilogue ------------------------


def _gemm_parts(body: Any, p: Plan, inputs: Sequence[Any]) -> tuple[Any, Any, Any, str]:
    """The leading gemm's ``a`` (2-D), ``b``, bias operand and the bias's kind."""
    a, b, *bias = (inputs[i] for i in p.gemm_inputs)
    ta = p.gemm.param("transpose_a")
    a2 = a if ta else jnp.reshape(a, (p.rows, a.shape[-1]))
    if not bias:
        return a2, b, None, ""
    kind = operand_kind(bias[0].shape, body.output_specs[0].shape)
    return a2, b, as_operand(bias[0], kind, p.rows, p.lanes), kind


def _epilogue(body: Any, p: Plan, bias_kind: str, save: bool) -> Callable[..., Any]:
    fn = _block_fn(body, p)

    def epilogue(z: Any, *tiles: Any) -> tuple[Any, ...]:
        if bias_kind:
            z, tiles = z + tiles[0], tiles[1:]
        outs = fn(z, *tiles)
        return (*outs, z) if save else outs

    return _triton.lowerable(epilogue)


def _run_gemm(body, p, kind, save, a, b, bias, *extras):
    ops = ([(bias, kind)] if kind else []) + list(zip(extras, _kinded(p)))
    dtypes = [s.dtype for s in body.output_specs] + ([a.dtype] if save else [])
    ta, tb = p.gemm.param("transpose_a"), p.gemm.param("transpose_b")
    epilogue = _epilogue(body, p, kind, save)
    return _gemm.matmul(a, b, ta=ta, tb=tb, operands=ops, epilogue=epilogue, out_dtypes=dtypes)


def _gemm_grads(body, p, kind, a, b, bias, extras, z, cts):
    ops = [(z, FULL), *zip(extras, _kinded(p))]
    pull = _block_pull(body, p)
    gz, *g_extras = _blockwise.vjp_call(pull, ops, (p.rows, p.lanes), p.blocks, cts)
    da, db = _gemm.matmul_grads(gz, a, b, p.gemm.param("transpose_a"), p.gemm.param("transpose_b"))
    dbias = None if bias is None else reduce_partials(gz, kind, bias.shape, bias.dtype)
    return (da, db, dbias, *g_extras)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _gemm_chain(body, p, kind, a, b, bias, *extras):
    return _run_gemm(body, p, kind, False, a, b, bias, *extras)


def _gemm_chain_fwd(body, p, kind, a, b, bias, *extras):
    *outs, z = _run_gemm(body, p, kind, True, a, b, bias, *extras)
    return tuple(outs), (a, b, bias, extras, z)


def _gemm_chain_bwd(body, p, kind, residuals, cts):
    a, b, bias, extras, z = residuals
    return _gemm_grads(body, p, kind, a, b, bias, extras, z, cts)


def _gemm_chain_reference(body, p, kind, a, b, bias, *extras):
    return _reference(body, p, [x for x in (a, b, bias) if x is not None] + list(extras))


_derivatives.defvjp(_gemm_chain, _gemm_chain_fwd, _gemm_chain_bwd, _gemm_chain_reference)


# --- the backend ---------------------------------------------------------------------


def _plan_of(body: Any) -> Plan:
    p = plan(body)
    assert isinstance(p, Plan), p
    return p


def _extras(p: Plan, inputs: Sequence[Any]) -> list[Any]:
    return [as_operand(x, k, p.rows, p.lanes) for x, k in zip(inputs, p.kinds) if k]


def fused_elementwise(*inputs: Any, body: Any) -> Any:
    """The kernel backend: same signature and results as the reference."""
    p = _plan_of(body)
    if p.gemm is None:
        outs = _chain(body, p, *_extras(p, inputs))
    else:
        a, b, bias, kind = _gemm_parts(body, p, inputs)
        outs = _gemm_chain(body, p, kind, a, b, bias, *_extras(p, inputs))
    outs = [jnp.reshape(o, s.shape) for o, s in zip(outs, body.output_specs)]
    return outs[0] if len(outs) == 1 else tuple(outs)


def _pre_activation(p: Plan, kind: str, a: Any, b: Any, bias: Any) -> Any:
    """The leading gemm's result (what the epilogue reads), recomputed by the kernel."""
    ops, add = ([(bias, kind)], lambda z, t: (z + t,)) if kind else ([], None)
    ta, tb = p.gemm.param("transpose_a"), p.gemm.param("transpose_b")
    return _gemm.matmul(a, b, ta=ta, tb=tb, operands=ops, epilogue=add)[0]


def backward(grads, inputs, outputs, wants, *, body) -> tuple[Any, ...]:
    """The command's backward (NNC convention) as generated kernels."""
    p = _plan_of(body)
    flat = lambda g, s: jnp.reshape(g, (p.rows, p.lanes)).astype(s.dtype)
    zero = lambda s: jnp.zeros((p.rows, p.lanes), s.dtype)
    cts = [zero(s) if g is None else flat(g, s) for g, s in zip(grads, body.output_specs)]
    extras = _extras(p, inputs)
    head: dict[int, Any] = {}
    if p.gemm is None:
        ops = list(zip(extras, _kinded(p)))
        pull = _block_pull(body, p)
        g_extras = _blockwise.vjp_call(pull, ops, (p.rows, p.lanes), p.blocks, cts)
    else:
        a, b, bias, kind = _gemm_parts(body, p, inputs)
        z = _pre_activation(p, kind, a, b, bias)
        da, db, dbias, *g_extras = _gemm_grads(body, p, kind, a, b, bias, extras, z, cts)
        head = dict(zip(p.gemm_inputs, (da, db, dbias)))
    kinded = iter(g_extras)
    result = [next(kinded) if k else head.get(i) for i, k in enumerate(p.kinds)]
    return tuple(None if g is None else jnp.reshape(g, x.shape) for g, x in zip(result, inputs))
