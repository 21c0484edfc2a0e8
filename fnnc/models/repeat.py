"""Repeat: N identical blocks as one ``scan`` over stacked parameters (scanned layers).

``Repeat(block, n)`` computes what ``n`` fresh copies of ``block`` applied in sequence
compute, but builds the block's graph once and runs it with
:func:`fnnc.graph.scan` over its parameters stacked on a leading axis (``[n,
*shape]``), so the graph, the trace and XLA's compile do not grow with depth (Flax's
``nnx.scan`` over layers, MaxText's ``scan_layers``). ``checkpoint=True`` (or a
:func:`~fnnc.graph.remat` policy) recomputes each block in the backward from its input.

**Parameter ids.** The reference is the *unrolled* model: ``Sequential([copy_0, ...,
copy_{n-1}], name=<the Repeat's name>)`` in the Repeat's place, each copy a fresh block.
Its ids are NNC's (:class:`~fnnc.models.BuildContext`): a named Repeat is one level
``<name>-<seq>`` holding the copies; an unnamed one adds no level, so the copies take
their numbers in the enclosing level, and so do the layers after it. Every parameter
id of block ``i`` differs from block 0's only in the number of the id's first component
below the Repeat (``block-0`` -> ``block-i``; unnamed ``3`` -> ``3 + i * k`` when each
block takes ``k`` numbers of that name). The stacked parameter's id is block 0's id with
that number written as the Python range of the blocks' numbers:

====================================  =================================================
stacked id (``[4, 8, 8]``)             per-block ids (``[8, 8]`` each)
====================================  =================================================
``t-blocks-0-block-[0:4]-fc-0-0``      ``t-blocks-0-block-0-fc-0-0`` ... ``block-3-...``
``t-[1:9:2]-0`` (2 dense per block)    ``t-1-0``, ``t-3-0``, ``t-5-0``, ``t-7-0``
====================================  =================================================

Files keep NNC's per-block ids: :meth:`Model.write <fnnc.models.Model.write>` writes
each slice under its block's id and :meth:`Model.read <fnnc.models.Model.read>` reads
them back into the stack, so a file written by a Repeat model reads into the unrolled
model (and into NNC) and the reverse. Training checkpoints
(:class:`fnnc.io.Checkpoints`) store parameters and optimizer state under the per-block
ids too, so a run saved by either model resumes in the other.
:func:`unstack_parameters` and :func:`stack_parameters` convert dicts of values the same
way, :func:`unstack_states` and :func:`stack_states` optimizer-state views
(:mod:`fnnc.models.stacks`).

**Training.** The minimizer updates a stack as the unrolled model's ``n`` parameters: a
rule with a norm or statistic per tensor (LAMB's trust ratio, Adafactor's factored
moments, ``clip_by_block_rms``) takes it per block, while one over all parameters
(``clip_by_global_norm``) still sees every block
(:func:`~fnnc.models.stacks.per_block`). Elementwise rules (SGD, Adam, RMSProp) update
the stack whole, which is the same bit for bit and skips the slicing. Masks and labels
given as dicts (``optax.masked``) key a non-elementwise rule's blocks by their per-block
ids; masks computed from shapes (``x.ndim > 1``) see one block with such rules, and the
whole stack with elementwise ones.

>>> import numpy as np, optax
>>> from fnnc.models import Dense, Input, Model, Repeat, ReLU, Sequential
>>> x = Input()
>>> blocks = Repeat(lambda: Sequential([Dense(8, name="fc"), ReLU()], name="block"), 4,
...                 name="blocks")
>>> model = Model(x, blocks(x))
>>> model.compile(np.zeros((2, 8), np.float32), loss="mse", minimizer=optax.sgd(0.1))
>>> {k: v.shape for k, v in model.parameters().items()}
{'t-blocks-0-block-[0:4]-fc-0-0': (4, 8, 8), 't-blocks-0-block-[0:4]-fc-0-1': (4, 8)}
>>> stacked_ids(model)["t-blocks-0-block-[0:4]-fc-0-1"][-1]
't-blocks-0-block-3-fc-0-1'
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from fnnc import ops
from fnnc.core.ir import Graph, Symbol
from fnnc.graph import GraphBuilder, scan
from fnnc.graph import pipeline as graph_pipeline
from fnnc.graph.scan import Checkpoint
from fnnc.models.layer import BuildContext, Initializer, Layer, ModelError, ParamInfo, is_int
from fnnc.models.pipeline import Pipeline
from fnnc.models.stacks import stack_parameters as stack_parameters
from fnnc.models.stacks import stack_states as stack_states
from fnnc.models.stacks import stacked_ids as stacked_ids
from fnnc.models.stacks import unstack_parameters as unstack_parameters
from fnnc.models.stacks import unstack_states as unstack_states


class Repeat(Layer):
    """``n`` fresh copies of ``block`` applied in sequence, run as one ``scan``.

    Args:
        block: a layer or model taking as many inputs as it returns outputs, each output
            of its input's shape and dtype (the carry); or a function of no arguments
            making one. It is built once, as block 0 of the stack. A block holding the
            values it starts from (a :meth:`~fnnc.models.Model.from_flax` module's
            weights) must be given as a function: it is called once per block (the
            other ``n - 1`` times at the first build), and block ``i`` starts from the
            values of the ``i``-th block it made, as the unrolled model
            ``Sequential([make() for _ in range(n)])`` does; a block given as a layer
            would start every block equal, and is a ModelError.
        n: the number of blocks (>= 1).
        checkpoint: ``False`` keeps what each block's backward reads; ``True`` keeps
            only each block's input and recomputes the block in the backward; a
            :func:`~fnnc.graph.remat` policy keeps what it saves. A block model with
            :meth:`~fnnc.models.Model.set_gradient_checkpointing` counts as ``True``.
        name: the layer's name (a level in parameter ids, as a named ``Sequential``).
        is_trainable: as for any layer.
        pipeline: a :class:`~fnnc.models.Pipeline` ``(stages, microbatches, axis)``
            runs the blocks as GPipe stages over that mesh axis instead of one scan,
            the block built for one microbatch (:mod:`fnnc.models.pipeline`).

    Random layers (Dropout) draw one key per block: each block's random layer gets row
    ``i`` of ``random_split(key, n)`` (:func:`fnnc.ops.random_split`), so blocks draw
    independent masks and a recomputed block (``checkpoint``) draws its mask again. A
    pipelined Repeat folds the microbatch into that key
    (:func:`fnnc.ops.random.fold_keys`): each microbatch draws its own mask.
    Blocks with internal state (batch-norm running statistics) keep one stack per
    statistic (``r-`` ids, ``[n, *shape]``, per-block ids in files as parameters): in
    training each block updates its own slice, which the loop returns as a per-block
    result (``n_ys`` of :func:`~fnnc.graph.scan`). In a pipelined Repeat each block
    normalizes every microbatch by that microbatch's statistics (as GPipe does), and its
    running statistics move once per step, by the mean over microbatches of the update
    each microbatch makes from the same old value: ``(1 - m) old + m mean_j(s_j)``. The
    running mean thus follows the whole batch's mean (equal microbatches); the running
    variance, the mean of the microbatches' variances, which is what the blocks normalized
    by.
    """

    def __init__(
        self,
        block: Layer | Callable[[], Layer],
        n: int,
        *,
        checkpoint: Checkpoint = False,
        name: str = "",
        is_trainable: bool | None = None,
        pipeline: Pipeline | None = None,
        **unknown: Any,
    ):
        super().__init__(name=name, is_trainable=is_trainable, **unknown)
        self._factory: Callable[[], Layer] | None = None
        self._others: list[Layer] | None = None  # blocks 1..n-1 where needed (_given_inits)
        self._given: dict[Any, list[list[Initializer]]] = {}
        if not isinstance(block, Layer) and callable(block):
            self._factory, block = block, block()
        if not isinstance(block, Layer):
            raise ModelError(
                f"layer {self.describe()}: block must be a fnnc.models Layer or Model, or a "
                f"function making one; got {type(block).__name__}"
            )
        if not is_int(n) or n < 1:
            raise ModelError(f"layer {self.describe()}: n must be an int >= 1, got {n!r}")
        self.block, self.n, self.checkpoint = block, int(n), checkpoint
        self.pipeline = Pipeline.check(pipeline, f"layer {self.describe()}", self.n)

    def num_outputs(self, num_inputs: int) -> int:
        return num_inputs

    def build(self, ctx: BuildContext, *xs: Symbol) -> Any:
        sub = _BlockContext(ctx)
        pipe, where = self.pipeline, f"layer {self.describe()}"
        shapes = [x.shape if pipe is None else pipe.microbatch(where, x.shape) for x in xs]
        ins = [
            sub.b.input(s, x.dtype, name=f"carry[{i}]") for i, (s, x) in enumerate(zip(shapes, xs))
        ]
        out = self.block.build(sub, *ins)
        outs = tuple(out) if isinstance(out, (tuple, list)) else (out,)
        self._check_block(sub, ins, outs)
        # each block's new running statistics leave the loop as per-iteration results
        updated = [(k, pid) for k, pid in enumerate(sub.params) if pid in sub.updates]
        body = sub.b.build([*outs, *(sub.updates[pid] for _, pid in updated)])
        order = (*(s.id for s in ins), *(sub.symbols[pid].id for pid in sub.params))
        body = dataclasses.replace(body, inputs=(*order, *(k.id for k in sub.keys)))
        stacked = []
        blocks = sub.block_ids(self.n)
        given = self._given_inits(ctx, sub, ins)
        for k, (pid, info) in enumerate(sub.params.items()):
            ids = blocks[pid]
            stacked_info = ParamInfo(
                id=sub.stacked_id(pid, self.n),
                shape=(self.n, *info.shape),
                dtype=info.dtype,
                init=_stacked_init(info.init, self.n) if k not in given else given[k],
                owners=(*ctx.owners, self, *info.owners),
                internal=info.internal,
                blocks=ids,
            )
            stacked.append(ctx.declare(self, k, stacked_info))
        sub.advance(ctx, self.n)
        # one key per random layer of the block, split into one row per block: block i
        # draws its own dropout mask, and a recomputed block (checkpoint) the same one
        stacked += [ctx.b.exec(ops.random_split(n=self.n), ctx.key()) for _ in sub.keys]
        checkpoint = self.checkpoint
        if checkpoint is False and sub.checkpoints:
            checkpoint = True
        keys = tuple(range(len(stacked) - len(sub.keys), len(stacked)))
        ys = self.run(
            ctx.b, body, xs, stacked, length=self.n, checkpoint=checkpoint,
            name=ctx.layer_id(self), n_ys=len(updated), keys=keys,
        )  # fmt: skip
        ys, news = ys[: len(xs)], ys[len(xs) :]
        for (k, _), new in zip(updated, news):
            if self.pipeline is not None:  # [n, microbatches, ...]: each microbatch's update
                mean = ctx.b.exec(ops.reduce_mean(axes=(1,)), new)
                new = ctx.b.exec(ops.reshape(shape=(new.shape[0], *new.shape[2:])), mean)
            ctx.update(self, k, new)  # the stack of every block's new statistics
        return ys if len(ys) > 1 else ys[0]

    def run(
        self,
        builder: GraphBuilder,
        body: Graph,
        carry: Sequence[Symbol],
        stacked: Sequence[Symbol],
        *,
        length: int,
        checkpoint: Checkpoint,
        name: str,
        n_ys: int = 0,
        keys: Sequence[int] = (),
    ) -> tuple[Symbol, ...]:
        """Adds the loop over the blocks: the one place that schedules them (one
        :func:`~fnnc.graph.scan`, or with ``pipeline`` :func:`fnnc.graph.pipeline`).
        Returns the final carries, then the ``n_ys`` per-block results stacked
        (``[n, ...]``; a pipeline's ``[n, microbatches, ...]``).
        ``keys``: the positions in ``stacked`` of per-block key rows (a pipeline folds
        the microbatch into them; a scan feeds them as they are)."""
        pipe = self.pipeline
        if pipe is not None:
            return graph_pipeline(
                builder, body, carry, stacked, stages=pipe.stages, axis=pipe.axis,
                microbatches=pipe.microbatches, checkpoint=checkpoint, name=name, keys=keys,
                n_ys=n_ys,
            )  # fmt: skip
        return scan(
            builder, body, carry, stacked, length=length, checkpoint=checkpoint, name=name,
            n_ys=n_ys,
        )  # fmt: skip

    def _given_inits(
        self, ctx: BuildContext, sub: _BlockContext, ins: Sequence[Symbol]
    ) -> dict[int, Initializer]:
        """The stacked initializers of block 0's parameters whose first value is given
        rather than drawn (a ``from_flax`` module's weights), by their index: each
        block's slice from that block's own module, as in the unrolled model. The
        factory makes blocks ``1..n-1`` the first time one is needed; they are built
        (once per input shape) only to read their parameters' values."""
        given = [k for k, info in enumerate(sub.params.values()) if getattr(info.init, "given", 0)]
        if not given or self.n == 1:
            return {}
        where = f"layer {self.describe()} (block {self.block.describe()})"
        ids = ", ".join(list(sub.params)[k] for k in given[:2]) + (", ..." if given[2:] else "")
        if self._factory is None:
            raise ModelError(
                f"{where}: the block's parameters {ids} start from values it holds (a "
                f"from_flax module's weights), so {self.n} copies of it would all start "
                "equal; pass a function making the block, called once per block: "
                "Repeat(lambda: Model.from_flax(make_module()), n)"
            )
        if self._others is None:
            self._others = [self._factory() for _ in range(self.n - 1)]
            if not all(isinstance(b, Layer) for b in self._others):
                raise ModelError(f"{where}: the function making the block returned a non-Layer")
        specs = tuple((tuple(x.shape), np.dtype(x.dtype).str) for x in ins)
        if specs not in self._given:
            layout = [(i.shape, i.dtype, i.internal) for i in sub.params.values()]
            inits = [[info.init for info in sub.params.values()]]
            for i, block in enumerate(self._others, 1):
                other = _BlockContext(ctx)
                block.build(other, *(other.b.input(x.shape, x.dtype) for x in ins))
                if [(p.shape, p.dtype, p.internal) for p in other.params.values()] != layout:
                    raise ModelError(
                        f"{where}: the function making the block made block {i} with other "
                        "parameters (shapes, dtypes) than block 0; it must make equal blocks"
                    )
                inits.append([info.init for info in other.params.values()])
            self._given[specs] = inits
        inits = self._given[specs]
        return {k: _per_block_init([block[k] for block in inits]) for k in given}

    def _check_block(
        self, sub: _BlockContext, ins: Sequence[Symbol], outs: Sequence[Symbol]
    ) -> None:
        where = f"layer {self.describe()} (block {self.block.describe()})"
        if len(outs) != len(ins) or any(
            tuple(o.shape) != tuple(i.shape) or o.dtype != i.dtype for i, o in zip(ins, outs)
        ):
            given = ", ".join(f"{np.dtype(i.dtype).name}{list(i.shape)}" for i in ins)
            got = ", ".join(f"{np.dtype(o.dtype).name}{list(o.shape)}" for o in outs)
            raise ModelError(
                f"{where}: a repeated block must return what it takes (each block's output "
                f"is the next one's input); it takes {given} and returns {got}. Repeat "
                "only the shape-preserving part (e.g. transformer blocks, not the embedding)"
            )
        nested = [pid for pid, info in sub.params.items() if info.blocks]
        if nested:
            raise ModelError(
                f"{where}: the block holds a Repeat itself ({', '.join(nested)}); repeats do "
                "not nest. Repeat the inner block's layers once, or unroll the inner Repeat"
            )


class _BlockContext(BuildContext):
    """Builds one block as block 0 of a stack, where the outer build ``ctx`` stands.

    Its id stack starts as a copy of ``ctx``'s, so ids come out as the outer build would
    give block 0. It records, for every parameter, the label its id has at the Repeat's
    level (the *varying* component), and how many numbers of each name one block takes
    there, from which the ids of blocks ``1..n-1`` follow (module doc).
    """

    def __init__(self, ctx: BuildContext):
        super().__init__(ctx.training)
        labels, bank = ctx.level()
        self._depth = len(labels)
        self._prefix = "-".join(labels)
        self._base = dict(bank)
        if labels:
            self._levels = [(label, {}) for label in labels[:-1]] + [(labels[-1], dict(bank))]
        else:
            self._root = dict(bank)
        self._numbers: dict[str, tuple[str, int]] = {}  # label -> (name, number)
        self._owner: dict[str, str] = {}  # parameter id -> its label at the Repeat's level

    def _number(self, layer: Layer) -> str:
        label = super()._number(layer)
        if len(self._levels) == self._depth:
            _, bank = self.level()
            self._numbers[label] = (layer.name, bank[layer.name])
        return label

    def param(self, layer: Layer, index: int, shape: Sequence[int], init: Initializer,
              dtype: Any = np.float32, *, internal: bool = False) -> Symbol:  # fmt: skip
        sym = super().param(layer, index, shape, init, dtype, internal=internal)
        pid = self._pids[(id(layer), internal, index)]
        if len(self._levels) > self._depth:
            self._owner[pid] = self._levels[self._depth][0]
        else:
            path = self._paths[id(layer)]
            self._owner[pid] = path[len(self._prefix) + 1 :] if self._prefix else path
        return sym

    def _split(self, pid: str) -> tuple[str, str, str, int, int]:
        """``(head, name, tail, first number, numbers per block)`` of ``pid``."""
        label = self._owner[pid]
        name, number = self._numbers[label]
        kind = pid[:2]
        head = f"{kind}{self._prefix}-" if self._prefix else kind
        tail = pid[len(head) + len(label) :]
        per_block = sum(1 for n, _ in self._numbers.values() if n == name)
        return head, name, tail, number, per_block

    def block_ids(self, n: int) -> dict[str, tuple[str, ...]]:
        """Block 0's id -> the ids of blocks ``0..n-1`` in the unrolled model."""
        out = {}
        for pid in self.params:
            head, name, tail, first, step = self._split(pid)
            labels = [_label(name, first + i * step) for i in range(n)]
            out[pid] = tuple(f"{head}{label}{tail}" for label in labels)
        return out

    def stacked_id(self, pid: str, n: int) -> str:
        """The id of the stack of block 0's parameter ``pid`` (module doc)."""
        head, name, tail, first, step = self._split(pid)
        span = f"[{first}:{first + n * step}" + (f":{step}]" if step != 1 else "]")
        return f"{head}{_label(name, span)}{tail}"

    def advance(self, ctx: BuildContext, n: int) -> None:
        """Moves ``ctx``'s name bank on as ``n`` builds of the block would have."""
        _, bank = ctx.level()
        for name, _ in self._numbers.values():  # one block's draws, n times over
            bank[name] = bank.get(name, -1) + n


def _label(name: str, number: Any) -> str:
    return f"{name}-{number}" if name else str(number)


def _per_block_init(inits: Sequence[Initializer]) -> Initializer:
    """Block ``i``'s initializer ``inits[i]`` run from its own key, stacked on axis 0."""

    def stacked(key: jax.Array, shape: tuple[int, ...], dtype: Any) -> jax.Array:
        keys = jax.random.split(key, len(inits))
        return jax.numpy.stack([init(k, tuple(shape[1:]), dtype) for init, k in zip(inits, keys)])

    return stacked


def _stacked_init(init: Initializer, n: int) -> Initializer:
    """``init`` run for each of ``n`` blocks from its own key, stacked on axis 0."""

    def stacked(key: jax.Array, shape: tuple[int, ...], dtype: Any) -> jax.Array:
        keys = jax.random.split(key, n)
        return jax.vmap(lambda k: init(k, tuple(shape[1:]), dtype))(keys)

    return stacked
