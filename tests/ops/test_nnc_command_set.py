"""NNC's whole command set: every ``CCV_NNC_*_FORWARD`` command has an fnnc command.

The names: the 71 of liuliu/ccv's ``lib/nnc/cmd/ccv_nnc_cmd.h`` at c6ce5b1 (2024; 69
commands plus ``CUSTOM`` and ``GRAPH``), the newest header that could be read, and the
31 that NNC registered since (``REGISTER_COMMAND`` in ``lib/nnc/cmd/<family>/``:
``SCATTER_ADD``, ``SORT``, ``ARGSORT``, ``PARTITION``, ... and ``EWABS``, which s4nnc
calls). The issue counts 100 commands in the newest header (69 + 31); all are here
(``ARGSORT``, the last one found, is registered in NNC's ``sort/gpu`` backend). Each name maps
to the fnnc command that does its work, or, for the communication commands, to the API
that does it instead (XLA collectives that sharding inserts), or is listed as not
applicable with the reason.

The MoE, sparse-attention and vision commands are grouped in :data:`MOE_AND_VISION`.
"""

from __future__ import annotations

from fnnc import ops

NNC_TO_FNNC = {
    # optimizers: one command that runs any Optax transformation (NNC's five are Optax's)
    "ADAM": "optax_update",
    "ADAMW": "optax_update",
    "LAMB": "optax_update",
    "RMSPROP": "optax_update",
    "SGD": "optax_update",
    # BLAS and elementwise
    "ADD": "add",
    "MUL": "mul",
    "SCALAR_MUL": "scalar_mul",
    "GEMM": "gemm",
    "CMUL": "cmul",
    "ROTATE_HALF": "rotate_half",
    "EWSUM": "ewsum",
    "EWPROD": "ewprod",
    "EWDIV": "ewdiv",
    "EWEXP": "ewexp",
    "EWLOG": "ewlog",
    "EWSQRT": "ewsqrt",
    "EWABS": "ewabs",
    "EWSIN": "ewsin",
    "EWCOS": "ewcos",
    "EWPOW": "ewpow",
    "SIGNED_SQRT": "signed_sqrt",
    "CLAMP": "clamp",
    "MIN": "min",
    "MAX": "max",
    "FILL_IF_LESS_THAN": "fill_if_less_than",
    # activations and gated units
    "RELU": "relu",
    "LEAKY_RELU": "leaky_relu",
    "SIGMOID": "sigmoid",
    "TANH": "tanh",
    "SWISH": "swish",
    "GELU": "gelu",
    "SOFTMAX": "softmax",
    "SWISH_MUL": "swish_mul",
    "SWIGLU": "swiglu",
    "SEGMENTED_SWIGLU": "segmented_swiglu",
    # reductions, sorting, counting
    "REDUCE_SUM": "reduce_sum",
    "REDUCE_MEAN": "reduce_mean",
    "REDUCE_MAX": "reduce_max",
    "REDUCE_MIN": "reduce_min",
    "REDUCE_NORM2": "reduce_norm2",
    "REDUCE_ISNAN": "reduce_isnan",
    "REDUCE_LOGSUMEXP": "reduce_logsumexp",
    "ARGMAX": "argmax",
    "ARGMIN": "argmin",
    "GUMBEL_ARGMAX": "gumbel_argmax",
    "SORT": "sort",
    "ARGSORT": "argsort",
    "PARTITION": "partition",
    "UNIQUE_CONSECUTIVE": "unique_consecutive",
    "SCATTER_ADD": "scatter_add",
    "HISTOGRAM": "histogram",
    # convolution, pooling, resampling
    "CONVOLUTION": "convolution",
    "CONVOLUTION_TRANSPOSE": "convolution_transpose",
    "MAX_POOL": "max_pool",
    "AVERAGE_POOL": "avg_pool",
    "UPSAMPLE": "upsample",
    # normalisation
    "BATCH_NORM": "batch_norm",
    "LAYER_NORM": "layer_norm",
    "GROUP_NORM": "group_norm",
    "RMSNORM": "rms_norm",
    "RMSNORM_GATED": "rmsnorm_gated",
    "RMSNORM_CMUL": "rmsnorm_cmul",
    # losses
    "SOFTMAX_CROSSENTROPY": "softmax_crossentropy",
    "CATEGORICAL_CROSSENTROPY": "categorical_crossentropy",
    "BINARY_CROSSENTROPY": "binary_crossentropy",
    "SIGMOID_BINARY_CROSSENTROPY": "sigmoid_binary_crossentropy",
    "MSE": "mse",
    "SMOOTH_L1": "smooth_l1",
    # data movement
    "DATA_TRANSFER": "data_transfer",
    "DATATYPE_CONVERSION": "datatype_conversion",
    "FORMAT_TRANSFORM": "format_transform",
    "TRANSPOSE": "transpose",
    "SET": "set",
    "MASKED_FILL": "masked_fill",
    "INDEX_SELECT": "index_select",
    "PAD": "pad",
    # randomness, compression, quantisation
    "DROPOUT": "dropout",
    "RANDOM_NORMAL": "random_normal",
    "RANDOM_UNIFORM": "random_uniform",
    "COMPRESSION_LSSC": "lssc_compress",
    "CONFORM_DATA_FORMAT": "conform_data_format",
    "WALSH_HADAMARD_TRANSFORM": "walsh_hadamard_transform",
    # recurrent, attention
    "LSTM": "lstm",
    "SCALED_DOT_PRODUCT_ATTENTION": "scaled_dot_product_attention",
    # a user's computation as one node: a JAX primitive, or a whole graph
    "CUSTOM": "primitive",
    "GRAPH": "call",
}
"""NNC command (``CCV_NNC_<name>_FORWARD``) -> the fnnc command that stands for it."""

