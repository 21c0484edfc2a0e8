"""Tensor parallelism as sharding rules: a table from parameter roles (and the user's
patterns on parameter ids and layer names) to named mesh axes, turned into the
``PartitionSpec`` of each parameter and optimizer-state leaf of a graph.

On a 2-D mesh ``("data", "model")`` (MaxText's logical axes, Megatron-LM's layout):

- the batch is split over ``"data"`` (as :func:`~fnnc.graph.data_parallel` does);
- parameters follow their :class:`~fnnc.graph.Role` (:func:`~fnnc.graph.find_roles`):
  an MLP's first dense split by output features over ``"model"``, its second by input
  features, attention's q/k/v projections by heads and its output projection by input
  features, embedding tables by vocabulary; everything else replicated; the stacked
  ``[n, ...]`` parameters of a ``scan`` or ``pipeline`` node (a ``Repeat``) as their
  block's, one axis on (``P(None, "model")`` for a stacked first dense);
- with ``fsdp=True`` each parameter is also split over ``"data"`` along its first
  other axis that divides (ZeRO-3 on the data axis, tensor parallel on the model axis);
- optimizer state shaped like a parameter takes that parameter's layout (Optax's own
  ``tree_map_params`` says which leaves those are).

A user rule ``(pattern, PartitionSpec)`` matches a parameter id (``t-fc-0-0``) or its
layer's name (``fc``) as a glob (``"mlp*"``) or a compiled regex, and overrides the
role. XLA's SPMD partitioner inserts the collectives (one all-reduce after each row
split); :func:`~fnnc.graph.constrain_activations` pins the activations between them.

>>> import jax, numpy as np
>>> from jax.sharding import PartitionSpec as P
>>> from fnnc import ops
>>> from fnnc.graph import GraphBuilder, ShardingRules, parameter_specs
>>> b = GraphBuilder()
>>> x = b.input((4, 8), name="x")
>>> w1, w2 = b.input((16, 8), name="fc1"), b.input((8, 16), name="fc2")
>>> h = b.exec(ops.relu(), b.exec(ops.gemm(transpose_b=True), x, w1))
>>> g = b.build([b.exec(ops.gemm(transpose_b=True), h, w2)])
>>> mesh = jax.make_mesh((1, 1), ("data", "model"))
>>> parameter_specs(g, mesh, "megatron", parameters=["fc1", "fc2"])
{'fc1': P('model',), 'fc2': P(None, 'model')}
>>> rules = ShardingRules.of({"fc2": P()})
>>> parameter_specs(g, mesh, rules, parameters=["fc1", "fc2"])["fc2"]
P()
"""

from __future__ import annotations

import dataclasses
import fnmatch
import re
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import optax
from jax.sharding import Mesh, PartitionSpec

from fnnc.core.ir import Graph, require_graph
from fnnc.core.text import first_few
from fnnc.errors import GraphError, ShapeError
from fnnc.graph.sharding import Shardings, data_parallel, require_mesh
from fnnc.graph.sharding_roles import find_roles

MEGATRON = (
    ("column", "model"),
    ("row", "model"),
    ("heads", "model"),
    ("heads_out", "model"),
    ("vocab", "model"),
)
"""The default role table: every role split over the mesh axis ``"model"``."""

NAMES = ("megatron", "tensor_parallel")

Pattern = str | re.Pattern[str]


