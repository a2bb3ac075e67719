"""`nf.cuda`: the CUDA devices CuPy sees (none without CuPy or a driver).

>>> n = nf.cuda.device_count()
>>> isinstance(n, int) and n >= 0
True
"""

from __future__ import annotations

from nestflow.core.place import CUDAPlace, cuda_device_count
from nestflow.errors import PlaceError


def device_count() -> int:
    """The number of CUDA devices; 0 without CuPy, without a driver or without a device."""
    try:
        return cuda_device_count()
    except PlaceError:
        return 0


def synchronize(device_id: int | None = None) -> None:
    """Wait for the work queued on GPU `device_id` (default: every GPU) to finish; nothing to
    wait for without a GPU."""
    from nestflow.core.device_context import device_context

    ids = range(device_count()) if device_id is None else [device_id]
    for i in ids:
        device_context(CUDAPlace(i)).synchronize()
