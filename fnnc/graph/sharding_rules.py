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
from fnnc.errors import GraphError
from fnnc.graph.sharding import Shardings, data_parallel, require_mesh
from fnnc.graph.sharding_checks import (
    check_spec,
    indivisible,
    input_position,
    known_specs,
    mesh_axes,
    rule_spec,
    uneven,
)
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
            layers.append((pattern, rule_spec(spec, pattern)))
        object.__setattr__(self, "layers", tuple(layers))  # a tuple: rules are hashed
        roles = self.roles
        if not isinstance(roles, (tuple, list)) or not all(
            isinstance(r, (tuple, list))
            and len(r) == 2
            and isinstance(r[0], str)
            and (r[1] is None or isinstance(r[1], str))
            for r in roles
        ):
            raise GraphError(
                f"sharding rules: roles is {roles!r}; expected pairs (role, mesh axis or "
                "None), e.g. (('column', 'model'), ('row', 'model'))"
            )
        object.__setattr__(self, "roles", tuple(tuple(r) for r in roles))

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
            or a user rule matches no parameter (a typo would leave them replicated), or
            ``fsdp`` asks for a data axis the mesh lacks.
        ShapeError: a split axis does not divide by its mesh axis's size.
    """
    rules = ShardingRules.of(rules)
    require_graph(graph, "parameter_specs")
    require_mesh(mesh, "parameter_specs")
    if rules.fsdp and rules.data not in mesh.axis_names:  # was no FSDP at all, silently
        raise GraphError(
            f"parameter_specs: fsdp=True splits parameters over the data axis "
            f"{rules.data!r}, which the mesh lacks (its axes: {list(mesh.axis_names)}); "
            f"name the mesh's batch axis with ShardingRules(data=...), build the mesh with "
            f"an axis {rules.data!r}, or pass fsdp=False"
        )
    positions = range(len(graph.inputs)) if parameters is None else parameters
    sids = [graph.inputs[input_position(graph, p)] for p in positions]
    roles = find_roles(graph, sids)
    names = names or {}
    _unmatched(rules, [graph.symbols[sid].name for sid in sids], names)
    out, split_uneven = {}, []
    for sid in sids:
        sym = graph.symbols[sid]
        pid, shape = sym.name, tuple(sym.shape)
        spec = rules.match(pid, names.get(pid))
        how = "its rule"
        if spec is None and sid in roles:
            role = roles[sid]
            axis, how = rules.axis_of(role.name), f"its role {role.name!r}"
            spec = PartitionSpec(*([None] * role.dim), axis) if axis else PartitionSpec()
        if how != "its rule" and indivisible(shape, spec, mesh):
            split_uneven.append((pid, shape, spec, how))  # reported together below
            continue
        spec = check_spec(pid, shape, spec or PartitionSpec(), mesh, how)
        if rules.fsdp and (trainable is None or pid in trainable):
            spec = _with_fsdp(shape, spec, rules.data, mesh)
        out[pid] = spec
    uneven(split_uneven, mesh)
    return out


def _with_fsdp(shape: tuple[int, ...], spec: PartitionSpec, axis: str, mesh: Mesh) -> Any:
    """``spec`` with ``axis`` added on the first unsplit dimension that divides by it
    (unchanged where a rule already split the parameter over ``axis``)."""
    if axis not in mesh.axis_names or mesh.shape[axis] == 1 or axis in mesh_axes(spec):
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
    params = sorted({*range(n_params), *(input_position(graph, p) for p in parameters)})
    if specs is None:
        specs = parameter_specs(graph, mesh, rules, parameters=params, names=names)
    known_specs(graph, specs)
    inputs = list(base.inputs)
    for i in params:
        sym = graph.symbols[graph.inputs[i]]
        spec = specs.get(sym.name, PartitionSpec())
        inputs[i] = check_spec(sym.name, sym.shape, spec, mesh, "specs=")
    if layout is None:
        return Shardings(mesh, tuple(inputs), base.outputs)
    state = state_specs(
        layout.optimizer, [graph.symbols[s] for s in graph.inputs[:n_params]], inputs[:n_params]
    )
    inputs[n_params : n_params + layout.n_state] = state
    outputs = list(base.outputs or ())
    outputs[: n_params + layout.n_state] = inputs[: n_params + layout.n_state]
    return Shardings(mesh, tuple(inputs), tuple(outputs))
