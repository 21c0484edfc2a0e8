"""fnnc.io: NNC's SQLite tensor files, model parameters, checkpoints, stored graphs.

Files are NNC's (``ccv_nnc_tensor_write``): one SQLite table ``tensors`` with a row per
named tensor, so NNC reads what fnnc writes and the other way round. On top of it:

- :class:`TensorFile`: write / read / info / delete rows; ``transaction()`` batches;
  encoder / decoder hooks (:class:`Codec`) as NNC's ``ccv_nnc_tensor_io_option_t``.
- :func:`write_parameters` / :func:`read_parameters`: a model's parameters and
  internals under NNC's row names (``<id>``, ``__<name>__[<id>]``, ``<id>(<device>)``),
  read back with a report of every missing or mis-shaped one.
- :class:`SafetensorsFile` and :func:`convert`: safetensors files (read and written
  through the ``safetensors`` library) with the same interface; conversion both ways
  with a name map; ``python -m fnnc convert A B``.
- NNC's codecs (:mod:`fnnc.io.nnc_codecs`: palettized ``q4p`` .. ``q8p``, ``ezm7``,
  ``zip``, ``fpzip``), registered by default: ``TensorFile.write(..., encoder="q8p")``.
- :class:`Checkpoints`: a journal of training steps (state, optimizer state, metadata)
  in one file; each save is one transaction, so a killed writer loses nothing saved.
- :class:`ShardedCheckpoints`: the same journal as an Orbax directory, each process
  writing only its own shards (models split over processes: FSDP, tensor parallel).
- :func:`save_to` / :func:`load_from`: graphs (:mod:`fnnc.graph`) beside the tensors.
- :func:`format_tensor`: an array as NNC's debug string (``ccv_nnc_tensor_format_new``).
- ``python -m fnnc inspect FILE [--stats] [--verify]``: what a file holds; with
  ``--verify``, every row checked (exit status 1 on damage).

Reading never creates or changes a file (read-only SQLite connections until the first
write); every SQLite failure is a :class:`~fnnc.errors.TensorFileError` naming the file
and the operation; every row fnnc writes carries a checksum in its own side table,
checked on read and by :meth:`TensorFile.verify` (NNC's ``tensors`` table is
unchanged). In a multi-process run only process 0 writes.

>>> import os, tempfile
>>> import numpy as np
>>> from fnnc import io
>>> path = os.path.join(tempfile.mkdtemp(), "model.sqlite")
>>> io.write_parameters(path, {"t-linear-0-0": np.eye(2, dtype=np.float32)})
>>> io.read_parameters(path, {"t-linear-0-0": ((2, 2), np.float32)})["t-linear-0-0"]
array([[1., 0.],
       [0., 1.]], dtype=float32)

Nothing is ever unpickled: arrays are raw bytes, structure and metadata are JSON.
"""

from fnnc.io import nnc_codecs as _nnc_codecs
from fnnc.io.checkpoints import Checkpoint as Checkpoint
from fnnc.io.checkpoints import Checkpoints as Checkpoints
from fnnc.io.codecs import Codec as Codec
from fnnc.io.codecs import register_codec as register_codec
from fnnc.io.codecs import registered_codecs as registered_codecs
from fnnc.io.codecs import unregister_codec as unregister_codec
from fnnc.io.convert import convert as convert
from fnnc.io.documents import Format as Format
from fnnc.io.documents import graph_names as graph_names
from fnnc.io.documents import load_from as load_from
from fnnc.io.documents import register_format as register_format
from fnnc.io.documents import save_to as save_to
from fnnc.io.format import TensorInfo as TensorInfo
from fnnc.io.integrity import IntegrityReport as IntegrityReport
from fnnc.io.parameters import Mismatch as Mismatch
from fnnc.io.parameters import ParameterSet as ParameterSet
from fnnc.io.parameters import internal_row as internal_row
from fnnc.io.parameters import parameter_row as parameter_row
from fnnc.io.parameters import read_parameters as read_parameters
from fnnc.io.parameters import write_parameters as write_parameters
from fnnc.io.safetensors_io import SafetensorsFile as SafetensorsFile
from fnnc.io.sharded_checkpoints import ShardedCheckpoints as ShardedCheckpoints
from fnnc.io.tensor_file import TensorFile as TensorFile
from fnnc.io.tensor_string import format_tensor as format_tensor

_nnc_codecs.register_nnc_codecs()
