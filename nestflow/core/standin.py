"""The stand-in device: NumPy arrays behind a CuPy-like module, so the device code paths run
(and fail where they would fail on a GPU) on a machine without one.

A `StandInArray` holds a NumPy array but behaves like a CuPy array where it matters:

- it refuses implicit conversion to NumPy (`np.asarray(a)` raises TypeError, as CuPy's
  `__array__` does), so a kernel that moves a device value to the host without saying so
  fails in the tests instead of copying silently on a GPU;
- it refuses NumPy arrays as operands (`a + np.ones(2)` raises TypeError, as CuPy does), so a
  host array made inside a kernel (`np.zeros` where `xp.zeros` was meant) fails too;
- NumPy functions and ufuncs called on it (`np.sum(a)`, `np.add(a, b)`) raise TypeError: a
  kernel is written against its place's `xp` (`xp.sum(a)`), whose functions give stand-in
  arrays (0-d arrays where NumPy gives scalars, as CuPy does);
- integer indices out of range wrap around in `take` and fancy indexing, as in CuPy, so a
  kernel that relies on NumPy's IndexError for bad ids must check them itself;
- inside `capturing()` (an emulated CUDA-graph capture) a matrix product (`xp.matmul`, `dot`,
  `einsum`, `tensordot`, `@`, `xp.linalg`) raises NotImplementedError, as CuPy 14 refuses
  every cuBLAS call on a capturing stream; a batched (3-d or more) bfloat16 matrix product
  raises TypeError, as CuPy 14.2 has no kernel for one.

Explicit reads stay allowed, as in CuPy: `.get()`, `xp.asnumpy(a)`, `.item()`, `.tolist()`,
`int(a)`, `float(a)`, `bool(a)` (a device value read on the host: the op must need it).

The module `xp` is what a kernel receives as its array module on a StandInPlace: NumPy's
namespace with every function unwrapping stand-in arguments and wrapping array results.
"""

from __future__ import annotations

import contextlib
import functools
import operator
import sys
import threading
import types
from typing import Any

import numpy as np

# Functions that move host data onto the device: they take NumPy arrays (CuPy's do too).
_HOST_TO_DEVICE = frozenset({"asarray", "array", "asanyarray", "ascontiguousarray"})


