"""Which elements of its root a view (alias) reads: do they repeat, do two views meet.

The backward pass sends a view's gradient back to the view's root. Where the view
reads an element twice (stride 0, sliding windows) the contributions must add up, and
where several views read disjoint parts of one root their gradients can share one
root-shaped tensor instead of one each and a sum (NNC writes them into one gradient
tensor too). Both answers must be exact when they say yes: a wrong "distinct" loses
gradient. So each test tries a cheap sufficient rule on the strides first and counts
the elements themselves only for views of at most :data:`EXACT_LIMIT` elements;
otherwise it answers no, and the caller takes the path that is right for any view.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from fnnc.core.ir import AliasSymbol

EXACT_LIMIT = 1 << 20
"""Views (or pairs of views) up to this many elements are checked element by element."""


def size(view: AliasSymbol) -> int:
    return int(np.prod(view.shape, dtype=np.int64))


def distinct(view: AliasSymbol) -> bool:
    """Whether ``view`` reads no element of its root twice."""
    dims = sorted((s, n) for n, s in zip(view.shape, view.stride) if n > 1)
    extent = 1  # elements spanned by the dimensions of smaller strides
    for stride, n in dims:
        if stride < extent:
            break
        extent = stride * (n - 1) + extent
    else:
        return True
    if size(view) > EXACT_LIMIT:
        return False
    idx = view.flat_indices().reshape(-1)
    return len(np.unique(idx)) == idx.size


def disjoint(a: AliasSymbol, b: AliasSymbol) -> bool:
    """Whether views ``a`` and ``b`` of one root read no element in common."""
    if a.last_index() < b.first_index() or b.last_index() < a.first_index():
        return True
    if size(a) + size(b) > EXACT_LIMIT:
        return False
    return not np.intersect1d(a.flat_indices(), b.flat_indices()).size


Part = tuple[AliasSymbol, Any]
"""A view and the gradient that reached it."""


def disjoint_groups(parts: Sequence[Part]) -> list[tuple[bool, list[Part]]]:
    """``parts`` (view, gradient) in groups, in order, each with whether its view repeats
    an element: such a view is a group of its own; the others group with views that are
    pairwise :func:`disjoint` from them."""
    groups: list[tuple[bool, list[Part]]] = []
    for view, g in parts:
        if not distinct(view):
            groups.append((True, [(view, g)]))
            continue
        for repeats, group in groups:
            if not repeats and all(disjoint(view, v) for v, _ in group):
                group.append((view, g))
                break
        else:
            groups.append((False, [(view, g)]))
    return groups
