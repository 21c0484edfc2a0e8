"""The case type the registry sweep runs; each family lists its cases in cases_<family>.py."""

from __future__ import annotations

import dataclasses
from typing import Any

from fnnc.ops import Command


@dataclasses.dataclass
class Case:
    """One command on concrete inputs.

    Attributes:
        cmd: the command.
        inputs: concrete NumPy inputs (float inputs are perturbed for the numeric check).
        id: a readable test id.
        numeric: run the finite-difference gradient check (turn off for kinks,
            e.g. max pooling ties, or random commands).
        rtol, atol: tolerances of the comparisons in float32.
        grad_inputs: indices of inputs whose gradient is checked; default all float ones.
        numeric_float32: run the finite-difference check in float32 (for commands whose
            results are float32 whatever their inputs, e.g. ``gradient`` nodes, which
            cast to the specs they carry); looser tolerances, larger step.
        sweep_float64: the backend sweep (``test_backend_sweep.py``) also compares every
            backend that takes this case in float64 with the reference, to 1e-9 (one
            compile per backend: set it on the few cases that reach each code path).
    """

    cmd: Command
    inputs: tuple[Any, ...]
    id: str
    numeric: bool = True
    rtol: float = 1e-4
    atol: float = 1e-5
    grad_inputs: tuple[int, ...] | None = None
    numeric_float32: bool = False
    sweep_float64: bool = False