@dataclasses.dataclass(frozen=True)
class ShardingRules:
    """How parameters are laid out on a mesh (see module doc).

    Attributes:
        layers: user rules ``(pattern, PartitionSpec)``, first match wins; a pattern is
            a glob or a compiled regex on the parameter id or its layer name.
        roles: ``(role, mesh axis or None)`` pairs; a role absent or ``None`` is
            replicated.
        data: the mesh axis of the batch (and of FSDP).
        fsdp: also split parameters over ``data`` (ZeRO-3).
        activations: pin activations with ``sharding_constraint`` nodes.
    """

    layers: tuple[tuple[Pattern, PartitionSpec], ...] = ()
    roles: tuple[tuple[str, str | None], ...] = MEGATRON
    data: str = "data"
    fsdp: bool = False
    activations: bool = True

    def __post_init__(self) -> None:
        # every way in (ShardingRules(layers=...) as much as a dict to ``of``) checks the
        # rules: a str spec was taken as a spec of one axis per character, P(1) failed on
        # ``tuple(1)`` and P(0) replicated, silently
        layers = []
        for rule in self.layers:
            if not (isinstance(rule, (tuple, list)) and len(rule) == 2):
                raise GraphError(
                    f"sharding rules: layers holds {rule!r}; each rule is a pair "
                    "(pattern, PartitionSpec), e.g. ('mlp*', PartitionSpec(None, 'model'))"
                )
            pattern, spec = rule
            if not isinstance(pattern, (str, re.Pattern)):
                raise GraphError(
                    f"sharding rules: pattern {pattern!r} must be a glob string or a "
                    "compiled regex on parameter ids and layer names"
                )
            layers.append((pattern, _spec(spec, pattern)))
        object.__setattr__(self, "layers", tuple(layers))  # a tuple: rules are hashed

    @staticmethod
    def of(value: Any) -> ShardingRules:
        """Rules from a :class:`ShardingRules`, ``"megatron"`` / ``"tensor_parallel"``
        (the default table), or a dict ``{pattern: PartitionSpec}`` of user rules on
        top of the default table."""
        if isinstance(value, ShardingRules):
            return value
        if isinstance(value, str) and value in NAMES:
            return ShardingRules()
        if isinstance(value, Mapping):
            return ShardingRules(layers=tuple(value.items()))
        raise GraphError(
            f"sharding rules: expected a ShardingRules, one of {NAMES} or a dict "
            f"{{layer-name pattern: PartitionSpec}}, got {value!r}"
        )

    def axis_of(self, role: str) -> str | None:
        """The mesh axis the role ``role`` is split over (``None``: replicated)."""
        return dict(self.roles).get(role)

    def match(self, pid: str, layer: str | None) -> PartitionSpec | None:
        """The spec of the first user rule matching ``pid`` or ``layer``, else ``None``."""
        for pattern, spec in self.layers:
            if _hits(pattern, pid, layer):
                return spec
        return None


def _hits(pattern: Pattern, *names: str | None) -> bool:
    """Whether ``pattern`` (a glob or a compiled regex) matches one of ``names``. A
    glob equal to a name matches it: a Repeat's ids hold ``[0:4]``, which as a glob is
    a character class, so the id itself (as the errors suggest it) matched nothing."""
    for name in names:
        if name is None:
            continue
        if isinstance(pattern, re.Pattern):
            if pattern.search(name):
                return True
        elif name == pattern or fnmatch.fnmatchcase(name, pattern):
            return True
    return False


def _unmatched(rules: ShardingRules, pids: Sequence[str], names: Mapping[str, str]) -> None:
    """A user rule that matches no parameter is a typo (it would leave the parameters it
    meant replicated, silently): raises naming the parameters and layers there are."""
    missing = [p for p, _ in rules.layers if not any(_hits(p, i, names.get(i)) for i in pids)]
    if not missing:
        return
    layers = sorted({names[i] for i in pids if names.get(i)})
    shown = ", ".join(repr(getattr(p, "pattern", p)) for p in missing)
    raise GraphError(
        f"sharding rules: the rule(s) {shown} match no parameter; a rule matches a "
        f"parameter id or its layer's name (a glob, or a compiled regex searched); the "
        f"layers are {_some(layers)} and the parameter ids {_some(list(pids))}: fix the "
        "pattern or drop the rule"
    )


def _some(items: list[str], n: int = 12) -> str:
    return f"[{first_few(items, n)}]" if items else "[] (none)"


