"""Checks of sharding layouts for :mod:`fnnc.graph.sharding_rules`: a rule's spec, a
parameter's spec on a mesh (axis names the mesh has, splits that divide), role splits
that do not divide (named together), ``specs=`` keys and input positions; and of the
layouts a :class:`~fnnc.graph.Shardings` gives ``compile`` (:func:`check_layouts`)."""

from __future__ import annotations

import operator
from collections.abc import Mapping
from typing import Any

import numpy as np
from jax.sharding import Mesh, PartitionSpec

from fnnc.core.ir import Graph
from fnnc.core.text import first_few
from fnnc.errors import GraphError, GraphInputError, ShapeError


def rule_spec(spec: Any, where: Any) -> PartitionSpec:
    """``spec`` (a ``PartitionSpec``, or a tuple or list of its entries) as a
    ``PartitionSpec`` of mesh axis names; else a :class:`GraphError` naming the rule
    ``where``."""
    if isinstance(spec, (tuple, list)) and not isinstance(spec, PartitionSpec):
        spec = PartitionSpec(*spec)
    if not isinstance(spec, PartitionSpec) or bad_entry(spec) is not None:
        raise GraphError(
            f"sharding rules: the rule for {getattr(where, 'pattern', where)!r} gives "
            f"{spec!r}; expected a jax.sharding.PartitionSpec of mesh axis names (None: "
            "not split, a tuple of names: split over several) such as "
            "PartitionSpec(None, 'model')"
        )
    return spec


def bad_entry(spec: PartitionSpec) -> Any:
    """The first entry of ``spec`` that is not ``None``, a mesh axis name or a tuple of
    names (an int such as ``P(1)``), else ``None``."""
    for entry in spec:
        names = (entry,) if isinstance(entry, str) else entry
        if entry is not None and not (
            isinstance(names, tuple) and all(isinstance(a, str) for a in names)
        ):
            return entry
    return None


def indivisible(shape: tuple[int, ...], spec: Any, mesh: Mesh) -> bool:
    """Whether a role's ``spec`` (mesh axes the mesh has) splits an axis of ``shape``
    that does not divide."""
    if not isinstance(spec, PartitionSpec) or bad_entry(spec) is not None:
        return False
    if len(spec) > len(shape) or not set(mesh_axes(spec)) <= set(mesh.axis_names):
        return False
    return any(n % axes_size(mesh, e) for n, e in zip(shape, spec))


def uneven(found: list[tuple[str, tuple[int, ...], Any, str]], mesh: Mesh) -> None:
    """Raises for the parameters whose role's split does not divide, all at once: one
    at a time, the rule each error suggested led to the next (a column dense's weight,
    then its bias, then the row dense after it)."""
    if len(found) == 1:
        check_spec(*found[0][:3], mesh, found[0][3])  # raises
    if found:
        listed = []
        for pid, shape, spec, how in found:
            dim, entry = next((d, e) for d, e in enumerate(spec) if shape[d] % axes_size(mesh, e))
            listed.append(
                f"{pid} {list(shape)} is split along axis {dim} ({shape[dim]}) over mesh "
                f"axis {entry!r} of size {axes_size(mesh, entry)} by {how}"
            )
        rules = ", ".join(f"{pid!r}: PartitionSpec()" for pid, _, _, _ in found)
        raise ShapeError(
            f"sharding rules: parameter {listed[0]}, which does not divide, and so are "
            f"{len(found) - 1} more: {'; '.join(listed[1:])}; make those sizes multiples "
            f"of the mesh axes', use smaller mesh axes, or replicate them all with the "
            f"rules {{{rules}}}"
        )


def check_spec(pid: str, shape: tuple[int, ...], spec: PartitionSpec, mesh: Mesh, how: str) -> Any:
    """``spec``, checked for parameter ``pid`` of ``shape`` on ``mesh`` (``how``: what
    gave it, for the errors): entries that are mesh axis names the mesh has, at most
    one per tensor axis, each axis once, each split dividing."""
    if not isinstance(spec, PartitionSpec) or bad_entry(spec) is not None:
        raise GraphError(
            f"sharding rules: parameter {pid} {list(shape)} gets {spec!r} by {how}; "
            "expected a jax.sharding.PartitionSpec of mesh axis names (None: not split, "
            "a tuple of names: split over several) such as PartitionSpec(None, 'model')"
        )
    if len(spec) > len(shape):
        raise GraphError(
            f"sharding rules: parameter {pid} {list(shape)} gets {spec} by {how}, which "
            f"names {len(spec)} axes; give at most {len(shape)} entries"
        )
    used = mesh_axes(spec)
    twice = sorted({a for a in used if used.count(a) > 1})
    if twice:
        raise GraphError(
            f"sharding rules: parameter {pid} {list(shape)} gets {spec} by {how}, which "
            f"splits over mesh axis {twice[0]!r} twice; an axis can split one dimension "
            f"only: give each mesh axis once, e.g. {{{pid!r}: PartitionSpec({twice[0]!r})}}"
        )
    for dim, entry in enumerate(spec):
        for axis in (entry,) if isinstance(entry, str) else tuple(entry or ()):
            if axis not in mesh.axis_names:
                raise GraphError(
                    f"sharding rules: parameter {pid} {list(shape)} is split over mesh axis "
                    f"{axis!r} by {how}, but the mesh has axes {list(mesh.axis_names)}; "
                    f"build the mesh with that axis, e.g. jax.make_mesh((2, 2), "
                    f"('data', {axis!r})), or add a rule that replicates it: "
                    f"{{{pid!r}: PartitionSpec()}}"
                )
        size = axes_size(mesh, entry)
        if shape[dim] % size:
            raise ShapeError(
                f"sharding rules: parameter {pid} {list(shape)} is split along axis {dim} "
                f"({shape[dim]}) over mesh axis {entry!r} of size {size} by {how}, which "
                f"does not divide; make that size a multiple of {size}, use a smaller "
                f"{entry!r} axis, or add a rule: {{{pid!r}: PartitionSpec()}}"
            )
    return spec


