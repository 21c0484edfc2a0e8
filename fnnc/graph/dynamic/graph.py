"""DynamicGraph: run commands now, record them, differentiate the record (NNC's dynamic graph).

:class:`DynamicGraph` is a plain class: it defines every method itself and holds the
per-graph state (the :class:`~.record.Record`, its IR; the plans; gradients and
optimizer states). What takes more than a few lines lives in helper modules it calls
explicitly with itself as first argument:

* :mod:`.leaves`: values into leaf versions, variables into reads (``_leaf``,
  ``_read``, ``_slot``, ``_view_value``);
* :mod:`.execute`: plans (cached per command and input specs) and the recorded run
  of one command; ``exec`` keeps its fast path here and calls :func:`.execute.run`;
* :mod:`.versions`: writes, ``set``, ``free``, ``detach`` and ``exec(outputs=...)``;
* :mod:`.autodiff`: ``backward``; :mod:`.steps`: ``apply_gradients`` and ``minimize``;
* :mod:`.parallel`: NNC's ``parallel`` copies of ``exec``, ``apply_gradients`` and
  ``minimize``;
* :mod:`.lazy`: ``flush``, lazy mode's sync point.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import numpy as np

from fnnc.core.dispatch import state as dispatch_state
from fnnc.core.ir import Graph
from fnnc.errors import GraphError
from fnnc.graph._builder_args import without_trailing_none
from fnnc.graph.passes.pipeline import resolve_passes
from fnnc.ops import Command

from . import autodiff, cnnp, effects, lazy, leaves, optim, steps, versions
from . import parallel as dp
from .execute import Plans, run, run_reads, where
from .extract import PROGRAMS, extract
from .record import Read, Record, Version, View
from .state_views import StateStore
from .variable import Slot, Variable
from .views import alias_view

Pass = Callable[[Graph], Graph]


class DynamicGraph:
    """NNC's dynamic graph: commands run eagerly on variables while a graph is recorded.

    Gradients come from fnnc's symbolic ``backward`` pass on the recorded graph (no
    tape), compiled once per graph structure. See :mod:`fnnc.graph.dynamic`.

    Args:
        lazy: record commands and run them only at a sync point (reading a value,
            ``backward``, ``apply_gradients``) as one compiled program.
        memo: reuse the result of a pure command already run on the same versions.
        passes: passes ``Graph -> Graph`` (or names of the built-in ones, e.g.
            ``"cse"``) run on each lazy flush's graph before it is simplified and
            compiled (cached per structure and passes, as flushes are); ``backward``
            differentiates the forward they rewrote, as it ran.

    Attributes:
        grads: accumulated gradient variables by (slot, view) of what they belong to;
            read them with :meth:`grad`.
        opt_store: Optax state views per variable (``"#<slot id>"``) and structure:
            each variable's moments follow it into any set or order of variables, and
            a fresh optimizer of the same structure finds them (see :mod:`.optim`).
            A step keeps its whole state as is (``opt_hot``); it is cut into views
            only when another list or order needs them. Read them with
            :meth:`optimizer_states`.
        opt_states: the same for a transformation that takes its parameters only as
            a list (``optax.masked`` with a list mask): by (structure, variable list).
        num_compiled: programs this graph compiled (gradients, updates, lazy flushes);
            it stops growing once a training loop repeats the same structure.

    >>> import numpy as np
    >>> from fnnc import ops
    >>> from fnnc.graph import DynamicGraph
    >>> dg = DynamicGraph()
    >>> x = dg.variable(np.float32([19.0]), name="x")
    >>> f = x * dg.exec(ops.ewlog(), x) + 1.2 * x
    >>> (dx,) = dg.backward(f, [x])
    >>> round(float(dx.numpy()[0]), 5)              # log(19) + 1 + 1.2
    5.14444
    """

    def __init__(
        self, *, lazy: bool = False, memo: bool = True, passes: Sequence[str | Pass] = ()
    ) -> None:
        if passes and not lazy:
            raise GraphError(
                "DynamicGraph: passes run on lazy flushes (one compiled program per sync "
                "point); eager mode runs each command at once. Use "
                "DynamicGraph(lazy=True, passes=[...])"
            )
        self.lazy = lazy
        self.passes = resolve_passes(passes, "DynamicGraph")
        self.memo = memo
        self._record = Record()
        self._grad_enabled = True
        self._plans = Plans(memo)
        self._fast = self._plans.fast  # exec's one lookup (see execute.py)
        self._scalars: dict[tuple[Any, np.dtype], Any] = {}
        self._dead: list[Slot] = []
        self.grads: dict[tuple[Slot, View | None], Variable] = {}
        self.opt_states: dict[tuple[Any, tuple[Slot, ...]], list[Any]] = {}
        self._opt_owner: dict[tuple[Any, tuple[Slot, ...]], Any] = {}  # see optim.state
        self.opt_store = StateStore()  # per variable ("#<slot id>"), see optim.state
        self.opt_hot: dict[Any, Any] = {}  # whole states as the last step left them
        self.opt_latest: dict[tuple[Slot, Any], Any] = {}  # where each one's newest is
        self._models: dict[int, Any] = {}  # cnnp models evaluated here (cnnp.py)
        self.num_compiled = 0

    # -- variables -------------------------------------------------------------
    def variable(self, value: Any, name: str = "") -> Variable:
        """A trainable variable holding ``value`` (gradients can flow to it; an integer
        one gets none, as integers are not differentiable, and ``backward`` says so).

        A JAX array is held as is: the first step that updates the variable spends its
        buffer, unless another variable of this graph shares it (``dg.variable(w)``)."""
        leaf = self._leaf(value, grad=True, name=name, where="variable")
        return self._handle(leaf, name, trainable=True)

    def constant(self, value: Any, name: str = "") -> Variable:
        """A constant: a value that never gets a gradient."""
        leaf = self._leaf(value, grad=False, name=name, where="constant")
        return self._handle(leaf, name, trainable=False)

    def scalar(self, value: Any, dtype: Any) -> Variable:
        """A constant scalar of ``dtype`` (operators use it for Python numbers)."""
        return self.constant(self._scalar_array(value, np.dtype(dtype)))

    def alias(
        self,
        of: Variable,
        shape: Sequence[int],
        offset: Sequence[int] | None = None,
        stride: Sequence[int] | None = None,
        *,
        base: int | None = None,
        name: str = "",
    ) -> Variable:
        """A view of ``of`` by NNC's alias rule (as :meth:`GraphBuilder.alias`). A stride
        of all zeros is NNC's ``DIM_ALLOC()``, no stride given: the default (the parent's
        strides). NNC's ``ccv_nnc_tensor_variable_alias_new`` reads any ``stride[0] == 0``
        so; fnnc only all zeros, since a zero stride on some axes is its broadcast view
        (``stride=(0, 1)`` repeats one row)."""
        if stride is not None and len(stride) and all(_is_zero(s) for s in stride):
            stride = None
        slot = self._slot(of, "alias")
        parent = of._root_view()
        view = alias_view(
            parent, slot.version.shape, of.is_alias, shape, offset, stride, base, of.label
        )
        return self.view(of, view, name)

    def view(self, of: Variable, view: View, name: str = "") -> Variable:
        """A variable seeing ``view`` of ``of``'s root (used by indexing and reshape)."""
        slot = self._slot(of, "view")
        return Variable(self, slot, view, name)

    def _leaf(self, value: Any, grad: bool, name: str = "", where: str = "") -> Version:
        """A new version holding ``value`` (:func:`.leaves.leaf`)."""
        return leaves.leaf(self, value, grad, name, where)

    def _scalar_array(self, value: Any, dtype: np.dtype) -> Any:
        return leaves.scalar_array(self, value, dtype)

    def _handle(self, version: Version, name: str, trainable: bool) -> Variable:
        return Variable(self, Slot(version, name, trainable), None, name)

    # -- running commands ------------------------------------------------------
    def exec(
        self,
        cmd: Command,
        *inputs: Any,
        outputs: Sequence[Variable] | None = None,
        name: str = "",
        parallel: int = 1,
    ) -> Any:
        """Runs ``cmd`` on ``inputs`` now and records it; returns the output variable(s).

        Args:
            cmd: a command, e.g. ``ops.gemm(transpose_b=True)``.
            *inputs: variables (or arrays, taken as constants); trailing ``None``
                leave optional inputs out (as :meth:`GraphBuilder.exec`; a ``None``
                before a given input is an error).
            outputs: variables to write instead of new ones; writing a variable makes
                a new version of it, and writing an alias makes a new version of the
                whole variable it views. A constant written stays one: it takes the
                value, no gradient flows through it.
            name: the node's name in listings and errors.
            parallel: NNC's copies (:mod:`.parallel`): ``inputs`` and ``outputs`` hold
                that many copies one after another; the command runs on each.

        Returns:
            One variable, or a tuple for a command with several outputs (with
            ``parallel``, every copy's outputs in order).
        """
        if isinstance(parallel, bool) or parallel != 1:
            return dp.exec_copies(self, cmd, inputs, outputs, name, parallel)
        record = self._record
        if record.garbage > record.limit or len(record.nodes) > record.limit:
            self.collect()
        # The fast path (an eager step is mostly this): live variables of this graph,
        # read whole, by a command already planned for their specs; one dict lookup
        # keyed by the command's identity and the inputs' spec ids finds the plan. A
        # plain loop: on Python 3.11 a comprehension is a function call, and a few of
        # them would be a fair share of what recording a command may cost at all.
        plan = None
        reads: list[Read] = []
        args: list[Any] = []
        key = [id(cmd)]
        try:
            for x in inputs:
                if x._view is not None or x._dg is not self:
                    break
                v = x._slot.version
                reads.append((v, None))
                args.append(v.value)
                key.append(v.sid)
            else:
                entry = self._fast.get(tuple(key))
                if entry is not None and entry[0] is cmd and entry[1].cfg == dispatch_state():
                    plan = entry[1]
        except AttributeError:  # not a variable, or a freed one: the general path says
            pass
        if plan is not None and outputs is None:
            outs = run(self, cmd, plan, reads, args, name)
        else:
            if plan is None:  # the general path: arrays, views, a first use, a mistake
                at = where(cmd, name)
                inputs = without_trailing_none(inputs, at, getattr(cmd, "name", ""))
                reads = [self._read(x, at, i) for i, x in enumerate(inputs)]
                job: Any = functools.partial(run_reads, self, cmd, reads, name)
            else:
                job = functools.partial(run, self, cmd, plan, reads, args, name)
            if outputs is not None:
                written = versions.exec_into(self, cmd, job, outputs, name)
                if self._models:
                    cnnp.sync(self)
                return written
            outs = job()
        if len(outs) == 1:
            return Variable(self, Slot(outs[0], "", True), None, "")
        return tuple(Variable(self, Slot(v, "", True), None, "") for v in outs)

    def evaluate(
        self,
        model: Any,
        inputs: Sequence[Any],
        name: str = "",
        *,
        is_test: bool = True,
        outputs: Sequence[Variable] | None = None,
    ) -> Any:
        """Runs a whole graph as one recorded node; gradients flow through it.

        ``model``: a :class:`~fnnc.graph.Graph` (e.g. :func:`fnnc.graph.trace`'s), a
        :class:`~fnnc.graph.Program`, or a cnnp :class:`~fnnc.models.Model` whose
        parameters are this graph's variables (:meth:`parameters`), so ``minimize``
        trains it (:mod:`.cnnp`); a model never compiled is compiled for ``inputs``
        first, as NNC does. Changes the model makes itself (``set_parameters``,
        ``fit``) are seen here.

        A model runs in **test mode by default** (``is_test=True``): Dropout passes
        everything, BatchNorm normalises with its running statistics. **To train a
        model through the dynamic graph pass** ``is_test=False``, as NNC's callers of
        ``ccv_nnc_dynamic_graph_evaluate`` do: Dropout drops (keys from the model's
        stream), BatchNorm uses the batch's statistics and updates its running
        statistics in the model, as ``Model.fit`` does.

        ``outputs``: variables to write the model's outputs into, one per output, as
        ``exec(outputs=...)`` writes them (NNC's ``ccv_nnc_dynamic_graph_evaluate``
        takes its outputs so; ``outputs=[y]`` with ``y`` among the inputs runs in
        place); they are returned instead of new variables.
        """
        if outputs is None:
            return cnnp.evaluate(self, model, inputs, name, is_test)
        at = f"evaluate {name or 'model'}"
        targets = versions.output_list(self, outputs, at, cnnp.output_count(model))
        outs = cnnp.evaluate(self, model, inputs, name, is_test)
        written = versions.write_outputs(self, outs, targets, at)
        if self._models:  # outputs may be a bound model's parameters: one copy
            cnnp.sync(self)
        return written

    def parameters(self, model: Any) -> dict[str, Variable]:
        """A cnnp model's trainable parameters as variables of this graph, by id."""
        return cnnp.parameters(self, model)

    # -- reading ---------------------------------------------------------------
    def _read(self, x: Any, where: str, i: int) -> Read:
        return leaves.read(self, x, where, i)

    def _slot(self, x: Any, where: str) -> Slot:
        return leaves.slot_of(self, x, where)

    def freed_error(self, x: Variable, where: str) -> None:
        """Raises the :class:`GraphError` for using ``x`` after it was freed."""
        raise GraphError(
            f"{where}: variable {x.label} was freed (dg.free or detach of its last handle); "
            "make a new variable instead of reusing it"
        )

    def value_of(self, var: Variable) -> Any:
        """The value of ``var`` as a JAX array (in lazy mode, runs what is pending)."""
        slot = self._slot(var, "value")
        v = slot.version
        if v.value is None:
            self.flush()
        return v.value if var._view is None else self._view_value(v, var._view)

    def _view_value(self, v: Version, view: View) -> Any:
        return leaves.view_value(self, v, view)

    # -- lifetime ----------------------------------------------------------------
    def release(self, slot: Slot) -> None:
        """One handle of ``slot`` is gone (bookkeeping only: safe inside ``__del__``)."""
        slot.handles -= 1
        if slot.handles == 0:
            self._dead.append(slot)
            self._record.unpin(slot.version)

    def collect(self) -> None:
        """Prunes the record now (runs by itself as variables come and go)."""
        if self._dead:
            dead, self._dead = set(self._dead), []
            self.grads = {k: g for k, g in self.grads.items() if k[0] not in dead}
            optim.forget(self, dead)
        self._record.prune()

    @contextlib.contextmanager
    def no_grad(self) -> Iterator[None]:
        """Commands inside run (and memoise) but record nothing differentiable."""
        before, self._grad_enabled = self._grad_enabled, False
        try:
            yield
        finally:
            self._grad_enabled = before

    # -- introspection -------------------------------------------------------------
    @property
    def num_nodes(self) -> int:
        """Recorded nodes, after pruning, as NNC counts exec symbols
        (``ccv_nnc_dynamic_graph_bookkeeping_count(graph, CCV_NNC_SYMBOL_GRAPH_EXEC)``):
        one per ``exec`` of yours that is kept; the nodes that carry a write through an
        alias into its variable are part of that exec, not counted apart."""
        self.collect()
        return sum(1 for node in self._record.nodes.values() if not node.internal)

    @property
    def num_tensors(self) -> int:
        """Tensor symbols of the recorded graph as NNC counts them
        (``ccv_nnc_dynamic_graph_bookkeeping_count(graph, CCV_NNC_SYMBOL_TENSOR)``), after
        pruning: the versions recorded nodes read or write, and the values live variables
        hold that a recorded node once read or wrote and that were not detached since. A
        variable not yet used, a gradient ``backward`` gave and a detached value that no
        node uses any more have no symbol."""
        self.collect()
        return sum(
            1
            for v in self._record.versions.values()
            if v.node is not None or v.readers or (v.pins and v.linked and not v.cut)
        )

    def graph(self) -> Graph:
        """The recorded graph: leaves as inputs, held versions as outputs, with names."""
        self.collect()
        record = self._record
        leaves = [(v, None) for v in record.versions.values() if v.node is None]
        held = [(v, None) for v in record.pinned()]
        return extract(record.node_list(), names=True, outputs=held, first=leaves).graph

    def __str__(self) -> str:
        return str(self.graph())

    def __repr__(self) -> str:
        mode = "lazy" if self.lazy else "eager"
        return f"<DynamicGraph ({mode}): {self.num_nodes} nodes, {self.num_tensors} tensors>"

    # -- writes and lifetime: versions.py -------------------------------------------
    def write(self, target: Variable, value: Any) -> None:
        """Writes ``value`` (a variable, an array or a number) into ``target``.

        ``target`` keeps its shape; a number or array broadcasts to it (leading size-1
        axes dropped first, as NumPy's assignment does). Writing an alias
        makes a new version of the variable it views (``y[0] = z`` is
        ``dg.write(y[0], z)``). A constant ``target`` takes ``value``'s value only: no
        gradient flows through it, however it is written (``value`` keeps its own). An
        array that does not broadcast to ``target``'s shape is a :class:`ShapeError`.
        """
        versions.write(self, target, value)
        if self._models:  # a model's parameter written: the model sees it (one copy)
            cnnp.sync(self)

    def set(self, var: Variable, value: Any) -> None:
        """Gives ``var`` a new value (a leaf version; NNC's ``ccv_nnc_tensor_variable_set``)
        of its shape and dtype: another shape is a :class:`ShapeError`, another dtype a
        :class:`DTypeError` (convert with ``.astype`` first).

        A JAX array is taken as is, not copied: a later optimizer step that updates
        ``var`` in place spends it (reading it raises JAX's "Array has been deleted");
        pass ``jnp.array(value)`` to keep the caller's array.
        """
        versions.set_value(self, var, value)
        if self._models:
            cnnp.sync(self)

    def free(self, var: Variable) -> None:
        """Frees ``var`` now (NNC's ``ccv_nnc_tensor_variable_free``) and prunes the record."""
        versions.free(self, var)

    def detach(self, var: Variable) -> None:
        """Makes ``var`` a constant: no gradient passes through its current value any more.

        Nodes that only that value fed are pruned (NNC's ``ccv_nnc_tensor_variable_detach``).
        """
        versions.detach(self, var)

    def has_effect(
        self,
        sources: Sequence[Variable] | Variable,
        destinations: Sequence[Variable] | Variable,
    ) -> list[bool]:
        """Per variable of ``sources`` (one variable: a list of one), whether the recorded
        computation carries its value into any of ``destinations`` (NNC's
        ``ccv_nnc_dynamic_graph_has_effect_to_tensor_variables``, as a list for its
        bitmask). A detached value carries nothing on, and neither does a value read
        only by commands of constants alone, which are not recorded.

        >>> import numpy as np
        >>> from fnnc import ops
        >>> dg = DynamicGraph()
        >>> x, c = dg.variable(np.float32([2.0])), dg.constant(np.float32([3.0]))
        >>> y, k = dg.exec(ops.ewlog(), x), dg.exec(ops.mul(), c, c)
        >>> z = dg.exec(ops.mul(), y, k)
        >>> dg.has_effect([x, c, y, k], [z])
        [True, False, True, True]
        """
        return effects.has_effect(self, sources, destinations)

    # -- gradients and optimizer steps: autodiff.py, steps.py -----------------------------------
    def backward(
        self, f: Any, wrt: Any, df: Any = None, *, into: Any = None, create_graph: bool = False
    ) -> list[Variable]:
        """Accumulates the gradient of ``f`` with respect to each of ``wrt``.

        Args:
            f: a variable (or several: their gradients add up). Without ``df`` every
                element is seeded with one, as NNC does: an ``f`` of several elements
                gives the gradient of their sum.
            wrt: the variables to differentiate with respect to (aliases too).
            df: seed gradients, one per ``f``, shaped like it. With ``create_graph``
                a seed that is a trainable variable is differentiated too (the
                gradient is linear in it), as with ``jax.vjp``'s cotangent.
            into: per ``wrt``, a variable to accumulate into instead of the one
                :meth:`grad` holds (NNC passes them explicitly); it becomes that gradient.
            create_graph: record the gradient computation and return its results as
                differentiable variables (not accumulated), so a second ``backward``
                differentiates them (:mod:`.higher`).

        Returns:
            The gradient variables, one per ``wrt``; :meth:`grad` returns them too. A
            gradient that already holds a value is added to (NNC's rule); reset it with
            :meth:`zero_grad` or :meth:`set`.

        Raises:
            GraphError: ``f`` was computed from an earlier value of a ``wrt`` variable
                (before a step, ``set`` or write replaced it): compute ``f`` again.
        """
        fs, listed = autodiff._listed(f), autodiff._listed
        if len(fs) > 1 and not create_graph and len(jax.local_devices()) > 1:  # copies
            split = dp.backward_by_device(
                self, fs, listed(wrt), None if df is None else listed(df),
                None if into is None else listed(into),
            )  # fmt: skip
            if split is not None:
                return split
        return autodiff.backward(self, f, wrt, df, into, create_graph)

    def grad(self, var: Variable) -> Variable | None:
        """The gradient accumulated for ``var`` (``None`` before any backward reached it)."""
        return self.grads.get((self._slot(var, "grad"), var._view))

    def zero_grad(self, variables: Sequence[Variable] | Variable | None = None) -> None:
        """Forgets accumulated gradients (of ``variables``, one or a list; default all)."""
        if variables is None:
            self.grads.clear()
            return
        # one variable is itself, as backward's wrt (iterating it gave its rows' views,
        # whose gradients were not the ones held: zero_grad(w) silently kept w's)
        for var in autodiff._listed(variables):
            self.grads.pop((self._slot(var, "zero_grad"), var._view), None)

    def apply_gradients(self, optimizer: Any, variables: Any, *, parallel: int = 1) -> None:
        """One step of any Optax ``optimizer`` on ``variables`` from their accumulated
        gradients.

        The optimizer state is kept per variable and state structure and carried
        across steps, into any set or order of variables (Adam's moments follow each
        variable; see :mod:`.optim`); the gradients are consumed (reset) by the step.
        With ``parallel=n`` (NNC's copies, :mod:`.parallel`) each variable's gradient is
        first summed over the ``n`` copies in ``variables``.
        """
        if isinstance(parallel, bool) or parallel != 1:
            dp.apply_copies(
                self, optimizer, autodiff._listed(variables), parallel, "apply_gradients"
            )
            return
        steps.apply_gradients(self, optimizer, variables)
        cnnp.sync(self)

    def optimizer_states(self, variable: Variable) -> dict[str, Any]:
        """The optimizer states kept for ``variable``, each as the variable sees it
        (Adam's ``mu`` cut to its entry, the step count whole), keyed by the state's
        structure: one per kind of transformation that stepped it.

        >>> import numpy as np, optax
        >>> dg = DynamicGraph()
        >>> w = dg.variable(np.float32([1.0, 2.0]), name="w")
        >>> dg.minimize(optax.adam(0.1), (w * w).sum(), [w])
        >>> [int(s[0].count) for s in dg.optimizer_states(w).values()]
        [1]
        """
        return optim.states_of(self, self._slot(variable, "optimizer_states"))

    def minimize(self, optimizer: Any, f: Any, variables: Any, *, parallel: int = 1) -> None:
        """``backward(f, variables)`` and ``apply_gradients`` as one compiled program;
        with ``parallel=n`` (NNC's copies, :mod:`.parallel`), each copy's ``f`` with
        respect to its own variables, the gradients summed over the copies."""
        if isinstance(parallel, bool) or parallel != 1:
            dp.minimize_copies(self, optimizer, f, variables, parallel)
            return
        steps.minimize(self, optimizer, f, variables)
        cnnp.sync(self)

    def flush(self) -> None:
        """Runs every pending command whose result is needed (lazy mode's sync point)."""
        lazy.flush(self)

    @staticmethod
    def programs() -> int:
        """How many programs dynamic graphs hold compiled (gradients, updates, flushes)."""
        return len(PROGRAMS)


def _is_zero(value: Any) -> bool:
    """``value == 0`` for an int (NumPy's too); anything else is left to the view checks."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value == 0
