"""DeviceContext: what runs on a place (Paddle's DeviceContextPool, thinc's Ops/CupyOps).

One context per place, from a pool (`device_context(place)`). A kernel that declares an `xp`
parameter gets the context's array module (NumPy, CuPy or the stand-in) and is written once
against it; a kernel that declares `device` gets the context itself, for what differs between
places: scatter-add, random draws, host transfers the op's meaning needs. The CPU context also
owns the intra-op thread budget; the CUDA one the device, its stream and memory pool.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from types import ModuleType
from typing import Any

import numpy as np

from nestflow.core.place import CPUPlace, CUDAPlace, Place, StandInPlace
from nestflow.errors import PlaceError


class DeviceContext:
    """What runs on `place`: its array module `xp`, transfers to and from the host, and the
    few operations whose kernels differ between places.

    >>> ctx = nf.device_context(nf.CPUPlace())
    >>> isinstance(ctx, nf.DeviceContext), ctx.to_device([1, 2]).tolist()
    (True, [1, 2])
    >>> target = np.zeros(3)
    >>> ctx.scatter_add(target, np.array([0, 2, 0]), np.ones(3))
    >>> target.tolist()
    [2.0, 0.0, 1.0]
    """

    def __init__(self, place: Place, xp: ModuleType):
        self.place = place
        self.xp = xp

    def owns(self, array: Any) -> bool:
        """Whether `array` is an array of this place."""
        return isinstance(array, self.xp.ndarray)

    def to_device(self, array: Any) -> Any:
        """`array` on this place: an array of the place as it is, a host array (or array-like)
        copied over; PlaceError for an array of another device."""
        raise NotImplementedError

    def to_host(self, array: Any) -> np.ndarray:
        """An array of this place as a host NumPy array (a copy for device arrays)."""
        return self.place.to_host(array)

    def activate(self) -> contextlib.AbstractContextManager:
        """A context in which this place's device is the current one (for the length of a
        run)."""
        return contextlib.nullcontext()

    def synchronize(self) -> None:
        """Wait for the work queued on this place to finish."""

    def scatter_add(self, target: Any, indices: Any, values: Any) -> None:
        """target[indices] += values, repeated indices adding up (NumPy's `add.at`)."""
        self.xp.add.at(target, indices, values)

    def random(self, host_generator: np.random.Generator) -> Any:
        """A generator drawing arrays on this place (`uniform`, `normal`, `random`,
        `integers`, `standard_normal`), made from the run's host generator."""
        return host_generator

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.place!r})"


def _foreign_array(place: Place, array: Any) -> PlaceError:
    return PlaceError(
        f"an array of type {type(array).__module__}.{type(array).__name__} (shape "
        f"{list(getattr(array, 'shape', ()))}) is on another device than {place!r}: copy it "
        "to the host first (CuPy: .get()) or run the program on its place"
    )


class CPUDeviceContext(DeviceContext):
    """The host: NumPy kernels, and the intra-op thread budget (`num_threads`)."""

    def __init__(self, place: CPUPlace):
        super().__init__(place, np)
        self.num_threads = 1

    def to_device(self, array: Any) -> np.ndarray:
        if type(array) is np.ndarray:
            return array
        if hasattr(array, "__cuda_array_interface__") or type(array).__name__ == "StandInArray":
            raise _foreign_array(self.place, array)
        return np.asarray(array)


class StandInDeviceContext(DeviceContext):
    """The stand-in device: NumPy memory behind a CuPy-like module (nestflow.core.standin).
    Random draws come from the host generator, so results equal CPUPlace's bit for bit."""

    def __init__(self, place: StandInPlace):
        from nestflow.core import standin

        super().__init__(place, standin.xp)
        self._standin = standin

    def to_device(self, array: Any) -> Any:
        if type(array) is self._standin.StandInArray:
            return array
        if hasattr(array, "__cuda_array_interface__"):
            raise _foreign_array(self.place, array)
        return self._standin.StandInArray(np.array(array, copy=True))

    def random(self, host_generator: np.random.Generator) -> Any:
        return _StandInGenerator(host_generator, self._standin.StandInArray)


class _StandInGenerator:
    """The host generator's draws as stand-in arrays."""

    def __init__(self, host: np.random.Generator, wrap):
        self._host = host
        self._wrap = wrap

    def __getattr__(self, name: str):
        draw = getattr(self._host, name)
        wrap = self._wrap

        def on_device(*args, **kwargs):
            return wrap(np.asarray(draw(*args, **kwargs)))

        return on_device


class CUDADeviceContext(DeviceContext):
    """GPU `place.device_id` through CuPy: the device, its current stream and CuPy's memory
    pool. Random draws use CuPy's generator, seeded once from the run's host generator:
    reproducible on the device, not bit-equal to the CPU."""

    def __init__(self, place: CUDAPlace):
        import cupy

        super().__init__(place, cupy)
        self.device = cupy.cuda.Device(place.device_id)
        self.memory_pool = cupy.get_default_memory_pool()
        self._generators: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    @property
    def stream(self):
        return self.xp.cuda.get_current_stream()

    def to_device(self, array: Any) -> Any:
        if isinstance(array, self.xp.ndarray):
            if array.device.id == self.place.device_id:
                return array
            with self.device:
                return self.xp.asarray(array)  # peer copy from another GPU
        if type(array).__name__ == "StandInArray":
            raise _foreign_array(self.place, array)
        with self.device:
            return self.xp.asarray(np.asarray(array))

    def activate(self) -> contextlib.AbstractContextManager:
        return self.device

    def synchronize(self) -> None:
        self.device.synchronize()

    def scatter_add(self, target: Any, indices: Any, values: Any) -> None:
        import cupyx

        cupyx.scatter_add(target, indices, values)

    def random(self, host_generator: np.random.Generator) -> Any:
        made = self._generators.get(host_generator)
        if made is None:
            seed = int(host_generator.integers(2**63))
            made = self._generators[host_generator] = self.xp.random.default_rng(seed)
        return made


def array_module(*arrays: Any) -> ModuleType:
    """The array module of `arrays` (CuPy's `get_array_module`): for a helper shared by kernels
    that gets arrays, not the kernel's `xp`. NumPy unless one of them is a device array.

    >>> array_module(np.ones(2)) is np
    True
    """
    for array in arrays:
        kind = type(array)
        if kind is np.ndarray:
            continue
        if kind.__name__ == "StandInArray":
            from nestflow.core.standin import xp

            return xp
        if hasattr(array, "__cuda_array_interface__"):
            import cupy

            return cupy
    return np


_POOL: dict[Place, DeviceContext] = {}
_POOL_LOCK = threading.Lock()
_KINDS = {
    CPUPlace: CPUDeviceContext,
    StandInPlace: StandInDeviceContext,
    CUDAPlace: CUDADeviceContext,
}


def device_context(place: Place | None = None) -> DeviceContext:
    """The DeviceContext of `place` (default CPUPlace()), one per place for the process.

    >>> ctx = nf.device_context(nf.CPUPlace())
    >>> ctx.xp is np, ctx is nf.device_context(nf.CPUPlace())
    (True, True)
    """
    place = place if place is not None else CPUPlace()
    ctx = _POOL.get(place)
    if ctx is None:
        kind = _KINDS.get(type(place))
        if kind is None:
            raise PlaceError(f"no device context for {place!r}: nestflow knows {list(_KINDS)}")
        with _POOL_LOCK:
            ctx = _POOL.get(place) or _POOL.setdefault(place, kind(place))
    return ctx
