"""fnnc: NNC's layered neural-network design (libccv) rebuilt on JAX.

Layers: commands (:mod:`fnnc.ops`), the symbolic graph and its passes
(:mod:`fnnc.graph`), and errors (:mod:`fnnc.errors`). See README.md for a tour.
"""

from fnnc import config as config
from fnnc import errors as errors
from fnnc import io as io
from fnnc import ops as ops
from fnnc.errors import FnncError as FnncError

__version__ = "0.1.0"
