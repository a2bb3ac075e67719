"""Tensor: lazy allocation (seed 004) and exchange with NumPy and PyTorch (DESIGN Core runtime)."""

from __future__ import annotations

import numpy as np
import pytest

import nestflow as nf
from nestflow.errors import DTypeError, NestflowError, UninitializedError


def test_tensor_has_no_memory_until_mutable_data():
    """seed 004: "a tensor gets its memory until Tensor::mutable_data()"."""
    t = nf.Tensor()
    assert not t.is_allocated()
    assert t.dtype is None and t.shape == ()
    assert isinstance(t.place, nf.CPUPlace)
    a = t.mutable_data((100, 200), "float16")
    assert t.is_allocated()
    assert a.shape == (100, 200) and a.dtype == np.float16
    assert t.shape == (100, 200) and t.dtype == np.float16


def test_data_before_allocation_raises():
    """seed 004 / DESIGN: data() raises if the tensor was never allocated."""
    t = nf.Tensor()
    with pytest.raises(UninitializedError, match="no memory"):
        t.data()
    with pytest.raises(UninitializedError):
        t.numpy()
    with pytest.raises(UninitializedError):
        np.asarray(t)


def test_mutable_data_reallocates_only_when_shape_or_dtype_changes():
    """DESIGN Core runtime: mutable_data "reallocates only when shape or dtype changes"."""
    t = nf.Tensor()
    a = t.mutable_data((4, 5), "float32")
    a[...] = 3.0
    same = t.mutable_data([4, 5], np.float32)  # other spellings of the same shape and dtype
    assert same is a
    assert t.data() is a
    assert (same == 3.0).all()  # contents are kept, not re-allocated
    reshaped = t.mutable_data((5, 4), "float32")
    assert reshaped is not a and reshaped.shape == (5, 4)
    retyped = t.mutable_data((5, 4), "float64")
    assert retyped is not reshaped and retyped.dtype == np.float64
    assert t.mutable_data((5, 4), "float64") is retyped


def test_data_returns_the_allocated_buffer():
    """seed 004: data() gives read access to what mutable_data allocated."""
    t = nf.Tensor()
    a = t.mutable_data((2, 3), "int64")
    a[...] = np.arange(6).reshape(2, 3)
    assert t.data() is a
    np.testing.assert_array_equal(t.numpy(), np.arange(6).reshape(2, 3))


def test_set_copies_the_array():
    """DESIGN: set(array) makes the tensor hold a copy of any array-like."""
    src = np.arange(6, dtype=np.float32).reshape(2, 3)
    t = nf.Tensor()
    t.set(src)
    src[0, 0] = 100.0
    assert t.data()[0, 0] == 0.0
    assert t.shape == (2, 3) and t.dtype == np.float32
    t.set([[1, 2]])
    assert t.shape == (1, 2) and t.dtype == np.int64


def test_numpy_returns_an_independent_copy():
    """DESIGN: numpy() is a host copy; changing it does not change the tensor."""
    t = nf.Tensor()
    t.set(np.ones(3, dtype=np.float32))
    host = t.numpy()
    host[0] = 9.0
    assert t.data()[0] == 1.0
    assert isinstance(host, np.ndarray)


def test_array_protocol():
    """DESIGN: __array__ lets NumPy read a Tensor directly."""
    t = nf.Tensor()
    t.set(np.arange(4, dtype=np.float32))
    np.testing.assert_array_equal(np.asarray(t), np.arange(4, dtype=np.float32))
    assert np.asarray(t, dtype=np.float64).dtype == np.float64
    assert np.array(t, copy=True) is not t.data()
    assert float(np.sum(t)) == 6.0
    assert len(t) == 4


def test_dlpack_with_numpy_is_zero_copy():
    """DESIGN: __dlpack__ is a zero-copy exchange."""
    t = nf.Tensor()
    a = t.mutable_data((2, 3), "float32")
    a[...] = 1.0
    view = np.from_dlpack(t)
    view[0, 0] = 5.0
    assert a[0, 0] == 5.0
    assert t.__dlpack_device__()[0] == 1  # kDLCPU


