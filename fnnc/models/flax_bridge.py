"""The Flax bridge: a Flax module as one cnnp layer (``Model.from_flax``).

:class:`FlaxLayer` traces the module's call (:func:`fnnc.graph.trace`) and inlines the
graph into the model, once per build: the training-mode build (``fit``,
``evaluate(is_test=False)``) runs the module as ``module.train()`` leaves it, the
test-mode build as ``module.eval()`` does (``deterministic`` and
``use_running_average`` set through ``nnx.view`` and on every module holding them).
The module object itself is never changed.

What each piece of an NNX module's state becomes:

==============================  ====================================================
NNX variable                    in the cnnp model
==============================  ====================================================
``nnx.Param`` (and subclasses)  parameter ``t-<layer>-<i>``: trained, optimizer state
``nnx.RngKey``                  not a parameter: each training-mode step draws a fresh
                                key (``ctx.key()``, as fnnc's ``Dropout``); the
                                test-mode build, where Dropout is off, takes none
``nnx.RngCount``                a constant (the stream's count when wrapped)
any other (``nnx.BatchStat``)   internal ``r-<layer>-<j>``: no gradient, no optimizer
                                state, no weight decay; a training-mode step stores
                                the value the module leaves in it (BatchNorm's
                                momentum update), test mode reads it
==============================  ====================================================

A Linen module's ``"params"`` collection gives the parameters and every other
collection (``"batch_stats"``) internals, applied ``mutable`` so that training-mode
steps keep what the module writes. Every call passes a fresh ``"dropout"`` key in
``rngs``, test mode's too: Linen modules choose their mode themselves, by their
attributes, and one built to drop (``nn.Dropout(deterministic=False)``) draws in both.

``<i>`` and ``<j>`` count the parameters and the internals in the order of the
module's flattened state; :func:`parameter_paths` maps each id back to its Flax path
(``"layers.0.kernel"``, ``"bn.mean"``; Linen: ``"params.Dense_0.kernel"``).
"""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Callable
from typing import Any

import flax.errors
import jax
import jax.numpy as jnp
import numpy as np

from fnnc.core.ir import Graph, Symbol
from fnnc.core.keys import is_key
from fnnc.graph import trace
from fnnc.graph.inline import inline
from fnnc.models.layer import BuildContext, Layer, ModelError

_KEY_DATA = jax.ShapeDtypeStruct((2,), np.uint32)  # what ctx.key() holds


class FlaxLayer(Layer):
    """A Flax module (NNX, or Linen with its variables) as a layer, traced and inlined
    (see the module docstring).

    Attributes:
        param_paths: the Flax path of each parameter, by index (``t-<layer>-<i>``).
        state_paths: the Flax path of each internal, by index (``r-<layer>-<j>``).
    """

    def __init__(self, module: Any, variables: Any = None, **kw: Any):
        super().__init__(**kw)
        from flax import nnx

        if isinstance(module, nnx.Module):
            self._fn: _Function = _NnxFunction(module)
        elif variables is not None:
            self._fn = _LinenFunction(module, variables)
        else:
            raise ModelError(
                f"from_flax: {type(module).__name__} is a Linen module (or not a Flax "
                "module); pass its variables too: Model.from_flax(module, "
                "module.init(key, x)), or give an nnx.Module"
            )
        _check_one_input(module)
        self.param_paths = [p for p, _ in self._fn.params]
        self.state_paths = [p for p, _ in self._fn.state]

    def build(self, ctx: BuildContext, x: Symbol) -> Symbol:
        fn = self._fn
        params = [
            ctx.param(self, i, v.shape, _fixed(v), v.dtype) for i, (_, v) in enumerate(fn.params)
        ]
        state = [
            ctx.param(self, j, v.shape, _fixed(v), v.dtype, internal=True)
            for j, (_, v) in enumerate(fn.state)
        ]
        graph = trace(
            functools.partial(fn, ctx.training),
            [_spec(v) for _, v in fn.params],
            [_spec(v) for _, v in fn.state],
            [_KEY_DATA] * fn.n_keys,
            jax.ShapeDtypeStruct(x.shape, x.dtype),
        )
        n_out = len(graph.outputs) - len(state)
        if n_out != 1:
            raise ModelError(
                f"from_flax: layer {self.describe()}: {fn.kind} returns {n_out} arrays; a "
                "from_flax model has one output: wrap the module in one that returns one array"
            )
        read = _read_inputs(graph)
        first = len(params) + len(state)
        # A key only where the module draws from it: the test-mode build (Dropout off)
        # then takes no keys, as fnnc's own Dropout layer.
        keys = [
            ctx.key()
            if graph.inputs[first + k] in read
            else ctx.b.constant(np.zeros(2, np.uint32), np.uint32)
            for k in range(fn.n_keys)
        ]
        out, *new_state = inline(
            ctx.b, graph, [*params, *state, *keys, x], prefix=ctx.layer_id(self)
        )
        if ctx.training:
            for j, value in enumerate(new_state):
                ctx.update(self, j, value)
        return out


