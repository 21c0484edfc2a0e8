"""Which process writes files in a multi-process JAX run: process 0, and only it.

Every process of a multi-host run executes the same program, so each would otherwise
write the same checkpoint or model file, racing on one shared path. The writers of
:mod:`fnnc.io` (:meth:`Checkpoints.save <fnnc.io.Checkpoints.save>`,
:func:`~fnnc.io.write_parameters`, hence ``Model.write``) do any work the caller needs
from every process first (gathering sharded arrays happens before they are called),
then write only where :func:`writes_files` is true; elsewhere they return without
touching the file.

>>> from fnnc.io.processes import writes_files
>>> writes_files()  # a single-process run is process 0
True
"""

from __future__ import annotations

import jax


def writes_files() -> bool:
    """Whether this process writes files: ``jax.process_index() == 0``."""
    return jax.process_index() == 0
