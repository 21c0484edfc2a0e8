"""Training and inference on a cnnp model: :class:`fnnc.models.Model` mixes them in.

:class:`TrainingMixin` holds the methods of a compiled model (``compile``, ``fit``,
``evaluate``, ``score``, ``predict``, ``train``, ``backward``, ``apply_gradients``,
``set_minimizer``, ``autotune``, ``profile``, ``summary``, ``to_nnx``; the memory
options are :mod:`fnnc.models.model_memory`'s); each delegates to the model's
:class:`~fnnc.models.engine.Engine` or to the module that does the work, so
``model.py`` stays the model's structure.

>>> import numpy as np, optax
>>> from fnnc.models import Dense, Input, Model
>>> x = Input()
>>> model = Model(x, Dense(1, name="fc")(x))
>>> model.compile(np.zeros((2, 3), np.float32), loss="mse", minimizer=optax.sgd(0.1))
>>> model.evaluate(np.ones((2, 3), np.float32)).shape
(2, 1)
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

from fnnc.core.params import flag_value, is_count, require_flag
from fnnc.models import checks
from fnnc.models.engine import Engine
from fnnc.models.keras_habits import refuse_unknown
from fnnc.models.layer import ModelError
from fnnc.models.sample_sets import check_batch_size


class TrainingMixin:
    """Compiling, training and running a model (see module doc)."""

    _engine: Engine | None

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            raise ModelError(
                f"model {self.describe()} is not compiled; call model.compile(input_specs, "
                "loss=..., minimizer=...) first"
            )
        return self._engine

    def compile(
        self, inputs: Sequence[Any] | Any = None, *, loss: Any = None, minimizer: Any = None,
        seed: int | None = None,
        mesh: Any = None, parameter_sharding: Any = None, precision: str | None = None,
        loss_scale: Any = None, passes: Any = None, input_specs: Any = None,
    ) -> None:  # fmt: skip
        """Fixes input specs (arrays or ShapeDtypeStructs), the loss and the minimizer,
        and initialises parameters. New input shapes later recompile, keeping weights
        and optimizer state. ``loss`` is a name (``"softmax_crossentropy"``, ``"mse"``,
        ...: the first output against one target), ``None`` (the first output is the
        loss), or a JAX function called as ``fn(outputs, targets)`` with two *lists* of
        arrays (``outputs[0]``, ``targets[0]`` even for one of each) that returns one
        scalar (:mod:`fnnc.models.losses`); an error it raises (traced by ``fit``, or
        called by ``score``) is a ``ModelError`` restating this. ``mesh`` (a
        ``jax.sharding.Mesh`` with axis ``"data"``) and ``parameter_sharding``
        (``"replicated"``/``"fsdp"``) train data-parallel (see
        :meth:`set_data_parallel`); on a ``("data", "model")`` mesh, sharding rules
        (``"megatron"``, ``{layer pattern: PartitionSpec}``, a
        :class:`fnnc.graph.ShardingRules`) add tensor parallelism
        (:mod:`fnnc.models.parallel`); a pipelined :class:`~fnnc.models.Repeat` lays its
        blocks on the mesh's stage axis, ``"pipeline"`` on a mesh of stages alone
        (:mod:`fnnc.models.pipeline`); ``precision`` (``"bfloat16"``/``"float16"``) computes
        in that type with float32 parameters (:mod:`fnnc.models.precision`); float16
        scales the loss dynamically, ``loss_scale`` (a
        :class:`fnnc.models.loss_scale.LossScale`, ``True``/``False``) says how.
        ``passes``: graph passes on the forward graph before ``backward`` (a list), or
        ``{"forward": [...], "training": [...]}`` to also rewrite the training graph
        after it (:mod:`fnnc.models.model_passes`). ``seed`` (an int, default 0) seeds
        the parameters' initialisation and the dropout key; it counts at the first
        compile only (later compiles keep the weights, and warn if given another seed).
        ``input_specs=`` is another name for ``inputs`` (NNC's and the issue's word)."""
        if (inputs is None) == (input_specs is None):
            raise ModelError(
                f"model {self.describe()}.compile: give the input specs once, as the first "
                "argument or input_specs= (one array or ShapeDtypeStruct per model input), "
                f"got {'both' if inputs is not None else 'neither'}"
            )
        inputs = input_specs if inputs is None else inputs
        arrays = checks.numeric_inputs(self, _arrays(inputs))  # before anything is built or kept
        given = None if seed is None else checks.seed(self, seed)
        if self._engine is None:
            self._engine = Engine(self, 0 if given is None else given)
        elif given is not None and given != self._engine.seed:
            warnings.warn(
                f"{self.name or 'model'}.compile: seed={given} is ignored, the model was "
                f"compiled with seed={self._engine.seed} and keeps its weights and dropout "
                "key; build a new model to start from another seed",
                UserWarning,
                stacklevel=2,
            )
        self._scale_options(mesh, parameter_sharding, precision, loss_scale)
        self._engine.compile(arrays, loss=loss, minimizer=minimizer, passes=passes)
        self._engine.place_parameters()

    def fit(
        self,
        inputs: Sequence[Any] | Any,
        targets: Sequence[Any] | Any = (),
        *extra: Any,
        **unknown: Any,
    ) -> Any:
        """One fused training step (forward, loss, backward, update); returns the loss.
        ``inputs`` and ``targets``: one array each, or lists of arrays (``targets=None``:
        none, as for ``loss=None``). A batch of 0 rows is a
        :class:`~fnnc.errors.ModelError` and changes nothing (its loss would be NaN).
        Keras's ``fit(x, y, epochs=...)`` over a dataset is :meth:`train`; its keywords
        here are a ``ModelError`` saying so."""
        refuse_unknown("fit", self, unknown, extra)
        return self.engine.fit(_arrays(inputs), [] if targets is None else _arrays(targets))

    def evaluate(
        self,
        inputs: Sequence[Any] | Any,
        *extra: Any,
        is_test: bool = True,
        requires_grad: bool = False,
        **unknown: Any,
    ) -> Any:
        """The model's outputs for one batch (one array or a list of arrays);
        ``requires_grad`` keeps what :meth:`backward` needs. 0 rows give 0 rows of
        outputs in test mode; in training mode (``is_test=False``, which updates running
        statistics) they are a :class:`~fnnc.errors.ModelError`. Data parallel over several
        processes, each passes its own rows (as many as the others) and gets the
        outputs of every process's rows, process 0's first (:mod:`fnnc.models.processes`).
        Keras's ``evaluate(x, y)`` is :meth:`score`."""
        refuse_unknown("evaluate", self, unknown, extra)
        is_test = _flag(self, "evaluate", "is_test", is_test)
        requires_grad = _flag(self, "evaluate", "requires_grad", requires_grad)
        return self.engine.evaluate(_arrays(inputs), is_test=is_test, requires_grad=requires_grad)

    def score(
        self, data: Any, labels: Any = None, *, metrics: Any = None, batch_size: int = 256,
        inputs: Any = None, targets: Any = None, **unknown: Any,
    ) -> dict[str, float]:  # fmt: skip
        """Loss and metrics on a labelled set in one call (Keras's ``evaluate(x, y)``;
        ``evaluate`` here is NNC's forward pass): ``{"loss": ..., "accuracy": ...}``,
        what ``train(validation=data)`` logs as ``val_loss``, ``val_accuracy``.

        ``data`` is what ``validation=`` takes (``(x, y)``, a dataframe with columns
        ``inputs``/``targets``, a Grain dataset), or ``x`` with ``labels``; ``metrics``
        adds names, :class:`fnnc.models.metrics.Metric` objects or ``{"name": fn}``
        (:mod:`fnnc.models.metrics`). Data parallel over several processes, each passes
        its share of the set and every process gets the numbers of the whole set.

        >>> import numpy as np, optax
        >>> from fnnc.models import Dense, Input, Model
        >>> x = Input()
        >>> model = Model(x, Dense(3, name="fc")(x))
        >>> model.compile(np.zeros((4, 2), np.float32), loss="softmax_crossentropy",
        ...               minimizer=optax.sgd(0.1))
        >>> sorted(model.score(np.ones((5, 2), np.float32), np.arange(5) % 3,
        ...                    metrics=["top_2_accuracy"]))
        ['loss', 'top_2_accuracy']
        """
        from fnnc.models.metrics import score

        refuse_unknown("score", self, unknown)
        return score(
            self, data, labels, metrics=metrics, batch_size=batch_size, inputs=inputs,
            targets=targets,
        )  # fmt: skip

    def summary(self, inputs: Sequence[Any] | None = None, *, print_fn: Any = print) -> str:
        """Prints (with ``print_fn``; ``None`` prints nothing) and returns a table of the
        layers: output shapes, parameter ids, counts and bytes (Keras's ``summary``), for
        the compiled input specs or ``inputs`` (arrays or specs);
        see :mod:`fnnc.models.summary`."""
        from fnnc.models.summary import summary

        return summary(self, inputs, print_fn=print_fn)

    def profile(
        self, inputs: Sequence[Any] | Any, targets: Sequence[Any] | Any | None = None, *,
        runs: int = 10, log_dir: str | None = None,
    ) -> Any:  # fmt: skip
        """Time per node and per command of the training step on this batch (given
        ``targets``; it trains, as ``fit`` does) or of the forward pass, under
        ``jax.profiler``: a :class:`fnnc.graph.profile.Profile` (print it for the
        tables; :mod:`fnnc.models.profiling`)."""
        from fnnc.models.profiling import profile_model

        targets = None if targets is None else _arrays(targets)
        return profile_model(self, _arrays(inputs), targets, runs=runs, log_dir=log_dir)

    def to_nnx(self, **options: Any) -> Any:
        """This compiled model as a Flax ``nnx.Module`` whose variables are its parameters
        by id (:class:`fnnc.models.FnncModule`; ``options`` go to it)."""
        from fnnc.models.nnx_module import FnncModule

        return FnncModule(self, **options)

    def predict(
        self, inputs: Sequence[Any] | Any, *extra: Any, batch_size: int = 256, **unknown: Any
    ) -> Any:
        """The outputs (test mode) over every sample of ``inputs`` (one array or a
        list), evaluated ``batch_size`` samples at a time, as NumPy: one array for a
        one-output model, else a list. Data parallel over several processes, each
        passes its own rows (as many as the others) and gets every process's outputs
        in process order, as :meth:`evaluate` gives them: all of process 0's rows, then
        process 1's...; a last batch whose rows do not divide over a process's devices
        is padded and cut back.

        >>> import numpy as np, optax
        >>> from fnnc.models import Dense, Input, Model
        >>> x = Input()
        >>> model = Model(x, Dense(2, name="fc")(x))
        >>> model.compile(np.zeros((4, 3), np.float32), loss="mse", minimizer=optax.sgd(0.1))
        >>> model.predict(np.ones((10, 3), np.float32), batch_size=4).shape
        (10, 2)
        """
        from fnnc.models.training import predict

        refuse_unknown("predict", self, unknown, extra)
        self.engine._check_inputs(_arrays(inputs))  # evaluate's check, before batching
        return predict(self, inputs, batch_size=batch_size)

    def autotune(
        self, inputs: Sequence[Any] | Any | None = None,
        targets: Sequence[Any] | Any | None = None,
        *, repeats: int = 5, retune: bool = False,
    ) -> dict[str, dict[int, str]]:  # fmt: skip
        """Times every node's eligible backends of the ``evaluate`` (and, given
        ``targets``, ``fit``) programs on this batch into the autotune table, as NNC's
        ``ccv_nnc_graph_autotune``; later programs compile with the winners. Changes
        nothing the model holds; see :mod:`fnnc.models.autotune`. Without ``inputs``,
        a batch of the shapes the model was compiled for is made up (standard-normal
        floats, zero integers) and ``evaluate`` is tuned."""
        from fnnc.models.autotune import autotune, stand_in

        targets = None if targets is None else _arrays(targets)
        arrays = stand_in(self.engine) if inputs is None else _arrays(inputs)
        retune = _flag(self, "autotune", "retune", retune)
        return autotune(self.engine, arrays, targets, repeats=repeats, retune=retune)

    def backward(
        self,
        ingrads: Any = None,
        outgrads: bool | Sequence[int] = True,
        *,
        outgrad: bool | Sequence[int] | None = None,
    ) -> list[Any]:
        """Backpropagates ``ingrads`` (the output gradients; by default, as NNC's, ones shaped
        as the outputs, and ones for an entry that is ``None``) from the residuals the last
        ``evaluate(..., requires_grad=True)`` kept, without running the forward again.
        Parameter gradients accumulate for :meth:`apply_gradients`. Returns the gradients of
        the model inputs ``outgrads`` selects (NNC's ``ccv_cnnp_model_backward(...,
        outgrads)``): every floating-point input (``True``), none (``False``: parameter
        gradients only, and the program computes no more), or the listed input positions.
        ``outgrad=`` is the same argument under its earlier name. Data parallel over several
        processes, ``ingrads`` and the input gradients returned are those of every process's
        rows, shaped as ``evaluate`` returned the outputs (each process passes the same
        ``ingrads``). See :mod:`fnnc.models.residuals`."""
        ingrads = None if ingrads is None else _arrays(ingrads)  # one array, as fit takes
        return self.engine.backward(ingrads, outgrads if outgrad is None else outgrad)

    def apply_gradients(self) -> None:
        """Applies the accumulated parameter gradients with the minimizers, then clears them."""
        self.engine.apply_gradients()

    def set_minimizer(
        self, minimizer: Any, *, reset: bool = False, params: Sequence[str] | str | None = None
    ) -> None:
        """Sets the minimizer of all (or some) parameters; state carries over unless ``reset``.

        The minimizer (an Optax transformation or ``optax.MultiSteps``) updates the dict
        of trainable parameters ``{id: array}`` as a whole; ``params`` makes those ids a
        partition that ``minimizer`` updates as a whole, as ``optax.multi_transform``
        does (the ids set with one object are one partition; one id alone is a list of
        it); see :mod:`fnnc.models.optim`. Without ``params`` (a new default, e.g. a
        new learning rate each epoch) the ids given their own minimizer keep it, as
        NNC's ``ccv_cnnp_model_set_minimizer`` re-applies them; ``reset=True`` with no
        ``params`` drops them too, so every parameter takes ``minimizer`` afresh."""
        reset = _flag(self, "set_minimizer", "reset", reset)
        self.engine.set_minimizer(minimizer, reset=reset, params=params)

    def train(
        self,
        data: Any,
        *,
        epochs: int = 1,
        batch_size: int = 32,
        validation: Any = None,
        metrics: Any = None,
        callbacks: Sequence[Any] | Any = (),
        resume: Any = None,
        seed: int | None = None,
        stop_on_nan: bool = True,
        inputs: Any = None,
        targets: Any = None,
        progress: bool | None = None,
        verbose: bool | int = True,
        **unknown: Any,
    ) -> dict[str, list[float]]:
        """Trains the compiled model for ``epochs`` epochs of fused steps.

        Args:
            data: ``(inputs, targets)`` arrays (or lists of arrays, samples first), a
                :class:`fnnc.data.DataFrame` (batched with ``batch_size`` unless it has
                a ``batch``; columns ``inputs``/``targets``, by default the last column
                is the target), or a ``grain.MapDataset`` of ``(inputs, targets)`` batches.
            epochs: epochs to run, an int >= 0; with ``resume``, the epoch to run up to
                (Keras's ``initial_epoch`` convention: the run ends at epoch ``epochs``).
            batch_size: samples per step (arrays and unbatched dataframes). These are cut
                into full batches only: the rows after the last full batch sit the epoch
                out (each epoch's order differs, so every row is seen over epochs), and
                every step runs the one compiled program.
            validation: measured after every epoch: ``val_loss``, ``val_accuracy``
                (classification losses) and ``val_<name>`` per metric. Arrays, a
                dataframe (its columns chosen as for ``data``) or a Grain dataset of
                ``(inputs, targets)`` batches (:mod:`fnnc.models.validation`).
            metrics: ``{"name": fn(outputs, targets)}`` or ``["accuracy"]``; accuracy
                takes integer labels, one-hot or soft (mixup) targets. ``loss`` and
                ``epoch`` are the model's own names, refused for your metrics.
            callbacks: :class:`fnnc.models.callbacks.Callback` objects (a list, or one
                alone), e.g. ``CheckpointEvery(path, per_epoch=True)``,
                ``EarlyStopping(patience=2)``; anything else is a ``ModelError``.
            resume: a checkpoint path or ``Checkpoints``: its newest step (if any) is
                restored first (:meth:`fnnc.io.Checkpoints.restore_into`) and the run
                continues exactly where it stopped, mid-epoch included. Given another
                ``batch_size``, arrays go on at the same sample of the stopped epoch's
                order; a dataframe's epoch must end in its own batch size (an error
                says which).
            seed: the shuffling seed, an int >= 0 (kept by the model; default 0). Epoch ``e`` is
                shuffled from ``(seed, e)``: the model counts epochs, so two calls with
                ``epochs=1`` continue one sequence, as one call with ``epochs=2`` does.
            stop_on_nan: raise :class:`fnnc.errors.NumericsError` at the first loss that
                is NaN or infinite (naming the step, the last good checkpoint, and the
                batch's non-finite values if it had any). In-memory data is checked once
                before the first step: NaN or infinity warns (``RuntimeWarning``), class
                labels out of range raise (:mod:`fnnc.models.checks`).
            inputs: with a dataframe (``data`` or ``validation``), the column(s) fed
                to the model's inputs; with arrays alone there are no columns to name,
                and giving it is a ``ModelError``.
            targets: the dataframe column(s) of the targets, as ``inputs``.
            progress: a tqdm bar per epoch that stays on screen with the epoch's
                metrics (default: when stderr is a terminal; else one log line per
                epoch on stderr; :mod:`fnnc.models.progress`). ``verbose=False``: neither;
                Keras's ``verbose=2``: one log line per epoch (0 and 1 are False and True).

        Returns:
            ``{"epoch": [...], "loss": [mean training loss], "val_loss": [...], ...}``,
            one entry per epoch run by this call. ``loss`` is the mean of the epoch's
            step losses weighted by their batches' rows (Keras's), so a short last batch
            (a dataframe's own ``batch``, a Grain dataset) counts for its rows: for a
            loss that is a mean over rows, the mean over the epoch's rows, as the
            weights changed under them.

        >>> import numpy as np, optax
        >>> from fnnc.models import Dense, Input, Model
        >>> xs = np.random.default_rng(0).standard_normal((64, 4)).astype(np.float32)
        >>> ys = (xs.sum(1) > 0).astype(np.int32)
        >>> x = Input()
        >>> model = Model(x, Dense(2, name="fc")(x))
        >>> model.compile(xs[:16], loss="softmax_crossentropy", minimizer=optax.adam(0.05))
        >>> h = model.train((xs, ys), epochs=2, batch_size=16, verbose=False)
        >>> h = model.train((xs, ys), epochs=1, batch_size=16, verbose=False)
        >>> h["epoch"], model.train_progress.step
        ([3], 12)
        """
        from fnnc.models.training import train

        refuse_unknown("train", self, unknown)
        batch_size = check_batch_size(batch_size, "train")  # before resume restores anything
        stop_on_nan = _flag(self, "train", "stop_on_nan", stop_on_nan)
        progress = None if progress is None else _flag(self, "train", "progress", progress)
        if is_count(verbose) and verbose == 2:  # Python's or NumPy's 2, not True
            verbose, progress = True, False if progress is None else progress  # Keras's 2
        elif flag_value(verbose) is None:
            raise ModelError(
                f"{self.describe()}: train(verbose=...) takes True or False, 0, 1 or Keras's "  # type: ignore[attr-defined]
                f"2 (one line per epoch), got {type(verbose).__name__} {verbose!r:.40}"
            )
        verbose = _flag(self, "train", "verbose", verbose)
        return train(
            self, data, epochs=epochs, batch_size=batch_size, validation=validation,
            metrics=metrics, callbacks=callbacks, resume=resume, seed=seed,
            stop_on_nan=stop_on_nan, inputs=inputs, targets=targets, progress=progress,
            verbose=verbose,
        )  # fmt: skip


def _arrays(value: Any) -> list[Any]:
    """A list of arrays from one array or a list/tuple of them."""
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _flag(model: Any, method: str, arg: str, value: Any) -> bool:
    """``value`` of a switch argument as a bool (True, False, NumPy's, NNC's 1/0); anything
    else is a ModelError, since ``bool("false")`` is True (``reset="no"`` would drop the
    optimizer state, ``is_test="false"`` would run in test mode)."""
    return require_flag(value, f"{model.describe()}: {method}({arg}=...)", ModelError)
