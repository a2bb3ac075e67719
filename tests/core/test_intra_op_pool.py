"""The CPU context's intra-op pool (parallel_for) and the kernels that split work across it:
chunk order, errors, nesting, the one budget with BLAS, chunked kernels equal to the plain
ones, and a conv net's training bit-identical at 1 and 3 threads."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

import nestflow as nf
from nestflow.core.device_context import chunk_grain
from nestflow.ops.registry import get_op_def

threadpoolctl = pytest.importorskip("threadpoolctl")


@pytest.fixture
def threads():
    """Set the budget inside a test; put it (and BLAS) back afterwards."""
    before = nf.get_num_threads()
    with threadpoolctl.threadpool_limits(limits=None):
        yield nf.set_num_threads
    nf.device_context().num_threads = before


def test_chunks_come_back_in_order_whatever_the_thread_count(threads):
    ctx = nf.device_context(nf.CPUPlace())
    for n in (1, 3):
        threads(n)
        assert ctx.parallel_for(10, lambda a, b: (a, b), 3) == [(0, 3), (3, 6), (6, 9), (9, 10)]
        assert ctx.parallel_for(0, lambda a, b: (a, b), 3) == []


def test_chunks_run_on_several_threads_with_blas_at_one(threads):
    threads(3)
    ctx = nf.device_context(nf.CPUPlace())
    seen, blas = set(), []
    barrier = threading.Barrier(3, timeout=10)

    def body(a, b):
        seen.add(threading.get_ident())
        blas.append(
            max(
                p["num_threads"] for p in threadpoolctl.threadpool_info() if p["user_api"] == "blas"
            )
        )
        barrier.wait()  # only passes when three chunks run at once

    ctx.parallel_for(3, body, 1)
    assert len(seen) == 3 and blas == [1, 1, 1]
    assert nf.get_num_threads() == 3  # BLAS back at the budget after the region
    assert all(
        p["num_threads"] == 3 for p in threadpoolctl.threadpool_info() if p["user_api"] == "blas"
    )


def _fresh_pool(ctx) -> None:
    if ctx._workers is not None:
        ctx._workers.shutdown(wait=True)
    ctx._workers, ctx._worker_count = None, 0


@pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="needs Linux and two CPUs for this process",
)
@pytest.mark.parametrize("pin", [True, False])
def test_the_pool_pins_one_thread_to_a_cpu_and_gives_the_caller_its_cpus_back(
    pin, threads, monkeypatch
):
    monkeypatch.setenv("NF_PIN_THREADS", "1" if pin else "0")
    threads(2)
    ctx = nf.device_context(nf.CPUPlace())
    _fresh_pool(ctx)
    before = os.sched_getaffinity(0)
    placed = {}
    barrier = threading.Barrier(2, timeout=10)

    def body(a, b):
        placed[threading.get_ident()] = os.sched_getaffinity(0)
        barrier.wait()  # both chunks at once: one on the caller, one on the helper

    try:
        ctx.parallel_for(2, body, 1)
        assert len(placed) == 2 and threading.get_ident() in placed
        if pin:
            assert all(len(cpus) == 1 for cpus in placed.values())
            assert len(set.union(*placed.values())) == 2
        else:
            assert all(cpus == before for cpus in placed.values())
        assert os.sched_getaffinity(0) == before
    finally:
        _fresh_pool(ctx)  # later tests get a pool made under their own settings


def test_nested_loops_and_errors(threads):
    threads(2)
    ctx = nf.device_context(nf.CPUPlace())
    inner = ctx.parallel_for(4, lambda a, b: ctx.parallel_for(4, lambda c, d: c, 1), 2)
    assert inner == [[0, 1, 2, 3]] * 2

    def fails(a, b):
        if a == 2:
            raise nf.errors.ShapeError("chunk 2")
        return a

    with pytest.raises(nf.errors.ShapeError, match="chunk 2"):
        ctx.parallel_for(4, fails, 1)
    assert ctx.parallel_for(2, lambda a, b: a, 1) == [0, 1]  # the pool still works


def test_device_places_run_the_plain_body():
    ctx = nf.device_context(nf.core.StandInPlace(0))
    assert ctx.parallel_for(7, lambda a, b: (a, b), 2) == [(0, 7)]


def test_grain_depends_on_the_shapes_only(threads):
    """Up to a kernel's chunk cap (8 by default) the thread count does not change the grain."""
    threads(1)
    assert chunk_grain(32, 200_000, 1 << 17) == 4
    threads(8)
    assert chunk_grain(32, 200_000, 1 << 17) == 4
    assert chunk_grain(32, 10, 1 << 17) == 32  # small: one chunk, the calling thread
    assert chunk_grain(0, 10, 1) == 0


