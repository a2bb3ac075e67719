"""Places: where a Tensor's memory lives and its ops run (seed 004's `op->Run(scope, place)`).

CPUPlace is host memory (NumPy); CUDAPlace(i) is GPU i through CuPy; StandInPlace(i) is a
stand-in for a GPU on the host (nestflow.core.standin), on which the device code paths run
and fail as they would on a GPU. What runs on a place is its DeviceContext
(nestflow.core.device_context); a Place itself only names the memory.
"""

from __future__ import annotations

import functools
import importlib.util
from dataclasses import dataclass
from types import ModuleType

import numpy as np

from nestflow.errors import PlaceError


class Place:
    """Base of all places; `array_module` is the NumPy-compatible module that allocates there.

    >>> place = nf.CPUPlace()
    >>> isinstance(place, nf.Place), place.array_module is np
    (True, True)
    """

    # True for places whose memory the host cannot read directly (CUDA, the stand-in).
    is_device = False

    @property
    def array_module(self) -> ModuleType:
        raise NotImplementedError

    def to_host(self, array) -> np.ndarray:
        """`array` (of this place) as a host NumPy array: the array itself on the CPU."""
        return np.asarray(array)


@dataclass(frozen=True)
class CPUPlace(Place):
    """Host memory, NumPy arrays.

    >>> exe = nf.Executor(nf.CPUPlace())
    >>> nf.CPUPlace().to_host([1, 2])
    array([1, 2])
    """

    @property
    def array_module(self) -> ModuleType:
        return np

    def __repr__(self) -> str:
        return "CPUPlace()"


def is_compiled_with_cuda() -> bool:
    """True when CuPy is importable, so CUDAPlace can allocate (a GPU must be present too).

    >>> isinstance(nf.is_compiled_with_cuda(), bool)
    True
    """
    return importlib.util.find_spec("cupy") is not None


@functools.cache
def cuda_device_count() -> int:
    """The number of CUDA devices CuPy sees; PlaceError when CuPy or the driver is missing."""
    if not is_compiled_with_cuda():
        raise PlaceError(
            "CUDA needs CuPy, which is not installed: pip install 'nestflow[cuda]' "
            "(cupy-cuda12x; CUDA 13: cupy-cuda13x), or use nf.CPUPlace()"
        )
    import cupy

    try:
        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception as err:  # CUDARuntimeError: no driver, or a driver too old for CuPy
        raise PlaceError(
            f"CuPy is installed but cannot reach a CUDA driver ({err}); use nf.CPUPlace()"
        ) from None


@dataclass(frozen=True)
class CUDAPlace(Place):
    """GPU `device_id`'s memory, CuPy arrays. PlaceError at construction without CuPy, without
    a CUDA driver, or without that device.

    >>> try:
    ...     place = nf.CUDAPlace(0)
    ... except nf.errors.PlaceError:  # no GPU here: run on the host
    ...     place = nf.CPUPlace()
    >>> place.array_module.zeros(2).shape
    (2,)
    """

    device_id: int = 0
    is_device = True

    def __post_init__(self):
        if isinstance(self.device_id, bool) or not isinstance(self.device_id, int):
            raise PlaceError(f"CUDAPlace(device_id): an int, got {self.device_id!r}")
        try:
            count = cuda_device_count()
        except PlaceError as err:
            raise PlaceError(f"CUDAPlace({self.device_id}): {err.message}") from None
        if not 0 <= self.device_id < count:
            raise PlaceError(
                f"CUDAPlace({self.device_id}): there is no CUDA device {self.device_id} "
                f"({count} found: ids 0..{count - 1})"
                if count
                else f"CUDAPlace({self.device_id}): the CUDA driver reports no device"
            )

    @property
    def array_module(self) -> ModuleType:
        import cupy

        return cupy

    def to_host(self, array) -> np.ndarray:
        return array.get() if hasattr(array, "get") else np.asarray(array)

    def __repr__(self) -> str:
        return f"CUDAPlace({self.device_id})"


@dataclass(frozen=True)
class StandInPlace(Place):
    """A stand-in for GPU `device_id` on the host: NumPy memory behind a CuPy-like module whose
    arrays refuse implicit conversion to NumPy, so device code paths run (and a hidden host
    transfer fails) on machines without a GPU. Results equal CPUPlace's.

    >>> t = nf.Tensor(nf.core.StandInPlace(0))
    >>> t.set(np.ones(2, "float32"))
    >>> type(t.data()).__name__, t.numpy().tolist()
    ('StandInArray', [1.0, 1.0])
    """

    device_id: int = 0
    is_device = True

    @property
    def array_module(self) -> ModuleType:
        from nestflow.core.standin import xp

        return xp

    def to_host(self, array) -> np.ndarray:
        from nestflow.core.standin import asnumpy

        return asnumpy(array)

    def __repr__(self) -> str:
        return f"StandInPlace({self.device_id})"


_HOST = CPUPlace()
_default: list[Place] = [_HOST]


def set_default_place(place: Place) -> None:
    """Make `place` the one an `Executor()` given no place runs on, for the rest of the process
    (Paddle's `set_device`): a script written for the CPU runs on a GPU with one line.

    >>> nf.set_default_place(nf.CPUPlace()); nf.default_place()
    CPUPlace()
    """
    if not isinstance(place, Place):
        raise PlaceError(f"set_default_place needs a Place such as nf.CPUPlace(), got {place!r}")
    _default[0] = place


def default_place() -> Place:
    """The place an `Executor()` given no place runs on (CPUPlace() unless set).

    >>> nf.default_place()
    CPUPlace()
    >>> nf.Executor().place == nf.default_place()
    True
    """
    return _default[0]


def parse_place(name: str) -> Place:
    """A place from its command-line spelling: "cpu", "cuda" / "cuda:1", "standin"."""
    kind, _, index = name.partition(":")
    device_id = int(index) if index.isdigit() else 0
    if kind == "cpu":
        return CPUPlace()
    if kind in ("cuda", "gpu"):
        return CUDAPlace(device_id)
    if kind == "standin":
        return StandInPlace(device_id)
    raise PlaceError(f"unknown place {name!r}: cpu, cuda[:i] or standin[:i]")


def place_of(array) -> Place:
    """The place an array lives on: CUDAPlace(i) for a CuPy array on GPU i, StandInPlace(0)
    for a stand-in array, CPUPlace() for anything else."""
    kind = type(array)
    if kind is np.ndarray:
        return _HOST
    if kind.__name__ == "StandInArray":
        return StandInPlace(0)
    if hasattr(array, "__cuda_array_interface__") and hasattr(array, "device"):
        return CUDAPlace(int(array.device.id))
    return _HOST


def is_array(value) -> bool:
    """Whether `value` is an array of some place: NumPy, CuPy or the stand-in's."""
    kind = type(value)
    return (
        kind is np.ndarray
        or kind.__name__ == "StandInArray"
        or hasattr(value, "__cuda_array_interface__")
    )
