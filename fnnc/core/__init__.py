"""fnnc's ground floor: commands and the IR they form, shared by every layer.

As JAX keeps ``Primitive`` and ``Jaxpr`` together in its core, fnnc keeps here what a
command and a graph need of each other: a command may hold a graph (loops, branches,
fused chains) and a graph holds commands.

- :mod:`~fnnc.core.command`: :class:`Command`, :class:`OpDef`, :func:`defcommand` and
  the registry.
- :mod:`~fnnc.core.ir`: the frozen SSA records (:class:`Graph`, :class:`TensorSymbol`,
  :class:`AliasSymbol`, :class:`Node`).
- :mod:`~fnnc.core.evaluate`: :func:`run_nodes`, the one node-by-node semantics that
  ``interpret``, ``compile`` and sub-graph commands share.
- :mod:`~fnnc.core.dispatch`: backends, the autotune table and the selection rule
  (from :mod:`~fnnc.core.backends`, :mod:`~fnnc.core.selection` and
  :mod:`~fnnc.core.compiled`), and eager calls.
- :mod:`~fnnc.core.platforms`: platform names (``cuda`` is ``gpu``), checked.
- :mod:`~fnnc.core.text`: the SSA printer.
- :mod:`~fnnc.core.dtypes`: float kinds as JAX counts them (bfloat16 is floating).

This package imports no other fnnc package but :mod:`fnnc.errors` and
:mod:`fnnc.config`. Users normally reach these names through :mod:`fnnc.ops` and
:mod:`fnnc.graph`.
"""

from fnnc.core.command import Attributes as Attributes
from fnnc.core.command import BackwardNode as BackwardNode
from fnnc.core.command import Command as Command
from fnnc.core.command import OpDef as OpDef
from fnnc.core.command import Uses as Uses
from fnnc.core.command import defcommand as defcommand
from fnnc.core.command import lookup as lookup
from fnnc.core.command import registry as registry
from fnnc.core.dispatch import Backend as Backend
from fnnc.core.dispatch import select_backend as select_backend
from fnnc.core.evaluate import run_nodes as run_nodes
from fnnc.core.ir import AliasSymbol as AliasSymbol
from fnnc.core.ir import Graph as Graph
from fnnc.core.ir import Node as Node
from fnnc.core.ir import TensorSymbol as TensorSymbol
from fnnc.core.text import format_graph as format_graph