def _conv_cases():
    rng = np.random.default_rng(0)
    for k, pad, stride, groups, channels, dtype in (
        (3, 1, 1, 1, 16, "float64"),  # Winograd
        (3, 1, 2, 1, 16, "float64"),  # im2col, strided
        (1, 0, 1, 1, 16, "float32"),  # pointwise
        (1, 0, 2, 1, 16, "float64"),  # pointwise, strided
        (3, 1, 1, 4, 16, "float64"),  # grouped im2col
        (5, 2, 1, 1, 16, "float64"),  # im2col, batch last
        (3, 1, 1, 1, 3, "float64"),  # im2col of few terms, images first
    ):
        x = rng.standard_normal((13, channels, 12, 12)).astype(dtype)
        w = rng.standard_normal((16, channels // groups, k, k)).astype(dtype) / 8
        yield x, w, {"paddings": [pad, pad], "strides": [stride, stride], "groups": groups}


@pytest.mark.parametrize(
    "case",
    list(_conv_cases()),
    ids=["winograd", "strided", "1x1", "1x1_strided", "grouped", "batch_last", "few_terms"],
)
def test_chunked_conv_equals_the_plain_kernel(case, threads, monkeypatch):
    from nestflow.ops import nn

    monkeypatch.setattr(nn, "_CONV_CHUNK_WORK", 1)  # chunks even on these small shapes
    monkeypatch.setattr(nn, "_CONV_CHUNK_PIXELS", 1)
    monkeypatch.setattr(nn, "_WINOGRAD_MIN_BLOCKS", 1)  # and Winograd in every chunk
    threads(2)
    x, w, attrs = case
    conv = get_op_def("conv2d")
    full = {**{n: s.default for n, s in conv.attrs.items()}, **attrs}
    ctx = nf.device_context()
    plain = conv.forward(x, w, **full)
    pooled = conv.forward(x, w, device=ctx, **full)
    tol = 1e-12 if x.dtype == np.float64 else 1e-5
    np.testing.assert_allclose(pooled, plain, rtol=tol, atol=tol)
    g = np.random.default_rng(1).standard_normal(plain.shape).astype(x.dtype)
    want = conv.backward(x, w, None, None, plain, g, **full)
    got = conv.backward(x, w, None, None, pooled, g, device=ctx, **full)
    for a, b in zip(got[:2], want[:2]):
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol * np.abs(b).max())


@pytest.mark.parametrize(
    "k,stride,dilation,pad",
    [(3, 1, 1, 1), (3, 2, 1, 1), (5, 2, 1, 2), (3, 1, 2, 2), (1, 2, 1, 0)],
    ids=["batch_last", "strided", "strided_phases", "dilated", "1x1_strided"],
)
def test_im2col_and_col2im_split_by_channels_with_the_same_bits(
    k, stride, dilation, pad, threads, monkeypatch
):
    """_im2col's copies and _col2im's sums over blocks of channels on the pool (at least two
    blocks here) equal one call over all channels, bit for bit."""
    from nestflow.ops import nn

    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 7, 11, 10)).astype("float32")
    attrs = {
        **{n: s.default for n, s in get_op_def("conv2d").attrs.items()},
        "paddings": [pad, pad],
        "strides": [stride, stride],
        "dilations": [dilation, dilation],
    }
    geo = nn._conv_geometry(attrs, x.shape[2:], (k, k), x.shape[1])
    out_hw = geo.out_hw(x.shape[2:], (k, k))
    padded_hw = (11 + 2 * pad, 10 + 2 * pad)
    threads(2)
    results, blocks = {}, []
    grain = nn.thread_grain
    monkeypatch.setattr(
        nn,
        "thread_grain",
        lambda n, *rest: blocks.append(-(-n // grain(n, *rest))) or grain(n, *rest),
    )
    for split, size in (("whole", 1 << 40), ("split", 1)):
        monkeypatch.setattr(nn, "_COPY_CHUNK_ELEMENTS", size)
        blocks.clear()
        cols = nn._im2col(nn._layout(geo).arrange(x, geo.pads), (k, k), geo, out_hw)
        summed = nn._col2im(cols * 2, padded_hw, geo, out_hw)
        results[split] = (cols, summed, list(blocks))
    np.testing.assert_array_equal(results["split"][0], results["whole"][0])
    np.testing.assert_array_equal(results["split"][1], results["whole"][1])
    assert results["whole"][2] == [1, 1] and min(results["split"][2]) >= 2


def test_chunked_fused_conv_applies_bias_residual_and_relu_per_image(threads, monkeypatch):
    from nestflow.ops import nn

    monkeypatch.setattr(nn, "_CONV_CHUNK_WORK", 1)
    monkeypatch.setattr(nn, "_CONV_CHUNK_PIXELS", 1)
    threads(2)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((9, 8, 10, 10))
    w = rng.standard_normal((8, 8, 3, 3)) / 8
    bias, residual = rng.standard_normal(8), rng.standard_normal((9, 8, 10, 10))
    conv = get_op_def("conv2d")
    attrs = {n: s.default for n, s in conv.attrs.items()}
    attrs.update(paddings=[1, 1], fuse_residual_connection=True, fuse_relu=True)
    plain = conv.forward(x, w, bias, residual, **attrs)
    pooled = conv.forward(x, w, bias, residual, device=nf.device_context(), **attrs)
    np.testing.assert_allclose(pooled, plain, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    "kind,ksize,stride,pad",
    [("max", 2, 2, 0), ("max", 3, 2, 1), ("avg", 2, 2, 0), ("avg", 3, 1, 1)],
)
def test_chunked_pool_equals_the_plain_kernel(kind, ksize, stride, pad, threads, monkeypatch):
    from nestflow.ops import nn

    monkeypatch.setattr(nn, "_POOL_CHUNK_ELEMENTS", 1)
    threads(2)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((7, 3, 9, 8)).round(1)  # ties: the first maximum takes the gradient
    pool = get_op_def("pool2d")
    attrs = {n: s.default for n, s in pool.attrs.items()}
    attrs.update(pooling_type=kind, ksize=[ksize] * 2, strides=[stride] * 2, paddings=[pad] * 2)
    plain = pool.forward(x, **attrs)
    pooled = pool.forward(x, device=nf.device_context(), **attrs)
    np.testing.assert_array_equal(pooled, plain)
    g = rng.standard_normal(plain.shape)
    (want,) = pool.backward(x, plain, g, **attrs)
    (got,) = pool.backward(x, plain, g, device=nf.device_context(), **attrs)
    np.testing.assert_array_equal(got, want)


def test_tiled_max_pool_gradient_equals_the_general_one():
    from nestflow.ops import nn

    rng = np.random.default_rng(4)
    x = rng.standard_normal((3, 4, 8, 6)).round(0)  # many ties
    geo = nn._PoolGeometry((2, 2), (2, 2), (0, 0, 0, 0), (4, 3), False)
    out = nn._pool(x, geo, "max", True)
    g = rng.standard_normal(out.shape)
    tiled = nn._tiled_max_pool_grad(x, out, g, geo)
    general = nn._pool_grad(
        x, out, g, nn._PoolGeometry((2, 2), (2, 2), (0, 0, 0, 0), (4, 3), False), "max", True
    )
    np.testing.assert_array_equal(tiled, general)
    assert (tiled != 0).sum() == out.size  # one element per window takes the gradient


@pytest.mark.parametrize(
    "layout,shape",
    [
        ("NCHW", (6, 10, 5, 7)),  # few pixels: the images summed first
        ("NCHW", (6, 10, 9, 8)),  # vecdot over each channel's pixels
        ("NHWC", (6, 5, 7, 10)),
        ("NCHW", (40, 10)),
    ],
)
def test_chunked_batch_norm_equals_the_plain_kernel(layout, shape, threads, monkeypatch):
    """batch_norm split by channels across the pool gives the plain kernel's bits, forward and
    gradient, whichever way its per-channel sums run."""
    from nestflow.ops import norm

    monkeypatch.setattr(norm, "_NORM_CHUNK_ELEMENTS", 1)
    threads(2)
    rng = np.random.default_rng(5)
    x = rng.standard_normal(shape)
    c = shape[1] if layout == "NCHW" else shape[-1]
    scale, bias = rng.random(c), rng.random(c)
    mean, var = np.zeros(c), np.ones(c)
    bn = get_op_def("batch_norm")
    attrs = {n: s.default for n, s in bn.attrs.items()}
    attrs["data_layout"] = layout
    plain = bn.forward(x, scale, bias, mean, var, None, xp=np, **attrs)
    pooled = bn.forward(x, scale, bias, mean, var, None, xp=np, device=nf.device_context(), **attrs)
    for a, b in zip(pooled, plain):
        np.testing.assert_array_equal(a, b)
    g = rng.standard_normal(shape)
    args = (x, scale, bias, mean, var, None, plain[0], None, None, plain[3], plain[4], g)
    want = bn.backward(*args, None, None, None, None, xp=np, **attrs)
    got = bn.backward(*args, None, None, None, None, xp=np, device=nf.device_context(), **attrs)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)


def _train_conv_net(steps: int) -> list[np.ndarray]:
    main, startup = nf.Program(), nf.Program()
    main.random_seed = startup.random_seed = 7
    with nf.program_guard(main, startup):
        img = nf.data("img", [-1, 16, 16, 16])
        label = nf.data("label", [-1, 1], dtype="int64")
        h = nf.layers.conv2d(img, 32, 3, padding=1, act=None)
        h = nf.layers.batch_norm(h, act="relu")
        h = nf.layers.pool2d(h, 2, "max", 2)
        h = nf.layers.conv2d(h, 32, 1, act="relu")
        h = nf.layers.conv2d(h, 32, 3, stride=2, padding=1, act="relu")
        h = nf.layers.pool2d(h, 2, "avg", 2)
        logits = nf.layers.fc(h, 10)
        loss = nf.layers.mean(nf.layers.softmax_with_cross_entropy(logits, label))
        nf.optimizer.Momentum(0.05, 0.9).minimize(loss)
    exe, scope = nf.Executor(nf.CPUPlace()), nf.Scope()
    exe.run(startup, scope=scope)
    rng = np.random.default_rng(0)
    for _ in range(steps):
        feed = {
            "img": rng.standard_normal((32, 16, 16, 16)).astype("float32"),
            "label": rng.integers(0, 10, (32, 1)),
        }
        exe.run(main, feed=feed, fetch_list=[loss], scope=scope)
    names = [v.name for v in main.global_block().vars.values() if v.persistable]
    return [np.array(scope.find_var(n).get(nf.Tensor).numpy()) for n in names]


def test_conv_net_training_is_bit_identical_at_1_and_3_threads(threads, monkeypatch):
    """Every conv, batch_norm and pool2d of this net splits across the pool (its convs with
    chunks of 2M multiply-adds, as small as nestflow split them before), and the parameters
    after training agree bit for bit."""
    from nestflow.ops import nn

    monkeypatch.setattr(nn, "_CONV_CHUNK_WORK", 1 << 21)
    threads(1)
    one = _train_conv_net(3)
    threads(3)
    three = _train_conv_net(3)
    assert len(one) == len(three) >= 10  # weights, biases, running statistics, velocities
    for a, b in zip(one, three):
        np.testing.assert_array_equal(a, b)


def test_a_forked_child_gets_a_pool_of_its_own(threads):
    import multiprocessing

    threads(2)
    ctx = nf.device_context()
    ctx.parallel_for(4, lambda a, b: a, 1)  # the parent's workers exist
    fork = multiprocessing.get_context("fork")
    with fork.Pool(1) as pool:
        assert pool.apply(_chunks_in_child) == [0, 1, 2, 3]


def _chunks_in_child():
    return nf.device_context().parallel_for(4, lambda a, b: a, 1)


def test_past_its_chunk_cap_a_kernel_splits_in_at_most_max_chunks(threads):
    """A kernel capped below MAX_CHUNKS takes more chunks with more threads, up to MAX_CHUNKS
    and never more (a 16-core host ran W9's 3x3 conv in 37.6 ms at 16 threads with a chunk
    per thread, 18.4 with 8 chunks)."""
    from nestflow.core.device_context import MAX_CHUNKS, chunk_grain

    threads(1)
    assert chunk_grain(64, 1 << 24, 1 << 23, 4) == 16  # 4 chunks
    threads(3)
    assert chunk_grain(64, 1 << 24, 1 << 23, 4) == 16
    threads(6)
    assert chunk_grain(64, 1 << 24, 1 << 23, 4) == 11  # 6 chunks
    for n in (8, 12, 16):
        threads(n)
        assert chunk_grain(64, 1 << 24, 1 << 23, 4) == 64 // MAX_CHUNKS
        assert chunk_grain(64, 1 << 24, 1 << 23) == 64 // MAX_CHUNKS
        assert chunk_grain(64, 1 << 10, 1 << 23, 4) == 64  # small work stays one chunk


def test_a_conv_splits_in_more_chunks_only_where_they_stay_wide(threads):
    """Up to 4 chunks of at least 1,024 output pixels, up to 8 where each keeps 2,048, at any
    thread count (nn._conv_grain)."""
    from nestflow.ops.nn import _conv_grain

    for n in (1, 2, 8, 16):
        threads(n)
        assert _conv_grain((64, 64, 3, 3), (28, 28), 32) == 4  # W9: 8 chunks of 3,136 pixels
        assert _conv_grain((64, 64, 3, 3), (32, 32), 32) == 4  # ResNet-18's first stage
        assert _conv_grain((128, 128, 3, 3), (16, 16), 32) == 8  # 4 chunks of 2,048
        assert _conv_grain((256, 256, 3, 3), (8, 8), 32) == 16  # 2 chunks of 1,024
        assert _conv_grain((16, 6, 5, 5), (8, 8), 64) == 64  # LeNet's: too little work


def test_conv_net_training_is_bit_identical_at_1_and_12_threads(threads, monkeypatch):
    """Past MAX_CHUNKS threads the convs still split in the chunks of 1 thread: the filter
    gradients' per-chunk sums, and so a step's parameters, keep their bits."""
    from nestflow.ops import nn

    monkeypatch.setattr(nn, "_CONV_CHUNK_WORK", 1 << 21)
    threads(1)
    one = _train_conv_net(1)
    threads(12)
    twelve = _train_conv_net(1)
    for a, b in zip(one, twelve):
        np.testing.assert_array_equal(b, a)


def test_large_elementwise_ops_split_across_the_pool_with_the_same_bits(threads, monkeypatch):
    """relu, its gradient, elementwise_add (with Y broadcast) and sum (a gradient summed over
    two readers) split outputs of 2M elements in rows across the pool (map_rows, thread_grain):
    the results equal NumPy's whole-array ones bit for bit, at 1 and at 2 threads."""
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        x = nf.data("x", [-1, 512, 1024])
        y = nf.data("y", [1024])
        x.stop_gradient = False
        a = nf.layers.relu(x)
        c = nf.layers.elementwise_add(nf.layers.elementwise_add(a, y), a)
        loss = nf.layers.reduce_sum(c)
        grads = nf.gradients(loss, [x])
    rng = np.random.default_rng(0)
    feed = {
        "x": rng.standard_normal((4, 512, 1024)).astype("float32"),
        "y": rng.standard_normal(1024).astype("float32"),
    }
    relu = np.maximum(feed["x"], 0)
    want_c = (relu + feed["y"]) + relu
    want_dx = np.where(feed["x"] > 0, np.float32(2), np.float32(0))
    ctx, splits = nf.device_context(), []
    parallel_for = ctx.parallel_for

    def counted(n, body, grain=1):
        splits.append((n, grain))
        return parallel_for(n, body, grain)

    monkeypatch.setattr(ctx, "parallel_for", counted)
    for n in (1, 2):
        threads(n)
        splits.clear()
        got_c, got_dx = nf.Executor(nf.CPUPlace()).run(main, feed, [c, grads[0]])
        np.testing.assert_array_equal(got_c, want_c)
        np.testing.assert_array_equal(got_dx, want_dx)
        # relu, two adds, relu_grad, the gradients' sum: four chunks of 512K elements
        # (CACHE_CHUNK_ELEMENTS each) at either thread count
        assert splits.count((4, 1)) >= 5, splits


def test_chunks_on_the_pool_keep_the_callers_numpy_error_state(threads):
    """np.errstate lives in the caller's context: every chunk, on whichever thread, sees it
    (a large elementwise_div with one zero raised on some runs only before)."""
    threads(2)
    ctx = nf.device_context()
    with np.errstate(divide="raise", invalid="ignore"):
        seen = ctx.parallel_for(8, lambda a, b: (np.geterr()["divide"], np.geterr()["invalid"]), 1)
    assert seen == [("raise", "ignore")] * 8
    from nestflow.core.device_context import pooled_ufunc

    x = np.ones((4, 512, 1024), np.float32)
    y = x.copy()
    y[3, 0, 0] = 0  # in the last chunk
    for _ in range(5):
        with np.errstate(divide="raise"), pytest.raises(FloatingPointError):
            pooled_ufunc(np.divide)(x, y)


def _bits_whole_and_split(run, modules, threads, monkeypatch, counts=(1, 2)):
    """run() with ROW_CHUNK_ELEMENTS too large to split anything in `modules` (want: checked
    to split nothing), then as it is at each thread count in `counts` (got): (want, [got per
    count], whether any call split)."""
    ctx, splits = nf.device_context(), []
    parallel_for = ctx.parallel_for
    monkeypatch.setattr(
        ctx,
        "parallel_for",
        lambda n, body, grain=1: splits.append(grain < n) or parallel_for(n, body, grain),
    )
    with pytest.MonkeyPatch.context() as whole:
        for module in modules:
            whole.setattr(module, "ROW_CHUNK_ELEMENTS", 1 << 40)
        want = run()
    assert not any(splits), "the whole-array run split"
    got = []
    for n in counts:
        threads(n)
        got.append(run())
    return want, got, any(splits)


@pytest.mark.parametrize(
    "op_type,shape,attrs",
    [
        ("softmax", (8, 8, 128, 128), {"axis": -1}),
        ("softmax", (64, 1000, 20), {"axis": 1}),
        ("layer_norm", (64, 128, 128), {"begin_norm_axis": 2}),
        ("layer_norm", (32, 64, 32, 32), {"begin_norm_axis": 1}),
    ],
)
def test_large_row_wise_ops_split_by_rows_with_the_same_bits(
    op_type, shape, attrs, threads, monkeypatch
):
    """softmax (forward and gradient, normalised along any axis but the first) and layer_norm's
    forward compute each row on its own: split across the pool by rows, the bits equal the
    whole-array computation's, at 1 and at 2 threads."""
    from nestflow.ops import activation, norm

    op = get_op_def(op_type)
    full = {**{n: s.default for n, s in op.attrs.items()}, **attrs}
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape).astype("float32")
    g = rng.standard_normal(shape).astype("float32")

    def run():
        if op_type == "softmax":
            out = op.forward(x, xp=np, **full)
            return [out, op.backward(x, out, g, xp=np, **full)[0]]
        width = int(np.prod(shape[attrs["begin_norm_axis"] :]))
        scale = np.random.default_rng(1).standard_normal(width).astype("float32")
        return list(op.forward(x, scale, np.zeros(width, "float32"), xp=np, **full))

    want, got, split = _bits_whole_and_split(run, [activation, norm], threads, monkeypatch)
    assert split
    for results in got:
        for a, b in zip(results, want):
            np.testing.assert_array_equal(a, b)


