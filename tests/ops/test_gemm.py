"""The BLAS-shaped products of nestflow/ops/gemm.py equal one plain NumPy product."""

import numpy as np
import pytest

from nestflow.ops import gemm
from nestflow.ops.gemm import TN_PIECE_ROWS, matmul_nt, matmul_tn, matmul_tn_blocks


@pytest.mark.parametrize(
    "rows", [0, 1, 7, TN_PIECE_ROWS, 2 * TN_PIECE_ROWS - 1, 2 * TN_PIECE_ROWS, 1000, 1031]
)
@pytest.mark.parametrize("m, n", [(1, 1), (3, 5), (64, 128)])
def test_matmul_tn_equals_one_product(rows, m, n):
    rng = np.random.default_rng(rows + 7 * m + n)
    x, g = rng.standard_normal((rows, m)), rng.standard_normal((rows, n))
    got = matmul_tn(x, g)
    assert got.shape == (m, n) and got.dtype == np.float64
    np.testing.assert_allclose(got, x.T @ g, rtol=1e-12, atol=1e-12)


def test_matmul_tn_float32_and_integers():
    rng = np.random.default_rng(0)
    x, g = rng.standard_normal((700, 9), "float32"), rng.standard_normal((700, 4), "float32")
    got = matmul_tn(x, g)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, x.astype("float64").T @ g.astype("float64"), rtol=1e-4)
    xi, gi = rng.integers(-5, 5, (600, 3)), rng.integers(-5, 5, (600, 2))
    np.testing.assert_array_equal(matmul_tn(xi, gi), xi.T @ gi)


def test_matmul_tn_is_deterministic_and_leaves_inputs_alone():
    rng = np.random.default_rng(1)
    x, g = rng.standard_normal((999, 16), "float32"), rng.standard_normal((999, 8), "float32")
    before = x.copy(), g.copy()
    assert np.array_equal(matmul_tn(x, g), matmul_tn(x, g))
    np.testing.assert_array_equal(x, before[0])
    np.testing.assert_array_equal(g, before[1])


def test_matmul_tn_strided_views():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((600, 10))[:, ::2]  # non-contiguous columns
    g = rng.standard_normal((1200, 3))[::2]  # every other row
    np.testing.assert_allclose(matmul_tn(x, g), x.T @ g, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    "block_rows", [[32] * 32, [1], [0, 0], [127, 1, 128, 5], [300], [3, 0, 200, 0, 7]]
)
def test_matmul_tn_blocks_equals_one_product_of_the_stacks(block_rows):
    rng = np.random.default_rng(len(block_rows))
    xs = [rng.standard_normal((rows, 6)) for rows in block_rows]
    gs = [rng.standard_normal((rows, 5)) for rows in block_rows]
    want = np.concatenate(xs).T @ np.concatenate(gs)
    got = matmul_tn_blocks(xs, gs)
    assert got.shape == (6, 5)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    "a_shape, b_shape",
    [
        ((5, 7), (3, 7)),  # M > N
        ((3, 7), (5, 7)),  # M < N: computed transposed
        ((64, 2051), (64, 2051)),  # long K
        ((2, 20, 3000), (2, 16, 3000)),  # batched
        ((4, 0), (6, 0)),  # K = 0
        ((1, 1), (1, 1)),
    ],
)
def test_matmul_nt_equals_one_product(a_shape, b_shape):
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal(a_shape), rng.standard_normal(b_shape)
    np.testing.assert_allclose(matmul_nt(a, b), a @ np.swapaxes(b, -1, -2), rtol=1e-12, atol=1e-11)


@pytest.mark.parametrize(
    "a_shape, b_shape",
    [((5, 7), (3, 7)), ((3, 7), (5, 7)), ((2, 20, 300), (2, 16, 300)), ((2, 16, 30), (2, 20, 30))]
    + [((4, 0), (6, 0)), ((0, 5), (3, 5)), ((1, 1), (1, 1))],
)
@pytest.mark.parametrize("copy_max", [gemm.TRANSPOSED_COPY_MAX, 0])
def test_matmul_nt_contiguous_is_the_product_laid_out_by_rows(
    a_shape, b_shape, copy_max, monkeypatch
):
    """Copied out of the transposed product, or (above TRANSPOSED_COPY_MAX outputs) computed in
    its own orientation: either way a C-contiguous array equal to the product."""
    monkeypatch.setattr(gemm, "TRANSPOSED_COPY_MAX", copy_max)
    rng = np.random.default_rng(4)
    a, b = rng.standard_normal(a_shape), rng.standard_normal(b_shape)
    got = gemm.matmul_nt_contiguous(a, b)
    assert got.flags.c_contiguous
    np.testing.assert_allclose(got, a @ np.swapaxes(b, -1, -2), rtol=1e-12, atol=1e-11)


