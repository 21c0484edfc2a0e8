"""GraphBuilder: the one mutable object of the graph layer.

Example: NNC's autograd example, w = x*x, u = 1/x, v = log u, z = w + v.

>>> import numpy as np
>>> from fnnc import ops
>>> from fnnc.graph import GraphBuilder, interpret
>>> b = GraphBuilder()
>>> x = b.input((), name="x")
>>> w = b.exec(ops.ewprod(), x, x, name="w")
>>> u = b.exec(ops.ewdiv(), b.constant(np.float32(1)), x, name="u")
>>> z = b.exec(ops.ewsum(), w, b.exec(ops.ewlog(), u, name="v"), name="z")
>>> graph = b.build([z])
>>> round(float(interpret(graph, np.float32(0.84))), 6)
0.879953

A graph input may be made without a shape and given one after the computation is
written (:meth:`GraphBuilder.set_shape`, NNC's ``ccv_nnc_tensor_symbol_set``): the
shapes that depend on it are inferred at :meth:`~GraphBuilder.build` (see
:mod:`fnnc.graph._deferred`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from fnnc import config
from fnnc.core.command import output_specs
from fnnc.core.ir import (
    AliasSymbol,
    Graph,
    Node,
    Symbol,
    TensorSymbol,
    contiguous_strides,
    unit_axes_apart,
)
from fnnc.errors import CommandError, DTypeError, FnncError, GraphError, ShapeError
from fnnc.ops import Command
from fnnc.ops.constant import constant as constant_cmd
from fnnc.ops.data import reshape as reshape_cmd

from . import _deferred
from ._builder_args import (
    _dtype,
    _ints,
    _is_contiguous,
    _listed,
    _shape,
    _spec,
    without_trailing_none,
)


class GraphBuilder:
    """Builds a :class:`Graph` one symbol and node at a time.

    Symbols it returns are frozen values; pass them back to :meth:`exec`, :meth:`alias`
    and :meth:`build`. A builder can keep going after :meth:`build`.
    """

    def __init__(self) -> None:
        self._symbols: list[Symbol] = []
        self._nodes: list[Node] = []
        self._inputs: list[int] = []
        self._auto: dict[int, TensorSymbol] = {}  # id -> the shape-less symbol handed out
        # shapes known only at build: inputs made without a shape, outputs of the
        # nodes that read them (pending: their shape rules run at build)
        self._deferred: set[int] = set()
        self._pending: list[int] = []
        self._source: Graph | None = None  # from_graph's: its in_paths, while inputs are

    @classmethod
    def from_graph(cls, graph: Graph) -> GraphBuilder:
        """A builder holding ``graph``'s symbols, nodes and inputs, to extend (passes).

        Symbols of ``graph`` are symbols of the new builder, so a pass can pass them
        straight to :meth:`exec`. While its inputs stay ``graph``'s, :meth:`build` keeps
        ``graph.in_paths`` (the argument structure checks of traced graphs).
        """
        builder = cls()
        builder._source = graph
        builder._symbols = list(graph.symbols)
        builder._nodes = list(graph.nodes)
        builder._inputs = list(graph.inputs)
        return builder

    def add_input(self, sym: TensorSymbol) -> None:
        """Makes an existing, unwritten tensor symbol a graph input (appended last).

        A symbol made without a shape (``tensor(None)``, NNC's auto tensor) becomes an
        input like ``input(None)``: nodes may read it, and :meth:`set_shape` gives it
        its shape before :meth:`build`.
        """
        held = self._known(sym, "add_input")
        self._inputs.append(held.id)
        if held.shape is None and not held.is_alias:
            self._deferred.add(held.id)

    # -- symbols ---------------------------------------------------------------
    def input(
        self, shape: Sequence[int] | None, dtype: Any = np.float32, name: str = ""
    ) -> TensorSymbol:
        """A graph input of ``shape`` and ``dtype``, fed by callers in creation order.

        ``shape=None``: the shape is set later with :meth:`set_shape` (NNC's
        ``ccv_nnc_tensor_symbol_set``), after the nodes that read the input are added;
        their shapes, and those of the nodes after them, are inferred at :meth:`build`.
        """
        sym = self._new(shape, dtype, name, "input")
        self._inputs.append(sym.id)
        if shape is None:
            self._deferred.add(sym.id)
        return sym

    def set_shape(
        self, symbol: TensorSymbol, shape: Sequence[int], dtype: Any = None
    ) -> TensorSymbol:
        """Gives a graph input made without a shape its shape (NNC's
        ``ccv_nnc_tensor_symbol_set``; ``set_tensor_symbol_shape`` is the same method).

        The nodes that read it may already be there: every shape that depends on it is
        inferred at :meth:`build`. It may be set again before a later build (NNC sets a
        symbol's parameters and compiles again).

        Args:
            symbol: a graph input made with ``input(None)``.
            shape: its shape.
            dtype: its dtype; default the one ``input()`` was given.

        Returns:
            The input with its shape (the shape-less symbol stays usable).

        >>> import numpy as np
        >>> from fnnc import ops
        >>> from fnnc.graph import GraphBuilder, interpret
        >>> b = GraphBuilder()
        >>> a = b.input(None, name="a")
        >>> y = b.exec(ops.ewlog(), a, name="log")
        >>> _ = b.set_shape(a, (1,))
        >>> graph = b.build([y])
        >>> graph.output_specs[0].shape, round(float(interpret(graph, np.float32([1.25]))[0]), 5)
        ((1,), 0.22314)
        """
        held = self._known(symbol, "set_shape")
        where = f"set_shape {self._label(held)}"
        if held.id not in self._inputs or held.id not in self._deferred:
            made = (
                "a view"
                if held.is_alias
                else (
                    f"made with shape {list(held.shape)}, and the nodes reading it were shaped then"
                    if held.id in self._inputs and held.shape is not None
                    else "not a graph input; its shape comes from the node that writes it"
                )
            )
            raise GraphError(
                f"{where}: it is {made}; set_shape gives a shape to a graph input made with "
                "input(None)"
            )
        dtype = held.dtype if dtype is None else _dtype(dtype, where)
        if dtype is None:  # an auto tensor made an input (add_input): float32, as tensor()
            dtype = np.dtype(np.float32)
        sym = TensorSymbol(held.id, _shape(shape, where, auto=False), dtype, held.name)
        self._symbols[held.id] = sym
        return sym

    set_tensor_symbol_shape = set_shape

    def tensor(
        self, shape: Sequence[int] | None, dtype: Any = None, name: str = ""
    ) -> TensorSymbol:
        """A tensor symbol not yet written (write it via ``exec(outputs=)`` or aliases).

        ``shape=None`` is NNC's auto shape (``ccv_nnc_tensor_symbol_new`` with auto
        parameters): the node that writes the symbol (``exec(cmd, x, outputs=[t])``)
        fills its shape, and its dtype unless ``dtype`` is given. ``exec`` returns the
        filled symbol; the shape-less one stays usable in later calls. ``dtype=None``
        means float32 for a tensor with a shape.
        """
        return self._new(shape, dtype, name, "tensor")

    def _new(self, shape: Any, dtype: Any, name: str, kind: str) -> TensorSymbol:
        where = f"{kind} {name!r}" if name else kind
        sid = len(self._symbols)
        if shape is None:  # auto: shape (and dtype, unless given) come from the writer
            auto_dtype = None if dtype is None else _dtype(dtype, where)
            sym = TensorSymbol(sid, None, auto_dtype, name)  # type: ignore[arg-type]
            self._auto[sid] = sym
        else:
            dtype = np.float32 if dtype is None else dtype
            sym = TensorSymbol(sid, _shape(shape, where), _dtype(dtype, where), name)
        self._symbols.append(sym)
        return sym

    def constant(self, value: Any, dtype: Any = None, name: str = "") -> TensorSymbol:
        """A ``constant`` node producing ``value``; returns its output."""
        return self.exec(constant_cmd(value, dtype), name=name)

    def alias(
        self,
        of: Symbol,
        shape: Sequence[int],
        offset: Sequence[int] | None = None,
        stride: Sequence[int] | None = None,
        name: str = "",
        base: int | None = None,
    ) -> AliasSymbol:
        """A view of ``of``, NNC's ``ccv_nnc_tensor_symbol_alias_new``.

        Args:
            of: the tensor (or alias) to view.
            shape: the view's shape.
            offset: per view axis, where the view starts; the flat start is
                ``sum(offset[d] * stride[d])`` (NNC's rule). Default zeros. For a view
                of a view it counts from the parent view's start (as NNC's dynamic
                graph does); NNC's symbolic ``ccv_nnc_tensor_symbol_alias_new`` counts
                an alias of an alias from the root: port those with ``base=``.
            stride: per view axis, in elements of the root's flat buffer. Default:
                the root's strides when ranks agree (a slice), else the view's own
                contiguous strides (a reshape).
            base: the flat start in the root's buffer, instead of ``offset`` (passes
                use it to copy a view's exact placement).
        """
        if self._known(of, "alias").root in self._deferred:
            raise GraphError(
                f"alias of {self._label(of)}: its shape is known only at build (a graph input "
                "made with input(None), which set_shape may change, or a result computed "
                "from one); a view needs a fixed shape: give input() the shape, or use "
                "commands (ops.reshape, ...)"
            )
        parent = self._shaped(of, "alias")
        root = self._symbols[parent.root]
        where = f"alias {name!r} of {self._label(of)}" if name else f"alias of {self._label(of)}"
        shape = _shape(shape, where, auto=False)
        if stride is None:
            if len(shape) == len(parent.shape) and not parent.is_alias:
                stride = contiguous_strides(root.shape)
            elif parent.is_alias and len(shape) == len(parent.shape):
                stride = parent.stride
            elif parent.is_alias and not _is_contiguous(parent):
                raise ShapeError(
                    f"alias{' ' + name if name else ''} of {self._label(of)}: a reshape "
                    f"{list(shape)} of the strided view {list(parent.shape)} (stride "
                    f"{list(parent.stride)}) is not a view of consecutive elements; pass "
                    "stride= explicitly, or reshape a contiguous tensor"
                )
            else:
                stride = contiguous_strides(shape)
        stride = _ints(stride, "stride", where)
        offset = _ints(offset or (0,) * len(shape), "offset", where)
        if not len(offset) == len(stride) == len(shape):
            raise ShapeError(
                f"alias of {self._label(of)}: shape {list(shape)}, offset {list(offset)} and "
                f"stride {list(stride)} must have one entry per view axis"
            )
        start = (parent.base if parent.is_alias else 0) + sum(o * s for o, s in zip(offset, stride))
        base = start if base is None else int(base)
        sym = AliasSymbol(len(self._symbols), root.id, shape, root.dtype, base, stride, name)
        size = int(np.prod(root.shape, dtype=np.int64))
        if sym.outside(size):
            reach = sym.last_index() if sym.first_index() >= 0 else sym.first_index()
            raise ShapeError(
                f"alias {name or ''} of {self._label(of)}: view {list(shape)} at base {base} with "
                f"stride {list(stride)} reaches element {reach}, but the root "
                f"{self._label(root)} has {size} elements (0 to {size - 1})"
            )
        self._symbols.append(sym)
        return sym

    # -- nodes -----------------------------------------------------------------
    def exec(
        self,
        cmd: Command,
        *inputs: Symbol,
        outputs: Sequence[Symbol] | None = None,
        name: str = "",
    ) -> Any:
        """Adds ``outputs = cmd(*inputs)``; returns the output symbol (a tuple if several).

        The command's shape rule runs now, so a mismatch raises here, naming the node.

        Args:
            cmd: a command, e.g. ``ops.gemm(transpose_b=True)``.
            *inputs: symbols of this builder; trailing ``None`` are left out (optional
                inputs not given), an input before a given one cannot be.
            outputs: existing symbols (tensors or aliases) to write instead of new ones;
                ``None`` for an output not kept (NNC's ``NO_TENSOR_SYMBOL``) gets a new
                symbol, returned in its place.
            name: the node's name (shown in listings and errors).
        """
        if not isinstance(cmd, Command):
            raise CommandError(
                f"exec {name!r}: expected a Command (e.g. fnnc.ops.relu()), got "
                f"{type(cmd).__name__}; call the factory to build one"
            )
        where = f"node {name!r} ({cmd.name})" if name else f"node {cmd.name}"
        inputs = without_trailing_none(inputs, where, cmd.name)
        held = [self._known(s, f"node {name or cmd.name}") for s in inputs]
        if any(s.id in self._deferred for s in held):
            return self._exec_later(cmd, held, outputs, name, where)
        for s in held:
            if s.shape is None:
                raise GraphError(f"node {name or cmd.name}: {self._auto_problem(s)}")
        ins = tuple(held)
        try:
            specs = output_specs(cmd, [s.spec for s in ins])
        except FnncError as e:
            listing = ", ".join(f"{self._label(s)}:{_spec(s)}" for s in ins)
            raise type(e)(f"{where}: {e}\n  inputs: {listing or '(none)'}") from None
        if outputs is None:
            outs = tuple(
                self.tensor(
                    s.shape, s.dtype, name if len(specs) == 1 else f"{name}.{i}" if name else ""
                )
                for i, s in enumerate(specs)
            )
        else:
            listed = _listed(outputs, where, "outputs=")
            if len(listed) != len(specs):  # before any None gets a symbol
                self._check_outputs(where, tuple(listed), specs)
            outs = tuple(
                self._known(self.tensor(tuple(spec.shape), spec.dtype) if s is None else s, where)
                for s, spec in zip(listed, specs)
            )
            outs = self._fill_auto(where, outs, specs)
        given, outs, reshapes = outs, *self._reshaped_outputs(outs, specs)
        self._check_outputs(where, outs, specs)
        self._nodes.append(Node(cmd, tuple(s.id for s in ins), tuple(s.id for s in outs), name))
        self._nodes.extend(reshapes)
        return given[0] if len(given) == 1 else given

    def _reshaped_outputs(
        self, outs: tuple[Symbol, ...], specs: tuple[Any, ...]
    ) -> tuple[tuple[Symbol, ...], list[Node]]:
        """NNC writes a command's result into an output of the same elements: a given
        output whose shape differs from the result's only by size-1 axes (a reduction's
        ``[1, 3]`` into a ``[3]`` tensor) gets the result through a ``reshape`` node, as
        the dynamic graph's ``exec(..., outputs=)`` does. ``(what the command writes,
        the reshape nodes)``."""
        written, reshapes = list(outs), []
        for i, (sym, spec) in enumerate(zip(outs, specs)):
            same = sym.shape is not None and np.dtype(sym.dtype) == np.dtype(spec.dtype)
            if not same or tuple(sym.shape) == tuple(spec.shape):
                continue
            if not unit_axes_apart(sym.shape, spec.shape):
                continue  # a real mismatch: _check_outputs says so
            written[i] = self.tensor(tuple(spec.shape), spec.dtype)
            reshape = reshape_cmd(shape=tuple(sym.shape))
            reshapes.append(Node(reshape, (written[i].id,), (sym.id,), ""))
        return tuple(written), reshapes

    def build(
        self,
        outputs: Sequence[Symbol],
        *,
        out_tree: Any = None,
        in_paths: Sequence[str] | None = None,
    ) -> Graph:
        """The graph so far, returning ``outputs``; verified when checks are on.

        ``out_tree`` and ``in_paths`` are the structure of the outputs and the key path of
        each input (see :class:`~fnnc.core.ir.Graph`); a pass that rebuilds a traced graph
        with the same inputs passes the source graph's, so its callers keep them. A
        builder made by :meth:`from_graph` whose inputs are still the source's keeps the
        source's paths without being told.
        """
        source = self._source
        if in_paths is None and source is not None and source.inputs == tuple(self._inputs):
            in_paths = source.in_paths
        outs = tuple(self._known(s, "build").id for s in _listed(outputs, "build", "outputs"))
        symbols = self._symbols
        if self._pending:
            symbols = _deferred.resolve(
                symbols, self._nodes, self._pending, self._label, self._auto_problem
            )
        for sid in self._auto:
            if symbols[sid].shape is None:
                raise GraphError(f"build: {self._auto_problem(symbols[sid])}")
        paths = None if in_paths is None else tuple(in_paths)
        graph = Graph(
            tuple(symbols), tuple(self._nodes), tuple(self._inputs), outs, out_tree, paths
        )
        if config.get().checks:
            from fnnc.graph.verify import verify

            verify(graph)
        return graph

    # -- helpers ---------------------------------------------------------------
    def _exec_later(
        self,
        cmd: Command,
        ins: Sequence[Symbol],
        outputs: Sequence[Symbol] | None,
        name: str,
        where: str,
    ) -> Any:
        """Adds a node reading a symbol whose shape is known only at build (pending)."""
        cmd.definition.check_arity(len(ins), where)
        if outputs is None:
            n = _deferred.count_outputs(cmd, ins)
            names = [name] if n == 1 else [f"{name}.{i}" if name else "" for i in range(n)]
            outs = tuple(self.tensor(None, None, label) for label in names)
        else:
            listed = _listed(outputs, where, "outputs=")
            outs = tuple(self._known(self.tensor(None) if s is None else s, where) for s in listed)
            for sym in outs:
                if sym.id in self._inputs:
                    raise GraphError(f"{where}: {self._written_input(sym)}")
        self._deferred.update(s.id for s in outs if s.shape is None)
        self._pending.append(len(self._nodes))
        self._nodes.append(Node(cmd, tuple(s.id for s in ins), tuple(s.id for s in outs), name))
        return outs[0] if len(outs) == 1 else outs

    def _known(self, sym: Any, where: str) -> Symbol:
        """``sym`` as this builder holds it now (an auto symbol comes back filled)."""
        if not isinstance(sym, (TensorSymbol, AliasSymbol)):
            raise CommandError(
                f"{where}: expected a tensor symbol of this builder, got {type(sym).__name__} "
                f"{sym!r}; wrap values with builder.constant(value)"
            )
        if sym.id >= len(self._symbols):
            raise GraphError(f"{where}: symbol {self._label(sym)} belongs to another builder")
        held = self._symbols[sym.id]
        if held != sym and self._auto.get(sym.id) != sym and not self._earlier_shape(sym, held):
            raise GraphError(f"{where}: symbol {self._label(sym)} belongs to another builder")
        return held

    def _earlier_shape(self, sym: Symbol, held: Symbol) -> bool:
        """``sym`` is what an earlier :meth:`set_shape` of the input ``held`` returned."""
        return (
            held.id in self._deferred
            and isinstance(sym, TensorSymbol)
            and sym.name == held.name
            and sym.id in self._inputs
        )

    def _shaped(self, sym: Any, where: str) -> Symbol:
        """:meth:`_known`, for uses that need the shape (node inputs, views)."""
        held = self._known(sym, where)
        if held.shape is None:
            raise GraphError(f"{where}: {self._auto_problem(held)}")
        return held

    def _auto_problem(self, sym: Symbol) -> str:
        label = self._label(sym)
        if sym.id in self._deferred and sym.id not in self._inputs:
            return (
                f"tensor {label}, whose shape is inferred at build (it depends on a graph "
                "input made with input(None))"
            )
        if sym.id in self._inputs:
            return (
                f"graph input {label}, which has no shape (input(None)): give it one with "
                "builder.set_shape(input, shape) before build (NNC's "
                "ccv_nnc_tensor_symbol_set), or give input() a shape"
            )
        return (
            f"tensor {label} has no shape yet (made with shape=None, NNC's auto shape, which "
            "the node writing it fills); write it first with exec(..., outputs=[it]), or "
            "give tensor() a shape; if callers feed it (NNC's ccv_nnc_tensor_symbol_set "
            "after the nodes), make it a graph input: input(None) (or add_input(it) before the "
            "nodes reading it), then set_shape(it, shape)"
        )

    def _written_input(self, sym: Symbol) -> str:
        return (
            f"graph input {self._label(sym)} is an output here, but callers feed graph "
            "inputs and no node writes a graph input; write a tensor() instead"
        )

    def _fill_auto(self, where: str, outs: tuple[Symbol, ...], specs: Any) -> tuple[Symbol, ...]:
        """Gives the auto symbols among ``outs`` the specs the command produces."""
        filled = []
        for sym, spec in zip(outs, specs):
            if sym.id in self._inputs and sym.id in self._deferred:
                raise GraphError(f"{where}: {self._written_input(sym)}")
            if sym.shape is None:
                dtype = np.dtype(spec.dtype) if sym.dtype is None else sym.dtype
                sym = TensorSymbol(sym.id, tuple(spec.shape), dtype, sym.name)
                self._symbols[sym.id] = sym
            filled.append(sym)
        return tuple(filled)

    def _check_outputs(self, where: str, outs: tuple[Symbol, ...], specs: tuple[Any, ...]) -> None:
        if len(outs) != len(specs):
            raise GraphError(
                f"{where}: the command has {len(specs)} outputs, {len(outs)} were given; "
                "pass one per output, None for one not kept (NNC's NO_TENSOR_SYMBOL)"
            )
        for sym, spec in zip(outs, specs):
            if sym.shape != tuple(spec.shape):
                raise ShapeError(
                    f"{where}: output {self._label(sym)} is {_spec(sym)}, but the command "
                    f"produces {np.dtype(spec.dtype).name}{list(spec.shape)}"
                )
            if np.dtype(sym.dtype) != np.dtype(spec.dtype):
                raise DTypeError(
                    f"{where}: output {self._label(sym)} is {_spec(sym)}, but the command "
                    f"produces {np.dtype(spec.dtype).name}{list(spec.shape)}"
                )

    def _label(self, sym: Symbol) -> str:
        return f"%{sym.id} ({sym.name})" if sym.name else f"%{sym.id}"
