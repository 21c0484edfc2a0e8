"""fnnc's implementations of ``benchmarks/lm_step.py``: ``Model.fit`` and its variants
(``fnnc-xla``, ``fnnc-tuned``, ``fnnc-unfused``, ``fnnc-blockwise``, and the forced
attention layouts of :data:`ATTENTION`), and the report of where their time goes by
command (``Model.profile``)."""

from __future__ import annotations

import collections
import contextlib
import gzip
import os
import re
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

import jax.numpy as jnp

from benchmarks import _profile
from benchmarks._lm_common import LR, Result, Size, _jax_peak, _profiled, fnnc_model
from benchmarks._timing import median_time
from fnnc import config, ops
from fnnc.graph.passes import linear_crossentropy, linear_crossentropy_mean
from fnnc.graph.profile import NO_NODE, trace_file
from fnnc.models import minimizers


def by_command(report: Any, result: Result | None = None) -> dict[str, float]:
    """Milliseconds per step per command from a :class:`fnnc.graph.profile.Profile`;
    a gradient node ``<name>.backward`` counts under ``<its forward command> backward``
    (the profile's own per-command table lumps every backward under ``gradient``).
    Where ``(no node)`` holds over a quarter of the time, its first operations go to
    ``result.unplaced``."""
    forward = {r.name: r.command for r in report.nodes}
    out: dict[str, float] = {}
    for r in report.nodes:
        unplaced = r.name == NO_NODE  # XLA's copies, say; or a trace read wrongly
        if unplaced and result is not None and r.seconds > report.seconds / 4:
            result.unplaced = list(r.ops[:12])
        command = NO_NODE if unplaced else r.command
        if command == "gradient" and r.name.endswith(".backward"):
            command = f"{forward.get(r.name.removesuffix('.backward'), '?')} backward"
        out[command] = out.get(command, 0.0) + 1e3 * r.seconds
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def commands_table(results: Sequence[Result], top: int = 16) -> str:
    """fnnc's implementations side by side: ms/step of their largest commands."""
    rows = [r for r in results if r.commands]
    if not rows:
        return ""
    names = list(dict.fromkeys(c for r in rows for c in list(r.commands)[:top]))
    head = f"{'fnnc ms/step by command':40s}" + "".join(f"{r.impl:>15s}" for r in rows)
    lines = [head]
    for c in names:
        lines.append(f"{c[:40]:40s}" + "".join(f"{r.commands.get(c, 0.0):15.3f}" for r in rows))
    total = "".join(f"{sum(r.commands.values()):15.3f}" for r in rows)
    return "\n".join([*lines, f"{'all commands':40s}" + total])


@contextlib.contextmanager
def _restored(min_logits: int, mean_in_fit: bool):
    try:
        yield
    finally:
        linear_crossentropy.MIN_LOGITS = min_logits
        linear_crossentropy_mean.IN_FIT = mean_in_fit


ATTENTION = {
    "fnnc-bq128": "pallas_bq128",
    "fnnc-split": "pallas_split",
    "fnnc-fused": "pallas_fused",
    "fnnc-cudnn": "cudnn",
}
"""Variants that force one attention backend (its gradient nodes too) in the default
step: what the step would take if measurement made that layout the device's default,
timed in the same run as the default itself."""


def _forced(variant: str) -> Any:
    """The configuration a variant runs under."""
    if variant == "fnnc-xla":
        return config.override(backend="xla")
    if variant in ATTENTION:
        return config.override(
            backend_per_command={"scaled_dot_product_attention": ATTENTION[variant]}
        )
    return contextlib.nullcontext()