def mesh_axes(spec: PartitionSpec) -> list[str]:
    """The mesh axes ``spec`` names, in order, with repeats."""
    return [a for e in spec for a in ((e,) if isinstance(e, str) else tuple(e or ()))]


def axes_size(mesh: Mesh, entry: Any) -> int:
    """The number of devices of the mesh axes ``entry`` (a name, a tuple or ``None``)."""
    size = 1
    for axis in (entry,) if isinstance(entry, str) else tuple(entry or ()):
        size *= int(mesh.shape[axis])
    return size


def known_specs(graph: Graph, specs: Mapping[str, Any]) -> None:
    """A ``specs=`` key that names no input of ``graph`` is a typo (it left the
    parameter it meant replicated, silently): raises naming the inputs there are."""
    names = [graph.symbols[s].name for s in graph.inputs]
    unknown = [repr(k) for k in specs if k not in names]
    if unknown:
        shown = [str(n) for n in names]
        raise GraphError(
            f"tensor_parallel: specs= names {first_few(unknown, 6)}, which no input of the "
            f"graph is; its inputs are [{first_few(shown, 12)}]: key specs by the "
            "parameter inputs' names (as parameter_specs returns them)"
        )


def input_position(graph: Graph, which: int | str, where: str = "sharding rules") -> int:
    """The position of graph input ``which``: a position (a Python or NumPy int,
    range-checked) or a name; a bool is neither (True was input 1)."""
    if isinstance(which, (bool, np.bool_)):
        raise GraphError(
            f"{where}: input {which!r} is a bool; name an input by its position (an int) "
            "or its name"
        )
    if isinstance(which, (int, np.integer)):
        which = operator.index(which)
        if not 0 <= which < len(graph.inputs):  # -1 was the last input, 99 an IndexError
            raise GraphError(
                f"{where}: input position {which} is out of range; the graph has "
                f"{len(graph.inputs)} inputs (positions 0..{len(graph.inputs) - 1})"
            )
        return which
    names = [graph.symbols[s].name for s in graph.inputs]
    if which not in names:
        raise GraphError(f"{where}: no input named {which!r}; the inputs are {names}")
    return names.index(which)


def check_layouts(graph: Graph, inputs: Any, outputs: Any, mesh: Mesh) -> None:
    """The layouts a :class:`~fnnc.graph.Shardings` gives ``compile``, checked against
    ``graph`` and ``mesh`` before ``jax.jit`` sees them (which raised its own
    ValueError, IndivisibleError or AttributeError naming no input): one
    ``PartitionSpec`` per input (and output, when given), of axes the mesh has, at most
    one entry per tensor axis, each split dividing that axis."""
    for kind, sids, specs in (("input", graph.inputs, inputs), ("output", graph.outputs, outputs)):
        if specs is None:
            continue
        if len(specs) != len(sids):
            raise GraphInputError(
                f"compile: shardings give {len(specs)} {kind} layouts for a graph with "
                f"{len(sids)} {kind}s; give one PartitionSpec per {kind}"
                + (" (or outputs=None to let XLA choose)" if kind == "output" else "")
            )
        for i, (sid, spec) in enumerate(zip(sids, specs)):
            sym = graph.symbols[sid]
            what = f"compile: shardings.{kind}s[{i}] for {kind} {i}" + (
                f" ({sym.name})" if sym.name else ""
            )
            shape = tuple(sym.shape)
            named = spec  # UNCONSTRAINED entries (XLA chooses) split nothing here
            if isinstance(spec, PartitionSpec):
                named = PartitionSpec(
                    *(None if e is PartitionSpec.UNCONSTRAINED else e for e in spec)
                )
            if not isinstance(spec, PartitionSpec) or bad_entry(named) is not None:
                raise GraphError(
                    f"{what} is {spec!r}; expected a jax.sharding.PartitionSpec of mesh "
                    f"axis names (None: not split), e.g. PartitionSpec({mesh.axis_names[0]!r})"
                )
            if len(spec) > len(shape):
                raise GraphError(
                    f"{what} is {spec}, {len(spec)} entries for a tensor of shape "
                    f"{list(shape)}; give at most {len(shape)}"
                )
            used = mesh_axes(named)
            for axis in used:
                if axis not in mesh.axis_names:
                    raise GraphError(
                        f"{what} is {spec}, which names mesh axis {axis!r}; the mesh has "
                        f"axes {list(mesh.axis_names)}: use one of them or build the mesh "
                        "with that axis"
                    )
                if used.count(axis) > 1:
                    raise GraphError(
                        f"{what} is {spec}, which names mesh axis {axis!r} twice; a mesh "
                        "axis can split one dimension only"
                    )
            for dim, entry in enumerate(named):
                size = axes_size(mesh, entry)
                if shape[dim] % size:
                    raise ShapeError(
                        f"{what} is {spec}: it splits axis {dim} of shape {list(shape)} "
                        f"({shape[dim]}) over mesh axis {entry!r} of size {size}, which "
                        f"does not divide; make that size a multiple of {size} or do not "
                        "split that axis"
                    )
