"""Pallas kernels: the ``"pallas"`` backend of fnnc's hot commands.

Each module is named after the command it backs and holds the kernel forward (same
signature and results as the reference), a ``*_reference`` (the command's ``"xla"``
forward it matches), a ``jax.custom_vjp`` whose backward is a kernel too, a
``supports(cmd, specs)`` predicate (``None`` or the reason) and ``backward`` in NNC's
convention. The backward is registered with the forward (``Backend.backward``), so a
graph's ``gradient[of=cmd]`` nodes run it under the same ``"pallas"`` name (see
:mod:`fnnc.core.dispatch`). Each ``custom_vjp`` is wired by
:func:`fnnc.ops.pallas._derivatives.defvjp`, so ``jax.grad`` of ``jax.grad`` and
Hessian-vector products of an eager call or a ``Program`` differentiate the kernels'
derivatives by the reference's; forward mode (``jax.jvp``) of a kernel is a
:class:`~fnnc.errors.BackendError` saying to run the command on ``"xla"``.

========================================  ===============================================
module                                    kernel
========================================  ===============================================
``softmax_crossentropy``                  online logsumexp over class blocks + softmax
``layer_norm``, ``rms_norm``              row statistics and normalisation; backward
                                          with partial scale/bias sums
``scaled_dot_product_attention``          flash attention: online softmax over key blocks;
                                          dQ and dK/dV kernels
``fused_elementwise``                     generated from the fused body (and a gemm head:
                                          bias + activation epilogue)
``gemm``                                  tiled product with a bias epilogue
========================================  ===============================================

Importing this package registers every backend. They are written for the Pallas Triton
lowering (GPU; every kernel is checked to lower to Triton IR by
``tests/ops/pallas/test_triton_lowering.py``) and registered as compiled on GPU only;
on CPU they run in interpret mode, and :func:`~fnnc.ops.select_backend` picks them there
only when forced. On a GPU a kernel is the default only where measured faster (the
shipped :mod:`fnnc.core.measured` defaults for the device kind, or the autotune table),
except flash attention, which wins by construction (:data:`PRIORITY`).
``config.override(backend="pallas")`` prefers them wherever they
support the input (elsewhere the usual choice applies); forcing one command
(``backend_per_command``) on an input its kernel declines raises
:class:`~fnnc.errors.BackendError` with the reason. Support is decided by each module's
``supports``: dtypes (float32, bfloat16, float16; 16-bit inputs accumulate in float32),
shapes and, for a generated ``fused_elementwise`` body, its primitives (those the
installed JAX's Triton lowering implements, or fnnc's rules: see
:mod:`~fnnc.ops.pallas._triton`), so a body Triton cannot lower selects the reference at
selection time, for ``"gpu"`` on any host, never failing later. Sizes need not split
into blocks: every block is a power of two (Triton's rule), grids and walks are
``cdiv``, and a ragged last block is masked (iota masks on loads and stores, ``-inf`` or
0 where nothing was loaded; see :mod:`fnnc.ops.pallas._common`), so 1001-class
vocabularies and 67-token sequences run in the kernels.

>>> import jax.numpy as jnp
>>> from fnnc import config, ops
>>> x = jnp.ones((4, 32))
>>> with config.override(backend_per_command={"rms_norm": "pallas"}):
...     y, inv_std = ops.rms_norm()(x)
>>> y.shape
(4, 32)
"""

import functools

from fnnc.core.dispatch import Backend, register_backend
from fnnc.ops.pallas import (
    fused_elementwise,
    gemm,
    layer_norm,
    rms_norm,
    scaled_dot_product_attention,
    softmax_crossentropy,
)

NAME = "pallas"
# GPU only: the kernels are written for the Triton lowering (checked by exporting them for
# CUDA in tests/ops/pallas/test_triton_lowering.py). Some block shapes (one-column
# statistics, one-row bias) do not meet Mosaic's 8x128 TPU tiling, so on a TPU the
# reference runs until the kernels are verified there.
PLATFORMS = ("gpu",)
INTERPRET_PLATFORMS = ("cpu",)
PRIORITY = {"scaled_dot_product_attention": 10}
"""Priorities without measurement: only flash attention wins by construction (it never
materialises the scores), and only where its products run on tensor cores (its
``wins``: 16-bit inputs, or float32 below full float32 precision). Every other kernel is
the default only where the measured defaults (:mod:`fnnc.core.measured`) or the
autotune table say it is faster: on an H100 XLA ran gemm + bias 2x faster than the
Pallas gemm, which had been chosen by priority."""

MODULES = (
    fused_elementwise,
    gemm,
    layer_norm,
    rms_norm,
    scaled_dot_product_attention,
    softmax_crossentropy,
)
"""One module per backed command, named after it."""


def _register() -> None:
    for module in MODULES:
        command = module.__name__.rsplit(".", 1)[-1]
        forward = getattr(module, command)
        backend = Backend(
            NAME,
            forward,
            PLATFORMS,
            module.supports,
            PRIORITY.get(command, 0),
            INTERPRET_PLATFORMS,
            backward=module.backward,
            wins=getattr(module, "wins", None),
        )
        register_backend(command, backend)
    attention = scaled_dot_product_attention
    variants = (
        (WIDE_ATTENTION, attention.WIDE),
        (SPLIT_ATTENTION, attention.SPLIT),
        (FUSED_ATTENTION, attention.FUSED),
    )
    for name, blocks in variants:
        register_backend(
            attention.NAME,
            Backend(
                name,
                functools.partial(attention.scaled_dot_product_attention, blocks=blocks),
                PLATFORMS,
                functools.partial(attention.supports, blocks=blocks),
                0,
                INTERPRET_PLATFORMS,
                backward=functools.partial(attention.backward, blocks=blocks),
            ),
        )


WIDE_ATTENTION = "pallas_bq128"
"""Flash attention with 128-query blocks (:data:`scaled_dot_product_attention.WIDE`):
chosen only where measured faster (priority 0)."""

SPLIT_ATTENTION = "pallas_split"
"""Flash attention with :data:`scaled_dot_product_attention.SPLIT`'s blocks (WIDE's
forward; backward kernels that keep 128 rows and stream 32): chosen only where
measured faster (priority 0)."""

FUSED_ATTENTION = "pallas_fused"
"""Flash attention with FlashAttention-2's one-kernel backward
(:data:`scaled_dot_product_attention.FUSED`; dQ summed with atomic adds, so not
bit-for-bit repeatable): chosen only where measured faster (priority 0)."""

_register()