def _spec(spec: Any, where: Any) -> PartitionSpec:
    if isinstance(spec, (tuple, list)) and not isinstance(spec, PartitionSpec):
        spec = PartitionSpec(*spec)
    if not isinstance(spec, PartitionSpec) or _bad_entry(spec) is not None:
        raise GraphError(
            f"sharding rules: the rule for {getattr(where, 'pattern', where)!r} gives "
            f"{spec!r}; expected a jax.sharding.PartitionSpec of mesh axis names (None: "
            "not split, a tuple of names: split over several) such as "
            "PartitionSpec(None, 'model')"
        )
    return spec


def _bad_entry(spec: PartitionSpec) -> Any:
    """The first entry of ``spec`` that is not ``None``, a mesh axis name or a tuple of
    names (an int such as ``P(1)``), else ``None``."""
    for entry in spec:
        names = (entry,) if isinstance(entry, str) else entry
        if entry is not None and not (
            isinstance(names, tuple) and all(isinstance(a, str) for a in names)
        ):
            return entry
    return None


def parameter_specs(
    graph: Graph,
    mesh: Mesh,
    rules: Any = "megatron",
    *,
    parameters: Sequence[int | str] | None = None,
    trainable: Sequence[str] | None = None,
    names: Mapping[str, str] | None = None,
) -> dict[str, PartitionSpec]:
    """The layout of each parameter of ``graph`` on ``mesh`` under ``rules``.

    Args:
        graph: the forward graph whose inputs are the parameters (named by their ids).
        mesh: the device mesh.
        rules: anything :meth:`ShardingRules.of` takes.
        parameters: the parameter inputs (positions or names); default all inputs.
        trainable: the ids FSDP splits (default: all parameters).
        names: parameter id -> layer name, for user rules on layer names.

    Returns:
        Parameter id -> ``PartitionSpec``, in input order.

    Raises:
        GraphError: a rule names an axis the mesh lacks, or more axes than a tensor has,
            or a user rule matches no parameter (a typo would leave them replicated).
        ShapeError: a split axis does not divide by its mesh axis's size.
    """
    rules = ShardingRules.of(rules)
    require_graph(graph, "parameter_specs")
    require_mesh(mesh, "parameter_specs")
    positions = range(len(graph.inputs)) if parameters is None else parameters
    sids = [graph.inputs[_position(graph, p)] for p in positions]
    roles = find_roles(graph, sids)
    names = names or {}
    _unmatched(rules, [graph.symbols[sid].name for sid in sids], names)
    out, uneven = {}, []
    for sid in sids:
        sym = graph.symbols[sid]
        pid, shape = sym.name, tuple(sym.shape)
        spec = rules.match(pid, names.get(pid))
        how = "its rule"
        if spec is None and sid in roles:
            role = roles[sid]
            axis, how = rules.axis_of(role.name), f"its role {role.name!r}"
            spec = PartitionSpec(*([None] * role.dim), axis) if axis else PartitionSpec()
        if how != "its rule" and _indivisible(shape, spec, mesh):
            uneven.append((pid, shape, spec, how))  # reported together below
            continue
        spec = _check(pid, shape, spec or PartitionSpec(), mesh, how)
        if rules.fsdp and (trainable is None or pid in trainable):
            spec = _with_fsdp(shape, spec, rules.data, mesh)
        out[pid] = spec
    _uneven(uneven, mesh)
    return out


def _indivisible(shape: tuple[int, ...], spec: Any, mesh: Mesh) -> bool:
    """Whether a role's ``spec`` (mesh axes the mesh has) splits an axis of ``shape``
    that does not divide."""
    if not isinstance(spec, PartitionSpec) or _bad_entry(spec) is not None:
        return False
    if len(spec) > len(shape) or not set(_axes(spec)) <= set(mesh.axis_names):
        return False
    return any(n % _size(mesh, e) for n, e in zip(shape, spec))