def test_products_sum_their_long_axes_in_one_call(monkeypatch):
    """One BLAS call per product, whatever OpenBLAS's kernels: summing the long axis in pieces
    was slower on every shape measured with OpenBLAS 0.3.31 (see gemm's docstring)."""
    calls = []
    monkeypatch.setattr(gemm.np, "matmul", lambda *a, **k: calls.append(1) or np.dot(*a, **k))
    a = b = np.ones((64, 2048))
    for kernels in ("haswell", "zen", "skylakex", ""):
        monkeypatch.setattr(gemm, "_blas_kernels", [kernels])
        calls.clear()
        np.testing.assert_array_equal(matmul_nt(a, b), np.full((64, 64), 2048.0))
        assert len(calls) == 1
    calls.clear()
    np.testing.assert_array_equal(matmul_tn(a.T, b.T), np.full((64, 64), 2048.0))
    assert len(calls) == 1


def test_the_blas_kernels_are_asked_once(monkeypatch):
    monkeypatch.setattr(gemm, "_blas_kernels", [])
    asked = []
    monkeypatch.setattr(gemm, "_numpy_openblas_kernels", lambda: asked.append(1) or "skylakex")
    assert gemm.avx512_kernels() is True and gemm.avx512_kernels() is True
    assert asked == [1]


def test_the_probe_reads_numpys_openblas_and_survives_a_failing_threadpoolctl(monkeypatch):
    import threadpoolctl

    infos = [
        {
            "internal_api": "openblas",
            "filepath": "/x/torch/lib/libopenblas.so",
            "architecture": "Haswell",
        },
        {
            "internal_api": "openblas",
            "filepath": "/x/numpy.libs/libscipy_openblas.so",
            "architecture": "SkylakeX",
        },
        {"internal_api": "mkl", "filepath": "/x/libmkl_rt.so"},
    ]
    monkeypatch.setattr(threadpoolctl, "threadpool_info", lambda: infos)
    assert gemm._numpy_openblas_kernels() == "skylakex"
    monkeypatch.setattr(threadpoolctl, "threadpool_info", lambda: infos[2:])
    assert gemm._numpy_openblas_kernels() == ""  # not OpenBLAS

    def broken():
        raise RuntimeError("no /proc")

    monkeypatch.setattr(threadpoolctl, "threadpool_info", broken)
    assert gemm._numpy_openblas_kernels() == ""


def test_device_arrays_get_one_product_of_their_place(monkeypatch):
    from nestflow.core import standin

    monkeypatch.setattr(gemm, "_blas_kernels", ["skylakex"])  # small-kernel blocks for host arrays
    rng = np.random.default_rng(4)
    x, g = rng.standard_normal((700, 6)), rng.standard_normal((700, 5))
    a, b = rng.standard_normal((64, 2051)), rng.standard_normal((20, 2051))
    on = standin.xp.asarray
    got = matmul_tn(on(x), on(g)), matmul_nt(on(a), on(b)), matmul_nt(on(b), on(a))
    got += (matmul_tn_blocks([on(x[:300]), on(x[300:])], [on(g[:300]), on(g[300:])]),)
    assert all(type(r) is standin.StandInArray for r in got)
    for r, want in zip(got, (x.T @ g, a @ b.T, b @ a.T, x.T @ g)):
        np.testing.assert_allclose(r.get(), want, rtol=1e-12, atol=1e-11)


@pytest.mark.parametrize(
    "a_shape,b_shape",
    [
        ((8, 96, 200), (8, 200, 700)),  # a stack: split by its leading axis
        ((1100, 200), (200, 300)),  # more rows than columns: split by rows
        ((300, 200), (200, 1100)),  # split by columns
    ],
)
def test_pooled_matmul_has_the_same_bits_at_any_thread_count(a_shape, b_shape):
    """The split depends on the shapes alone: 1 and 3 threads give the same bits, a stack's
    products are each one whole call (NumPy's own bits), a split product agrees with one call
    to float32 rounding."""
    import nestflow as nf
    from nestflow.ops.gemm import pooled_matmul

    rng = np.random.default_rng(0)
    a = rng.standard_normal(a_shape).astype(np.float32)
    b = rng.standard_normal(b_shape).astype(np.float32)
    budget = nf.get_num_threads()
    try:
        results = []
        for threads in (1, 3):
            nf.set_num_threads(threads)
            results.append(pooled_matmul(a, b))
        nf.set_num_threads(1)  # one call to single-threaded BLAS, as each chunk's
        whole = np.matmul(a, b)
    finally:
        nf.set_num_threads(budget)
    np.testing.assert_array_equal(results[0], results[1])
    if len(a_shape) == 3:
        np.testing.assert_array_equal(results[0], whole)
    else:
        np.testing.assert_allclose(results[0], whole, rtol=1e-5, atol=1e-4)


