"""NNC's minimizers, rule for rule, as Optax transformations.

Any ``optax.GradientTransformation`` trains an fnnc model. The ones here reproduce
NNC's update commands exactly: the same hyper-parameter names, the same order of
operations (where ``scale`` and ``decay`` enter, where ``epsilon`` sits relative to the
square root, how the step count enters the bias corrections), and the same dtypes
(computed in float32, new parameters and saved auxiliaries written back in each
parameter's dtype, so float16 and bfloat16 parameters behave as on NNC's GPU kernels).
The update of a half or bfloat16 parameter is therefore float32: ``optax.apply_updates``
adds it in float32 and rounds the sum once to the parameter's dtype, as NNC's kernels
round ``a - delta`` once (an update in 16 bits would be rounded, then the sum again).
A wrapper whose ``lax.cond`` branches must agree on dtypes and whose other branch gives
the gradients' dtype (``optax.apply_if_finite``, ``optax.conditionally_transform``)
needs float32 gradients: chain :func:`float32_gradients` before it (the numbers are the
same: NNC reads a 16-bit gradient into float32 anyway).

===============  ==================================  ============================================
NNC command      fnnc                                rule taken from (liuliu/ccv)
===============  ==================================  ============================================
SGD_FORWARD      :func:`sgd`                         lib/nnc/cmd/sgd/ccv_nnc_sgd_cpu_ref.c
ADAM_FORWARD     :func:`adam`                        lib/nnc/cmd/adam/ccv_nnc_adam_cpu_ref.c
ADAMW_FORWARD    :func:`adamw`                       lib/nnc/cmd/adam/ccv_nnc_adamw_cpu_ref.c
RMSPROP_FORWARD  :func:`rmsprop`                     lib/nnc/cmd/rmsprop/ccv_nnc_rmsprop_cpu_ref.c
LAMB_FORWARD     :func:`lamb`                        lib/nnc/cmd/lamb/ccv_nnc_lamb_cpu_ref.c
NOOP             :func:`noop`                        lib/nnc/ccv_cnnp_model.c (noop minimizer)
backward x k     :func:`with_gradient_accumulation`  lib/nnc/ccv_cnnp_model.c (EWSUM accumulation)
===============  ==================================  ============================================

Hyper-parameter structs are in ``lib/nnc/ccv_nnc.h`` (C ``float`` fields: fnnc rounds
every hyper-parameter to float32 too, so ``1 - beta2`` is NNC's number); the dtype
handling is that of ``lib/nnc/cmd/*/gpu/ccv_nnc_*_gpu_ref.cu``. Defaults that NNC's C
macros leave to the caller follow s4nnc (``nnc/OptimizerAddons.swift``) and PyTorch.

Where fnnc differs in form: NNC's Adam and LAMB take the step ``t`` from the command,
and callers raise it by one per apply; here each state counts applies (``count``)
and ``t = count + 1``. ``rate`` may be an Optax schedule of that count, in place of
NNC's habit of setting a new minimizer with a new rate. Where it adds to NNC:
``rmsprop(centered=True)`` (off by default) and :func:`with_gradient_accumulation`
as a wrapper rather than a model mode. Each factory also runs under
``optax.inject_hyperparams`` (its numbers then traced in the jitted update: they are
range-checked only when given as numbers, and a traced ``decay`` counts as nonzero, so
``update`` needs ``params``).

Example:
    >>> import jax, jax.numpy as jnp, optax
    >>> from fnnc.models import minimizers
    >>> opt = minimizers.sgd(0.1, momentum=0.9, nesterov=True, scale=1 / 32)
    >>> params = {"w": jnp.ones((2, 2)), "b": jnp.zeros(2)}
    >>> state = opt.init(params)
    >>> grads = jax.tree.map(lambda p: jnp.full_like(p, 32.0), params)
    >>> updates, state = jax.jit(opt.update)(grads, state, params)
    >>> optax.apply_updates(params, updates)["b"]  # 0.1 * (1 + 0.9 * 1)
    Array([-0.19, -0.19], dtype=float32)
"""

from fnnc.models.minimizers._accumulate import AccumulationState as AccumulationState
from fnnc.models.minimizers._accumulate import float32_gradients as float32_gradients
from fnnc.models.minimizers._accumulate import noop as noop
from fnnc.models.minimizers._accumulate import (
    with_gradient_accumulation as with_gradient_accumulation,
)
from fnnc.models.minimizers._adam import AdamState as AdamState
from fnnc.models.minimizers._adam import adam as adam
from fnnc.models.minimizers._adam import adamw as adamw
from fnnc.models.minimizers._common import Rate as Rate
from fnnc.models.minimizers._lamb import LAMBState as LAMBState
from fnnc.models.minimizers._lamb import lamb as lamb
from fnnc.models.minimizers._rmsprop import RMSPropState as RMSPropState
from fnnc.models.minimizers._rmsprop import rmsprop as rmsprop
from fnnc.models.minimizers._sgd import SGDState as SGDState
from fnnc.models.minimizers._sgd import sgd as sgd
