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
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from fnnc import config
from fnnc.core.command import output_specs
from fnnc.core.ir import AliasSymbol, Graph, Node, Symbol, TensorSymbol, contiguous_strides
from fnnc.errors import CommandError, DTypeError, FnncError, GraphError, ShapeError
from fnnc.ops import Command
from fnnc.ops.constant import constant as constant_cmd


class GraphBuilder:
    """Builds a :class:`Graph` one symbol and node at a time.

    Symbols it returns are frozen values; pass them back to :meth:`exec`, :meth:`alias`
    and :meth:`build`. A builder can keep going after :meth:`build`.
    """

    def __init__(self) -> None:
        self._symbols: list[Symbol] = []
        self._nodes: list[Node] = []
        self._inputs: list[int] = []

    @classmethod
    def from_graph(cls, graph: Graph) -> GraphBuilder:
        """A builder holding ``graph``'s symbols, nodes and inputs, to extend (passes).

        Symbols of ``graph`` are symbols of the new builder, so a pass can pass them
        straight to :meth:`exec`.
        """
        builder = cls()
        builder._symbols = list(graph.symbols)
        builder._nodes = list(graph.nodes)
        builder._inputs = list(graph.inputs)
        return builder

    def add_input(self, sym: TensorSymbol) -> None:
        """Makes an existing, unwritten tensor symbol a graph input (appended last)."""
        self._known(sym, "add_input")
        self._inputs.append(sym.id)

    # -- symbols ---------------------------------------------------------------
    def input(self, shape: Sequence[int], dtype: Any = np.float32, name: str = "") -> TensorSymbol:
        """A graph input of ``shape`` and ``dtype``, fed by callers in creation order."""
        sym = self.tensor(shape, dtype, name)
        self._inputs.append(sym.id)
        return sym

    def tensor(self, shape: Sequence[int], dtype: Any = np.float32, name: str = "") -> TensorSymbol:
        """A tensor symbol not yet written (write it via ``exec(outputs=)`` or aliases)."""
        dtype = jax.dtypes.canonicalize_dtype(np.dtype(dtype))
        sym = TensorSymbol(len(self._symbols), tuple(int(n) for n in shape), dtype, name)
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
                ``sum(offset[d] * stride[d])`` (NNC's rule). Default zeros.
            stride: per view axis, in elements of the root's flat buffer. Default:
                the root's strides when ranks agree (a slice), else the view's own
                contiguous strides (a reshape).
            base: the flat start in the root's buffer, instead of ``offset`` (passes
                use it to copy a view's exact placement).
        """
        parent = self._known(of, "alias")
        root = self._symbols[parent.root]
        shape = tuple(int(n) for n in shape)
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
        stride = tuple(int(s) for s in stride)
        offset = tuple(int(o) for o in (offset or (0,) * len(shape)))
        if not len(offset) == len(stride) == len(shape):
            raise ShapeError(
                f"alias of {self._label(of)}: shape {list(shape)}, offset {list(offset)} and "
                f"stride {list(stride)} must have one entry per view axis"
            )
        start = (parent.base if parent.is_alias else 0) + sum(o * s for o, s in zip(offset, stride))
        base = start if base is None else int(base)
        sym = AliasSymbol(len(self._symbols), root.id, shape, root.dtype, base, stride, name)
        size = int(np.prod(root.shape, dtype=np.int64))
        if base < 0 or (0 not in shape and sym.last_index() >= size):
            raise ShapeError(
                f"alias {name or ''} of {self._label(of)}: view {list(shape)} at base {base} with "
                f"stride {list(stride)} reaches element {sym.last_index()}, but the root "
                f"{self._label(root)} has {size} elements"
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
            *inputs: symbols of this builder.
            outputs: existing symbols (tensors or aliases) to write instead of new ones.
            name: the node's name (shown in listings and errors).
        """
        if not isinstance(cmd, Command):
            raise CommandError(
                f"exec {name!r}: expected a Command (e.g. fnnc.ops.relu()), got "
                f"{type(cmd).__name__}; call the factory to build one"
            )
        ins = tuple(self._known(s, f"node {name or cmd.name}") for s in inputs)
        where = f"node {name!r} ({cmd.name})" if name else f"node {cmd.name}"
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
            outs = tuple(self._known(s, where) for s in outputs)
            self._check_outputs(where, outs, specs)
        self._nodes.append(Node(cmd, tuple(s.id for s in ins), tuple(s.id for s in outs), name))
        return outs[0] if len(outs) == 1 else outs

    def build(self, outputs: Sequence[Symbol], *, out_tree: Any = None) -> Graph:
        """The graph so far, returning ``outputs``; verified when checks are on."""
        outs = tuple(self._known(s, "build").id for s in outputs)
        graph = Graph(tuple(self._symbols), tuple(self._nodes), tuple(self._inputs), outs, out_tree)
        if config.get().checks:
            from fnnc.graph.verify import verify

            verify(graph)
        return graph

    # -- helpers ---------------------------------------------------------------
    def _known(self, sym: Any, where: str) -> Symbol:
        if not isinstance(sym, (TensorSymbol, AliasSymbol)):
            raise CommandError(
                f"{where}: expected a tensor symbol of this builder, got {type(sym).__name__} "
                f"{sym!r}; wrap values with builder.constant(value)"
            )
        if sym.id >= len(self._symbols) or self._symbols[sym.id] != sym:
            raise GraphError(f"{where}: symbol {self._label(sym)} belongs to another builder")
        return sym

    def _check_outputs(self, where: str, outs: tuple[Symbol, ...], specs: tuple[Any, ...]) -> None:
        if len(outs) != len(specs):
            raise GraphError(
                f"{where}: the command has {len(specs)} outputs, {len(outs)} were given"
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


def _is_contiguous(sym: AliasSymbol) -> bool:
    """Whether the view covers consecutive root elements in row-major order."""
    want = contiguous_strides(sym.shape)
    return all(s == w for n, s, w in zip(sym.shape, sym.stride, want) if n != 1)


def _spec(sym: Symbol) -> str:
    return f"{np.dtype(sym.dtype).name}{list(sym.shape)}"