def test_pooled_matmul_leaves_short_sums_and_small_products_to_one_call(monkeypatch):
    from nestflow.ops.gemm import pooled_matmul

    calls = []
    matmul = np.matmul
    monkeypatch.setattr(np, "matmul", lambda *a, **k: calls.append(1) or matmul(*a, **k))
    rng = np.random.default_rng(0)
    for a_shape, b_shape in (((36, 512, 32), (36, 32, 512)), ((64, 64), (64, 64))):
        a, b = rng.standard_normal(a_shape), rng.standard_normal(b_shape)
        calls.clear()
        np.testing.assert_array_equal(pooled_matmul(a, b), matmul(a, b))
        assert len(calls) == 1


@pytest.mark.parametrize(
    "a_shape, b_shape, blocks",
    [
        ((6, 25), (25, 36864), 6),  # wide: blocks of 6,666 output columns
        ((36864, 25), (25, 6), 6),  # tall: blocks of rows
        ((16, 150), (150, 4097), 10),  # 416 columns a block, the last one short
        ((25, 36864), (36864, 6), 6),  # long K into a small output: pieces summed
        ((64, 27), (27, 32768), 1),  # 64 output rows by 27 terms: one call runs faster
        ((150, 16), (16, 4096), 10),  # 16 terms: blocks of 416 columns
        ((6, 25), (25, 6000), 1),  # within the small kernel's 10^6 multiply-adds already
        ((100, 100), (100, 1000), 1),  # no narrow side
    ],
)
@pytest.mark.parametrize("kernels", ["skylakex", "haswell"])
def test_skinny_products_run_in_blocks_for_openblas_small_kernel(
    a_shape, b_shape, blocks, kernels, monkeypatch
):
    monkeypatch.setattr(gemm, "_blas_kernels", [kernels])
    calls = []
    matmul = np.matmul
    monkeypatch.setattr(gemm.np, "matmul", lambda *a, **k: calls.append(1) or matmul(*a, **k))
    rng = np.random.default_rng(1)
    a = rng.standard_normal(a_shape).astype("float32")
    b = rng.standard_normal(b_shape).astype("float32")
    got = gemm.in_small_products(a, b)
    assert len(calls) == (blocks if kernels == "skylakex" else 1)
    assert got.shape == (a_shape[0], b_shape[1]) and got.dtype == np.float32
    np.testing.assert_allclose(got, matmul(a, b), rtol=1e-5, atol=1e-3)


def test_pooled_matmul_runs_a_single_skinny_product_in_small_kernel_blocks(monkeypatch):
    monkeypatch.setattr(gemm, "_blas_kernels", ["skylakex"])
    rng = np.random.default_rng(2)
    a = rng.standard_normal((1, 6, 25)).astype("float32")
    b = rng.standard_normal((1, 25, 36864)).astype("float32")
    calls = []
    matmul = np.matmul
    monkeypatch.setattr(gemm.np, "matmul", lambda *a, **k: calls.append(1) or matmul(*a, **k))
    got = gemm.pooled_matmul(a, b)
    assert got.shape == (1, 6, 36864) and len(calls) == 6
    np.testing.assert_allclose(got, matmul(a, b), rtol=1e-5, atol=1e-4)
    calls.clear()
    gemm.pooled_matmul(a.astype("float64"), b.astype("float64"))  # measured on sgemm only
    assert len(calls) == 1


@pytest.mark.parametrize(
    "a_shape,b_shape",
    [
        ((3, 4), (4, 5)),
        ((7, 3, 4), (7, 4, 5)),  # stacks that agree
        ((7, 3, 4), (4, 5)),  # b broadcast over a's stack
        ((3, 4), (2, 7, 4, 5)),  # a broadcast over b's
        ((2, 1, 3, 4), (6, 4, 5)),  # a true broadcast of the stacks
        ((0, 3, 4), (0, 4, 5)),  # an empty stack
    ],
)
def test_product_shape_agrees_with_numpy(a_shape, b_shape):
    """pooled_matmul's shape of a @ b skips np.broadcast_shapes where the stacks agree or one
    side has none; every case equals NumPy's own result's shape."""
    from nestflow.ops.gemm import _product_shape, pooled_matmul

    a, b = np.ones(a_shape, np.float32), np.ones(b_shape, np.float32)
    assert _product_shape(a_shape, b_shape) == np.matmul(a, b).shape
    assert pooled_matmul(a, b).shape == np.matmul(a, b).shape