def _uneven(found: list[tuple[str, tuple[int, ...], Any, str]], mesh: Mesh) -> None:
    """Raises for the parameters whose role's split does not divide, all at once: one
    at a time, the rule each error suggested led to the next (a column dense's weight,
    then its bias, then the row dense after it)."""
    if len(found) == 1:
        _check(*found[0][:3], mesh, found[0][3])  # raises
    if found:
        listed = []
        for pid, shape, spec, how in found:
            dim, entry = next((d, e) for d, e in enumerate(spec) if shape[d] % _size(mesh, e))
            listed.append(
                f"{pid} {list(shape)} is split along axis {dim} ({shape[dim]}) over mesh "
                f"axis {entry!r} of size {_size(mesh, entry)} by {how}"
            )
        rules = ", ".join(f"{pid!r}: PartitionSpec()" for pid, _, _, _ in found)
        raise ShapeError(
            f"sharding rules: parameter {listed[0]}, which does not divide, and so are "
            f"{len(found) - 1} more: {'; '.join(listed[1:])}; make those sizes multiples "
            f"of the mesh axes', use smaller mesh axes, or replicate them all with the "
            f"rules {{{rules}}}"
        )


def _check(pid: str, shape: tuple[int, ...], spec: PartitionSpec, mesh: Mesh, how: str) -> Any:
    if not isinstance(spec, PartitionSpec) or _bad_entry(spec) is not None:
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
    used = _axes(spec)
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
        size = _size(mesh, entry)
        if shape[dim] % size:
            raise ShapeError(
                f"sharding rules: parameter {pid} {list(shape)} is split along axis {dim} "
                f"({shape[dim]}) over mesh axis {entry!r} of size {size} by {how}, which "
                f"does not divide; make that size a multiple of {size}, use a smaller "
                f"{entry!r} axis, or add a rule: {{{pid!r}: PartitionSpec()}}"
            )
    return spec


def _axes(spec: PartitionSpec) -> list[str]:
    """The mesh axes ``spec`` names, in order, with repeats."""
    return [a for e in spec for a in ((e,) if isinstance(e, str) else tuple(e or ()))]


def _size(mesh: Mesh, entry: Any) -> int:
    size = 1
    for axis in (entry,) if isinstance(entry, str) else tuple(entry or ()):
        size *= int(mesh.shape[axis])
    return size


def _with_fsdp(shape: tuple[int, ...], spec: PartitionSpec, axis: str, mesh: Mesh) -> Any:
    """``spec`` with ``axis`` added on the first unsplit dimension that divides by it
    (unchanged where a rule already split the parameter over ``axis``)."""
    if axis not in mesh.axis_names or mesh.shape[axis] == 1 or axis in _axes(spec):
        return spec
    entries = list(spec) + [None] * (len(shape) - len(spec))
    for d, n in enumerate(shape):
        if entries[d] is None and n % mesh.shape[axis] == 0:
            entries[d] = axis
            while entries[-1] is None:  # P("data"), not P("data", None): one spelling
                entries.pop()
            return PartitionSpec(*entries)
    return spec


def state_specs(
    optimizer: optax.GradientTransformation, params: Sequence[Any], specs: Sequence[Any]
) -> list[PartitionSpec]:
    """The layout of each leaf of ``optimizer``'s state over the list ``params`` (arrays,
    shape structs or graph symbols): a leaf that is the state of parameter ``i`` (Adam's
    ``mu[i]``) gets ``specs[i]``, every other leaf (step counts, hyper-parameters) is
    replicated. Optax's ``tree_map_params`` says which leaves those are; for a state it
    cannot map (a transformation that regroups the list, as the model's partitioned
    minimizers key it by parameter id), a leaf under a dict key naming a parameter
    (its ``name``) with that parameter's shape is its state."""
    shapes = [jax.ShapeDtypeStruct(tuple(p.shape), p.dtype) for p in params]
    state = jax.eval_shape(optimizer.init, shapes)
    try:
        which = jax.tree.leaves(
            optax.tree_map_params(
                optimizer, lambda _, i: i, state, list(range(len(shapes))),
                transform_non_params=lambda _: -1,
            )
        )  # fmt: skip
    except (TypeError, ValueError):
        which = _by_key(state, params)
    return [specs[i] if i >= 0 else PartitionSpec() for i in which]