_UPDATES = [
    ("sgd", ("Param", "Grad"), {}),
    ("momentum", ("Param", "Grad", "Velocity"), {}),
    ("momentum", ("Param", "Grad", "Velocity"), {"use_nesterov": True}),
    ("adam", ("Param", "Grad", "Moment1", "Moment2"), {}),
    ("adamw", ("Param", "Grad", "Moment1", "Moment2"), {}),
    ("adagrad", ("Param", "Grad", "Moment"), {}),
    ("rmsprop", ("Param", "MeanSquare", "Grad", "Moment"), {}),
    ("rmsprop", ("Param", "MeanSquare", "MeanGrad", "Grad", "Moment"), {"centered": True}),
    ("adadelta", ("Param", "Grad", "AvgSquaredGrad", "AvgSquaredUpdate"), {}),
    ("adamax", ("Param", "Grad", "Moment", "InfNorm"), {}),
]


@pytest.mark.parametrize("op_type,full,attrs", _UPDATES)
def test_large_optimizer_updates_split_across_the_pool_with_the_same_bits(
    op_type, full, attrs, threads, monkeypatch
):
    """The dense updates of parameters of 1M values and more run over chunks of their values
    on the pool: every output equals the whole-array update bit for bit, at 1 and 2 threads,
    the one-value states (beta powers) included."""
    from nestflow.ops import optimizer

    op = get_op_def(op_type)
    rng = np.random.default_rng(0)
    shape = (1024, 1100)
    arrays = {name: rng.standard_normal(shape).astype("float32") for name in full}
    for name in ("Moment2", "Moment", "MeanSquare", "AvgSquaredGrad", "AvgSquaredUpdate"):
        if name in arrays:  # second moments are never negative
            arrays[name] = np.abs(arrays[name])
    if "InfNorm" in arrays:
        arrays["InfNorm"] = np.abs(arrays["InfNorm"]) + 1
    if "MeanGrad" in arrays:  # centered: MeanSquare - MeanGrad^2 stays positive
        arrays["MeanGrad"] *= 0.1
        arrays["MeanSquare"] += 1
    inputs = {slot.name: None for slot in op.inputs}
    inputs.update(arrays, LearningRate=np.array([0.01], "float32"))
    for power in ("Beta1Pow", "Beta2Pow"):
        if power in inputs:
            inputs[power] = np.array([0.9 if power == "Beta1Pow" else 0.999], "float32")
    kwargs = {**{n: s.default for n, s in op.attrs.items()}, **attrs}
    kwargs.pop("lazy_mode", None)

    def run():
        out = op.forward(**inputs, **kwargs, xp=np)
        return [np.asarray(a) for a in (out if isinstance(out, tuple) else (out,)) if a is not None]

    want, got, split = _bits_whole_and_split(run, [optimizer], threads, monkeypatch)
    assert split
    for results in got:
        assert len(results) == len(want)
        for a, b in zip(results, want):
            np.testing.assert_array_equal(a, b)


