"""cnnp models: a Keras-like functional model API, compiled through fnnc's symbolic graph.

Define a model with :func:`Input` and layers called on it, compile it for input specs
with a loss and an Optax minimizer, then train it one fused step at a time:

>>> import numpy as np, optax
>>> from fnnc.models import Input, Dense, Model, ReLU
>>> x = Input()
>>> model = Model([x], [Dense(2, name="linear")(ReLU()(Dense(4)(x)))])
>>> model.compile([np.zeros((8, 3), np.float32)], loss="softmax_crossentropy",
...               minimizer=optax.sgd(0.1))
>>> loss = model.fit([np.ones((8, 3), np.float32)], [np.zeros((8,), np.int32)])
>>> "t-linear-0-0" in model.parameters()
True
"""

from typing import TYPE_CHECKING

from fnnc.models import metrics as metrics
from fnnc.models import minimizers as minimizers
from fnnc.models.attention_layers import ScaledDotProductAttention as ScaledDotProductAttention
from fnnc.models.callbacks import Callback as Callback
from fnnc.models.callbacks import CheckpointEvery as CheckpointEvery
from fnnc.models.callbacks import EarlyStopping as EarlyStopping
from fnnc.models.layer import BuildContext as BuildContext
from fnnc.models.layer import Input as Input
from fnnc.models.layer import Layer as Layer
from fnnc.models.layer import ModelError as ModelError
from fnnc.models.layer import ModelIO as ModelIO
from fnnc.models.layers import Activation as Activation
from fnnc.models.layers import Add as Add
from fnnc.models.layers import BatchNorm as BatchNorm
from fnnc.models.layers import Chunk as Chunk
from fnnc.models.layers import CommandLayer as CommandLayer
from fnnc.models.layers import Concat as Concat
from fnnc.models.layers import Dense as Dense
from fnnc.models.layers import Dropout as Dropout
from fnnc.models.layers import Embedding as Embedding
from fnnc.models.layers import Flatten as Flatten
from fnnc.models.layers import GroupNorm as GroupNorm
from fnnc.models.layers import LayerNorm as LayerNorm
from fnnc.models.layers import Mul as Mul
from fnnc.models.layers import MultiHeadAttention as MultiHeadAttention
from fnnc.models.layers import Parameter as Parameter
from fnnc.models.layers import ReLU as ReLU
from fnnc.models.layers import Reshape as Reshape
from fnnc.models.layers import RMSNorm as RMSNorm
from fnnc.models.llm_layers import MoE as MoE
from fnnc.models.llm_layers import RotaryEmbedding as RotaryEmbedding
from fnnc.models.llm_layers import SwiGLU as SwiGLU
from fnnc.models.loggers import CSVLogger as CSVLogger
from fnnc.models.loggers import LearningRate as LearningRate
from fnnc.models.loggers import PlotHistory as PlotHistory
from fnnc.models.loggers import TensorBoard as TensorBoard
from fnnc.models.loss_scale import LossScale as LossScale
from fnnc.models.model import Model as Model
from fnnc.models.model import Sequential as Sequential
from fnnc.models.model_function import ModelFunction as ModelFunction
from fnnc.models.model_function import model_function as model_function
from fnnc.models.pipeline import Pipeline as Pipeline
from fnnc.models.repeat import Repeat as Repeat
from fnnc.models.rnn_layers import LSTM as LSTM
from fnnc.models.spatial_layers import AvgPool as AvgPool
from fnnc.models.spatial_layers import Conv as Conv
from fnnc.models.spatial_layers import ConvTranspose as ConvTranspose
from fnnc.models.spatial_layers import MaxPool as MaxPool
from fnnc.models.spatial_layers import Upsample as Upsample
from fnnc.models.stacks import stack_parameters as stack_parameters
from fnnc.models.stacks import stacked_ids as stacked_ids
from fnnc.models.stacks import unstack_parameters as unstack_parameters

if TYPE_CHECKING:
    from fnnc.models.nnx_module import FnncModule as FnncModule
    from fnnc.models.nnx_module import Frozen as Frozen

_FLAX = {"FnncModule", "Frozen"}  # need Flax: imported on first use (Flax costs ~0.4 s)


def __getattr__(name: str) -> object:
    if name in _FLAX:
        from fnnc.models import nnx_module

        return getattr(nnx_module, name)
    raise AttributeError(f"module 'fnnc.models' has no attribute {name!r}")