def _by_key(state: Any, params: Sequence[Any]) -> list[int]:
    """For each state leaf, the parameter whose name is a dict key on its path (and
    whose shape it has), or -1."""
    index = {getattr(p, "name", None): i for i, p in enumerate(params)}
    out = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
        keys = [k.key for k in path if isinstance(k, jax.tree_util.DictKey)]
        hits = [index[k] for k in keys if isinstance(k, str) and k in index]
        i = hits[-1] if hits else -1
        out.append(i if i >= 0 and tuple(params[i].shape) == tuple(leaf.shape) else -1)
    return out


def tensor_parallel(
    graph: Graph,
    mesh: Mesh,
    rules: Any = "megatron",
    *,
    batch: Sequence[int | str] | None = None,
    parameters: Sequence[int | str] = (),
    layout: Any = None,
    specs: Mapping[str, PartitionSpec] | None = None,
    names: Mapping[str, str] | None = None,
) -> Shardings:
    """Shardings of ``graph`` on a ``("data", "model")`` mesh under ``rules``: the batch
    over ``rules.data``, parameters by :func:`parameter_specs` (or ``specs``, found on
    the forward graph), optimizer state (with a :class:`~fnnc.graph.TrainLayout`
    ``layout``) as its parameters; new parameters and state keep their layouts.

    Args: as :func:`~fnnc.graph.data_parallel`, plus ``rules``, ``specs`` and ``names``
    (parameter id -> layer name) as :func:`parameter_specs` takes them.
    """
    rules = ShardingRules.of(rules)
    base = data_parallel(
        graph, mesh, batch=batch, axis=rules.data, parameters=parameters, layout=layout
    )
    n_params = layout.n_params if layout is not None else 0
    params = sorted({*range(n_params), *(_position(graph, p) for p in parameters)})
    if specs is None:
        specs = parameter_specs(graph, mesh, rules, parameters=params, names=names)
    _known(graph, specs)
    inputs = list(base.inputs)
    for i in params:
        sym = graph.symbols[graph.inputs[i]]
        spec = specs.get(sym.name, PartitionSpec())
        inputs[i] = _check(sym.name, sym.shape, spec, mesh, "specs=")
    if layout is None:
        return Shardings(mesh, tuple(inputs), base.outputs)
    state = state_specs(
        layout.optimizer, [graph.symbols[s] for s in graph.inputs[:n_params]], inputs[:n_params]
    )
    inputs[n_params : n_params + layout.n_state] = state
    outputs = list(base.outputs or ())
    outputs[: n_params + layout.n_state] = inputs[: n_params + layout.n_state]
    return Shardings(mesh, tuple(inputs), tuple(outputs))


def _known(graph: Graph, specs: Mapping[str, Any]) -> None:
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


def _position(graph: Graph, which: int | str) -> int:
    if isinstance(which, int) and not isinstance(which, bool):
        if not 0 <= which < len(graph.inputs):  # -1 was the last input, 99 an IndexError
            raise GraphError(
                f"sharding rules: input position {which} is out of range; the graph has "
                f"{len(graph.inputs)} inputs (positions 0..{len(graph.inputs) - 1})"
            )
        return which
    names = [graph.symbols[s].name for s in graph.inputs]
    if which not in names:
        raise GraphError(f"sharding rules: no input named {which!r}; the inputs are {names}")
    return names.index(which)
