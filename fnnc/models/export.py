"""A compiled model as one ``jax.export`` artifact: StableHLO that plain JAX runs.

:func:`export` (``Model.export``) serializes the model's inference (test mode) with
``jax.export``: a file that JAX loads and runs with no fnnc code, on the platforms it
was lowered for, at any batch size when the batch is symbolic::

    import jax, numpy as np
    exported = jax.export.deserialize(bytearray(open("model.jax", "rb").read()))
    y = exported.call(np.ones((5, 4), np.float32))            # parameters embedded
    y = exported.call(params, np.ones((5, 4), np.float32))    # parameters passed in

How: the model's forward graph is built for one sample as
:meth:`~fnnc.models.Model.evaluate` runs it (``compile``'s ``precision`` cast and
``passes`` included) and each node runs its
command's reference forward (:func:`fnnc.graph.interpret`); ``jax.vmap`` maps it over
the leading axis of every input, which ``jax.export`` keeps symbolic (``batch``, a
dimension name). So every input and output must have the batch first and the model
must treat samples independently in test mode, which export checks against
:meth:`~fnnc.models.Model.evaluate` on the example batch. A symbolic batch is at least 1
(``jax.export``'s dimension variables are), so such an artifact refuses an empty batch,
which :meth:`~fnnc.models.Model.predict` takes. ``batch=None`` exports the graph as
built, for the example shapes only.

With ``parameters="embedded"`` the parameters (internals included) are constants in
the module; with ``"argument"`` the function's first argument is a dict of them by id
(as :meth:`~fnnc.models.Model.parameters` gives them), so one artifact runs any
weights of the architecture. ``python -m fnnc inspect FILE`` prints the signature.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from fnnc import config
from fnnc.core.files import atomic_write
from fnnc.core.params import require_flag
from fnnc.core.platforms import platform_name
from fnnc.errors import ConfigError, ModelError
from fnnc.graph import interpret
from fnnc.graph.check import close, draw, max_error
from fnnc.models.pipeline import Pipeline

PARAMETERS = ("embedded", "argument")


def _specs(model: Any, inputs: Sequence[Any] | None) -> list[jax.ShapeDtypeStruct]:
    if inputs is None:
        specs = model.engine.input_specs
        if not specs:
            raise ModelError(f"export: model {model.describe()} is not compiled; compile it first")
    else:
        specs = _examples(inputs)
        for k, s in enumerate(specs):
            if not all(isinstance(n, (int, np.integer)) for n in np.shape(s)):
                raise ModelError(
                    f"export: example input {k} has the shape {tuple(np.shape(s))}, with a "
                    "symbolic dimension; inputs= takes concrete shapes (fnnc builds the "
                    "graph for sizes it knows): give an example batch, and name the "
                    "symbolic batch with batch= (other sizes stay as the example's)"
                )
    return [jax.ShapeDtypeStruct(tuple(np.shape(s)), np.dtype(s.dtype)) for s in specs]


def _examples(inputs: Any) -> list[Any]:
    """The example inputs or specs, one per model input: one array alone is a list of
    it, and a nested list of numbers is one array (as ``evaluate`` takes them)."""
    listed = list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
    return [x if hasattr(x, "shape") and hasattr(x, "dtype") else np.asarray(x) for x in listed]


def export(
    model: Any,
    path: str | os.PathLike[str] | None = None,
    *,
    batch: str | None = "b",
    parameters: str = "embedded",
    inputs: Sequence[Any] | None = None,
    platforms: Sequence[str] | None = None,
    check: bool = True,
) -> jax.export.Exported:
    """Exports ``model``'s inference as a ``jax.export`` artifact (see the module doc).

    Args:
        model: a compiled :class:`~fnnc.models.Model`.
        path: where to write the serialized artifact (``None``: do not write).
        batch: the name of the symbolic batch dimension (an identifier), or ``None``
            for fixed shapes.
        parameters: ``"embedded"`` (constants in the module) or ``"argument"`` (a dict
            by id, the first argument).
        inputs: example inputs or specs (one per model input); default: the shapes the
            model was compiled for.
        platforms: e.g. ``("cpu", "cuda")`` (one name alone is a tuple of it; names
            are ``jax.export``'s, in any case; ``"gpu"`` is this machine's GPU platform,
            ``cuda`` or ``rocm``, where it has one); default: JAX's default backend. For
            any platform but this process's own, every node takes its XLA reference (a
            kernel chosen here need not lower there).
        check: run the artifact on the example inputs (random ones drawn for the specs
            when only specs or nothing were given) and compare it with ``evaluate``
            (``ModelError`` if they differ by more than 1e-5, or by what a
            ``precision=`` model's compute type rounds to); skipped when ``platforms``
            leaves out this process's platform.

    Returns:
        The ``jax.export.Exported``.
    """
    check = require_flag(check, "export(check=...)", ModelError)
    if parameters not in PARAMETERS:
        raise ModelError(f"export: parameters={parameters!r}; expected one of {PARAMETERS}")
    if batch is not None and not (isinstance(batch, str) and batch.isidentifier()):
        raise ModelError(
            f"export: batch={batch!r}; expected the name of the symbolic batch dimension "
            "(an identifier such as 'b' or 'batch'), or None to export the example shapes"
        )
    platforms = _lowering_platforms(platforms)
    specs = _specs(model, inputs)
    if batch is not None and any(not s.shape for s in specs):
        raise ModelError(
            "export: an input is a scalar, so it has no batch axis; pass batch=None to "
            "export fixed shapes"
        )
    if batch is not None and len({s.shape[0] for s in specs}) > 1:
        raise ModelError(
            f"export: with a symbolic batch ({batch!r}) every input's first axis is that "
            f"batch, but the example inputs' first axes are {[s.shape[0] for s in specs]} "
            f"(shapes {[list(s.shape) for s in specs]}); give inputs of one batch size, or "
            "batch=None to export the example shapes (an input shared by all rows, of 1 "
            "row, say)"
        )
    if check and batch is not None and any(s.shape[0] == 0 for s in specs):
        empty = [k for k, s in enumerate(specs) if s.shape[0] == 0]
        raise ModelError(
            f"export: example input(s) {empty} have no rows (shapes "
            f"{[list(specs[k].shape) for k in empty]}), which the check cannot run: a "
            f"symbolic batch ({batch!r}) is at least 1 in jax.export. Give examples with "
            "rows, or check=False, or batch=None for fixed shapes"
        )
    graph, ids = _graph(model, specs, batch)
    values = model.parameters()
    n_out = len(model.outputs)

    def forward(params: dict[str, Any], *xs: Any) -> Any:
        weights = [params[i] for i in ids]
        if batch is None:
            outs = interpret(graph, *xs, *weights)
        else:
            sample = lambda *x: interpret(graph, *(v[None] for v in x), *weights)
            outs = jax.vmap(lambda *x: _strip(sample(*x), n_out))(*xs)
        outs = outs if isinstance(outs, tuple) else (outs,)
        return outs[0] if n_out == 1 else tuple(outs)

    if batch is not None:
        (b,) = jax.export.symbolic_shape(batch)
        arg_specs = [jax.ShapeDtypeStruct((b, *s.shape[1:]), s.dtype) for s in specs]
    else:
        arg_specs = specs
    param_specs = {i: jax.ShapeDtypeStruct(np.shape(values[i]), values[i].dtype) for i in ids}
    if parameters == "embedded":
        held = {i: values[i] for i in ids}
        fn, args = (lambda *xs: forward(held, *xs)), arg_specs
    else:
        fn, args = forward, [param_specs, *arg_specs]
    fn.__name__ = f"fnnc_{(model.name or 'model')}".replace("-", "_")
    here = _runs_here(platforms)
    # Backends are chosen for the platform tracing them: a kernel chosen on a GPU would
    # not lower for a CPU, so an artifact for other platforms takes the XLA references.
    references = config.override(backend="xla", backend_per_command={})
    with contextlib.nullcontext() if here == "only" else references:
        exported = jax.export.export(jax.jit(fn), platforms=platforms)(*args)
    if check and here != "no":  # an artifact that cannot run here is not checked here
        _check(model, exported, specs, inputs, values, ids, parameters, batch)
    if path is not None:
        atomic_write(path, bytes(exported.serialize(vjp_order=0)))
    return exported


def _graph(model: Any, specs: list[Any], batch: str | None) -> tuple[Any, list[str]]:
    """The graph :meth:`~fnnc.models.Model.evaluate` runs (precision cast and compile
    passes included), for ``specs``, or for one sample of them when ``batch`` is named."""
    if batch is None:
        return model.forward_graph(specs, as_evaluated=True)
    one = [jax.ShapeDtypeStruct((1, *s.shape[1:]), s.dtype) for s in specs]
    try:
        with _unpipelined(model):
            return model.forward_graph(one, as_evaluated=True)
    except ModelError:
        # the same mistake said of the shapes the user gave, not of the one-sample ones
        model.forward_graph(specs, as_evaluated=True)
        raise


def _lowering_platforms(platforms: str | Sequence[str] | None) -> tuple[str, ...] | None:
    """``platforms`` as ``jax.export`` names them: a string alone is one platform (not
    its letters), names lowercased and deduplicated, ``"gpu"`` this machine's GPU
    platform (``jax.export`` lowers for ``cuda`` or ``rocm``, not ``gpu``)."""
    if platforms is None:
        return None
    names = [platforms] if isinstance(platforms, str) else list(platforms)
    out = []
    for name in names:
        platform_name(name, "export")  # a ConfigError for a misspelt one
        name = name.lower()
        if name == "gpu":
            if platform_name(None, "export") != "gpu":
                raise ConfigError(
                    "export: platforms names 'gpu', which jax.export lowers for as 'cuda' "
                    "(NVIDIA) or 'rocm' (AMD), and this machine has no GPU to say which; "
                    "pass 'cuda' or 'rocm'"
                )
            name = jax.export.default_export_platform()
        out.append(name)
    if not out:
        raise ConfigError("export: platforms is empty; name one or more, or leave it None")
    return tuple(dict.fromkeys(out))


def _runs_here(platforms: Sequence[str] | None) -> str:
    """``"only"``: the artifact is for this process's platform alone; ``"also"``: for it
    and others; ``"no"``: for others only. ``platforms`` are ``jax.export``'s names
    (:func:`_lowering_platforms`), compared as such: an artifact for ``rocm`` does not
    run on ``cuda``, though fnnc calls both ``gpu``."""
    if platforms is None:
        return "only"
    here = jax.export.default_export_platform()
    hits = [p == here for p in platforms]
    return "only" if all(hits) else "also" if any(hits) else "no"


def _strip(outs: Any, n_out: int) -> Any:
    """One sample's outputs without the batch axis of size 1 they were built with."""
    outs = outs if isinstance(outs, tuple) else (outs,)
    return tuple(o[0] for o in outs[:n_out])


def _check(
    model: Any,
    exported: jax.export.Exported,
    specs: list[jax.ShapeDtypeStruct],
    inputs: Any,
    values: dict[str, Any],
    ids: list[str],
    parameters: str,
    batch: str | None,
) -> None:
    inputs = None if inputs is None else _examples(inputs)
    given = inputs is not None and all(hasattr(x, "__array__") for x in inputs)
    rng = np.random.default_rng(0)
    xs = [np.asarray(x) for x in inputs] if given else [draw(rng, s) for s in specs]
    args = xs if parameters == "embedded" else [{i: values[i] for i in ids}, *xs]
    got = _listed(exported.call(*args))
    want = _listed(model.evaluate(xs))
    tol = _tolerance(model)
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        if close(g, w, (tol, tol)):
            continue
        where = (
            f"export: output {k} of model {model.describe()} differs from evaluate on the "
            f"{'given' if given else 'random'} example inputs (shapes {np.shape(g)} and "
            f"{np.shape(w)}, largest difference {max_error(g, w):.3g})"
        )
        rows = np.shape(xs[0])[0] if batch is not None else None
        if rows is not None and (np.ndim(w) == 0 or np.shape(w)[0] != rows):
            raise ModelError(
                f"{where}: for a batch of {rows} rows evaluate gives output {k} shaped "
                f"{list(np.shape(w))}, whose first axis is not that batch (an output "
                "reduced over the batch, or not made per sample, as a parameter), so it "
                "cannot be mapped over a symbolic batch; export with batch=None for the "
                "example shapes"
            )
        if batch is not None and _mixes_samples(model, specs, xs, values, ids, k, w, tol):
            raise ModelError(
                f"{where}: the model mixes samples of a batch in test mode (its graph for "
                "the whole batch gives evaluate's result, mapped over one sample at a time "
                "it does not), so it cannot be mapped over a symbolic batch; export with "
                "batch=None for the example shapes"
            )
        raise ModelError(
            f"{where}: the exported graph runs each node's reference forward, evaluate "
            "the compiled program; a difference past the tolerance is an fnnc bug to "
            "report (export with check=False to write the artifact anyway)"
        )


def _tolerance(model: Any) -> float:
    """1e-5, or what the compute type of a ``precision=`` model rounds to (the artifact
    and evaluate may round a low-precision sum differently)."""
    precision = model.engine.precision
    return 1e-5 if precision is None else 8 * float(jax.numpy.finfo(precision.dtype).eps)


def _mixes_samples(
    model: Any, specs: Any, xs: Any, values: Any, ids: Any, k: int, want: Any, tol: float
) -> bool:
    """Whether the graph for the whole batch gives evaluate's output ``k`` (so the
    difference comes from running one sample at a time)."""
    graph, full_ids = model.forward_graph(specs, as_evaluated=True)
    outs = _listed(interpret(graph, *xs, *[values[i] for i in full_ids]))
    return close(outs[k], want, (tol, tol))


def _listed(value: Any) -> list[Any]:
    return list(value) if isinstance(value, (list, tuple)) else [value]


@contextlib.contextmanager
def _unpipelined(model: Any) -> Any:
    """``model``'s pipelined Repeats built as plain ones, for the one-sample graph that
    ``jax.vmap`` maps over the symbolic batch: one row does not split into microbatches,
    and a test-mode forward mixes no rows, so each sample's result is the same (their
    stacked parameters are the same too). The pipelines and the parameter records are
    put back after."""
    engine = model.engine
    repeats = {
        id(owner): owner
        for info in engine.infos.values()
        if info.blocks
        for owner in info.owners
        if isinstance(getattr(owner, "pipeline", None), Pipeline)
    }
    saved = [(layer, layer.pipeline) for layer in repeats.values()]
    infos = dict(engine.infos)
    try:
        for layer, _ in saved:
            layer.pipeline = None
        yield
    finally:
        for layer, pipeline in saved:
            layer.pipeline = pipeline
        engine.infos.update(infos)  # the records of the pipelined build where there were
