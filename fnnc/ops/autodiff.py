"""The ``gradient`` command: one forward command's backward, as an ordinary node.

NNC gives every command a ``*_BACKWARD`` twin; fnnc derives it from the forward's
:class:`~fnnc.ops.OpDef`. ``gradient[of=cmd]`` reads, in order,

1. the gradients of the forward outputs that have one (``grad_mask``),
2. the forward inputs named in ``cmd``'s ``backward_uses``,
3. the forward outputs named there,

and writes the gradients of the forward inputs listed in ``wants``. The forward
tensors it does not read are known only by their specs (``in_specs``/``out_specs``),
so a memory pass can trust that nothing else is kept alive. A ``None`` gradient from
the rule (e.g. a label) becomes zeros. ``gradient`` has the derived backward itself,
so second-order gradients work through the same pass.

Listings print ``relu.backward[wants=(0,)](%7, %3)``.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np

from fnnc.core.command import BackwardNode, Command, Spec, defcommand, make_command
from fnnc.errors import CommandError
from fnnc.ops.primitive import vjp_problem


def _specs(pairs: Any) -> tuple[Spec, ...]:
    return tuple(Spec(tuple(shape), np.dtype(dtype)) for shape, dtype in pairs)


def _gradient_shape(*specs: Spec, of, in_specs, out_specs, grad_mask, wants) -> tuple[Spec, ...]:
    check = of.definition.backward_check
    reason = check(of) if check is not None else None
    if reason is None:
        reason = vjp_problem(of, tuple(in_specs), tuple(wants))
    if reason is not None:
        raise CommandError(f"{of.name} has no backward here: {reason}")
    uses = of.definition.backward_uses
    n_used = sum(uses.input_used(i) for i in range(len(in_specs)))
    n_used += sum(i in uses.outputs for i in range(len(out_specs)))
    expected = sum(grad_mask) + n_used
    if len(specs) != expected:
        raise CommandError(
            f"{of}.backward: expected {expected} inputs ({sum(grad_mask)} gradients, "
            f"{n_used} forward tensors named in backward_uses), got {len(specs)}"
        )
    ins = _specs(in_specs)
    return tuple(ins[i] for i in wants)


def _gradient_check(cmd: Command, order: int = 1) -> str | None:
    """Why ``gradient[of=...]`` cannot be differentiated (``order`` more times): the
    innermost forward command's ``backward_check`` at the order that needs (a module
    loaded from a file keeps only the orders it had)."""
    order, inner = order + 1, cmd.param("of")
    while (node := inner.definition.backward_node) is not None:
        order, inner = order + 1, node.forward_of(inner)[0]
    check = inner.definition.backward_check
    reason = check(inner, order) if check is not None else None
    return None if reason is None else f"it runs the backward of {inner.name}, and {reason}"


def _display(cmd: Command) -> str:
    wants = cmd.param("wants")
    shown = ",".join(map(str, wants)) + ("," if len(wants) == 1 else "")
    return f"{cmd.param('of')}.backward[wants=({shown})]"


def _forward_of(cmd: Command) -> tuple[Command, tuple[Spec, ...]]:
    return cmd.param("of"), _specs(cmd.param("in_specs"))


def _run(rule, *inputs, of, in_specs, out_specs, grad_mask, wants):
    """Unpacks a gradient node's inputs, runs ``rule`` (NNC convention + ``wants``)."""
    uses = of.definition.backward_uses
    ins_spec, outs_spec = _specs(in_specs), _specs(out_specs)
    values = iter(inputs)
    grads = tuple(next(values) if m else None for m in grad_mask)
    ins = tuple(next(values) if uses.input_used(i) else s for i, s in enumerate(ins_spec))
    outs = tuple(next(values) if i in uses.outputs else s for i, s in enumerate(outs_spec))
    result = of.definition.run_backward(of, rule, grads, ins, outs, tuple(wants))
    picked = []
    for i in wants:
        g, spec = result[i], ins_spec[i]
        picked.append(jnp.zeros(spec.shape, spec.dtype) if g is None else g.astype(spec.dtype))
    return picked[0] if len(picked) == 1 else tuple(picked)


@defcommand(
    family="autodiff",
    shape=_gradient_shape,
    min_inputs=1,
    display=_display,
    backward_node=BackwardNode(_forward_of, _run),
    backward_check=_gradient_check,
)
def gradient(*inputs, of, in_specs, out_specs, grad_mask, wants):
    """Gradients of ``of``'s inputs ``wants`` from its output gradients (see module doc).

    This reference runs ``of``'s backward rule. A backend of ``of`` that carries its own
    ``backward`` (a kernel) serves this node under the same backend name (see
    :mod:`fnnc.core.dispatch`).
    """

    def rule(grads, ins, outs, wanted, /, **params):
        return of.definition.backward(grads, ins, outs, wanted, **params)

    return _run(
        rule,
        *inputs,
        of=of,
        in_specs=in_specs,
        out_specs=out_specs,
        grad_mask=grad_mask,
        wants=wants,
    )


def gradient_command(
    of: Command,
    in_specs: tuple[Spec, ...],
    out_specs: tuple[Spec, ...],
    grad_mask: tuple[bool, ...],
    wants: tuple[int, ...],
) -> Command:
    """The ``gradient`` command of one forward node."""

    def pairs(specs: tuple[Spec, ...]) -> tuple[tuple[tuple[int, ...], np.dtype], ...]:
        return tuple((tuple(s.shape), np.dtype(s.dtype)) for s in specs)

    return make_command(
        "gradient",
        {
            "of": of,
            "in_specs": pairs(in_specs),
            "out_specs": pairs(out_specs),
            "grad_mask": tuple(bool(m) for m in grad_mask),
            "wants": tuple(wants),
        },
    )