class _Function:
    """A Flax module's call as ``f(training, params, state, keys, x) -> (y, state')``.

    Attributes:
        params: ``(Flax path, value)`` of each parameter, in order.
        state: ``(Flax path, value)`` of each internal, in order.
        n_keys: how many random key inputs (key data, uint32[2]) it takes.
        kind: the module's class, for messages.
    """

    params: list[tuple[str, np.ndarray]]
    state: list[tuple[str, np.ndarray]]
    n_keys: int
    kind: str

    def __call__(
        self, training: bool, params: list[Any], state: list[Any], keys: list[Any], x: Any
    ) -> tuple[Any, list[Any]]:
        raise NotImplementedError


class _NnxFunction(_Function):
    def __init__(self, module: Any):
        from flax import nnx

        self._nnx = nnx
        self.kind = type(module).__name__
        self._filters = (nnx.Param, nnx.RngState, nnx.Not(nnx.Any(nnx.Param, nnx.RngState)))
        self._graphdefs = {training: _mode(module, training) for training in (True, False)}
        _, params, rngs, state = nnx.split(module, *self._filters)
        self.params, self._params_tree = _flat(params)
        self.state, self._state_tree = _flat(state)
        self._state_keys = [path for path, _ in jax.tree_util.tree_flatten_with_path(state)[0]]
        self._rngs = jax.tree.leaves(rngs)
        self._rngs_tree = jax.tree.structure(rngs)
        self._key_slots = [i for i, v in enumerate(self._rngs) if is_key(v)]
        self.n_keys = len(self._key_slots)

    def __call__(
        self, training: bool, params: list[Any], state: list[Any], keys: list[Any], x: Any
    ) -> tuple[Any, list[Any]]:
        nnx = self._nnx
        rngs = list(self._rngs)
        for slot, data in zip(self._key_slots, keys):
            rngs[slot] = _key_like(data, rngs[slot])
        module = nnx.merge(
            self._graphdefs[training],
            jax.tree.unflatten(self._params_tree, params),
            jax.tree.unflatten(self._rngs_tree, rngs),
            jax.tree.unflatten(self._state_tree, state),
        )
        y = module(x)
        # by path: variables the call creates (nnx.Module.sow) are not internals
        after = dict(jax.tree_util.tree_flatten_with_path(nnx.state(module, self._filters[2]))[0])
        return y, [after[path] for path in self._state_keys]


