"""NNC's dynamic graph: commands run now on variables while a symbolic graph is recorded.

Each :meth:`DynamicGraph.exec` runs its command eagerly (one cached executable per
command value) and records a node; :meth:`DynamicGraph.backward` differentiates the
recorded graph with fnnc's symbolic ``backward`` pass (no tape, no ``jax.grad``), on
the minimal sub-graph from ``wrt`` to ``f``, compiled once per graph structure:

>>> import numpy as np
>>> from fnnc import ops
>>> from fnnc.graph import DynamicGraph
>>> dg = DynamicGraph()
>>> x = dg.variable(np.float32([19.0]), name="x")
>>> y = dg.variable(np.float32([1.2]), name="y")
>>> f = x * dg.exec(ops.ewlog(), x) + x * y
>>> round(float(f.numpy()[0]), 4)               # 19 log 19 + 1.2 * 19
78.7443
>>> dx, dy = dg.backward(f, [x, y])
>>> round(float(dx.numpy()[0]), 6), float(dy.numpy()[0])
(5.144439, 19.0)
>>> print(dg)
graph(%0:f32[1] x, %1:f32[1] y, %2:f32[1] grad(x), %3:f32[1] grad(y)) {
  %4:f32[1] = ewlog(%0)
  %5:f32[1] = ewprod(%0, %4)
  %6:f32[1] = ewprod(%0, %1)
  %7:f32[1] = ewsum(%5, %6)
  return %0, %1, %7, %2, %3
}

Gradients accumulate into the gradient variables (NNC's rule): call ``backward``
again and ``dg.grad(x)`` grows; :meth:`~DynamicGraph.zero_grad` resets them.
:meth:`~DynamicGraph.apply_gradients` and :meth:`~DynamicGraph.minimize` step any
Optax transformation, keeping its state per variable set.

Memory stays bounded: a node is recorded only while it lies on a path from a live
trainable variable to a live variable; freeing (:meth:`~DynamicGraph.free`, or
Python dropping a variable) and :meth:`~DynamicGraph.detach` prune the rest. Aliases
(``x[0]``, ``x.reshape(...)``, :meth:`~DynamicGraph.alias`) view a variable; writing
one makes a new SSA version. ``DynamicGraph(lazy=True)`` records only and runs what is
needed at a sync point as one compiled program. :meth:`~DynamicGraph.evaluate` runs a
whole graph (a traced model, a program) as one node that gradients flow through.
"""

from fnnc.graph.dynamic.graph import DynamicGraph as DynamicGraph
from fnnc.graph.dynamic.variable import Variable as Variable
