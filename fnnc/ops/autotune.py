"""Autotuning: time the eligible backends of a command on real shapes, keep the winner.

The table (:data:`TABLE`, owned by :mod:`fnnc.core.dispatch`) maps
``key(command, specs, platform)`` to a backend name; every backend choice consults it
and every write to it invalidates cached programs. It is plain JSON on disk, so a tuned
table can ship with a deployment: ``{"format": "fnnc.autotune", "version": 2,
"entries": {key: backend}}``. A key names where its winner was measured (the device
kind, the JAX version and the matmul precision), so a table tuned on another GPU kind
or under another JAX loads but does not apply. A table of an earlier fnnc (a bare
``{key: backend}`` object, keyed without them) loads with a warning and contributes
nothing: tune again on this machine.

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
import warnings
from typing import Any

import jax

from fnnc.core.command import Command
from fnnc.core.dispatch import (
    PLATFORMS,
    REFERENCE,
    TABLE,
    as_specs,
    backends_of,
    checked_inputs,
    compiled_forward,
    platform_scope,
    why_not,
)
from fnnc.core.dispatch import table_key as key
from fnnc.core.files import atomic_write, locked
from fnnc.core.platforms import platform_name
from fnnc.errors import BackendError, CommandError, ConfigError, GraphFormatError

FORMAT, VERSION = "fnnc.autotune", 2
"""The table file's format and version (version 1: a bare ``{key: backend}`` object,
keyed without device kind, JAX version and matmul precision)."""

__all__ = [
    "PLATFORMS",
    "TABLE",
    "as_specs",
    "autotune",
    "check_repeats",
    "key",
    "load",
    "median_seconds",
    "save",
    "timing_target",
]


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

    ``arrays`` are checked as an eager call ``cmd(*arrays)`` checks them (lists are made
    arrays, an optional input may be ``None``, the shape rule must accept them). Interpret-
    mode backends are not timed: they are never a speed choice. A call that leaves out an
    optional input before a given one times the reference only (the one backend such a
    call runs, as eagerly).

    Args:
        cmd: the command, hyper-parameters bound.
        *arrays: its inputs.
        repeats: timed calls per backend, at least 1 (the median counts).
        platform: ``"cpu"``, ``"gpu"`` or ``"tpu"``: where the backends are timed (on
            its first device) and the winner applies; default JAX's default backend.

    Returns:
        The winning backend's name (also stored in :data:`TABLE`).

    Raises:
        BackendError: ``repeats`` below 1, a platform name fnnc does not know, or one
            with no device here.
        CommandError: ``cmd`` is no command (a name such as ``"gemm"``, or the factory
            ``ops.gemm`` not called).
    """
    if not isinstance(cmd, Command):  # "gemm" was an AttributeError on .definition
        raise CommandError(
            f"autotune: expected a Command with its hyper-parameters bound (e.g. "
            f"fnnc.ops.gemm(transpose_b=True)), got {type(cmd).__name__} {cmd!r:.60}"
        )
    platform, device = timing_target(platform, repeats, "autotune")
    arrays, specs, _ = checked_inputs(cmd, arrays)
    gap = any(s is None for s in specs)
    with platform_scope(platform):  # a forward choosing backends chooses for platform
        fns = {
            name: compiled_forward(cmd, name)
            for name, backend in backends_of(cmd.name).items()
            if platform in backend.platforms
            and why_not(backend, cmd, specs, platform) is None
            and not (gap and name != REFERENCE)
        }
    times = median_seconds(fns, *jax.device_put(arrays, device), repeats=repeats)
    winner = min(times, key=times.__getitem__)
    TABLE[key(cmd, specs, platform)] = winner
    return winner


def timing_target(platform: str | None, repeats: int, where: str) -> tuple[str, Any]:
    """``(platform, its first device)``: ``platform`` (default JAX's default backend)
    in fnnc's spelling (:func:`~fnnc.core.platforms.platform_name`: ``"cuda"`` is
    ``"gpu"``), checked to be present here, for timing there, and
    ``repeats`` checked to be at least 1.

    Raises:
        BackendError: ``repeats`` below 1, an unknown platform name, or one with no
            device in this process (timing elsewhere would record another platform's
            winner under its name).
    """
    check_repeats(repeats, where)
    try:  # the names compile and select_backend take: 'cuda' and 'rocm' are 'gpu'
        platform = platform_name(platform, where)
    except ConfigError as e:
        raise BackendError(str(e)) from None
    try:
        return platform, jax.devices(platform)[0]
    except RuntimeError:
        present = sorted({d.platform for d in jax.devices()})
        raise BackendError(
            f"{where}: platform {platform!r} has no device in this process (present: "
            f"{present}); winners are timed where they apply, so tune on a {platform} "
            "machine and load its table here with fnnc.ops.autotune.load"
        ) from None