class StandInArray:
    """A NumPy array on the stand-in device (see the module docstring)."""

    __slots__ = ("_data", "__weakref__")
    __array_priority__ = 1000

    def __init__(self, data: np.ndarray):
        self._data = data

    # ---- what CuPy refuses ----

    def __array__(self, dtype=None, copy=None):
        raise TypeError(
            "Implicit conversion to a NumPy array is not allowed: this array is on the "
            "stand-in device (as a CuPy array on a GPU); use .get() or xp.asnumpy() to copy it "
            "to the host where the op needs it"
        )

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        name = ufunc.__name__ + ("" if method == "__call__" else f".{method}")
        raise TypeError(f"np.{name} was called on a stand-in device array: use the kernel's xp")

    def __array_function__(self, func, types_, args, kwargs):
        raise TypeError(
            f"np.{func.__name__} was called on a stand-in device array: use the kernel's xp "
            "(or nestflow.core.device_context.array_module(x) in a helper)"
        )

    # ---- explicit transfers and reads ----

    def get(self) -> np.ndarray:
        """A host copy (CuPy's `ndarray.get`)."""
        _transferred("read")
        return self._data.copy()

    def set(self, array: np.ndarray) -> None:
        """Copy the host array `array` (of this shape and dtype) in (CuPy's `ndarray.set`)."""
        if type(array) is not np.ndarray or array.shape != self.shape or array.dtype != self.dtype:
            raise ValueError(
                f"set takes a host array of shape {self.shape} and dtype {self.dtype}, got "
                f"{type(array).__name__} {getattr(array, 'shape', '')}"
            )
        self._data[...] = array

    def item(self):
        _transferred("read")
        return self._data.item()

    def tolist(self):
        _transferred("read")
        return self._data.tolist()

    def __bool__(self) -> bool:
        _transferred("read")
        return bool(self._data)

    def __int__(self) -> int:
        _transferred("read")
        return int(self._data)

    def __float__(self) -> float:
        _transferred("read")
        return float(self._data)

    def __complex__(self) -> complex:
        _transferred("read")
        return complex(self._data)

    def __index__(self) -> int:
        _transferred("read")
        return operator.index(self._data)

    # ---- array protocol ----

    @property
    def shape(self) -> tuple[int, ...]:
        return self._data.shape

    @shape.setter
    def shape(self, value) -> None:
        self._data.shape = value

    @property
    def dtype(self) -> np.dtype:
        return self._data.dtype

    @property
    def ndim(self) -> int:
        return self._data.ndim

    @property
    def size(self) -> int:
        return self._data.size

    @property
    def nbytes(self) -> int:
        return self._data.nbytes

    @property
    def itemsize(self) -> int:
        return self._data.itemsize

    @property
    def strides(self) -> tuple[int, ...]:
        return self._data.strides

    @property
    def flags(self):
        return self._data.flags

    @property
    def T(self) -> StandInArray:
        return StandInArray(self._data.T)

    @property
    def real(self) -> StandInArray:
        return StandInArray(self._data.real)

    @property
    def imag(self) -> StandInArray:
        return StandInArray(self._data.imag)

    @property
    def base(self):
        return None

    @property
    def device(self) -> str:
        return "standin"

    def __len__(self) -> int:
        return len(self._data)

    def __iter__(self):
        return (StandInArray(np.asarray(row)) for row in self._data)

    def __getitem__(self, key):
        return _wrap(self._data[_wrapped_key(self._data, _unwrap_key(key))])

    def __setitem__(self, key, value) -> None:
        self._data[_wrapped_key(self._data, _unwrap_key(key))] = _unwrap(value)

    def __getattr__(self, name: str):
        if name.startswith("__"):  # __array_interface__ and the like would expose the host data
            raise AttributeError(name)
        attr = getattr(self._data, name)
        if callable(attr):
            return _wrapped_callable(attr, calls_blas=name in _BLAS_FUNCTIONS)
        return _wrap(attr)

    def __dlpack__(self, *args, **kwargs):
        return self._data.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self):
        return self._data.__dlpack_device__()

    def __repr__(self) -> str:
        return f"StandInArray({self._data!r})"

    def __copy__(self) -> StandInArray:
        return StandInArray(self._data.copy())

    def __deepcopy__(self, memo) -> StandInArray:
        return StandInArray(self._data.copy())


def _binary(name: str):
    blas = "matmul" in name

    def method(self, other):
        if blas:
            _check_matmul(self, other)
        return _wrap(getattr(self._data, name)(_unwrap(other)))

    method.__name__ = name
    return method


def _unary(name: str):
    def method(self):
        return _wrap(getattr(self._data, name)())

    method.__name__ = name
    return method


for _name in (
    "add sub mul truediv floordiv mod pow matmul and or xor lshift rshift lt le gt ge eq ne divmod"
).split():
    for _form in ("__{}__", "__r{}__", "__i{}__"):
        _dunder = _form.format(_name)
        if hasattr(np.ndarray, _dunder):
            setattr(StandInArray, _dunder, _binary(_dunder))
for _dunder in ("__neg__", "__pos__", "__abs__", "__invert__"):
    setattr(StandInArray, _dunder, _unary(_dunder))
StandInArray.__hash__ = None  # arrays are unhashable, as NumPy's and CuPy's


def _refuse_host(array: np.ndarray) -> None:
    raise TypeError(
        f"a NumPy array (shape {list(array.shape)}, {array.dtype}) was mixed with stand-in "
        "device arrays: CuPy refuses host arrays as operands; make it with the kernel's xp "
        "(xp.asarray / xp.zeros ...) instead of np"
    )


