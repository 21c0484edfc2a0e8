"""Program: a graph lowered to one jitted XLA computation, what :func:`fnnc.graph.compile`
returns.

Backends are chosen per node when the program is traced (see :mod:`fnnc.core.dispatch`)
and baked in; :attr:`Program.backends` reports the choice. Constants larger than a few
elements are passed to XLA as arguments (uploaded once) instead of being baked into the
HLO, which keeps compile times of traced models with closed-over weights low. A program
checks its inputs and donations, reports numerics failures by node, keeps a bounded
queue of calls on multi-device CPU meshes, and shows its lowered and compiled text and
memory plan.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, Mesh

from fnnc import config
from fnnc.core import dispatch
from fnnc.core.evaluate import as_tuple, run_nodes
from fnnc.core.ir import Graph, Node
from fnnc.errors import BackendError, CommandError, GraphInputError, NumericsError
from fnnc.graph import cpu_libraries
from fnnc.graph._io import donation_problem, flatten_inputs, unflatten_outputs
from fnnc.graph.memory import MemoryPlan, memory_plan
from fnnc.graph.numerics import Blame, numerics_error
from fnnc.graph.sharding import Shardings
from fnnc.graph.sharding_checks import check_layouts
from fnnc.ops import while_tape

HOIST_ELEMENTS = 16

IN_FLIGHT = 8
"""Calls of a multi-device CPU program left queued before one blocks (see Program)."""


@dataclasses.dataclass(frozen=True)
class MemoryReport:
    """XLA's memory analysis of a compiled program, in bytes."""

    argument_bytes: int
    output_bytes: int
    temp_bytes: int
    alias_bytes: int
    generated_code_bytes: int

    @property
    def peak_estimate_bytes(self) -> int:
        """Arguments + outputs + temporaries - donated (aliased) bytes."""
        return self.argument_bytes + self.output_bytes + self.temp_bytes - self.alias_bytes

    def __str__(self) -> str:
        rows = [(f.name, getattr(self, f.name)) for f in dataclasses.fields(self)]
        rows.append(("peak_estimate_bytes", self.peak_estimate_bytes))
        return "\n".join(f"{k:>22}: {v:>12,d}" for k, v in rows)


