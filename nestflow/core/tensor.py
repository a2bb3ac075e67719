"""Tensor: a dense array with lazy allocation (seed 004: memory comes at mutable_data, not before)."""

from __future__ import annotations

import operator
from collections.abc import Sequence

import numpy as np

from nestflow.core.dtype import BFLOAT16, dtype_name
from nestflow.core.place import CPUPlace, Place, place_of
from nestflow.errors import DTypeError, ShapeError, UninitializedError


def numeric_dtype(dtype, what: str) -> np.dtype:
    """`dtype` (any spelling; "float" is float32 as in a VarDesc) as a NumPy dtype a tensor may
    have: bool, integer, float (bfloat16 too) or complex. DTypeError naming `what` for others (structured,
    object, strings), which no kernel takes."""
    name = dtype_name(dtype)
    try:
        resolved = np.dtype(name)
    except TypeError:  # a structured dtype's name ("void128") is no dtype spelling
        resolved = None
    if resolved is None or (resolved.kind not in "biufc" and resolved != BFLOAT16):
        raise DTypeError(f"{what}: dtype {dtype!r} ({name}) is not a numeric tensor dtype")
    return resolved


# Places are immutable, so every Tensor made without one shares this one.
_HOST = CPUPlace()


class Tensor:
    """A possibly unallocated n-d array on a Place.

    `mutable_data(shape, dtype)` allocates, and reallocates only when shape or dtype changes;
    `data()` raises UninitializedError before that. The data lives on `place` (a NumPy array on
    CPUPlace, a CuPy array on CUDAPlace); `numpy()` copies it to the host, `to(place)` copies
    it to another place. Interchanges with NumPy (`__array__`) and, zero-copy, with
    PyTorch/CuPy/JAX (`__dlpack__`, `Tensor.from_dlpack`).

    >>> t = nf.Tensor()
    >>> t.is_allocated()
    False
    >>> buf = t.mutable_data([2, 3], "float32")  # allocates
    >>> buf[:] = 1.0
    >>> t.mutable_data([2, 3], "float32") is buf  # same shape and dtype: same buffer
    True
    >>> t.shape, t.dtype, float(np.asarray(t).sum())
    ((2, 3), dtype('float32'), 6.0)
    """

    __slots__ = ("_array", "place", "__weakref__")

    def __init__(self, place: Place | None = None):
        self._array = None
        self.place = place if place is not None else _HOST

    @classmethod
    def _holding(cls, array, place: Place | None = None) -> Tensor:
        """A Tensor holding `array` itself (no copy) on its place: how a scope keeps a computed
        value."""
        tensor = cls.__new__(cls)
        tensor._array = array
        tensor.place = place if place is not None else place_of(array)
        return tensor

    @classmethod
    def from_dlpack(cls, source) -> Tensor:
        """A Tensor sharing the memory of `source`, any object with `__dlpack__` (a PyTorch,
        CuPy or JAX array): zero-copy; host memory becomes a CPUPlace tensor, CUDA memory a
        CUDAPlace one. PlaceError for memory of another kind of device.

        >>> import torch
        >>> t = nf.Tensor.from_dlpack(torch.arange(3.0))
        >>> t.place, t.numpy().tolist()
        (CPUPlace(), [0.0, 1.0, 2.0])
        """
        from nestflow.errors import PlaceError

        try:
            device_type, device_id = source.__dlpack_device__()
        except AttributeError:
            raise PlaceError(
                f"Tensor.from_dlpack needs an object with __dlpack__, got {type(source).__name__}"
            ) from None
        if device_type == 1:  # kDLCPU
            return cls._holding(np.from_dlpack(source), _HOST)
        if device_type == 2:  # kDLCUDA
            import cupy

            return cls._holding(cupy.from_dlpack(source))
        raise PlaceError(f"Tensor.from_dlpack: DLPack device type {device_type} is not supported")

    def to(self, place: Place) -> Tensor:
        """A copy of this tensor on `place` (this tensor itself if it is already there).

        >>> t = nf.Tensor(); t.set(np.arange(3.0))
        >>> t.to(nf.CPUPlace()) is t
        True
        """
        if place == self.place:
            return self
        from nestflow.core.device_context import device_context

        host = self.place.to_host(self.data())
        return Tensor._holding(device_context(place).to_device(host), place)

    def is_allocated(self) -> bool:
        return self._array is not None

    @property
    def shape(self) -> tuple[int, ...]:
        return () if self._array is None else tuple(self._array.shape)

    @property
    def dtype(self) -> np.dtype | None:
        return None if self._array is None else self._array.dtype

    def mutable_data(self, shape: Sequence[int], dtype="float32"):
        """The writable buffer of this shape and dtype, allocating it only if it changed.

        ShapeError for a shape that is not a sequence of ints >= 0 or too big to allocate,
        DTypeError for a dtype that is not numeric (bool, int, float, complex)."""
        try:
            shape = tuple(operator.index(d) for d in shape)
        except TypeError:
            raise ShapeError(
                f"Tensor.mutable_data: shape {shape!r} must be a sequence of ints"
            ) from None
        if any(d < 0 for d in shape):
            raise ShapeError(f"Tensor.mutable_data: shape {list(shape)} has a negative dim")
        dtype = numeric_dtype(dtype, "Tensor.mutable_data")
        arr = self._array
        if arr is None or arr.shape != shape or arr.dtype != dtype:
            try:
                arr = self.place.array_module.empty(shape, dtype=dtype)
            except (MemoryError, ValueError) as err:  # ValueError: more bytes than can exist
                size = float(np.prod(shape, dtype=np.float64)) * dtype.itemsize
                raise ShapeError(
                    f"Tensor.mutable_data: cannot allocate shape {list(shape)} {dtype} "
                    f"({size / 2**30:.4g} GiB): {err}"
                ) from None
            self._array = arr
        return arr

    def data(self):
        """The held array; raises UninitializedError if mutable_data/set never ran."""
        if self._array is None:
            raise UninitializedError("tensor holds no memory yet: call mutable_data() or set()")
        return self._array

    def set(self, array, place: Place | None = None) -> None:
        """Hold a copy of `array` (any array-like)."""
        place = place if place is not None else self.place
        if isinstance(array, Tensor):
            array = array.data()
        if place_of(array) != place and place_of(array) != _HOST:
            array = place_of(array).to_host(array)
        try:
            copy = place.array_module.array(array, copy=True)
        except (ValueError, TypeError) as err:
            raise ShapeError(f"Tensor.set needs a rectangular array-like: {err}") from None
        numeric_dtype(copy.dtype, "Tensor.set")
        self._array = copy
        self.place = place

    def numpy(self) -> np.ndarray:
        """A host NumPy copy of the data."""
        return np.array(self.place.to_host(self.data()), copy=True)

    @property
    def xp(self):
        """The array module of the tensor's place (NumPy, CuPy or the stand-in)."""
        return self.place.array_module

    def __array__(self, dtype=None, copy=None):
        arr = self.place.to_host(self.data())
        if dtype is not None:
            arr = arr.astype(dtype, copy=False)
        return np.array(arr, copy=True) if copy else arr

    def __dlpack__(self, *args, **kwargs):
        return self.data().__dlpack__(*args, **kwargs)

    def __dlpack_device__(self):
        return self.data().__dlpack_device__()

    def __len__(self) -> int:
        return len(self.data())

    def __repr__(self) -> str:
        if self._array is None:
            return f"Tensor(unallocated, place={self.place!r})"
        return f"Tensor(shape={self.shape}, dtype={self.dtype}, place={self.place!r})"
