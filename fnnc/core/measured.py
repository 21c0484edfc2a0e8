"""Measured backend defaults: which backend runs a command when nothing is forced or tuned.

A priority alone never makes a kernel the default. On an accelerator, the default for a
command comes from timings shipped with the package (``measured_defaults.json`` beside
this file), keyed by the device kind (``jax.devices()[0].device_kind``, e.g.
``"NVIDIA H100 80GB HBM3"``), the command and a shape class (:func:`shape_class`). They
are produced by the autotuner and regenerated on a device by one command::

    python -m fnnc.ops.measure_defaults          # writes this device's entries

Where a device kind, command or shape class has no entry, the backends' priorities
decide, and only backends that win by construction carry a priority above 0 (flash
attention against materialised scores; CPU convolution rules that were measured when
written, see :mod:`fnnc.ops.conv_cpu`). Every other kernel stays on XLA until measured.

The file holds ``{"format": 1, "devices": {kind: {command: {class: backend}}},
"sources": {kind: "how it was measured"}}``; a class of ``"*"`` stands for every class
of that command. Gradient nodes look up the command they differentiate.
"""

from __future__ import annotations

import functools
import json
import math
import os
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

import jax

from fnnc.core.command import Spec
from fnnc.core.files import atomic_write, locked
from fnnc.errors import BackendError, GraphFormatError

PATH = pathlib.Path(__file__).with_name("measured_defaults.json")
FORMAT = 1
SIZES = ((2**16, "small"), (2**22, "medium"))
"""Upper bounds (elements of the largest input, exclusive) of the small and medium
classes; anything bigger is ``large``."""

_table: dict[str, dict[str, dict[str, str]]] | None = None


def shape_class(specs: Sequence[Spec | None]) -> str:
    """``"<dtype>:<size>"`` of the inputs: the first input's dtype, and ``small``,
    ``medium`` or ``large`` by the element count of the largest input."""
    given = [s for s in specs if s is not None]
    if not given:
        return "none:small"
    elements = max(math.prod(s.shape) for s in given)
    size = next((name for bound, name in SIZES if elements < bound), "large")
    return f"{given[0].dtype.name}:{size}"


@functools.cache
def device_kind(platform: str) -> str | None:
    """The kind of the first device of ``platform``; ``None`` where it has none here."""
    try:
        return jax.devices(platform)[0].device_kind
    except RuntimeError:
        return None


def read(path: str | os.PathLike[str] = PATH) -> dict[str, Any]:
    """The whole file at ``path`` (``{"format", "devices", "sources"}``)."""
    try:
        data = json.loads(pathlib.Path(path).read_text())
    except FileNotFoundError:
        return {"format": FORMAT, "devices": {}, "sources": {}}
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise GraphFormatError(f"measured defaults {path}: not JSON ({e})") from None
    except OSError as e:  # unreadable: say which file and what to do, not a raw error
        raise GraphFormatError(
            f"measured defaults {path}: cannot be read ({e}); make it readable "
            "(chmod a+r), or regenerate it with `python -m fnnc.ops.measure_defaults`"
        ) from None
    got = f"format {data.get('format')!r}" if isinstance(data, dict) else type(data).__name__
    if got != f"format {FORMAT!r}" or not isinstance(data.get("devices"), dict):
        raise GraphFormatError(
            f"measured defaults {path}: expected format {FORMAT} with a 'devices' mapping, "
            f"got {got}; regenerate it with "
            "`python -m fnnc.ops.measure_defaults`"
        )
    for kind, per in data["devices"].items():
        problem = _entries_problem(per)
        if problem:
            raise GraphFormatError(
                f"measured defaults {path}: device {kind!r}: {problem}; expected "
                "{command: {shape class: backend name}}; regenerate it with "
                "`python -m fnnc.ops.measure_defaults`"
            )
    return data


def _entries_problem(per: Any) -> str | None:
    """What is wrong with one device's entries (``None``: ``{command: {class: name}}``)."""
    if not isinstance(per, dict):
        return f"got a {type(per).__name__}"
    for command, classes in per.items():
        if not isinstance(classes, dict):
            return f"command {command!r} maps to a {type(classes).__name__}"
        for cls, name in classes.items():
            if not isinstance(name, str):
                return f"command {command!r}, class {cls!r}: backend {name!r} is no name"
    return None


def _devices_problem(devices: Any) -> str | None:
    """What is wrong with ``{device kind: entries}`` (``None``: nothing)."""
    if not isinstance(devices, Mapping):
        return f"got a {type(devices).__name__}"
    for kind, per in devices.items():
        problem = _entries_problem(per)
        if problem:
            return f"device {kind!r}: {problem}"
    return None


def table() -> Mapping[str, Mapping[str, Mapping[str, str]]]:
    """The defaults in force: ``{device kind: {command: {shape class: backend}}}``."""
    global _table
    if _table is None:
        _table = read()["devices"]
    return _table


def use(devices: Mapping[str, Mapping[str, Mapping[str, str]]] | None) -> None:
    """Replaces the defaults in force (``None``: the shipped file again). Callers that
    cache backend choices must also move the dispatch state
    (:func:`fnnc.core.dispatch.use_measured_defaults` does both)."""
    global _table
    if devices is not None:
        problem = _devices_problem(devices)
        if problem:  # not a bare AttributeError at the next backend choice
            raise BackendError(
                f"use_measured_defaults: {problem}; expected {{device kind: {{command: "
                "{shape class: backend name}}}, e.g. {'cpu': {'gemm': {'*': 'xla'}}}"
            )
        devices = {k: {c: dict(v) for c, v in per.items()} for k, per in devices.items()}
    _table = devices


def lookup(command: str, specs: Sequence[Spec | None], platform: str) -> str | None:
    """The measured default backend of ``command`` on these inputs here, or ``None``."""
    kind = device_kind(platform)
    per = table().get(kind or "", {}).get(command)
    if not per:
        return None
    return per.get(shape_class(specs)) or per.get("*")


def write(
    kind: str,
    entries: Mapping[str, Mapping[str, str]],
    source: str,
    path: str | os.PathLike[str] = PATH,
) -> None:
    """Merges ``entries`` (``{command: {class: backend}}``) for device ``kind`` into the
    file at ``path``, atomically (temp file + rename), under a lock against other writers
    (:func:`fnnc.core.files.locked`)."""
    with locked(path):
        data = read(path)
        per = data["devices"].setdefault(kind, {})
        for command, classes in entries.items():
            per.setdefault(command, {}).update(classes)
        data.setdefault("sources", {})[kind] = source
        atomic_write(path, json.dumps(data, indent=1, sort_keys=True) + "\n")
