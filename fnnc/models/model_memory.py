"""A cnnp model's memory options (NNC's ``ccv_cnnp_model_set_memory_*`` and
``_set_gradient_checkpointing``) and the memory of its compiled training step:
:class:`fnnc.models.Model` mixes them in.

>>> import numpy as np, optax
>>> from fnnc.models import Dense, Input, Model
>>> x = Input()
>>> model = Model(x, Dense(1, name="fc")(x))
>>> model.set_gradient_checkpointing(True)
>>> model.compile(np.zeros((2, 3), np.float32), loss="mse", minimizer=optax.sgd(0.1))
>>> model.memory_plan(np.zeros((2, 3), np.float32), np.zeros((2, 1), np.float32)).peak_bytes > 0
True
"""

from __future__ import annotations

from typing import Any

from fnnc.core.params import flag_value
from fnnc.graph.passes.remat import POLICIES
from fnnc.models.layer import ModelError
from fnnc.models.model_training import _arrays


class MemoryMixin:
    """Memory switches and the training step's memory (see module doc)."""

    gradient_checkpointing: bool
    memory_compression: bool
    memory_reduction: bool

    def set_gradient_checkpointing(self, enabled: bool = True) -> None:
        """Recompute this (sub-)model's activations in the backward instead of keeping
        them: every node built inside it, except those making its outputs, is not saved
        for the training step's backward (:func:`fnnc.graph.remat`). Set it on blocks of a
        larger model (one block's activations live at a time) or on the whole model."""
        self.gradient_checkpointing = _switch(self, "set_gradient_checkpointing", enabled)

    def set_memory_compression(self, enabled: bool = True) -> None:
        """Keep convolution activations for the backward LSSC-compressed (lossy, 8x
        smaller than float32; :func:`fnnc.graph.passes.memory_compression`)."""
        self.memory_compression = _switch(self, "set_memory_compression", enabled)

    def set_memory_reduction(self, enabled: bool = True) -> None:
        """Redo widening ``datatype_conversion`` nodes in the backward instead of keeping
        their wide outputs (lossless; :func:`fnnc.graph.passes.memory_reduction`)."""
        self.memory_reduction = _switch(self, "set_memory_reduction", enabled)

    def memory_plan(self, inputs: Any = None, targets: Any = ()) -> Any:
        """:func:`fnnc.graph.memory_plan` of the compiled training step: the last one
        :meth:`fit` ran, or the one for ``inputs``/``targets`` (arrays or specs: one, or
        a list, or ``None`` for no targets, as :meth:`fit` takes them)."""
        return self._fit_step(inputs, targets, "memory_plan").memory_plan()  # with donation

    def memory(self, inputs: Any = None, targets: Any = ()) -> Any:
        """XLA's memory analysis (:meth:`fnnc.graph.Program.memory`) of the compiled
        training step, chosen as :meth:`memory_plan` chooses it: e.g. a model with frozen
        layers against the same model all trainable (no gradient or optimizer buffers
        for frozen parameters)."""
        return self._fit_step(inputs, targets, "memory").memory()

    def _fit_step(self, inputs: Any, targets: Any, what: str) -> Any:
        """The compiled fit program both report on (:meth:`Engine.fit_step`)."""
        return self.engine.fit_step(  # type: ignore[attr-defined]
            None if inputs is None else _arrays(inputs),
            [] if targets is None else _arrays(targets),
            what,
        )


def _switch(model: Any, method: str, enabled: Any) -> bool:
    """``enabled`` of a memory switch as a bool: True, False (NumPy's too) or 1/0, as NNC's
    ``int`` flag; anything else (``"false"``, a remat policy name) is a ModelError, since
    ``bool()`` would turn it on."""
    meant = flag_value(enabled)
    if meant is not None:
        return meant
    hint = ""
    if isinstance(enabled, str) and enabled in POLICIES:
        hint = "; a remat policy per block is Repeat(..., checkpoint=policy)"
    raise ModelError(
        f"{model.describe()}: {method}(enabled) takes True or False, got "
        f"{type(enabled).__name__} {enabled!r}{hint}"
    )
