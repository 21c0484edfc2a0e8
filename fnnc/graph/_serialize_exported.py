"""How graph files hold what plain JSON cannot: ``jax.export`` modules.

A generic ``primitive`` node (a JAX primitive carried by ``trace``) is saved as an
``exported`` node (:func:`_file_command`, also inside gradient nodes), whose module
:mod:`fnnc.graph.serialize` stores as ``{"$stablehlo": base64, "sha256": ...}``:
:func:`_stablehlo` gives the bytes with as many VJP orders as the gradient nodes around
it run, and :func:`_module` reads them back, the checksum verified before the bytes are
parsed. Moved out of :mod:`fnnc.graph.serialize`, which calls them.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import warnings
from collections.abc import Sequence
from typing import Any

import jax
import jax.export

from fnnc.core.command import Command, Spec
from fnnc.errors import GraphFormatError
from fnnc.ops.primitive import Opaque, export_command

PLATFORMS = ("cpu", "cuda", "rocm", "tpu")
"""JAX's platforms a saved ``jax.export`` module is lowered for (those that lower it)."""


def _stablehlo(module: jax.export.Exported, order: int, where: str) -> bytes:
    """The module's bytes with ``order`` orders of its VJP, or the ``order - 1`` it needs.

    A module at the top of a graph keeps one order, so the loaded node is differentiable
    once more; inside ``k`` gradient nodes it keeps ``k + 1``, since running those nodes
    takes ``k``. The extra order is dropped where it cannot be had: a module that was
    itself loaded holds only the orders its file had (what the graph holding it could
    run anyway), and some primitives' higher VJPs do not export.
    """
    errors = []
    for held in range(order, max(order - 2, -1), -1):
        try:
            return bytes(module.serialize(vjp_order=held))
        except Exception as e:  # "does not have vjps of high-enough order", or export fails
            errors.append(f"{held}: {type(e).__name__}: {e}")
    raise GraphFormatError(
        f"save: {where}: the StableHLO module cannot be saved with the {order - 1} VJP "
        f"order(s) the gradient nodes around it run ({'; '.join(errors)}); graphs holding "
        "it can be compiled but not saved"
    )


def _module(value: dict[str, Any], where: str) -> Opaque:
    """A ``jax.export`` module from its file form, its checksum verified first."""
    try:
        blob = base64.b64decode(value["$stablehlo"], validate=True)
    except (TypeError, ValueError, binascii.Error) as e:
        raise GraphFormatError(f"load: {where}: StableHLO module is not base64 ({e})") from None
    if hashlib.sha256(blob).hexdigest() != value.get("sha256"):
        raise GraphFormatError(
            f"load: {where}: the StableHLO module does not match its sha256 (the file was "
            "damaged or edited); save the graph again"
        )
    try:
        module = jax.export.deserialize(bytearray(blob))
    except Exception as e:  # a damaged module: any parse failure is the file's fault
        raise GraphFormatError(
            f"load: {where}: the StableHLO module cannot be read ({type(e).__name__}: {e})"
        ) from None
    return Opaque(module, "<exported>")


def _platforms() -> tuple[str, ...]:
    """The platforms a saved module is lowered for: a file written on one machine runs
    on another (saved on a CPU, run on a GPU), as a module lowered for only the saving
    platform would not ("exported for platforms ('cpu',) but it is used on ('cuda',)")."""
    return tuple(dict.fromkeys([jax.export.default_export_platform(), *PLATFORMS]))


def _some_platforms(
    cmd: Command, in_specs: Sequence[Spec], where: str, joint: Exception
) -> Command:
    """``cmd`` exported for the platforms of :func:`_platforms` that lower it, one
    export per platform to find them (the joint export failed with ``joint``); warns
    naming the others.

    Raises:
        GraphFormatError: the default platform does not lower it (``jax.export``
            declines it: a host callback, say); the graph can be compiled, not saved.
    """
    lowered: dict[str, Command] = {}
    failed: dict[str, Exception] = {}
    for platform in _platforms():
        try:
            lowered[platform] = export_command(cmd, in_specs, (platform,))
        except Exception as e:  # any failure to lower is the platform's: leave it out
            failed[platform] = e
    default = jax.export.default_export_platform()
    if default in failed:
        e = failed[default]
        raise GraphFormatError(
            f"save: {where} ({cmd}) cannot be exported as StableHLO "
            f"({type(e).__name__}: {e}); graphs holding it can be compiled but not saved"
        ) from None
    if not failed:  # each lowers alone, not all together: the default's alone, as before
        failed = {p: joint for p in lowered if p != default}
        lowered = {default: lowered[default]}
    left_out = {p: (str(e).strip().splitlines() or [""])[0] for p, e in failed.items()}
    reasons = "; ".join(f"{p} ({type(failed[p]).__name__}: {why})" for p, why in left_out.items())
    warnings.warn(
        f"save: {where} ({cmd}) is saved for {tuple(lowered)} only, so the file does not "
        f"run on {', '.join(left_out)}: JAX does not lower it there: {reasons}",
        stacklevel=2,
    )
    if len(lowered) == 1:
        return lowered[default]
    return export_command(cmd, in_specs, tuple(lowered))


def _file_command(cmd: Command, in_specs: Sequence[Spec], where: str) -> Command:
    """The command a node is saved as: generic primitives become ``exported``.

    So does the forward command of a gradient node (any command with a
    ``backward_node``, to any depth): ``gradient[of=primitive[sin]]`` is saved as
    ``gradient[of=exported]``, whose derived backward runs the VJP stored with the module.
    """
    if cmd.name in ("primitive", "effectful_primitive"):
        try:
            return export_command(cmd, in_specs, _platforms())
        except Exception as e:  # a lowering some platform lacks: those that have it
            return _some_platforms(cmd, in_specs, where, e)
    backward_node = cmd.definition.backward_node
    if backward_node is None:
        return cmd
    of, of_specs = backward_node.forward_of(cmd)
    saved = _file_command(of, of_specs, where)
    if saved is of:
        return cmd
    return Command(cmd.name, tuple((k, saved if v is of else v) for k, v in cmd.params))
