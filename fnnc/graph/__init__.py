"""fnnc's symbolic graph: immutable SSA data, passes as pure functions, compile and interpret.

Build a graph by hand or trace a JAX function into one, then interpret it (the
oracle) or compile it into one jitted XLA program:

>>> import numpy as np
>>> from fnnc import ops
>>> from fnnc.graph import GraphBuilder, compile, interpret
>>> b = GraphBuilder()
>>> x = b.input((2, 3), name="x")
>>> w = b.input((4, 3), name="w")
>>> y = b.exec(ops.relu(), b.exec(ops.gemm(transpose_b=True), x, w, name="fc"))
>>> graph = b.build([y])
>>> print(graph)
graph(%0:f32[2,3] x, %1:f32[4,3] w) {
  %2:f32[2,4] = gemm[transpose_b=True](%0, %1)  # fc
  %3:f32[2,4] = relu(%2)
  return %3
}
>>> xs = (np.ones((2, 3), np.float32), np.ones((4, 3), np.float32))
>>> bool((compile(graph)(*xs) == interpret(graph, *xs)).all())
True

Passes are written as data: a :class:`Pat` and a replacement make a :class:`Rule`,
and :func:`graph_rewrite` runs rules to a fixpoint (:func:`replace_pattern` takes both
sides as plain functions, traced); a :class:`Rewriter` edits a graph by hand (insert,
replace all uses, remove). :func:`check_pass` runs a graph before and after a pass and
names the first node that differs. ``compile(graph, passes=[...])``,
``Model.compile(..., passes=...)`` and ``DynamicGraph(lazy=True, passes=...)`` run them.

>>> from fnnc.graph import Pat, Rule
>>> leaky = Rule(Pat.op("relu", Pat.var("x")), lambda m: m.exec(ops.leaky_relu(), m["x"]))
>>> print(graph_rewrite(graph, [leaky]).nodes[1].cmd)
leaky_relu
"""

from fnnc.core.ir import AliasSymbol as AliasSymbol
from fnnc.core.ir import Graph as Graph
from fnnc.core.ir import Node as Node
from fnnc.core.ir import TensorSymbol as TensorSymbol
from fnnc.core.text import to_dot as to_dot
from fnnc.graph.autotune import autotune_graph as autotune_graph
from fnnc.graph.builder import GraphBuilder as GraphBuilder
from fnnc.graph.check import PassCheck as PassCheck
from fnnc.graph.check import PassCheckError as PassCheckError
from fnnc.graph.check import check_pass as check_pass
from fnnc.graph.compile import MemoryReport as MemoryReport
from fnnc.graph.compile import Program as Program
from fnnc.graph.compile import compile as compile
from fnnc.graph.control import case_of as case_of
from fnnc.graph.control import while_loop as while_loop
from fnnc.graph.dynamic import DynamicGraph as DynamicGraph
from fnnc.graph.inline import inline as inline
from fnnc.graph.interpret import interpret as interpret
from fnnc.graph.matching import Match as Match
from fnnc.graph.memory import MemoryPlan as MemoryPlan
from fnnc.graph.memory import memory_plan as memory_plan
from fnnc.graph.numerics import Stats as Stats
from fnnc.graph.numerics import tensor_stats as tensor_stats
from fnnc.graph.passes import PassReport as PassReport
from fnnc.graph.passes import TrainLayout as TrainLayout
from fnnc.graph.passes import backward as backward
from fnnc.graph.passes import cast_precision as cast_precision
from fnnc.graph.passes import compact as compact
from fnnc.graph.passes import constrain_activations as constrain_activations
from fnnc.graph.passes import cse as cse
from fnnc.graph.passes import dce as dce
from fnnc.graph.passes import fold as fold
from fnnc.graph.passes import fuse as fuse
from fnnc.graph.passes import map_subgraphs as map_subgraphs
from fnnc.graph.passes import memory_compression as memory_compression
from fnnc.graph.passes import memory_reduction as memory_reduction
from fnnc.graph.passes import minimize as minimize
from fnnc.graph.passes import remat as remat
from fnnc.graph.passes import run_passes as run_passes
from fnnc.graph.passes import simplify as simplify
from fnnc.graph.pattern import Pat as Pat
from fnnc.graph.pattern_functions import pattern_of as pattern_of
from fnnc.graph.pattern_functions import replace_pattern as replace_pattern
from fnnc.graph.pattern_functions import traced_rule as traced_rule
from fnnc.graph.pipeline import pipeline as pipeline
from fnnc.graph.profile import Profile as Profile
from fnnc.graph.profile import profile as profile
from fnnc.graph.rewrite import Rewriter as Rewriter
from fnnc.graph.rules import Rule as Rule
from fnnc.graph.rules import graph_rewrite as graph_rewrite
from fnnc.graph.rules import rewrite_pass as rewrite_pass
from fnnc.graph.scan import scan as scan
from fnnc.graph.serialize import from_data as from_data
from fnnc.graph.serialize import load as load
from fnnc.graph.serialize import save as save
from fnnc.graph.serialize import to_data as to_data
from fnnc.graph.sharding import Shardings as Shardings
from fnnc.graph.sharding import data_parallel as data_parallel
from fnnc.graph.sharding_roles import Role as Role
from fnnc.graph.sharding_roles import find_roles as find_roles
from fnnc.graph.sharding_rules import ShardingRules as ShardingRules
from fnnc.graph.sharding_rules import parameter_specs as parameter_specs
from fnnc.graph.sharding_rules import state_specs as state_specs
from fnnc.graph.sharding_rules import tensor_parallel as tensor_parallel
from fnnc.graph.trace import trace as trace
from fnnc.graph.verify import verify as verify

# DESIGN.md's and issue 3's names for the two sub-graph nodes: the same builders.
While = while_loop
CaseOf = case_of
