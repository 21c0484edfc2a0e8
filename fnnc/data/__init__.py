"""fnnc.data: NNC's dataframe on Grain — columns, map, shuffle, batch, iterators.

A :class:`DataFrame` describes a data set: named columns over rows and the steps that
derive columns (:meth:`~DataFrame.map`), reorder rows (:meth:`~DataFrame.shuffle`,
:meth:`~DataFrame.shard`) and group them (:meth:`~DataFrame.batch`,
:meth:`~DataFrame.sample`). Columns come from NumPy arrays and memory maps
(:meth:`~DataFrame.from_arrays`, never copied), tensors of an NNC tensor file, one per
row (:meth:`~DataFrame.from_tensor_file`) or sliced along the first axis of one big
tensor (:meth:`~DataFrame.from_tensor_slices`), CSV files, Python sequences and
functions. Nothing is read until an iterator asks; then Grain (``grain.MapDataset``)
orders the rows, reads ahead on threads or worker processes, and keeps a position a
checkpoint can store, so data larger than memory streams from disk.

>>> import json
>>> import numpy as np
>>> from fnnc.data import DataFrame
>>> x = np.arange(10, dtype=np.float32).reshape(10, 1)
>>> df = DataFrame.from_arrays(x=x, y=np.arange(10) % 2)
>>> df = df.map(lambda v: v / 10, "x", "x").shuffle().batch(4, drop_remainder=True)
>>> len(df), df.columns
(2, ('x', 'y'))
>>> it = df.iterator(("x", "y"), seed=0, epoch=0)
>>> xb, yb = next(it)
>>> xb.shape, yb.shape, xb.dtype
((4, 1), (4,), dtype('float32'))
>>> state = json.dumps(it.get_state())  # store it with the model's checkpoint
>>> resumed = df.iterator(("x", "y"))
>>> resumed.set_state(json.loads(state))
>>> bool((next(resumed)[0] == next(it)[0]).all())
True

Epoch ``e`` is shuffled from ``(seed, e)``: ``df.iterator(epoch=e)`` for e = 0, 1, ...
continues one sequence, and the same seed replays it. ``workers=`` reads ahead in
processes and gives the same stream as ``workers=0``; ``df.read_with(workers=2)`` makes
that the default, for loops that make the iterators themselves (``Model.train``): the
processes then start once per run (:func:`release_workers` stops them before exit).
:meth:`~DataFrame.shard` gives each JAX process its share. NNC's add-ons derive columns
by name (``df.one_hot("y", 10)``, ``copy_scalar``, ``one_squared``, ``truncate``,
``image_random_jitter``: :mod:`fnnc.data.addons`), and ``it.prefetch(n)`` reads the
next ``n`` elements now, as NNC's ``ccv_cnnp_dataframe_iter_prefetch``. Errors are
:class:`DataError`, naming the column and row.
"""

from fnnc.data.errors import DataError as DataError
from fnnc.data.frame import DataFrame as DataFrame
from fnnc.data.iterator import DataIterator as DataIterator
from fnnc.data.sources import Column as Column
from fnnc.data.workers import release_workers as release_workers
