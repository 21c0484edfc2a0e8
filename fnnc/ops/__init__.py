"""fnnc commands: NNC's ops as frozen, hashable values (``ops.gemm(transpose_b=True)``).

A command is built by its factory and called on arrays to run eagerly, or added to a
graph with :meth:`fnnc.graph.GraphBuilder.exec`:

>>> import jax.numpy as jnp
>>> from fnnc import ops
>>> ops.gemm(transpose_b=True)(jnp.ones((2, 3)), jnp.ones((4, 3))).shape
(2, 4)

Each command has a shape rule, a reference forward (the ``"xla"`` backend), a backward
in NNC's convention and attributes; :func:`registry` lists them all.
"""

from fnnc.core.command import ALL_INPUTS as ALL_INPUTS
from fnnc.core.command import NOTHING as NOTHING
from fnnc.core.command import Attributes as Attributes
from fnnc.core.command import Command as Command
from fnnc.core.command import OpDef as OpDef
from fnnc.core.command import Uses as Uses
from fnnc.core.command import defcommand as defcommand
from fnnc.core.command import lookup as lookup
from fnnc.core.command import registry as registry
from fnnc.core.dispatch import Backend as Backend
from fnnc.core.dispatch import backends_of as backends_of
from fnnc.core.dispatch import register_backend as register_backend
from fnnc.core.dispatch import select_backend as select_backend
from fnnc.core.dispatch import unregister_backend as unregister_backend
from fnnc.ops import attention_cudnn as attention_cudnn
from fnnc.ops import autotune as autotune
from fnnc.ops import conv_cpu as conv_cpu
from fnnc.ops import pallas as pallas
from fnnc.ops.activation import gelu as gelu
from fnnc.ops.activation import leaky_relu as leaky_relu
from fnnc.ops.activation import log_softmax as log_softmax
from fnnc.ops.activation import mish as mish
from fnnc.ops.activation import relu as relu
from fnnc.ops.activation import sigmoid as sigmoid
from fnnc.ops.activation import softmax as softmax
from fnnc.ops.activation import softplus as softplus
from fnnc.ops.activation import swish as swish
from fnnc.ops.activation import tanh as tanh
from fnnc.ops.attention import scaled_dot_product_attention as scaled_dot_product_attention
from fnnc.ops.autodiff import gradient as gradient
from fnnc.ops.blas import add as add
from fnnc.ops.blas import gemm as gemm
from fnnc.ops.blas import mul as mul
from fnnc.ops.blas import scalar_mul as scalar_mul
from fnnc.ops.call import call as call
from fnnc.ops.call import write_view as write_view
from fnnc.ops.constant import Literal as Literal
from fnnc.ops.constant import constant as constant
from fnnc.ops.control import case_of as case_of
from fnnc.ops.control import compare as compare
from fnnc.ops.control import while_loop as while_loop
from fnnc.ops.conv import convolution as convolution
from fnnc.ops.conv import convolution_transpose as convolution_transpose
from fnnc.ops.data import broadcast_to as broadcast_to
from fnnc.ops.data import concat as concat
from fnnc.ops.data import data_transfer as data_transfer
from fnnc.ops.data import datatype_conversion as datatype_conversion
from fnnc.ops.data import format_transform as format_transform
from fnnc.ops.data import index_select as index_select
from fnnc.ops.data import reshape as reshape
from fnnc.ops.data import slice as slice
from fnnc.ops.data import transpose as transpose
from fnnc.ops.elementwise import clamp as clamp
from fnnc.ops.elementwise import ewabs as ewabs
from fnnc.ops.elementwise import ewdiv as ewdiv
from fnnc.ops.elementwise import ewerf as ewerf
from fnnc.ops.elementwise import ewerfc as ewerfc
from fnnc.ops.elementwise import ewexp as ewexp
from fnnc.ops.elementwise import ewexpm1 as ewexpm1
from fnnc.ops.elementwise import ewlog as ewlog
from fnnc.ops.elementwise import ewlog1p as ewlog1p
from fnnc.ops.elementwise import ewprod as ewprod
from fnnc.ops.elementwise import ewrsqrt as ewrsqrt
from fnnc.ops.elementwise import ewsqrt as ewsqrt
from fnnc.ops.elementwise import ewsum as ewsum
from fnnc.ops.elementwise import max as max
from fnnc.ops.elementwise import min as min
from fnnc.ops.elementwise import select as select
from fnnc.ops.elementwise import stop_gradient as stop_gradient
from fnnc.ops.embedding import embedding as embedding
from fnnc.ops.fill import masked_fill as masked_fill
from fnnc.ops.fill import pad as pad
from fnnc.ops.fill import set as set
from fnnc.ops.fused import fused_elementwise as fused_elementwise
from fnnc.ops.gated import rmsnorm_gated as rmsnorm_gated
from fnnc.ops.gated import segmented_swiglu as segmented_swiglu
from fnnc.ops.gated import swiglu as swiglu
from fnnc.ops.gated import swish_mul as swish_mul
from fnnc.ops.group_norm import group_norm as group_norm
from fnnc.ops.linear_crossentropy import (
    linear_softmax_crossentropy as linear_softmax_crossentropy,
)
from fnnc.ops.linear_crossentropy_mean import (
    linear_softmax_crossentropy_mean as linear_softmax_crossentropy_mean,
)
from fnnc.ops.loss import binary_crossentropy as binary_crossentropy
from fnnc.ops.loss import categorical_crossentropy as categorical_crossentropy
from fnnc.ops.loss import mse as mse
from fnnc.ops.loss import sigmoid_binary_crossentropy as sigmoid_binary_crossentropy
from fnnc.ops.loss import smooth_l1 as smooth_l1
from fnnc.ops.loss import softmax_crossentropy as softmax_crossentropy
from fnnc.ops.memory import lssc_compress as lssc_compress
from fnnc.ops.memory import lssc_decompress as lssc_decompress
from fnnc.ops.memory import optimization_barrier as optimization_barrier
from fnnc.ops.moe import comm_all_to_all as comm_all_to_all
from fnnc.ops.moe import moe_routing as moe_routing
from fnnc.ops.moe import segmented_gemm as segmented_gemm
from fnnc.ops.norm import batch_norm as batch_norm
from fnnc.ops.norm import layer_norm as layer_norm
from fnnc.ops.norm import rms_norm as rms_norm
from fnnc.ops.optimizer import optax_update as optax_update
from fnnc.ops.pipeline import pipeline as pipeline
from fnnc.ops.pool import avg_pool as avg_pool
from fnnc.ops.pool import max_pool as max_pool
from fnnc.ops.pool import sum_pool as sum_pool
from fnnc.ops.primitive import exported as exported
from fnnc.ops.primitive import primitive as primitive
from fnnc.ops.quantize import conform_data_format as conform_data_format
from fnnc.ops.quantize import walsh_hadamard_transform as walsh_hadamard_transform
from fnnc.ops.random import dropout as dropout
from fnnc.ops.random import random_normal as random_normal
from fnnc.ops.random import random_split as random_split
from fnnc.ops.random import random_uniform as random_uniform
from fnnc.ops.recurrent import gated_delta as gated_delta
from fnnc.ops.recurrent import hyper_connection as hyper_connection
from fnnc.ops.reduce import argmax as argmax
from fnnc.ops.reduce import argmin as argmin
from fnnc.ops.reduce import reduce_isnan as reduce_isnan
from fnnc.ops.reduce import reduce_max as reduce_max
from fnnc.ops.reduce import reduce_mean as reduce_mean
from fnnc.ops.reduce import reduce_min as reduce_min
from fnnc.ops.reduce import reduce_norm2 as reduce_norm2
from fnnc.ops.reduce import reduce_sum as reduce_sum
from fnnc.ops.rnn import lstm as lstm
from fnnc.ops.rope import cmul as cmul
from fnnc.ops.rope import rmsnorm_cmul as rmsnorm_cmul
from fnnc.ops.rope import rotate_half as rotate_half
from fnnc.ops.scan import scan as scan
from fnnc.ops.sharding import sharding_constraint as sharding_constraint
from fnnc.ops.sorting import argsort as argsort
from fnnc.ops.sorting import partition as partition
from fnnc.ops.sorting import scatter_add as scatter_add
from fnnc.ops.sorting import sort as sort
from fnnc.ops.sorting import unique_consecutive as unique_consecutive
from fnnc.ops.sparse_attention import (
    scaled_dot_product_arg_partition as scaled_dot_product_arg_partition,
)
from fnnc.ops.sparse_attention import sol_attention as sol_attention
from fnnc.ops.sparse_attention import sparse_indexed_attention as sparse_indexed_attention
from fnnc.ops.statistics import gumbel_argmax as gumbel_argmax
from fnnc.ops.statistics import histogram as histogram
from fnnc.ops.transcendental import ewcos as ewcos
from fnnc.ops.transcendental import ewpow as ewpow
from fnnc.ops.transcendental import ewsin as ewsin
from fnnc.ops.transcendental import fill_if_less_than as fill_if_less_than
from fnnc.ops.transcendental import reduce_logsumexp as reduce_logsumexp
from fnnc.ops.transcendental import signed_sqrt as signed_sqrt
from fnnc.ops.upsample import upsample as upsample
from fnnc.ops.vision import grid_sample as grid_sample
from fnnc.ops.vision import nms as nms
from fnnc.ops.vision import roi_align as roi_align