class Program:
    """A compiled graph. Call it like a function of the graph's inputs.

    Called on arrays it runs its ahead-of-time compiled executable. Called under a JAX
    transformation (``jax.jit``, ``jax.grad``, ``jax.vmap``, or inside a custom
    command's forward) it traces the same function into the caller's computation.

    Attributes:
        graph: the graph it was compiled from.
        backends: per node, ``(index, label, backend name)``.
        cpu_libraries: the XLA:CPU library set it was compiled with
            (:mod:`fnnc.graph.cpu_libraries`; ``"xla"`` off CPU).
        matmul_precision: the precision its float32 dots and convolutions were traced
            at (a name in :data:`fnnc.config.MATMUL_PRECISIONS`).
        donate: positions of the graph inputs it donates (their buffers may hold outputs).
    """

    def __init__(
        self,
        graph: Graph,
        donate: tuple[int, ...],
        platform: str,
        numerics: bool = False,
        shardings: Shardings | None = None,
        matmul_precision: str = "float32",
    ):
        self.graph = graph
        self.matmul_precision = matmul_precision
        self.donate = donate
        self.platform = platform
        self.shardings = shardings
        choices = []
        for i, node in enumerate(graph.nodes):
            specs = [graph.spec(s) for s in node.inputs]
            # the autotune winners timed under this program's precision, not the config's
            try:
                choices.append(dispatch.select_backend(node.cmd, specs, platform, matmul_precision))
            except BackendError as e:  # a forced backend that cannot run it: say which node
                raise BackendError(
                    f"compile: node {i} ({node.name or node.cmd.name}): {e}"
                ) from None
        self.backends = tuple(
            (i, node.name or str(node.cmd), b)
            for i, (node, b) in enumerate(zip(graph.nodes, choices))
        )
        hoisted = [
            i
            for i, node in enumerate(graph.nodes)
            if node.cmd.name == "constant" and _hoisted(node.cmd.param("value"))
        ]
        self._consts = tuple(
            jax.device_put(graph.nodes[i].cmd.param("value").numpy()) for i in hoisted
        )
        slot = {node_index: k for k, node_index in enumerate(hoisted)}
        forwards = [dispatch.forward_of(node.cmd, b) for node, b in zip(graph.nodes, choices)]
        n_in = len(graph.inputs)
        self.numerics = numerics
        # Taped loops' backwards check their tape on the host: wait for such a
        # program's outputs, so an overflow is a CommandError here, not an XLA
        # runtime error wherever the caller first reads a value.
        self._host_checks = [
            f"node {i} ({node.name or node.cmd.name})"
            for i, node in enumerate(graph.nodes)
            if while_tape.checks_on_host(node.cmd)
        ]
        scopes = [node.name or node.cmd.name for node in graph.nodes]

        def program(*args: Any) -> tuple[Any, ...]:
            consts = args[n_in:]
            bad: list[Any] = []  # one flag per node, in node order
            blame = Blame(graph, jnp) if numerics else None

            def run_node(index: int, node: Node, inputs: list[Any]) -> tuple[Any, ...]:
                if index in slot:
                    outs: tuple[Any, ...] = (consts[slot[index]],)
                else:
                    with jax.named_scope(scopes[index]):  # profiles and HLO show node names
                        outs = as_tuple(forwards[index](*inputs))
                if blame is not None:
                    bad.append(blame(node, outs))
                return outs

            # loop and branch bodies choose their nodes' backends as the top level's
            # were chosen: at this precision, for this platform
            with (
                dispatch.matmul_precision_scope(matmul_precision),
                dispatch.platform_scope(platform),
            ):
                results = tuple(run_nodes(graph, args[:n_in], run_node))
            return (*results, jnp.stack(bad)) if numerics and bad else results

        self.cpu_libraries = cpu_libraries.chosen(graph, platform, choices, matmul_precision)
        self._jitted = jax.jit(
            program,
            donate_argnums=donate,
            compiler_options=cpu_libraries.compiler_options(self.cpu_libraries),
            **self._jit_shardings(numerics),
        )
        arg_specs = list(graph.input_specs) + [
            jax.ShapeDtypeStruct(c.shape, c.dtype) for c in self._consts
        ]
        with _mesh_context(shardings):  # sharding_constraint and pipeline read the mesh
            self._lowered = self._jitted.lower(*arg_specs)
        self._compiled = self._lowered.compile()
        # XLA:CPU runs the collectives of a multi-device program on a shared thread
        # pool: with tens of steps queued (dispatch is asynchronous), participants of
        # different steps can fill it and the all-reduce rendezvous never completes.
        # Such programs keep at most IN_FLIGHT calls queued, blocking on the oldest.
        many = shardings is not None and len(shardings.mesh.devices.flat) > 1
        self._in_flight: collections.deque[Any] | None = (
            collections.deque() if many and platform == "cpu" else None
        )

    def __call__(self, *args: Any) -> Any:
        if not self._host_checks:
            return self._call(args)
        try:
            return self._call(args)
        except jax.errors.JaxRuntimeError as e:
            error = while_tape.host_error(e)
            if error is None:
                raise
            while_tape.forget_failed_tokens()  # reported here: not again at exit
            where = " or ".join(self._host_checks)
            raise CommandError(f"Program: {where}: {error}") from None

    def _call(self, args: tuple[Any, ...]) -> Any:
        if len(args) == len(self.graph.inputs):
            try:
                return self._outputs(args, self._compiled(*args, *self._consts))
            except (TypeError, ValueError):
                if self._on_one_other_device(args):  # see below: no second attempt
                    return self._outputs(args, self._jitted(*args, *self._consts))
                # wrong types or a pytree: check below and say what is wrong
            except RuntimeError as e:  # JAX's "Array has been deleted" (donated elsewhere)
                self._check_donations(args, e)
                raise
        leaves = flatten_inputs(self.graph, args, "Program")
        if any(isinstance(leaf, jax.core.Tracer) for leaf in leaves):
            return self._traced(leaves)
        try:
            values = self._compiled(*leaves, *self._consts)
        except RuntimeError as e:
            self._check_donations(leaves, e)
            raise
        except (TypeError, ValueError) as e:
            if not self._on_one_other_device(leaves):
                self._check_donations(leaves, e)
                raise GraphInputError(
                    f"Program: inputs were rejected by the compiled program: {e}"
                ) from e
            # a one-device program given arrays that all live on another device (NNC's
            # per-device copies): it runs there, as jax.jit does, compiled once for it
            values = self._jitted(*leaves, *self._consts)
        return self._outputs(leaves, values)

    def _check_donations(self, leaves: Sequence[Any], error: Exception) -> None:
        """A GraphInputError naming the input if a donation is why XLA refused ``leaves``
        (:func:`~fnnc.graph._io.donation_problem`). Only where the error's first line is
        about a deleted or donated buffer: a taped loop's overflow is raised after the
        call took its donated inputs, and stays the tape's error."""
        first = str(error).strip().split("\n", 1)[0].lower()
        if "delet" not in first and "donat" not in first:
            return
        why = donation_problem(self.graph, leaves, self.donate)
        if why is not None:
            raise GraphInputError(f"Program: {why}") from None

    def _on_one_other_device(self, leaves: Sequence[Any]) -> bool:
        if self.shardings is not None or any(isinstance(a, jax.core.Tracer) for a in leaves):
            return False  # a tracer (under jit, grad, vmap) has no devices: _traced takes it
        placed = {
            frozenset(leaf.devices())
            for leaf in leaves
            if isinstance(leaf, jax.Array) and getattr(leaf, "committed", True)
        }
        return len(placed) == 1 and len(next(iter(placed))) == 1

    def _traced(self, leaves: Sequence[Any]) -> Any:
        """Called under a JAX transformation (``jax.jit``, ``grad``, ``vmap``, or a
        custom command whose forward runs a graph): the executable compiled for
        concrete arrays cannot take tracers, so the same jitted function is traced
        into the caller's computation instead. The numerics flags and host checks
        need concrete values, so they are left to the outer program."""
        try:
            with _mesh_context(self.shardings):
                values = self._jitted(*leaves, *self._consts)
        except TypeError as e:  # jax.jvp of a node on a kernel backend (a custom_vjp)
            runs = [
                (f"node {i} ({where})", self.graph.nodes[i].cmd.name, b)
                for i, where, b in self.backends
            ]
            error = dispatch.forward_mode_error(e, runs)
            if error is None:
                raise
            raise error from None
        if self.numerics and len(values) > len(self.graph.outputs):
            values = values[:-1]
        return unflatten_outputs(self.graph, values)

    def _outputs(self, args: Sequence[Any], values: tuple[Any, ...]) -> Any:
        if self._host_checks:
            jax.block_until_ready(values)
        if self._in_flight is not None:
            self._in_flight.append(values)
            if len(self._in_flight) > IN_FLIGHT:
                _wait(jax.tree.leaves(self._in_flight.popleft()))
        if self.numerics and len(values) > len(self.graph.outputs):
            flags = np.asarray(values[-1])
            values = values[:-1]
            if flags.any():
                self._report_numerics(args, int(np.argmax(flags)))
        return unflatten_outputs(self.graph, values)

    def _report_numerics(self, args: Sequence[Any], first: int) -> None:
        """Raises the NumericsError of node ``first``, with its inputs' statistics."""
        from fnnc.graph.interpret import interpret  # the oracle re-runs up to the node

        def stop(index: int, node: Node, inputs: tuple, outputs: tuple) -> None:
            if index == first:
                raise numerics_error(self.graph, index, inputs, outputs, "Program")

        with config.override(numerics=False):
            interpret(self.graph, *args, on_node=stop)
        raise NumericsError(  # the reference did not reproduce it: name the node only
            f"Program: node {first} ({self.graph.nodes[first].name or self.graph.nodes[first].cmd})"
            " produced a NaN or an infinity in the compiled program (the reference "
            "interpreter computes finite values there: a backend differs)"
        )

    def _jit_shardings(self, numerics: bool) -> dict[str, Any]:
        """``in_shardings`` / ``out_shardings`` for ``jax.jit`` (constants replicated)."""
        plan = self.shardings
        if plan is None:
            return {}
        check_layouts(self.graph, plan.inputs, plan.outputs, plan.mesh)
        ins = plan.named(plan.inputs) + (plan.replicated,) * len(self._consts)
        out: dict[str, Any] = {"in_shardings": ins}
        if plan.outputs is not None:
            outs = plan.named(plan.outputs)
            out["out_shardings"] = (*outs, plan.replicated) if numerics else outs
        return out

    def lowered_text(self, *, debug_info: bool = False) -> str:
        """The StableHLO text XLA was given; with ``debug_info``, each operation's
        location too, which names its node (``loc("jit(program)/fc/...")``)."""
        return self._lowered.as_text(debug_info=debug_info)

    def compiled_text(self) -> str:
        """The optimised HLO XLA produced."""
        return self._compiled.as_text()

    def memory_plan(self) -> MemoryPlan:
        """fnnc's own plan of this program (:func:`~fnnc.graph.memory_plan` with its
        donation), beside XLA's :meth:`memory`."""
        return memory_plan(self.graph, donate=self.donate)

    def memory(self) -> MemoryReport:
        """XLA's memory analysis: arguments, outputs, temporaries, aliased (donated)."""
        m = self._compiled.memory_analysis()
        return MemoryReport(
            argument_bytes=int(m.argument_size_in_bytes),
            output_bytes=int(m.output_size_in_bytes),
            temp_bytes=int(m.temp_size_in_bytes),
            alias_bytes=int(m.alias_size_in_bytes),
            generated_code_bytes=int(m.generated_code_size_in_bytes),
        )

    def __repr__(self) -> str:
        return f"<Program of {self.graph!r} on {self.platform}>"


def _wait(values: Sequence[Any]) -> None:
    """Waits for the outputs of a queued call, skipping those a later call took: a
    donated output is deleted, or (jax 0.11) refuses the wait while the later call that
    took it is still queued, which is checked here, not before, to leave no race."""
    for v in values:
        try:
            if not v.is_deleted():
                v.block_until_ready()
        except jax.errors.JaxRuntimeError as e:
            if "deleted or donated" not in str(e):
                raise


def _hoisted(value: Any) -> bool:
    """Whether a constant is passed to XLA as an argument: large and not a splat (a
    splat lowers to a broadcast that XLA fuses; an argument it cannot see into)."""
    return value.size > HOIST_ELEMENTS and value.splat is None


def _mesh_context(plan: Shardings | None) -> Any:
    """The program's mesh as the context mesh while tracing, its axes ``Auto`` (XLA's
    partitioner chooses what no input, output or constraint fixes)."""
    if plan is None:
        return contextlib.nullcontext()
    mesh = plan.mesh
    auto = Mesh(mesh.devices, mesh.axis_names, axis_types=(AxisType.Auto,) * len(mesh.axis_names))
    return jax.set_mesh(auto)
