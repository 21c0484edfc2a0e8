"""Graph passes: pure functions ``Graph -> Graph`` that return their argument when
nothing changed, so pipelines detect a fixpoint with ``is``.

* :func:`cse` merges equal computations, :func:`fold` folds constants and algebraic
  identities, :func:`fuse` fuses NNC's patterns and elementwise chains, :func:`dce`
  drops dead nodes, :func:`compact` renumbers symbols densely.
* :func:`simplify` runs them to a fixpoint; :func:`run_passes` runs any tuple of
  passes, verifying and printing between them as :mod:`fnnc.config` says (each
  pass's time, node counts and diff: :class:`PassReport`, :func:`graph_diff`).
* :func:`fold` and the loss fusions of :func:`fuse` are written with the rewrite
  toolkit users get (:mod:`fnnc.graph.rules`, :mod:`fnnc.graph.rewrite`).
* :func:`map_subgraphs` applies a pass inside the sub-graphs commands hold.
* :func:`fuse_linear_crossentropy` turns a dense layer feeding the softmax
  cross-entropy loss into one blockwise ``linear_softmax_crossentropy`` node (before
  ``backward``; ``Model.fit`` runs it on its step); :func:`fuse_linear_crossentropy_mean`
  then makes one whose mean is the loss compute its gradient in the forward (training
  graphs: it saves the backward's recomputed logits).
* :func:`backward` appends gradient nodes (NNC's symbolic reverse mode);
  :func:`minimize` adds an Optax update so a training step is one graph;
  :func:`minimize_scaled` is the same with float16 dynamic loss scaling.
* :func:`cast_precision` computes a graph in bfloat16 or float16 (mixed precision),
  parameters and outputs kept in their types.
"""

from fnnc.graph.passes._subgraphs import map_subgraphs as map_subgraphs
from fnnc.graph.passes.backward import backward as backward
from fnnc.graph.passes.compact import compact as compact
from fnnc.graph.passes.constrain_activations import (
    constrain_activations as constrain_activations,
)
from fnnc.graph.passes.cse import cse as cse
from fnnc.graph.passes.dce import dce as dce
from fnnc.graph.passes.fold import fold as fold
from fnnc.graph.passes.fuse import fuse as fuse
from fnnc.graph.passes.linear_crossentropy import (
    fuse_linear_crossentropy as fuse_linear_crossentropy,
)
from fnnc.graph.passes.linear_crossentropy_mean import (
    fuse_linear_crossentropy_mean as fuse_linear_crossentropy_mean,
)
from fnnc.graph.passes.loss_scale import minimize_scaled as minimize_scaled
from fnnc.graph.passes.memory_compression import memory_compression as memory_compression
from fnnc.graph.passes.memory_reduction import memory_reduction as memory_reduction
from fnnc.graph.passes.minimize import TrainLayout as TrainLayout
from fnnc.graph.passes.minimize import minimize as minimize
from fnnc.graph.passes.pipeline import PassReport as PassReport
from fnnc.graph.passes.pipeline import graph_diff as graph_diff
from fnnc.graph.passes.pipeline import run_passes as run_passes
from fnnc.graph.passes.pipeline import simplify as simplify
from fnnc.graph.passes.precision import cast_precision as cast_precision
from fnnc.graph.passes.remat import remat as remat