MOE_AND_VISION = {
    "SEGMENTED_GEMM": "segmented_gemm",
    "MOE_ROUTING": "moe_routing",
    "COMM_ALL_TO_ALL": "comm_all_to_all",
    "SCALED_DOT_PRODUCT_ARG_PARTITION": "scaled_dot_product_arg_partition",
    "SPARSE_INDEXED_ATTENTION": "sparse_indexed_attention",
    "SOL_ATTENTION": "sol_attention",
    "GATED_DELTA": "gated_delta",
    "GRID_SAMPLE": "grid_sample",
    "ROI_ALIGN": "roi_align",
    "NMS": "nms",
    "HYPER_CONNECTION": "hyper_connection",
}
"""NNC's mixture-of-experts, sparse-attention and vision commands."""

OTHER_API = {
    "COMM_ALLREDUCE": "fnnc.graph.data_parallel / fnnc.graph.Shardings: XLA inserts the "
    "all-reduce of gradients that sharding implies (jax.lax.psum under shard_map)",
    "COMM_BROADCAST": "fnnc.graph.Shardings: replicated parameters are broadcast by XLA "
    "when a program's inputs are placed (jax.device_put with a NamedSharding)",
    "COMM_REDUCE": "fnnc.graph.data_parallel: the reduction of a sharded result is an "
    "XLA collective of the compiled program",
}
"""Communication commands done by another fnnc API (collectives of compiled programs)."""

NOT_APPLICABLE = {
    "MOE_WEIGHTS_STREAMING": "Metal-only streaming of expert weights from disk for "
    "inference on Apple devices; no counterpart in an XLA program",
}


def test_every_nnc_command_has_its_fnnc_command() -> None:
    from fnnc.graph import Shardings, data_parallel  # the communication commands' API

    groups = (NNC_TO_FNNC, MOE_AND_VISION, OTHER_API, NOT_APPLICABLE)
    names = [name for group in groups for name in group]
    # 71 names of the 2024 header and the 31 registered since (module docstring).
    assert len(names) == len(set(names)) == 71 + 31
    assert callable(data_parallel) and Shardings is not None
    registered = ops.registry()
    mapped = {**NNC_TO_FNNC, **MOE_AND_VISION}
    missing = {nnc: fnnc for nnc, fnnc in mapped.items() if fnnc not in registered}
    assert not missing, f"NNC commands without their fnnc command: {missing}"
