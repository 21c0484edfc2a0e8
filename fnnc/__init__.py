"""fnnc: NNC's layered neural-network design (libccv) rebuilt on JAX.

Layers, bottom to top: :mod:`fnnc.core` (commands and the IR), :mod:`fnnc.ops` (NNC's
commands and their backends), :mod:`fnnc.graph` (the symbolic graph, its passes and
the dynamic graph), :mod:`fnnc.io` (NNC's tensor files, checkpoints), and
:mod:`fnnc.models` (cnnp models, imported on first use). See README.md for a tour.
"""

import importlib
from typing import Any

from fnnc import config as config
from fnnc import core as core
from fnnc import errors as errors
from fnnc import graph as graph
from fnnc import io as io
from fnnc import ops as ops
from fnnc.errors import FnncError as FnncError

__version__ = "0.1.0"

_LAZY = ("models", "data")


def __getattr__(name: str) -> Any:
    # The model layer pulls in Flax; it loads when first used (``fnnc.models``).
    if name in _LAZY:
        return importlib.import_module(f"fnnc.{name}")
    raise AttributeError(f"module 'fnnc' has no attribute {name!r}")