class _LinenFunction(_Function):
    def __init__(self, module: Any, variables: Any):
        self._module = module
        self.kind = type(module).__name__
        variables = dict(variables)
        params = variables.pop("params", {})
        self.params, self._params_tree = _flat(params, prefix="params.")
        self.state, self._state_tree = _flat(variables)
        self._collections = list(variables)
        self.n_keys = 1

    def __call__(
        self, training: bool, params: list[Any], state: list[Any], keys: list[Any], x: Any
    ) -> tuple[Any, list[Any]]:
        variables = {
            "params": jax.tree.unflatten(self._params_tree, params),
            **jax.tree.unflatten(self._state_tree, state),
        }
        # a key in both modes: Linen modules pick their mode themselves, and one built to
        # drop (nn.Dropout(deterministic=False)) draws in test mode too; the build feeds
        # a real key only where the traced call reads it
        rngs = {"dropout": jax.random.wrap_key_data(keys[0])}
        # mutable even in test mode: a module that writes its statistics in every mode
        # runs; test mode drops what it wrote.
        mutable = self._collections or False
        try:
            out = self._module.apply(variables, x, rngs=rngs, mutable=mutable)
        except flax.errors.InvalidRngError as e:
            raise ModelError(_rng_stream_message(self.kind, e)) from e
        except flax.errors.ScopeCollectionNotFound as e:
            raise ModelError(self._collection_message(e)) from e
        if not self._collections:
            return out, []
        y, written = out
        merged = {c: written.get(c, variables[c]) for c in self._collections}
        return y, jax.tree.leaves(merged)

    def _collection_message(self, error: Exception) -> str:
        """What to do when the module reads a collection the variables lack (most often
        ``variables["params"]`` given for ``variables``)."""
        given = ["params"] * bool(self.params) + self._collections
        hint = (
            "; these look like a params tree (variables['params']): pass the whole "
            "variables, Model.from_flax(module, module.init(key, x)), or {'params': params}"
            if not self.params
            else ": pass every collection module.init(key, x) returns"
        )
        return (
            f"from_flax: Linen module {self.kind} reads a collection its variables lack "
            f"(they hold {', '.join(map(repr, given)) or 'none'}){hint}. Flax said: "
            f"{str(error).splitlines()[0]}"
        )


def _check_one_input(module: Any) -> None:
    """Raises :class:`ModelError` unless ``module.__call__`` takes one input: a layer
    calls it as ``module(x)`` (Linen: ``module.apply(variables, x)``), nothing more."""
    try:
        signature = inspect.signature(module.__call__)
    except (TypeError, ValueError):  # no signature to read: the call will tell
        return
    try:
        signature.bind(None)
    except TypeError as e:
        kind = type(module).__name__
        raise ModelError(
            f"from_flax: a from_flax layer calls {kind} with one input, {kind}(x) (Linen: "
            f"module.apply(variables, x)), but {kind}.__call__{signature} cannot be called "
            f"so ({e}). Give other arguments defaults, make them attributes of the module "
            "(Linen: a field such as train: bool, NNX: what module.train()/eval() set), or "
            "wrap it in a module whose __call__(x) passes them"
        ) from None


def _rng_stream_message(kind: str, error: Exception) -> str:
    """What to do when a Linen module draws from a stream other than ``"dropout"``."""
    found = re.search(r'PRNG for "([^"]+)"', str(error))
    stream = f"the RNG stream {found.group(1)!r}" if found else "an RNG stream"
    return (
        f"from_flax: Linen module {kind} draws from {stream} (self.make_rng), but a "
        "from_flax layer feeds its Linen module only a 'dropout' key (a fresh one each "
        "training step). Draw from self.make_rng('dropout') instead, or give the "
        f"randomness as an input. Flax said: {str(error).splitlines()[0]}"
    )


def parameter_paths(model: Any) -> dict[str, str]:
    """Parameter id -> Flax path of every parameter and internal of the compiled
    ``model`` that comes from a Flax module (:meth:`fnnc.models.Model.parameter_paths`)."""
    paths: dict[str, str] = {}
    for pid, info in model.engine.infos.items():
        layer = info.owners[-1]
        if isinstance(layer, FlaxLayer):
            index = int(pid.rsplit("-", 1)[1])
            paths[pid] = (layer.state_paths if info.internal else layer.param_paths)[index]
    return paths