def run_fnnc(
    z: Size,
    data,
    params,
    variant: str,
    precision: str,
    timed: bool,
    profile: int = 0,
    keep: str | None = None,
) -> Result:
    """``Model.fit`` losses on ``data`` then, if ``timed``, ms per step; with ``profile``
    and ``keep``, the profile's trace and HLO are kept there (:func:`keep_trace`)."""
    forced = _forced(variant)
    restored = _restored(linear_crossentropy.MIN_LOGITS, linear_crossentropy_mean.IN_FIT)
    if variant == "fnnc-unfused":
        linear_crossentropy.MIN_LOGITS = 2**62
    if variant == "fnnc-blockwise":
        linear_crossentropy_mean.IN_FIT = False
    with forced, restored:  # choices are cached per configuration: stay inside
        model = fnnc_model(z)
        x, y = (jnp.asarray(a) for a in data[0])
        model.compile(
            [x], loss="softmax_crossentropy", minimizer=minimizers.adam(LR), precision=precision
        )
        model.set_parameters(params)
        if variant == "fnnc-tuned":
            model.autotune([x], [y])
        losses = [float(model.fit([jnp.asarray(a)], [jnp.asarray(b)])) for a, b in data]
        ms = 1e3 * median_time(lambda: model.fit([x], [y]), repeats=5, inner=5) if timed else None

        def estimate() -> int:
            m = model.engine._last_fit.program.memory()
            return m.argument_bytes + m.output_bytes + m.temp_bytes - m.alias_bytes

        peak, kind = _jax_peak(estimate) if timed else (None, "")
        result = Result(variant, ms, peak, kind, losses)
        if variant == "fnnc-tuned":
            result.note = "tuned: " + tuned_choices(ops.autotune.TABLE)
        return _profiled(
            result,
            profile,
            lambda: _profile.jax_kernels(lambda: model.fit([x], [y]), profile),
            lambda: fnnc_commands(model, x, y, profile, result, keep),
        )


def fnnc_commands(
    model: Any, x: Any, y: Any, runs: int, result: Result, keep: str | None = None
) -> dict[str, float]:
    """:func:`by_command` of ``Model.profile``; where the nodes hold under half of the
    kernels' time (``result.kernels``, measured first), ``result.trace`` gets a sample
    of the trace, so that a GPU run shows why attribution failed."""
    with tempfile.TemporaryDirectory(prefix="lm-step-profile-") as folder:
        commands = by_command(model.profile([x], [y], runs=runs, log_dir=folder), result)
        placed = sum(ms for c, ms in commands.items() if c != NO_NODE)
        lost = placed < sum(result.kernels.values()) / 2
        hlo = model.engine._last_fit.program.compiled_text() if lost or keep else ""
        if lost:
            result.trace = _profile.trace_sample(folder, hlo)
        if keep:
            keep_trace(folder, hlo, keep, result.impl, runs)
    return commands


def keep_trace(folder: str, hlo: str, keep: str, name: str, runs: int) -> None:
    """``<keep>/<name>.xplane.pb.gz`` (the newest trace under ``folder``, of ``runs``
    runs) and ``<keep>/<name>.hlo.txt.gz`` (the optimised HLO it ran, after a line
    ``# runs=N``): what ``benchmarks/trace_report.py`` reads on any machine, so that a
    GPU session's profile can be studied after the GPU is gone."""
    source = trace_file(folder)
    os.makedirs(keep, exist_ok=True)
    trace = os.path.join(keep, f"{name}.xplane.pb.gz")
    with open(source, "rb") as src, gzip.open(trace, "wb") as dst:
        shutil.copyfileobj(src, dst)
    with gzip.open(os.path.join(keep, f"{name}.hlo.txt.gz"), "wt") as dst:
        dst.write(f"# runs={runs}\n{hlo}")


_OF = re.compile(r"\('of', Command\(name='([^']+)'")
"""A gradient command's key names the command it differentiates in its ``of`` parameter."""


def _tuned_command(key: str) -> str:
    """The command of an autotune table key (:func:`fnnc.core.dispatch.table_key`); a
    gradient node's as ``<its forward command> backward``."""
    name = key.split("|", 1)[0]
    of = _OF.search(key) if name == "gradient" else None
    return f"{of.group(1)} backward" if of else name


def tuned_choices(table: Mapping[str, str]) -> str:
    """The autotune table's entries (what later compiles read: ``Model.autotune`` tunes
    the fit and evaluate programs, keyed by command, parameters and shapes), counted by
    command and backend: ``gemm:xla x24, scaled_dot_product_attention backward:pallas x1``."""
    counts = collections.Counter(f"{_tuned_command(k)}:{v}" for k, v in table.items())
    return ", ".join(f"{k} x{n}" for k, n in sorted(counts.items())) or "nothing to choose"