def test_a_large_update_of_a_transposed_gradient_runs_whole(threads, monkeypatch):
    """A gradient laid out transposed (and the executor's buffer lent as ParamOut with it) is
    not flattened into chunks, which would copy it across its rows: the update runs whole, into
    the lent buffer, with sgd's values."""
    op = get_op_def("sgd")
    rng = np.random.default_rng(0)
    param = rng.standard_normal((1024, 1100)).astype("float32")
    grad = np.ascontiguousarray(rng.standard_normal((1100, 1024)).astype("float32")).T
    lent = np.empty_like(grad)
    lr = np.array([0.01], "float32")
    threads(2)
    ctx, calls = nf.device_context(), []
    parallel_for = ctx.parallel_for
    monkeypatch.setattr(
        ctx,
        "parallel_for",
        lambda n, body, grain=1: calls.append(n) or parallel_for(n, body, grain),
    )
    got = op.forward(param, grad, lr, xp=np, out=lent)
    assert not calls and got is lent
    np.testing.assert_array_equal(got, param - grad * np.float32(0.01))


@pytest.mark.parametrize(
    "shape,soft,ignored",
    [((2048, 600), False, False), ((4, 512, 600), False, True), ((2048, 600), True, False)],
)
def test_large_softmax_cross_entropy_splits_by_rows_with_the_same_bits(
    shape, soft, ignored, threads, monkeypatch
):
    """softmax_with_cross_entropy's forward and gradient over logits of 1M values and more
    run over chunks of rows on the pool (hard labels, with ignored rows, and soft ones): the
    softmax, loss and logits gradient equal the whole-array kernel's bit for bit."""
    from nestflow.ops import activation
    from nestflow.ops import loss as loss_ops

    op = get_op_def("softmax_with_cross_entropy")
    rng = np.random.default_rng(0)
    logits = (3 * rng.standard_normal(shape)).astype("float32")
    if soft:
        label = rng.random(shape).astype("float32")
        label /= label.sum(axis=-1, keepdims=True)
    else:
        label = rng.integers(0, shape[-1], shape[:-1] + (1,))
        if ignored:
            label[..., ::7, :] = -100
    loss_grad = rng.standard_normal(shape[:-1] + (1,)).astype("float32")
    attrs = {"soft_label": soft, "axis": -1, "ignore_index": -100}
    device = nf.device_context()

    def run():
        softmax, loss = op.forward(logits, label, **attrs, device=device)
        (grad,) = op.backward(logits, label, softmax, loss, None, loss_grad, **attrs, device=device)
        return [softmax, loss, grad]

    modules = [loss_ops, activation]
    want, got, split = _bits_whole_and_split(run, modules, threads, monkeypatch)
    assert split
    for results in got:
        for a, b in zip(results, want):
            np.testing.assert_array_equal(a, b)


