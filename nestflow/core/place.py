"""Places: where a Tensor's memory lives. CPUPlace uses NumPy; CUDAPlace uses CuPy when present."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from types import ModuleType

import numpy as np

from nestflow.errors import NestflowError


class Place:
    """Base of all places; `array_module` is the NumPy-compatible module that allocates there.

    >>> place = nf.CPUPlace()
    >>> isinstance(place, nf.Place), place.array_module is np
    (True, True)
    """

    @property
    def array_module(self) -> ModuleType:
        raise NotImplementedError

    def to_host(self, array):
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
    """True when CuPy is importable, so CUDAPlace can allocate."""
    return importlib.util.find_spec("cupy") is not None


@dataclass(frozen=True)
class CUDAPlace(Place):
    """GPU memory through CuPy; creating one without CuPy raises NestflowError.

    >>> try:
    ...     place = nf.CUDAPlace(0)
    ... except nf.errors.NestflowError:  # no CuPy here: fall back to the host
    ...     place = nf.CPUPlace()
    >>> place.array_module.zeros(2).shape
    (2,)
    """

    device_id: int = 0

    def __post_init__(self):
        if not is_compiled_with_cuda():
            raise NestflowError(
                f"CUDAPlace({self.device_id}) needs CuPy, which is not installed; use nf.CPUPlace()"
            )

    @property
    def array_module(self) -> ModuleType:
        import cupy

        return cupy

    def to_host(self, array):
        return array.get() if hasattr(array, "get") else np.asarray(array)

    def __repr__(self) -> str:
        return f"CUDAPlace({self.device_id})"