def check_repeats(repeats: Any, where: str) -> None:
    """Refuses a ``repeats`` that is no int of at least 1 (``True`` is no count) with a
    :class:`~fnnc.errors.BackendError` naming ``where``."""
    if not isinstance(repeats, int) or isinstance(repeats, bool) or repeats < 1:
        raise BackendError(f"{where}: repeats must be an int >= 1, got {repeats!r}")


def save(path: str | os.PathLike[str]) -> None:
    """Merges :data:`TABLE` into the table file at ``path`` (made if missing) as JSON,
    atomically (temp file + rename).

    Entries already in the file stay unless this process's table holds the same key
    (then its winner replaces the file's), so processes tuning different shapes can save
    to one file in turn, as :func:`load` merges. To drop stale entries, delete the file
    first (a table of an earlier fnnc, which no key here matches, is replaced). Saves
    from several processes at once are serialized by a lock
    (:func:`fnnc.core.files.locked`), so none loses another's entries.

    Raises:
        GraphFormatError: the file at ``path`` is not an fnnc autotune table (it is left
            as it is).
    """
    with locked(path):
        data = {"format": FORMAT, "version": VERSION, "entries": _merged(path)}
        atomic_write(path, json.dumps(data, indent=1, sort_keys=True))


def _merged(path: str | os.PathLike[str]) -> dict[str, str]:
    """The table in the file at ``path`` (none if missing) updated with :data:`TABLE`."""
    try:
        on_disk, _ = _read(path)
    except FileNotFoundError:
        on_disk = {}
    except GraphFormatError as e:
        raise GraphFormatError(f"save: {e}; save to another path or remove it") from None
    return {**on_disk, **TABLE}


def load(path: str | os.PathLike[str]) -> None:
    """Merges a table written by :func:`save` into :data:`TABLE`.

    A table of an earlier fnnc (version 1, keyed without device kind, JAX version and
    matmul precision) matches no key here: it loads nothing, with a warning.

    Raises:
        GraphFormatError: the file is not JSON, not an fnnc autotune table, of a
            newer version, or with the format key and a version other than the int
            2 (no fnnc writes that: version 1 had no format key).
    """
    entries, legacy = _read(path)
    if legacy:
        warnings.warn(
            f"autotune table {path}: its {legacy} entries were saved by an earlier fnnc, "
            "keyed without the device kind, JAX version and matmul precision they were "
            "measured under, so none is used; tune again here and save",
            stacklevel=2,
        )
    TABLE.update(entries)


def _read(path: str | os.PathLike[str]) -> tuple[dict[str, str], int]:
    """``(entries, legacy)``: the table in the file at ``path``, checked; ``legacy``
    counts the entries of a version-1 table, which are left out (none matches)."""
    with open(path) as f:
        try:
            data = json.load(f)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:  # text, or other bytes
            raise GraphFormatError(
                f"{path}: not an fnnc autotune table (not JSON: {e}); write one with "
                "fnnc.ops.autotune.save"
            ) from None
    if isinstance(data, dict) and data.get("format") == FORMAT:
        version, entries = data.get("version"), data.get("entries")
        if type(version) is int and version > VERSION:
            raise GraphFormatError(
                f"{path}: an fnnc autotune table of version {version!r}; this fnnc reads "
                f"up to {VERSION}: tune again with it, or upgrade fnnc"
            )
        if type(version) is not int or version != VERSION:  # True, 1.0, "2" included
            raise GraphFormatError(
                f"{path}: an fnnc autotune table of version {version!r}, which fnnc never "
                f"writes (version 1 was a JSON object of entries alone, without "
                f"{FORMAT!r}; this fnnc writes {VERSION}): the file is damaged or was "
                "edited; tune again and save"
            )
        if isinstance(entries, dict) and all(isinstance(v, str) for v in entries.values()):
            return entries, 0
    elif isinstance(data, dict) and all(isinstance(v, str) for v in data.values()):
        return {}, len(data)  # version 1: keys without where they were measured
    raise GraphFormatError(
        f"{path}: not an fnnc autotune table (expected a JSON object with format "
        f"{FORMAT!r}, version {VERSION} and its entries)"
    )


class _CallableModule(types.ModuleType):
    """``fnnc.ops.autotune(cmd, *arrays)`` is :func:`autotune` (the name the issues and
    NNC's ``ccv_nnc_cmd_autotune`` use for the tuner itself), while the module keeps
    ``TABLE``, ``save``, ``load`` and ``key`` as attributes."""

    def __call__(self, cmd: Command, *arrays: Any, **options: Any) -> str:
        return autotune(cmd, *arrays, **options)


sys.modules[__name__].__class__ = _CallableModule