def test_dlpack_with_torch_is_zero_copy_both_ways():
    """DESIGN: "__dlpack__ (zero-copy exchange with NumPy/PyTorch/JAX)"."""
    torch = pytest.importorskip("torch")
    t = nf.Tensor()
    a = t.mutable_data((3, 4), "float32")
    a[...] = np.arange(12, dtype=np.float32).reshape(3, 4)
    tt = torch.from_dlpack(t)
    assert tuple(tt.shape) == (3, 4) and tt.dtype == torch.float32
    tt += 1  # torch writes straight into the tensor's memory
    np.testing.assert_array_equal(t.data(), np.arange(1, 13, dtype=np.float32).reshape(3, 4))
    a[0, 0] = -7.0  # and torch sees nestflow's writes
    assert tt[0, 0].item() == -7.0
    assert tt.data_ptr() == a.ctypes.data


def test_dlpack_before_allocation_raises():
    """seed 004: an unallocated tensor has no memory to share."""
    with pytest.raises(UninitializedError):
        nf.Tensor().__dlpack__()


def test_float16_mutable_data_of_seed_004():
    """seed 004: mutable_data<float16>(DDim(100,200))."""
    t = nf.Tensor()
    a = t.mutable_data((100, 200), "float16")
    assert a.nbytes == 100 * 200 * 2
    a[...] = 0.5
    assert t.numpy().dtype == np.float16 and float(t.numpy().sum()) == 0.5 * 100 * 200


def test_repr_shows_allocation_state():
    """DESIGN (inspectability): repr says whether memory is allocated, and its shape/dtype."""
    t = nf.Tensor()
    assert "unallocated" in repr(t)
    t.mutable_data((2,), "int32")
    assert "(2,)" in repr(t) and "int32" in repr(t)


def test_cpu_place_allocates_numpy_arrays():
    """DESIGN: nf.CPUPlace() uses NumPy."""
    t = nf.Tensor(nf.CPUPlace())
    assert isinstance(t.mutable_data((1,), "float32"), np.ndarray)
    assert nf.CPUPlace() == nf.CPUPlace()


def test_cuda_place_without_cupy_is_a_clear_error():
    """DESIGN: CUDAPlace is backed by CuPy; without CuPy creating one says what to do."""
    if nf.core.is_compiled_with_cuda():
        pytest.skip("CuPy is installed here; the CuPy-backed test below covers CUDAPlace")
    with pytest.raises(NestflowError, match="CuPy"):
        nf.CUDAPlace(0)


def test_cuda_place_allocates_on_the_gpu():
    """DESIGN: nf.CUDAPlace(i) (CuPy) where a GPU exists; data comes back to host numpy()."""
    cupy = pytest.importorskip("cupy")
    t = nf.Tensor(nf.CUDAPlace(0))
    a = t.mutable_data((2, 3), "float32")
    assert isinstance(a, cupy.ndarray)
    a[...] = 2.0
    host = t.numpy()
    assert isinstance(host, np.ndarray) and (host == 2.0).all()
    assert t.mutable_data((2, 3), "float32") is a


def test_mutable_data_spells_dtypes_like_the_rest_of_nestflow():
    """DESIGN: every dtype is spelled as NumPy's canonical name; "float" is float32 in a Tensor
    as in a VarDesc, and an unknown dtype is a DTypeError."""
    t = nf.Tensor()
    a = t.mutable_data((2,), "float")
    assert a.dtype == np.float32
    assert t.mutable_data((2,), np.float32) is a
    assert t.mutable_data((2,), "fp16").dtype == np.float16
    with pytest.raises(DTypeError, match="'floatz'"):
        t.mutable_data((2,), "floatz")


def test_cuda_place_without_cupy_is_a_place_error(monkeypatch):
    """DESIGN Places: CUDAPlace(i) with no CuPy, no driver or no device i is a PlaceError at
    construction naming what is missing."""
    from nestflow.core import place as place_module

    counted = place_module.cuda_device_count  # a functools.cache: cleared before and after
    monkeypatch.setattr(place_module, "is_compiled_with_cuda", lambda: False)
    counted.cache_clear()
    try:
        with pytest.raises(nf.errors.PlaceError, match=r"CUDAPlace\(0\).*CuPy"):
            nf.CUDAPlace(0)
        monkeypatch.setattr(place_module, "is_compiled_with_cuda", lambda: True)
        monkeypatch.setattr(place_module, "cuda_device_count", lambda: 1)
        with pytest.raises(nf.errors.PlaceError, match=r"no CUDA device 3 \(1 found"):
            nf.CUDAPlace(3)
        with pytest.raises(nf.errors.PlaceError, match="an int"):
            nf.CUDAPlace("0")
    finally:
        counted.cache_clear()