def test_a_bad_class_id_in_large_logits_names_its_place_in_the_whole_label(threads):
    """Split by rows, a class id out of range is still reported at its place in the whole
    Label (not in a chunk's)."""
    threads(2)
    op = get_op_def("softmax_with_cross_entropy")
    logits = np.zeros((2048, 600), "float32")
    label = np.zeros((2048, 1), "int64")
    label[1500, 0] = 600
    attrs = {"soft_label": False, "axis": -1, "ignore_index": -100}
    with pytest.raises(nf.errors.ExecutionError, match=r"1500"):
        op.forward(logits, label, **attrs, device=nf.device_context())


def test_large_layer_norm_gradient_splits_by_rows(threads, monkeypatch):
    """layer_norm's gradient over [4096, 300] runs over chunks of rows on the pool: the input
    gradient equals the whole-array one bit for bit; the Scale and Bias gradients, sums of the
    chunks' partial sums in chunk order, have the same bits at 1, 2 and 3 threads and agree
    with the whole-array sums to float32 rounding."""
    from nestflow.ops import norm

    op = get_op_def("layer_norm")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4096, 300)).astype("float32")
    dy = rng.standard_normal(x.shape).astype("float32")
    scale = rng.standard_normal(300).astype("float32")
    bias = rng.standard_normal(300).astype("float32")
    attrs = {"epsilon": 1e-5, "begin_norm_axis": 1, "is_test": False, "use_mkldnn": False}
    y, mean, var = op.forward(x, scale, bias, **attrs, xp=np)

    def run():
        return list(op.backward(x, scale, bias, y, mean, var, dy, None, None, **attrs, xp=np))

    want, got, split = _bits_whole_and_split(run, [norm], threads, monkeypatch, (1, 2, 3))
    assert split
    for results in got:
        np.testing.assert_array_equal(results[0], want[0])
        for a, b, c in zip(results[1:], want[1:], got[0][1:]):
            np.testing.assert_array_equal(a, c)
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-3)