def _unwrap(value: Any) -> Any:
    """Stand-in arrays (also inside lists, tuples and dicts) as their NumPy arrays; a NumPy
    array given where a device array belongs is refused (0-d ones aside: CuPy takes them as
    scalars)."""
    kind = type(value)
    if kind is StandInArray:
        return value._data
    if kind is np.ndarray:
        if value.ndim:
            _refuse_host(value)
        return value
    if kind is list or kind is tuple:
        return kind(_unwrap(v) for v in value)
    if kind is dict:
        return {k: _unwrap(v) for k, v in value.items()}
    return value


def _unwrap_key(key: Any) -> Any:
    """An index: stand-in arrays unwrapped; NumPy index arrays accepted (CuPy takes them)."""
    kind = type(key)
    if kind is StandInArray:
        return key._data
    if kind is tuple:
        return tuple(_unwrap_key(k) for k in key)
    return key


def _wrapped_key(data: np.ndarray, key: Any) -> Any:
    """Integer index arrays taken modulo their dim, as CuPy does (it never raises IndexError
    on the device). Only the plain form `a[i, j, ...]` of index arrays is rewritten."""
    keys = key if type(key) is tuple else (key,)
    if not any(type(k) is np.ndarray and k.dtype.kind in "iu" for k in keys):
        return key
    if any(k is Ellipsis or k is None for k in keys) or len(keys) > data.ndim:
        return key
    fixed = tuple(
        k % data.shape[axis]
        if type(k) is np.ndarray and k.dtype.kind in "iu" and data.shape[axis]
        else k
        for axis, k in enumerate(keys)
    )
    return fixed if type(key) is tuple else fixed[0]


def _wrap(value: Any) -> Any:
    """NumPy results as stand-in arrays (scalars as 0-d arrays, as CuPy returns them)."""
    kind = type(value)
    if kind is np.ndarray:
        return StandInArray(value)
    if isinstance(value, np.generic):
        return StandInArray(np.asarray(value))
    if kind is tuple or kind is list:
        return kind(_wrap(v) for v in value)
    return value


def _wrapped_callable(function, calls_blas: bool = False):
    @functools.wraps(function)
    def call(*args, **kwargs):
        if calls_blas:
            _refuse_blas_in_capture()
        return _wrap(function(*_unwrap(args), **_unwrap(kwargs)))

    return call


# The functions that run on cuBLAS in CuPy (cuSOLVER for numpy.linalg): CuPy 14 refuses to
# call either while a stream is being captured.
_BLAS_FUNCTIONS = frozenset({"matmul", "dot", "vdot", "inner", "einsum", "tensordot"})
# .active: this thread is capturing (CuPy refuses cuBLAS on the capturing stream alone)
_capture = threading.local()


@contextlib.contextmanager
def capturing():
    """An emulated CUDA-graph capture on this thread: matrix products raise inside it, as in
    CuPy."""
    previous = getattr(_capture, "active", False)
    _capture.active = True
    try:
        yield
    finally:
        _capture.active = previous


def _refuse_blas_in_capture() -> None:
    if getattr(_capture, "active", False):
        raise NotImplementedError(
            "calling cuBLAS API during stream capture is currently unsupported"
        )


def _check_matmul(*operands) -> None:
    """CuPy 14's matrix product on operands (a capture refuses it; a batched bfloat16 one
    has no kernel: CuPy raises TypeError "data type 'E' not understood")."""
    _refuse_blas_in_capture()
    arrays = [o for o in operands if type(o) is StandInArray]
    if any(a.dtype.name == "bfloat16" for a in arrays) and any(a.ndim > 2 for a in arrays):
        raise TypeError("data type 'E' not understood (CuPy has no batched bfloat16 matmul)")


