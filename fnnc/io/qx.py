"""NNC's palettized ``QX`` rows, read as the elements they encode.

``ccv_nnc_tensor_write`` of a tensor from ``ccv_nnc_tensor_palettize`` stores the datatype
column ``block_size << 32 | QX | bits << 8 | element datatype >> 12`` and the palettized
bytes (:mod:`fnnc.io.palettize`'s layout, bit-exact with NNC's). NNC reads such a row back
as a QX tensor that its caller depalettizes; fnnc's reader depalettizes it at once (the
same ``ccv_nnc_depalettize``), so an NNC model with palettized weights loads as one whose
weights are the decoded values.
"""

from __future__ import annotations

import dataclasses
import math

from fnnc.errors import TensorFileError
from fnnc.io import format as fmt
from fnnc.io.palettize import depalettize


def decode(
    info: fmt.TensorInfo, datatype: int, data: bytes, where: str
) -> tuple[fmt.TensorInfo, bytes]:
    """``(info, bytes)`` of a QX row's decoded elements; ``info.dtype`` is their type.

    Raises:
        TensorFileError: the datatype column names no element type NNC palettizes, or the
            bytes are not a palettized tensor of the row's shape.
    """
    code = datatype & 0xFFFFFFFF
    element = info.palettized
    bits, block_size = (code >> 8) & 0xF, (datatype >> 32) & 0xFFFFFFFF
    if element is None:
        raise TensorFileError(
            f"{where} is NNC's quantized QX datatype {code:#x} (palettized), but its element type "
            f"{(code & 0xFF) << 12:#x} is none NNC has; the row is damaged or not NNC's"
        )
    try:
        values = depalettize(data, element, math.prod(info.shape), bits, block_size)
    except ValueError as e:
        raise TensorFileError(
            f"{where}: NNC's palettized QX row ({element.name} in {bits} bits, blocks of "
            f"{block_size}) cannot be decoded: {e}"
        ) from None
    return dataclasses.replace(info, dtype=element, palettized=None), values.tobytes()
