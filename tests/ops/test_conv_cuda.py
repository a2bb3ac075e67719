"""conv_cuda's kernels (nestflow/ops/conv_cuda.py): the conv and pool2d ops' forward_cuda /
backward_cuda against their CPU bodies on a CUDA GPU (edge shapes, groups, strides, dilations,
asymmetric paddings, the fused epilogue, the transposed convs; pooling's ceil_mode, exclusive,
adaptive and global windows, max pooling's ties), and their CUDA source compiled with NVRTC
where CuPy's NVRTC binding is installed (no GPU needed)."""

from __future__ import annotations

import numpy as np
import pytest

import nestflow as nf
from nestflow.ops import conv_cuda
from nestflow.ops import nn as nn_ops
from nestflow.ops.registry import get_op_def
from tests.ops.harness import assert_equal_on_device


@pytest.mark.parametrize("c_type", ["float", "double"])
def test_kernels_compile(c_type):
    nvrtc = pytest.importorskip("cupy_backends.cuda.libs.nvrtc")
    try:
        program = nvrtc.createProgram(f"typedef {c_type} T;\n{conv_cuda.SOURCE}", "conv", [], [])
    except Exception as error:  # CuPy without its NVRTC library
        pytest.skip(f"NVRTC unavailable: {error}")
    try:
        nvrtc.compileProgram(program, ["-std=c++17"])
    except nvrtc.NVRTCError:
        pytest.fail(nvrtc.getProgramLog(program))


@pytest.fixture(scope="module")
def cuda():
    if not nf.cuda.device_count():
        pytest.skip("no CUDA GPU here")
    return nf.device_context(nf.CUDAPlace(0))


rng = np.random.default_rng(7)

# (op, Input shape, Filter shape, attrs, Bias, ResidualData's kept dims or None)
CONVS = [
    ("conv2d", (2, 4, 7, 6), (6, 4, 3, 3), {"paddings": [1, 1]}, False, None),
    ("conv2d", (1, 1, 1, 1), (1, 1, 1, 1), {}, False, None),
    ("conv2d", (3, 4, 9, 5), (6, 2, 3, 2), {"groups": 2, "strides": [2, 3]}, False, None),
    (
        "conv2d",
        (2, 3, 8, 7),
        (5, 3, 3, 3),
        {"paddings": [1, 0, 2, 1], "dilations": [2, 1]},
        0,
        None,
    ),
    (
        "conv2d",
        (2, 3, 5, 5),
        (4, 3, 2, 2),
        {"padding_algorithm": "SAME", "strides": [2, 2]},
        0,
        None,
    ),
    ("conv2d", (2, 8, 5, 3), (6, 8, 1, 1), {}, False, None),
    ("conv2d", (2, 8, 5, 3), (6, 4, 1, 1), {"groups": 2, "strides": [2, 1]}, False, None),
    ("conv2d", (2, 4, 6, 6), (6, 4, 3, 3), {"paddings": [1, 1], "fuse_relu": True}, True, None),
    ("conv2d", (2, 4, 5, 5), (6, 4, 3, 3), {"fuse_activation": "relu"}, True, (1, 1, 1, 1)),
    ("conv2d", (2, 4, 5, 5), (6, 4, 1, 1), {"fuse_relu": True}, True, (0, 1, 0, 1)),
    ("conv2d", (1, 4, 3, 5), (6, 4, 1, 1), {"fuse_relu": True}, True, (1, 1, 0, 1)),
    ("conv2d", (3, 4, 5, 5), (6, 2, 3, 3), {"groups": 2, "strides": [2, 2]}, False, (1, 0, 1, 0)),
    ("depthwise_conv2d", (2, 4, 6, 5), (8, 1, 3, 3), {"groups": 4, "paddings": [1, 1]}, True, None),
    (
        "depthwise_conv2d",
        (2, 3, 5, 5),
        (3, 1, 3, 3),
        {"groups": 3, "strides": [2, 2], "fuse_relu_before_depthwise_conv": True},
        False,
        None,
    ),
    (
        "depthwise_conv2d",
        (2, 3, 4, 4),
        (3, 1, 1, 1),
        {"groups": 3, "fuse_relu_before_depthwise_conv": True},
        False,
        None,
    ),
]

