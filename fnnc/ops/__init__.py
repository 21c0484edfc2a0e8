"""fnnc commands: NNC's ops as frozen, hashable values (``ops.gemm(transpose_b=True)``).

A command is built by its factory and called on arrays to run eagerly, or added to a
graph with :meth:`fnnc.graph.GraphBuilder.exec`:

>>> import jax.numpy as jnp
>>> from fnnc import ops
>>> ops.gemm(transpose_b=True)(jnp.ones((2, 3)), jnp.ones((4, 3))).shape
(2, 4)

Each command has a shape rule, a reference forward (the ``"xla"`` backend), a backward
in NNC's convention and attributes; :func:`registry` lists them all.
"""

from fnnc.ops import autotune as autotune
from fnnc.ops.backends import Backend as Backend
from fnnc.ops.backends import backends_of as backends_of
from fnnc.ops.backends import register_backend as register_backend
from fnnc.ops.backends import select_backend as select_backend
from fnnc.ops.command import ALL_INPUTS as ALL_INPUTS
from fnnc.ops.command import NOTHING as NOTHING
from fnnc.ops.command import Attributes as Attributes
from fnnc.ops.command import Command as Command
from fnnc.ops.command import OpDef as OpDef
from fnnc.ops.command import Uses as Uses
from fnnc.ops.command import defcommand as defcommand
from fnnc.ops.command import lookup as lookup
from fnnc.ops.command import registry as registry
from fnnc.ops.constant import Literal as Literal
from fnnc.ops.constant import constant as constant

# --- families (importing registers them) ---
from fnnc.ops.blas import add as add
from fnnc.ops.blas import gemm as gemm
from fnnc.ops.blas import mul as mul
from fnnc.ops.blas import scalar_mul as scalar_mul
from fnnc.ops.elementwise import clamp as clamp
from fnnc.ops.elementwise import ewabs as ewabs
from fnnc.ops.elementwise import ewdiv as ewdiv
from fnnc.ops.elementwise import ewexp as ewexp
from fnnc.ops.elementwise import ewlog as ewlog
from fnnc.ops.elementwise import ewprod as ewprod
from fnnc.ops.elementwise import ewsqrt as ewsqrt
from fnnc.ops.elementwise import ewsum as ewsum
from fnnc.ops.elementwise import max as max  # noqa: A004
from fnnc.ops.elementwise import min as min  # noqa: A004
from fnnc.ops.elementwise import select as select
# --- data, activation, reduce, norm ---
# --- conv, pool, loss, attention, rnn, random, embedding ---
# --- primitive (trace) ---
