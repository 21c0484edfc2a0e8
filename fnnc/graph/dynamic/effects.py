"""Which variables a dynamic graph's recorded computation carries to which:
:meth:`DynamicGraph.has_effect` (NNC's ``ccv_nnc_dynamic_graph_has_effect_to_tensor_variables``).

A variable affects another when a path of recorded nodes leads from the version it
holds to the version the other holds. A detached version passes nothing on, and the
commands of constants alone are not recorded (:mod:`.record`): their inputs reach
nothing through them, as in NNC, which records neither.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from .record import Version
from .variable import Variable

if TYPE_CHECKING:
    from .graph import DynamicGraph


def has_effect(
    dg: DynamicGraph,
    sources: Sequence[Variable] | Variable,
    destinations: Sequence[Variable] | Variable,
) -> list[bool]:
    """Per source, whether recorded nodes carry its current value into any of
    ``destinations``' current values. One variable on either side is itself (it was
    iterated into its rows: a [3, 2] source gave three answers)."""
    if isinstance(sources, Variable):
        sources = [sources]
    if isinstance(destinations, Variable):
        destinations = [destinations]
    reached: set[int] = set()
    stack: list[Version] = [dg._slot(d, "has_effect").version for d in destinations]
    seen: set[int] = set()
    while stack:
        version = stack.pop()
        if version.id in seen or version.node is None:
            continue
        seen.add(version.id)
        for read, _ in version.node.inputs:
            if read.cut:  # detached: as a constant, it passes nothing on
                continue
            reached.add(read.id)
            stack.append(read)
    return [dg._slot(s, "has_effect").version.id in reached for s in sources]
