"""Autotuning: time the eligible backends of a command on real shapes, keep the winner.

The table (:data:`TABLE`, owned by :mod:`fnnc.core.dispatch`) maps
``key(command, specs, platform)`` to a backend name; every backend choice consults it
and every write to it invalidates cached programs. It is plain JSON on disk, so a tuned
table can ship with a deployment.

Example:
    >>> import jax.numpy as jnp
    >>> from fnnc import ops
    >>> ops.autotune.autotune(ops.relu(), jnp.ones((4, 4)))
    'xla'
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
import types
from typing import Any

import jax

from fnnc.core.command import Command
from fnnc.core.dispatch import TABLE, as_specs, backends_of, compiled_forward, why_not
from fnnc.core.dispatch import table_key as key
from fnnc.core.files import atomic_write
from fnnc.errors import GraphFormatError

__all__ = ["TABLE", "autotune", "key", "load", "median_seconds", "save"]


def median_seconds(fns: dict[str, Any], *args: Any, repeats: int = 5) -> dict[str, float]:
    """Median seconds per call of each function on ``args`` (each called once first, to
    compile), the functions taking turns every round so a slow spell hits all alike."""
    for fn in fns.values():
        jax.block_until_ready(fn(*args))
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            jax.block_until_ready(fn(*args))
            samples[name].append(time.perf_counter() - start)
    return {name: statistics.median(s) for name, s in samples.items()}


def autotune(cmd: Command, *arrays: Any, repeats: int = 5, platform: str | None = None) -> str:
    """Times every backend that compiles here and supports ``arrays``; records the winner.

    Interpret-mode backends are not timed: they are never a speed choice.

    Returns:
        The winning backend's name (also stored in :data:`TABLE`).
    """
    platform = platform or jax.default_backend()
    specs = as_specs(arrays, str(cmd))
    fns = {
        name: compiled_forward(cmd, name)
        for name, backend in backends_of(cmd.name).items()
        if platform in backend.platforms and not why_not(backend, cmd, specs, platform)
    }
    times = median_seconds(fns, *arrays, repeats=repeats)
    winner = min(times, key=times.__getitem__)
    TABLE[key(cmd, specs, platform)] = winner
    return winner


def save(path: str | os.PathLike[str]) -> None:
    """Writes :data:`TABLE` as JSON, atomically (temp file + rename)."""
    atomic_write(path, json.dumps(dict(TABLE), indent=1, sort_keys=True))


def load(path: str | os.PathLike[str]) -> None:
    """Merges a table written by :func:`save` into :data:`TABLE`."""
    with open(path) as f:
        data = json.load(f)
    if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
        raise GraphFormatError(f"{path}: not an fnnc autotune table (expected a JSON object)")
    TABLE.update(data)


class _CallableModule(types.ModuleType):
    """``fnnc.ops.autotune(cmd, *arrays)`` is :func:`autotune` (the name the issues and
    NNC's ``ccv_nnc_cmd_autotune`` use for the tuner itself), while the module keeps
    ``TABLE``, ``save``, ``load`` and ``key`` as attributes."""

    def __call__(self, cmd: Command, *arrays: Any, **options: Any) -> str:
        return autotune(cmd, *arrays, **options)


sys.modules[__name__].__class__ = _CallableModule