class _Ufunc:
    """A NumPy ufunc over stand-in arrays, with its methods (`xp.add.at`, `xp.maximum.reduce`)."""

    def __init__(self, ufunc: np.ufunc):
        self._ufunc = ufunc
        self.__name__ = ufunc.__name__
        self.nin, self.nout = ufunc.nin, ufunc.nout

    def __call__(self, *args, **kwargs):
        if self.__name__ == "matmul":
            _check_matmul(*args)
        if kwargs.get("out") is not None:  # out=None: a new array, returned as CuPy does
            out = kwargs["out"]
            kwargs["out"] = tuple(_unwrap(o) for o in out) if type(out) is tuple else _unwrap(out)
            self._ufunc(*_unwrap(args), **kwargs)
            return out
        return _wrap(self._ufunc(*_unwrap(args), **kwargs))

    def at(self, a, indices, b=None) -> None:
        if b is None:
            self._ufunc.at(_unwrap(a), _unwrap_key(indices))
        else:
            self._ufunc.at(_unwrap(a), _unwrap_key(indices), _unwrap(b))

    def __getattr__(self, name: str):
        return _wrapped_callable(getattr(self._ufunc, name))


class _Namespace(types.ModuleType):
    """A NumPy namespace (numpy, numpy.linalg, ...) over stand-in arrays."""

    def __init__(self, name: str, source: types.ModuleType):
        super().__init__(name)
        self._source = source

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        attr = getattr(self._source, name)
        if isinstance(attr, np.ufunc):
            value: Any = _Ufunc(attr)
        elif isinstance(attr, types.ModuleType):
            value = _Namespace(f"{self.__name__}.{name}", attr)
        elif isinstance(attr, type) or not callable(attr):
            value = attr  # dtypes, scalar types, constants, errstate
        elif name in _HOST_TO_DEVICE:
            value = _to_device(attr)
        else:
            blas = name in _BLAS_FUNCTIONS or self.__name__.endswith(".linalg")
            value = _wrapped_callable(attr, calls_blas=blas)
        setattr(self, name, value)
        return value


def _to_device(function):
    @functools.wraps(function)
    def call(obj, *args, **kwargs):
        if type(obj) is StandInArray:
            obj = obj._data
        elif type(obj) in (list, tuple):
            obj = type(obj)(o._data if type(o) is StandInArray else o for o in obj)
            _transferred("write")
        else:
            _transferred("write")
        return StandInArray(np.asarray(function(obj, *args, **kwargs)))

    return call


def asnumpy(array) -> np.ndarray:
    """A host copy of a stand-in array (a NumPy array as it is): CuPy's `asnumpy`."""
    if type(array) is StandInArray:
        _transferred("read")
        return array._data.copy()
    return np.asarray(array)


# The transfers being recorded (None: not recording): each a (kind, where) pair, kind "read"
# (a device value read on the host: the host waits for the device) or "write" (a host value
# made a device array by xp.asarray / xp.array: a synchronous copy on CUDA), where the
# nestflow source line that asked for it. A block that makes none can be captured as a CUDA
# graph and never waits for the GPU.
_recorded: list[tuple[str, str]] | None = None


@contextlib.contextmanager
def recording_transfers():
    """Record the host transfers made inside the block: yields the list it fills."""
    global _recorded
    previous, _recorded = _recorded, []
    try:
        yield _recorded
    finally:
        _recorded = previous


def _transferred(kind: str) -> None:
    if _recorded is None:
        return
    frame, where = sys._getframe(2), "?"
    while frame is not None:
        path = frame.f_code.co_filename
        if "nestflow" in path and not path.endswith("standin.py"):
            where = f"{path.rsplit('nestflow/', 1)[-1]}:{frame.f_lineno} {frame.f_code.co_name}"
            break
        frame = frame.f_back
    _recorded.append((kind, where))


def get_array_module(*arrays) -> types.ModuleType:
    """`xp` if any of `arrays` is on the stand-in device, else NumPy (CuPy's function)."""
    return xp if any(type(a) is StandInArray for a in arrays) else np


xp = _Namespace("nestflow.standin", np)
xp.ndarray = StandInArray
xp.asnumpy = asnumpy
xp.get_array_module = get_array_module
