"""The parameters and files of a cnnp model: NNC tensor files, safetensors, training
checkpoints (gathered or sharded) and ``jax.export`` artifacts.

:class:`FilesMixin` holds these methods of :class:`fnnc.models.Model`; each delegates
to the module that does the work (:mod:`fnnc.models.weights`,
:mod:`fnnc.models.checkpoint_state`, :mod:`fnnc.models.sharded_state`,
:mod:`fnnc.models.export`), so ``model.py`` stays the model's structure and training.

>>> import numpy as np, optax
>>> from fnnc.models import Dense, Input, Model
>>> x = Input()
>>> model = Model(x, Dense(2, name="fc")(x))
>>> model.compile(np.zeros((1, 3), np.float32), loss="mse", minimizer=optax.sgd(0.1))
>>> sorted(model.parameters())
['t-fc-0-0', 't-fc-0-1']
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fnnc.core.ir import unit_axes_apart
from fnnc.core.params import require_flag
from fnnc.models import checkpoint_state, checks, sharded_state, stacks
from fnnc.models.layer import ModelError, ModelIO


class FilesMixin:
    """Parameters in and out of a compiled model (see module doc)."""

    engine: Any

    def parameters(self, gather: bool = True) -> dict[str, Any]:
        """Parameter id -> array (internals ``r-...`` included).

        Args:
            gather: ``True`` (default): copies, each a full array on one device, so they
                stay valid while the engine reuses (donates) its own buffers in later
                steps. ``False``: the engine's live arrays themselves, laid out as they
                are (sharded over the mesh of ``set_data_parallel`` or
                ``compile(mesh=...)``, so ``.sharding`` tells where each part lives), with
                nothing copied or gathered. Use them read-only and before the next
                training step: that step donates their buffers (reading one afterwards
                is JAX's "Array has been deleted" error). To change parameters, use
                :meth:`set_parameters`.

        >>> import numpy as np
        >>> from fnnc.models import Dense, Sequential
        >>> model = Sequential([Dense(2, name="fc")])
        >>> model.compile(np.zeros((1, 3), np.float32))
        >>> model.parameters(gather=False)["t-fc-0-0"].sharding.is_fully_replicated
        True
        """
        if not require_flag(gather, "parameters(gather=...)", ModelError):
            return dict(self.engine.values)
        return self.engine.parameters()

    def parameter_ids(
        self, of: Any = None, select: int | None = None, index: int | None = None
    ) -> list[str]:
        """Ids of the parameters of ``of`` (a layer or sub-model of this compiled model;
        the whole model by default), in model order: NNC's
        ``ccv_cnnp_model_parameters(of, select, index)``, e.g. for
        ``set_minimizer(opt, params=model.parameter_ids(sub))``. ``select``: ``None`` or
        a negative int for all (NNC's ``ALL_PARAMETERS``, -1), 0 the weights, 1 the biases
        (the parameter's index in its layer, as ``CCV_CNNP_PARAMETER_SELECT_WEIGHT`` /
        ``_BIAS``); ``index``: the ``index``-th of those (a list of one), ``None`` or a
        negative int for all. Internals (``r-...``, e.g. running statistics) are not
        parameters here. A layer of another model, a ``select`` or ``index`` that is not
        an int, or an ``index`` past the end, is a ``ModelError``."""
        where = "the model" if of is None else getattr(of, "describe", lambda: repr(of))()
        select = _all_or_int(select, "select", where)
        index = _all_or_int(index, "index", where)
        inside = _layers_in(of)
        owned = [
            pid
            for pid, info in self.engine.infos.items()
            if of is None or any(id(o) in inside for o in info.owners)
        ]
        chosen = [
            pid
            for pid in owned
            if not self.engine.infos[pid].internal
            and (select is None or pid.rsplit("-", 1)[-1] == str(select))
        ]
        if not owned:
            hint = "pass a layer this model calls"
            if isinstance(of, ModelIO):  # NNC passes the model, not what it returned
                made = "a model input" if of.layer is None else of.layer.describe()
                where, hint = "a ModelIO", f"that is the output of {made}; pass the layer itself"
            elif isinstance(of, str):
                hint = "pass the layer object itself, not its name"
            raise ModelError(
                f"parameter_ids: {where} has no parameters in {self.describe()} (a layer "
                f"of another model, or one without parameters); {hint}"
            )
        if index is None:
            return chosen
        if index >= len(chosen):
            raise ModelError(
                f"parameter_ids: index={index!r}, but {where} has {len(chosen)} parameter(s) "
                f"for select={select!r}: {chosen}"
            )
        return [chosen[index]]

    def set_parameters(self, values: dict[str, Any], *, strict: bool = True) -> list[str]:
        """Sets parameters by id (e.g. from another model, or a checkpoint's
        ``Checkpoints(path).restore().state``) and returns the ids of ``values`` it
        did not set.

        ``values`` is a dict ``{id: array}``. A :class:`~fnnc.models.Repeat`'s stack
        takes its stacked id or the per-block ids files and checkpoints hold
        (``t-blocks-0-b-1-fc-0-0``); blocks not given keep their values. ``strict``
        (default): an id the model lacks or a value of another shape is a
        ``ModelError`` naming the id, and nothing is set. ``strict=False`` sets what fits
        and skips the rest, returning the ids skipped (as :meth:`read`). A value that is
        not numbers (a string, a ragged list) is a ``ModelError`` either way.
        """
        strict = require_flag(strict, "set_parameters(strict=...)", ModelError)
        if not isinstance(values, Mapping):
            self.engine.set_parameters(values)  # raises, saying what to pass
        block = {
            b: (pid, i) for pid, ids in stacks.stacked_ids(self).items() for i, b in enumerate(ids)
        }
        kept, skipped = {}, []
        for key, value in values.items():  # per-block values: the engine checks the rest
            if key not in block:
                kept[key] = value
                continue
            pid, i = block[key]
            info = self.engine.infos[pid]
            value = checks.parameter_value(key, info, value)
            given, shape = tuple(np.shape(value)), info.shape[1:]
            if unit_axes_apart(given, shape):
                value = np.reshape(value, shape)
            elif given != tuple(shape):
                if not strict:
                    skipped.append(key)
                    continue
                raise ModelError(
                    f"set_parameters: {key} (block {i} of {pid}, layer {info.layer}) is "
                    f"{list(shape)}, the value given is {list(given)}; pass strict=False to "
                    "set only the values that fit"
                )
            kept[key] = value
        stacked = stacks.stack_parameters(kept, self, strict=False)
        skipped += self.engine.set_parameters(stacked, strict=strict)
        return [k for k in values if k in skipped]  # in the order given

    def checkpoint_state(self, row: Any, metadata: Any, step: int) -> tuple[Any, Any, Any, Any]:
        """What :meth:`fnnc.io.Checkpoints.save` stores of this model (parameters, optimizer
        state, progress, random key); see :mod:`fnnc.models.checkpoint_state`."""
        return checkpoint_state.encode_model(self, row, metadata, step)

    def sharded_checkpoint_state(self, metadata: Any, step: int) -> tuple[Any, Any, Any]:
        """What :meth:`fnnc.io.ShardedCheckpoints.save` stores of this model: its arrays
        as laid out on its mesh (nothing gathered); see :mod:`fnnc.models.sharded_state`."""
        return sharded_state.encode(self, metadata, step)

    def restore_checkpoint(self, checkpoints: Any, step: int | None = None) -> Any:
        """Restores a step of ``checkpoints`` into this model
        (:meth:`fnnc.io.Checkpoints.restore_into` calls this)."""
        return checkpoint_state.restore_into(checkpoints, self, step)

    def write(
        self,
        target: Any,
        name: str | None = None,
        *,
        format: str | None = None,  # noqa: A002 (the file format)
        encoder: Any = None,
    ) -> None:
        """Writes parameters (``<id>`` or ``__<name>__[<id>]``) and internals
        (``<id>(0)``) to an NNC tensor file, in one transaction (NNC's
        ``ccv_cnnp_model_write``), or to a safetensors file under the same names.

        Args:
            target: a path or an open :class:`fnnc.io.TensorFile` /
                :class:`fnnc.io.SafetensorsFile`.
            name: the model name in the row names (``None`` for bare ids).
            format: ``"nnc"`` or ``"safetensors"``; by default ``.safetensors`` paths
                are safetensors, others NNC tensor files.
            encoder: a codec for every row (NNC files only), e.g. ``"q8p"``, ``"ezm7"``
                (:mod:`fnnc.io.nnc_codecs`); rows a codec declines are stored raw.
        """
        from fnnc.models.weights import write_model

        write_model(self, target, name=name, format=format, encoder=encoder)

    def read(
        self,
        source: Any,
        name: str | None = None,
        *,
        strict: bool = True,
        format: str | None = None,  # noqa: A002 (the file format)
        rename: Any = None,
    ) -> list[str]:
        """Reads parameters written by :meth:`write` (or by NNC, or a safetensors file)
        into this compiled model.

        ``format`` as in :meth:`write`. ``rename`` maps the file's names to this model's
        row names (a dict, a JSON file of one, or a function; see
        :mod:`fnnc.models.weights`), e.g. a Hugging Face checkpoint's ``"fc.weight"`` to
        ``"t-fc-0-0"``. Raises :class:`fnnc.errors.ParameterError` listing every missing
        or mis-shaped parameter, unless ``strict=False``, which loads what matches and
        returns what did not, one string each: a missing parameter's id (an internal's
        as its row, ``r-bn-0-0(0)``), and for a row of another shape or dtype
        ``"<id>: stored float32[3, 5], expected float32[4, 5]"`` (so
        ``s.split(":")[0]`` is the id); ``[]`` when everything loaded.
        """
        from fnnc.models.weights import read_model

        strict = require_flag(strict, "read(strict=...)", ModelError)
        return read_model(self, source, name=name, strict=strict, format=format, rename=rename)

    def export(
        self,
        path: Any = None,
        *,
        batch: str | None = "b",
        parameters: str = "embedded",
        inputs: Sequence[Any] | None = None,
        platforms: Sequence[str] | None = None,
        check: bool = True,
    ) -> Any:
        """Writes this compiled model's inference as a ``jax.export`` artifact that plain
        JAX loads (``jax.export.deserialize``) and runs without fnnc, at any size (1 or
        more) of the symbolic ``batch`` dimension; ``parameters="embedded"`` or
        ``"argument"`` (a dict by id, the first argument). The graph is the one
        :meth:`evaluate` runs (``compile``'s ``precision`` and ``passes`` included);
        ``check`` compares the artifact with :meth:`evaluate` on ``inputs`` (random ones
        for specs). Returns the ``jax.export.Exported``; see
        :func:`fnnc.models.export.export`."""
        from fnnc.models.export import export

        return export(
            self, path, batch=batch, parameters=parameters, inputs=inputs,
            platforms=platforms, check=check,
        )  # fmt: skip


def _layers_in(layer: Any) -> set[int]:
    """The ids of ``layer`` and of every layer its models call, however deep: a layer
    shared with another sub-model owns its parameters in both, as in NNC."""
    seen, todo = {id(layer)}, [layer]
    while todo:
        for io in getattr(todo.pop(), "_order", ()):
            if io.layer is not None and id(io.layer) not in seen:
                seen.add(id(io.layer))
                todo.append(io.layer)
    return seen


def _all_or_int(value: Any, what: str, where: str) -> int | None:
    """``select`` or ``index`` of :meth:`FilesMixin.parameter_ids`: ``None`` for all, as
    is any negative int (NNC's ``ALL_PARAMETERS``, -1: ``ccv_cnnp_model_parameters``
    takes every ``< 0`` as all), else the int; a bool, float or string is a
    :class:`ModelError` (``str(select)`` matched no parameter, so it gave ``[]``)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ModelError(
            f"parameter_ids: {what}={value!r}, but {what} takes an int (0 the weights, "
            f"1 the biases for select; a position for index) or None / -1 (NNC's "
            f"ALL_PARAMETERS) for all; in {where}"
        )
    return None if value < 0 else int(value)