TRANSPOSES = [
    ("conv2d_transpose", (2, 4, 3, 4), (4, 3, 3, 3), {"paddings": [1, 0, 0, 1]}),
    ("conv2d_transpose", (1, 2, 1, 1), (2, 1, 1, 1), {}),
    ("conv2d_transpose", (2, 4, 3, 3), (4, 2, 3, 2), {"groups": 2, "strides": [2, 3]}),
    ("conv2d_transpose", (2, 2, 3, 3), (2, 3, 3, 3), {"strides": [2, 2], "output_size": [8, 7]}),
    ("conv2d_transpose", (2, 2, 4, 3), (2, 3, 2, 2), {"dilations": [2, 1], "paddings": [1, 1]}),
    ("depthwise_conv2d_transpose", (2, 3, 4, 4), (3, 1, 3, 3), {"groups": 3, "strides": [2, 2]}),
]


def _close(device, got, want, where):
    if want is None:
        assert got is None, where
        return
    assert_equal_on_device(device.to_host(got), want, where)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case", CONVS, ids=lambda c: f"{c[0]}-{c[1]}-{c[2]}")
def test_conv_on_cuda_as_on_cpu(cuda, case, dtype):
    op, x_shape, w_shape, attrs, bias, kept_dims = case
    ops, attrs = getattr(nn_ops, op), get_op_def(op).check_attrs(attrs)
    x, w = (rng.standard_normal(s).astype(dtype) for s in (x_shape, w_shape))
    b = rng.standard_normal(w_shape[0]).astype(dtype) if bias else None
    res = None
    if kept_dims is not None:
        attrs["fuse_residual_connection"] = True
        plain = ops.forward(x, w, b, None, **{**attrs, "fuse_residual_connection": False})
        shape = [n if keep else 1 for n, keep in zip(plain.shape, kept_dims)]
        res = rng.standard_normal(shape).astype(dtype)
    inputs = (x, w, b, res)
    on_gpu = [None if a is None else cuda.to_device(a) for a in inputs]
    want = ops.forward(*inputs, **attrs)
    got = ops.forward_cuda(*on_gpu, device=cuda, **attrs)
    _close(cuda, got, want, f"{op} Output")
    g = rng.standard_normal(want.shape).astype(dtype)
    # the first backward reuses the forward's columns, the others recompute them
    for needs in [(True,) * 4, (True, False, True, False), (False, True, False, True)]:
        wanted = ops.backward(*inputs, want, g, needs=needs, **attrs)
        grads = ops.backward_cuda(
            *on_gpu, got, cuda.to_device(g), needs=needs, device=cuda, **attrs
        )
        for slot, p, q in zip(("Input", "Filter", "Bias", "ResidualData"), grads, wanted):
            _close(cuda, p, q, f"{op} {slot}@GRAD needs={needs}")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case", TRANSPOSES, ids=lambda c: f"{c[0]}-{c[1]}-{c[2]}")
def test_conv_transpose_on_cuda_as_on_cpu(cuda, case, dtype):
    op, x_shape, w_shape, attrs = case
    ops, attrs = getattr(nn_ops, op), get_op_def(op).check_attrs(attrs)
    x, w = (rng.standard_normal(s).astype(dtype) for s in (x_shape, w_shape))
    want = ops.forward(x, w, **attrs)
    got = ops.forward_cuda(cuda.to_device(x), cuda.to_device(w), device=cuda, **attrs)
    _close(cuda, got, want, f"{op} Output")
    g = rng.standard_normal(want.shape).astype(dtype)
    for needs in [(True, True), (False, True), (True, False)]:
        wanted = ops.backward(x, w, want, g, needs=needs, **attrs)
        on_gpu = (cuda.to_device(a) for a in (x, w, want, g))
        grads = ops.backward_cuda(*on_gpu, needs=needs, device=cuda, **attrs)
        for slot, p, q in zip(("Input", "Filter"), grads, wanted):
            _close(cuda, p, q, f"{op} {slot}@GRAD needs={needs}")