def parameter_id(model: Any, path: str) -> str:
    """The parameter id of Flax path ``path`` in ``model`` (the reverse of
    :func:`parameter_paths`)."""
    paths = parameter_paths(model)
    ids = [pid for pid, p in paths.items() if p == path]
    if len(ids) == 1:
        return ids[0]
    if ids:
        raise ModelError(
            f"model {model.describe()}: Flax path {path!r} names {len(ids)} parameters "
            f"({', '.join(ids)}), one per Flax module in it; use model.parameter_paths() "
            "and pick by id"
        )
    known = ", ".join(sorted(set(paths.values()))[:8]) or "none"
    raise ModelError(
        f"model {model.describe()}: no parameter has Flax path {path!r}; its Flax paths "
        f"are {known}{', ...' if len(set(paths.values())) > 8 else ''}"
    )


# -- helpers ---------------------------------------------------------------------------


def _flat(tree: Any, prefix: str = "") -> tuple[list[tuple[str, np.ndarray]], Any]:
    """``(Flax path, NumPy value)`` of each leaf of a state tree, and its structure."""
    leaves, treedef = jax.tree_util.tree_flatten_with_path(tree)
    for path, value in leaves:
        if is_key(value):
            raise ModelError(
                f"from_flax: variable {prefix + _path(path)} holds PRNG keys but is not an "
                "nnx.RngKey; keep keys in nnx.Rngs (each training step then draws fresh "
                "ones), or hold jax.random.key_data(key)"
            )
    return [(prefix + _path(p), np.asarray(v)) for p, v in leaves], treedef


def _path(path: tuple[Any, ...]) -> str:
    """``layers.0.kernel`` for a pytree path (a Variable's trailing ``.value`` dropped)."""
    parts = []
    for key in path:
        for attr in ("key", "name", "idx"):
            if hasattr(key, attr):
                parts.append(str(getattr(key, attr)))
                break
    if len(parts) > 1 and parts[-1] == "value":
        parts.pop()
    return ".".join(parts)


def _mode(module: Any, training: bool) -> Any:
    """The graph definition of ``module`` in training or test mode: NNX's modes, set
    by ``nnx.view`` (modules with ``set_view``, as ``nnx.Dropout``) and by the
    attributes ``module.train()``/``module.eval()`` set (any module holding them)."""
    from flax import nnx

    flags = {"deterministic": not training, "use_running_average": not training}
    view = nnx.view(module, **flags, raise_if_not_found=False)  # new nodes: module unchanged
    view.set_attributes(**flags, raise_if_not_found=False)
    return nnx.graphdef(view)


def _key_like(data: Any, like: Any) -> Any:
    """A key shaped and typed like ``like`` (a module's ``RngKey`` value), drawn from
    the key data ``data`` fed to the step."""
    base = jax.random.wrap_key_data(data)
    if like.shape == () and like.dtype == base.dtype:
        return base
    bits = jax.random.bits(base, jax.random.key_data(like).shape, jnp.uint32)
    return jax.random.wrap_key_data(bits, impl=jax.random.key_impl(like))


def _spec(value: np.ndarray) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(value.shape, value.dtype)


def _fixed(value: np.ndarray) -> Callable[..., Any]:
    """The initializer giving ``value`` (the module's own): marked ``given``, so that a
    :class:`~fnnc.models.Repeat` takes each block's from that block's module."""

    def init(key: Any, shape: tuple[int, ...], dtype: Any) -> Any:
        return jnp.asarray(value, dtype)

    init.given = True  # type: ignore[attr-defined]
    return init


def _read_inputs(graph: Graph) -> set[int]:
    """Ids of the symbols ``graph``'s nodes and outputs read (aliases by their root)."""
    read = {sid for node in graph.nodes for sid in node.inputs} | set(graph.outputs)
    return {graph.symbol(sid).root for sid in read} | read
