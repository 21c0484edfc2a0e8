"""Constants: array values carried inside a graph as hashable literals.

Graphs hold no arrays, so a constant's value is kept as its bytes in a
:class:`Literal` (hashable, comparable, serialisable without pickle). ``trace`` turns
closed-over arrays and jaxpr literals into ``constant`` nodes; ``compile`` passes large
ones to XLA as arguments rather than baking them into the program.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fnnc.core.command import NOTHING, Command, Spec, defcommand, make_command
from fnnc.core.dtypes import is_inexact
from fnnc.errors import DTypeError


@dataclasses.dataclass(frozen=True, eq=False)
class Literal:
    """An immutable array value: raw bytes, shape and dtype."""

    data: bytes
    shape: tuple[int, ...]
    dtype: np.dtype

    @staticmethod
    def of(value: Any, dtype: Any = None, *, where: str = "constant") -> Literal:
        """A literal from anything ``np.asarray`` takes (a JAX array too), its bytes in
        the machine's order (a big-endian array is converted: the bytes are what a graph
        file stores under the dtype's name, and what XLA reads). ``where`` starts the
        error messages (``trace`` names the captured constant).

        Raises:
            DTypeError: with x64 off (64-bit values stored as 32-bit), integers outside
                the 32-bit range, which the conversion would wrap (``2**40`` became 0),
                and finite float64 (complex128) values beyond float32's (complex64's)
                largest finite value, which would become infinite (``1e300``).
        """
        arr = np.asarray(value, dtype=dtype)
        canonical = jax.dtypes.canonicalize_dtype(arr.dtype)
        _refuse_wrapping(arr, canonical, where)
        with np.errstate(over="ignore"):  # overflow to inf is refused by _refuse_overflow
            narrowed = arr.astype(canonical.newbyteorder("="), copy=False)
        _refuse_overflow(arr, narrowed, where)
        arr = narrowed
        return Literal(np.ascontiguousarray(arr).tobytes(), tuple(arr.shape), arr.dtype)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    def numpy(self) -> np.ndarray:
        """The value as a read-only NumPy array."""
        return np.frombuffer(self.data, self.dtype).reshape(self.shape)

    @functools.cached_property
    def splat(self) -> np.ndarray | None:
        """The one value every element holds (a 0-d array), or ``None``. A splat lowers
        to a broadcast of a scalar, which XLA fuses into its consumers, instead of a
        dense array baked into (or passed to) the program: ``simplify`` folds the
        gradient of ``reduce_mean`` into a ``[batch, 1]`` constant of ``1/batch``."""
        flat = self.numpy().reshape(-1)
        if flat.size == 0:
            return None
        first = flat[:1]
        same = flat.view(np.uint8).reshape(flat.size, -1) == first.view(np.uint8)
        return flat[0].copy() if bool(np.all(same)) else None

    @functools.cached_property
    def _hash(self) -> int:
        return hash((self.data, self.shape, self.dtype))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Literal)
            and self.shape == other.shape
            and self.dtype == other.dtype
            and self.data == other.data
        )

    def __str__(self) -> str:
        if self.size == 1:
            return repr(self.numpy().reshape(()).item())
        return f"<{self.dtype.name}{list(self.shape)}>"


def _refuse_wrapping(arr: np.ndarray, dtype: np.dtype, where: str = "constant") -> None:
    """Raises unless the integers of ``arr`` all fit ``dtype``, its narrower JAX type."""
    if arr.dtype == dtype or not np.issubdtype(arr.dtype, np.integer) or arr.size == 0:
        return
    info, lo, hi = np.iinfo(dtype), int(arr.min()), int(arr.max())
    if lo < info.min or hi > info.max:
        bad = lo if lo < info.min else hi
        raise DTypeError(
            f"{where}: a {arr.dtype.name}{list(arr.shape)} value holds {bad}, "
            f"outside {dtype.name}'s range [{info.min}, {info.max}]; with jax_enable_x64 off "
            f"JAX stores {arr.dtype.name} as {dtype.name}, which would wrap it. Give values in "
            "that range, or turn on jax_enable_x64"
        )


def _refuse_overflow(arr: np.ndarray, narrowed: np.ndarray, where: str = "constant") -> None:
    """Raises if a finite float (or complex part) of ``arr`` became infinite in
    ``narrowed``, its narrower JAX type (float64 as float32 with x64 off). Values within
    the narrower type's range stay, large mask fills (``-1e9``, float32's own min) too."""
    if arr.dtype == narrowed.dtype or not is_inexact(arr.dtype) or not arr.size:
        return
    parts = [(arr.real, narrowed.real), (arr.imag, narrowed.imag)]
    if not np.iscomplexobj(arr):
        parts = parts[:1]
    for was, now in parts:
        lost = np.isfinite(was) & ~np.isfinite(now)
        if np.any(lost):
            bad, kind = was[lost].reshape(-1)[0], narrowed.dtype
            most = np.finfo(kind).max
            raise DTypeError(
                f"{where}: a {arr.dtype.name}{list(arr.shape)} value holds {float(bad)!r}, "
                f"beyond {kind.name}'s largest finite value {float(most):.8g}; with "
                f"jax_enable_x64 off JAX stores {arr.dtype.name} as {kind.name}, where it "
                "would become infinite. "
                f"Give values within {kind.name}'s range (an infinity explicitly as inf), or "
                "turn on jax_enable_x64"
            )


def _constant_shape(*, value: Literal) -> Spec:
    return Spec(value.shape, value.dtype)


@defcommand(
    family="data", shape=_constant_shape, uses=NOTHING, differentiable=False, name="constant"
)
def _constant(*, value):
    """A fixed array value (no inputs)."""
    splat = value.splat
    if splat is not None and value.size > 1:
        return jnp.full(value.shape, splat, value.dtype)
    return jnp.asarray(value.numpy())


def constant(value: Any, dtype: Any = None) -> Command:
    """The command that produces a fixed array.

    >>> import numpy as np
    >>> from fnnc import ops
    >>> ops.constant(np.float32(2.5))()
    Array(2.5, dtype=float32)
    """
    lit = value if isinstance(value, Literal) else Literal.of(value, dtype)
    return make_command("constant", {"value": lit})


constant.definition = _constant.definition  # type: ignore[attr-defined]