def test_what_the_kernels_leave_to_the_xp_body(cuda):
    attrs = get_op_def("conv2d").check_attrs({})
    x, w = rng.standard_normal((2, 3, 4, 4)), rng.standard_normal((2, 3, 3, 3))
    empty = cuda.to_device(x[:0])
    half = [cuda.to_device(a.astype("float16")) for a in (x, w)]
    nhwc = {**attrs, "data_format": "NHWC"}
    assert (
        nn_ops.conv2d.forward_cuda(empty, cuda.to_device(w), device=cuda, **attrs) is NotImplemented
    )
    assert nn_ops.conv2d.forward_cuda(*half, device=cuda, **attrs) is NotImplemented
    x_nhwc = cuda.to_device(x.transpose(0, 2, 3, 1).copy())
    assert nn_ops.conv2d.forward_cuda(x_nhwc, cuda.to_device(w), device=cuda, **nhwc) is (
        NotImplemented
    )


# (X shape, attrs); integer inputs make max pooling's windows tie
POOLS = [
    ((2, 3, 7, 6), {"ksize": [3, 3], "strides": [2, 2], "paddings": [1, 1]}),
    ((1, 1, 1, 1), {"ksize": [1, 1]}),
    ((2, 2, 5, 4), {"ksize": [3, 2], "strides": [2, 3], "paddings": [1, 0, 1, 1]}),
    ((2, 2, 5, 5), {"ksize": [2, 2], "strides": [2, 2], "ceil_mode": True, "exclusive": False}),
    ((2, 2, 4, 6), {"ksize": [2, 2], "strides": [2, 2]}),
    ((2, 2, 6, 5), {"ksize": [3, 3], "padding_algorithm": "SAME"}),
    ((2, 3, 7, 5), {"ksize": [3, 2], "adaptive": True}),
    ((2, 3, 2, 3), {"ksize": [3, 4], "adaptive": True}),
    ((2, 3, 5, 4), {"ksize": [1, 1], "global_pooling": True}),
]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("kind", ["max", "avg"])
@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("case", POOLS, ids=lambda c: f"{c[0]}-{c[1]}")
def test_pool2d_on_cuda_as_on_cpu(cuda, case, kind, ties, dtype):
    shape, attrs = case
    attrs = get_op_def("pool2d").check_attrs({**attrs, "pooling_type": kind})
    x = rng.integers(-2, 2, shape) if ties else rng.standard_normal(shape)
    x = x.astype(dtype)
    want = nn_ops.pool2d.forward(x, **attrs)
    got = nn_ops.pool2d.forward_cuda(cuda.to_device(x), device=cuda, **attrs)
    _close(cuda, got, want, "pool2d Out")
    g = rng.standard_normal(want.shape).astype(dtype)
    wanted = nn_ops.pool2d.backward(x, want, g, **attrs)
    on_gpu = (cuda.to_device(a) for a in (x, want, g))
    grads = nn_ops.pool2d.backward_cuda(*on_gpu, device=cuda, **attrs)
    assert len(grads) == 1
    _close(cuda, grads[0], wanted[0], "pool2d X@GRAD")


def test_max_pool_gradient_lost_to_the_padding_as_on_cpu(cuda):
    # all of a window's inputs -inf: its first element, in the padding, takes the gradient
    x = np.full((1, 1, 3, 3), -np.inf)
    x[0, 0, 2, 2] = 1.0
    attrs = get_op_def("pool2d").check_attrs(
        {"pooling_type": "max", "ksize": [2, 2], "paddings": [1, 1]}
    )
    out, g = nn_ops.pool2d.forward(x, **attrs), np.ones((1, 1, 4, 4))
    want = nn_ops.pool2d.backward(x, out, g, **attrs)[0]
    on_gpu = (cuda.to_device(a) for a in (x, out, g))
    _close(cuda, nn_ops.pool2d.backward_cuda(*on_gpu, device=cuda, **attrs)[0], want, "dX")
