"""Vision ops against NumPy references written per output position (conv2d, depthwise_conv2d,
conv2d_transpose, pool2d, lrn, flatten, flatten2), float64 numeric gradients for every
differentiable input, PyTorch's forward and gradients in float64 over grids of settings, and the
build-time errors."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import nestflow as nf
from nestflow.errors import AttrError, DTypeError, NestflowError, ShapeError
from nestflow.ops import gemm, winograd
from nestflow.ops import nn as nn_ops
from nestflow.ops.registry import get_op_def
from tests.ops.harness import OpCase, case_id

rng = np.random.default_rng(1818)


def normal(*shape, dtype="float64"):
    return rng.standard_normal(shape).astype(dtype)


# ---- NumPy references (Fluid's rules, one output position at a time) ----


def four_pads(paddings):
    return list(paddings) * 1 if len(paddings) == 4 else [paddings[0]] * 2 + [paddings[1]] * 2


def same_pads(size, k, s):
    out = (size + s - 1) // s
    total = max((out - 1) * s + k - size, 0)
    return [total // 2, total - total // 2]


def conv_settings(x, k_hw, strides, paddings, dilations, padding_algorithm):
    pads = four_pads(paddings)
    if padding_algorithm == "VALID":
        pads = [0, 0, 0, 0]
    if padding_algorithm == "SAME":
        pads = same_pads(x.shape[2], k_hw[0], strides[0]) + same_pads(
            x.shape[3], k_hw[1], strides[1]
        )
        dilations = [1, 1]
    return pads, dilations


def ref_conv2d(
    Input,
    Filter,
    strides=(1, 1),
    paddings=(0, 0),
    dilations=(1, 1),
    groups=1,
    padding_algorithm="EXPLICIT",
    data_format="NCHW",
    fuse_relu_before_depthwise_conv=False,
    **_,
):
    x = Input.transpose(0, 3, 1, 2) if data_format == "NHWC" else Input
    if fuse_relu_before_depthwise_conv:
        x = np.maximum(x, 0)
    m, cg, kh, kw = Filter.shape
    pads, dil = conv_settings(x, (kh, kw), strides, paddings, dilations, padding_algorithm)
    xp = np.pad(x, ((0, 0), (0, 0), pads[:2], pads[2:]))
    eh, ew = dil[0] * (kh - 1) + 1, dil[1] * (kw - 1) + 1
    oh = (xp.shape[2] - eh) // strides[0] + 1
    ow = (xp.shape[3] - ew) // strides[1] + 1
    out = np.zeros((x.shape[0], m, oh, ow), x.dtype)
    mg = m // groups
    for i, j in itertools.product(range(oh), range(ow)):
        r, c = i * strides[0], j * strides[1]
        patch = xp[:, :, r : r + eh : dil[0], c : c + ew : dil[1]]
        for g in range(groups):
            out[:, g * mg : (g + 1) * mg, i, j] = np.einsum(
                "nckl,mckl->nm", patch[:, g * cg : (g + 1) * cg], Filter[g * mg : (g + 1) * mg]
            )
    out = out.transpose(0, 2, 3, 1) if data_format == "NHWC" else out
    return {"Output": out}


def ref_conv2d_transpose(
    Input,
    Filter,
    strides=(1, 1),
    paddings=(0, 0),
    dilations=(1, 1),
    groups=1,
    output_size=(),
    padding_algorithm="EXPLICIT",
    data_format="NCHW",
    **_,
):
    x = Input.transpose(0, 3, 1, 2) if data_format == "NHWC" else Input
    c, mg, kh, kw = Filter.shape
    pads, dil = conv_settings(x, (kh, kw), strides, paddings, dilations, padding_algorithm)
    n, _, h, w = x.shape
    eh, ew = dil[0] * (kh - 1) + 1, dil[1] * (kw - 1) + 1
    full_h, full_w = (h - 1) * strides[0] + eh, (w - 1) * strides[1] + ew
    oh = output_size[0] if output_size else full_h - pads[0] - pads[1]
    ow = output_size[1] if output_size else full_w - pads[2] - pads[3]
    full = np.zeros((n, mg * groups, pads[0] + oh + full_h, pads[2] + ow + full_w), x.dtype)
    cg = c // groups
    for i, j in itertools.product(range(h), range(w)):
        r, q = i * strides[0], j * strides[1]
        for g in range(groups):
            full[:, g * mg : (g + 1) * mg, r : r + eh : dil[0], q : q + ew : dil[1]] += np.einsum(
                "nc,cmkl->nmkl", x[:, g * cg : (g + 1) * cg, i, j], Filter[g * cg : (g + 1) * cg]
            )
    out = full[:, :, pads[0] : pads[0] + oh, pads[2] : pads[2] + ow]
    out = out.transpose(0, 2, 3, 1) if data_format == "NHWC" else out
    return {"Output": np.ascontiguousarray(out)}


def adaptive_bounds(size, n_out):
    return [(i * size // n_out, -(-(i + 1) * size // n_out)) for i in range(n_out)]


def ref_pool2d(
    X,
    pooling_type,
    ksize,
    strides=(1, 1),
    paddings=(0, 0),
    global_pooling=False,
    ceil_mode=False,
    exclusive=True,
    adaptive=False,
    padding_algorithm="EXPLICIT",
    data_format="NCHW",
    **_,
):
    x = X.transpose(0, 3, 1, 2) if data_format == "NHWC" else X
    n, c, h, w = x.shape
    pads = four_pads(paddings)
    if padding_algorithm == "SAME":
        pads = same_pads(h, ksize[0], strides[0]) + same_pads(w, ksize[1], strides[1])
    if global_pooling:
        ksize = [h, w]
    if global_pooling or adaptive or padding_algorithm == "VALID":
        pads = [0, 0, 0, 0]
    if adaptive:
        rows, cols = adaptive_bounds(h, ksize[0]), adaptive_bounds(w, ksize[1])
    else:
        extra = [strides[0] - 1, strides[1] - 1] if ceil_mode else [0, 0]
        oh = (h - ksize[0] + pads[0] + pads[1] + extra[0]) // strides[0] + 1
        ow = (w - ksize[1] + pads[2] + pads[3] + extra[1]) // strides[1] + 1
        rows = [
            (max(i * strides[0] - pads[0], 0), min(i * strides[0] - pads[0] + ksize[0], h))
            for i in range(oh)
        ]
        cols = [
            (max(j * strides[1] - pads[2], 0), min(j * strides[1] - pads[2] + ksize[1], w))
            for j in range(ow)
        ]
    out = np.zeros((n, c, len(rows), len(cols)), x.dtype)
    for (i, (r0, r1)), (j, (c0, c1)) in itertools.product(enumerate(rows), enumerate(cols)):
        cell = x[:, :, r0:r1, c0:c1]
        if pooling_type == "max":
            out[:, :, i, j] = cell.max(axis=(2, 3))
        else:
            count = (r1 - r0) * (c1 - c0) if exclusive or adaptive else ksize[0] * ksize[1]
            out[:, :, i, j] = cell.sum(axis=(2, 3)) / count
    out = out.transpose(0, 2, 3, 1) if data_format == "NHWC" else out
    return {"Out": np.ascontiguousarray(out)}


def ref_lrn(X, n=5, k=2.0, alpha=1e-4, beta=0.75, data_format="AnyLayout", **_):
    x = X.transpose(0, 3, 1, 2) if data_format == "NHWC" else X
    mid = np.full(x.shape, k, x.dtype)
    channels = x.shape[1]
    for c in range(channels):
        for j in range(c - (n - 1) // 2, c - (n - 1) // 2 + n):
            if 0 <= j < channels:
                mid[:, c] += alpha * x[:, j] ** 2
    out = x * mid ** (-beta)
    if data_format == "NHWC":
        out, mid = out.transpose(0, 2, 3, 1), mid.transpose(0, 2, 3, 1)
    return {"Out": np.ascontiguousarray(out), "MidOut": np.ascontiguousarray(mid)}


def ref_flatten(X, axis=1):
    return {"Out": X.reshape(int(np.prod(X.shape[:axis])), int(np.prod(X.shape[axis:])))}


def ref_flatten2(X, axis=1):
    return {**ref_flatten(X, axis), "XShape": np.empty((0,) + X.shape, X.dtype)}


# ---- cases ----


def conv_case(x_shape, f_shape, attrs, name, op="conv2d", dtype="float64", grad=True):
    reference = ref_conv2d_transpose if op.endswith("_transpose") else ref_conv2d
    loose = dtype == "float32"
    return OpCase(
        op,
        {"Input": normal(*x_shape, dtype=dtype), "Filter": normal(*f_shape, dtype=dtype)},
        reference,
        attrs,
        grad=("Input", "Filter") if grad else (),
        atol=1e-4 if loose else 1e-9,
        rtol=1e-4 if loose else 1e-9,
        grad_atol=1e-5,
        grad_rtol=1e-5,
        id=f"{op}-{name}",
    )


CONV_CASES = [
    conv_case((2, 3, 5, 5), (4, 3, 3, 3), {}, "plain"),
    conv_case(
        (2, 3, 7, 6), (4, 3, 3, 2), {"strides": [2, 3], "paddings": [1, 2]}, "odd_stride_pad"
    ),
    conv_case((1, 4, 7, 7), (6, 2, 3, 3), {"groups": 2, "dilations": [2, 1]}, "groups_dilation"),
    conv_case((2, 2, 5, 6), (3, 2, 3, 3), {"paddings": [0, 1, 2, 1]}, "asymmetric_pads"),
    conv_case((2, 2, 6, 5), (3, 2, 3, 3), {"padding_algorithm": "SAME", "strides": [2, 2]}, "same"),
    conv_case(
        (1, 2, 6, 5), (2, 2, 3, 2), {"padding_algorithm": "VALID", "paddings": [4, 4]}, "valid"
    ),
    conv_case((2, 5, 4, 3), (2, 3, 3, 2), {"data_format": "NHWC", "paddings": [1, 0]}, "nhwc"),
    conv_case((2, 3, 1, 1), (2, 3, 1, 1), {}, "size1"),
    # products of more than 32 terms: the batch-last im2col layout (fewer go images first)
    conv_case((2, 6, 6, 5), (3, 6, 3, 2), {"paddings": [1, 0]}, "many_channels"),
    conv_case(
        (2, 6, 7, 6), (2, 6, 3, 3), {"dilations": [2, 1], "paddings": [1, 1]}, "many_dilated"
    ),
    conv_case((3, 4, 5, 5), (5, 4, 1, 1), {}, "1x1"),
    conv_case((2, 4, 5, 5), (3, 4, 1, 1), {"strides": [2, 2]}, "1x1_stride2"),
    conv_case((0, 3, 5, 5), (2, 3, 3, 3), {"paddings": [1, 1]}, "empty_batch", grad=False),
    conv_case(
        (0, 3, 5, 5),
        (3, 1, 3, 3),
        {"groups": 3, "paddings": [1, 1]},
        "depthwise_empty_batch",
        op="depthwise_conv2d",
        grad=False,
    ),
    conv_case(
        (2, 3, 9, 8),
        (4, 3, 3, 3),
        {"strides": [2, 2], "paddings": [1, 1]},
        "f32",
        dtype="float32",
        grad=False,
    ),
    conv_case(
        (2, 3, 5, 5),
        (6, 1, 3, 3),
        {"groups": 3, "paddings": [1, 1]},
        "depthwise",
        op="depthwise_conv2d",
    ),
    conv_case(
        (2, 2, 4, 4),
        (2, 1, 3, 3),
        {"groups": 2, "fuse_relu_before_depthwise_conv": True},
        "fused_relu",
        op="depthwise_conv2d",
    ),
    conv_case((2, 3, 4, 5), (3, 2, 3, 3), {}, "plain", op="conv2d_transpose"),
    conv_case(
        (2, 4, 3, 4),
        (4, 1, 3, 2),
        {"strides": [2, 3], "paddings": [1, 0], "groups": 2, "dilations": [1, 2]},
        "stride_pad_groups_dilation",
        op="conv2d_transpose",
    ),
    conv_case(
        (1, 2, 3, 3),
        (2, 2, 3, 3),
        {"strides": [2, 2], "paddings": [1, 1], "output_size": [6, 5]},
        "output_size",
        op="conv2d_transpose",
    ),
    conv_case(
        (2, 2, 3, 4), (2, 3, 2, 2), {"paddings": [1, 0, 0, 1]}, "asymmetric", op="conv2d_transpose"
    ),
    conv_case(
        (2, 3, 4, 2),
        (2, 2, 3, 3),
        {"data_format": "NHWC", "strides": [2, 1]},
        "nhwc",
        op="conv2d_transpose",
    ),
    conv_case(
        (1, 2, 3, 4),
        (2, 2, 3, 3),
        {"padding_algorithm": "SAME", "strides": [2, 2]},
        "same",
        op="conv2d_transpose",
    ),
    conv_case((2, 1, 1, 1), (1, 2, 1, 1), {}, "size1", op="conv2d_transpose"),
    conv_case(
        (2, 3, 4, 5), (3, 6, 3, 2), {"paddings": [1, 0]}, "many_channels", op="conv2d_transpose"
    ),
    conv_case(
        (2, 3, 3, 4),
        (3, 1, 3, 3),
        {"groups": 3, "strides": [2, 2], "paddings": [1, 1]},
        "depthwise",
        op="depthwise_conv2d_transpose",
    ),
    conv_case((0, 2, 3, 3), (2, 2, 3, 3), {}, "empty_batch", op="conv2d_transpose", grad=False),
    conv_case(
        (1, 2, 1, 1), (2, 1, 1, 1), {"groups": 2}, "dw_size1", op="depthwise_conv2d_transpose"
    ),
    conv_case(
        (0, 3, 3, 3),
        (3, 1, 3, 3),
        {"groups": 3},
        "dw_empty_batch",
        op="depthwise_conv2d_transpose",
        grad=False,
    ),
    conv_case(
        (2, 2, 5, 3),
        (2, 2, 2, 3),
        {"groups": 2, "strides": [3, 2], "paddings": [1, 2]},
        "dw_odd_stride_pad_multiplier",
        op="depthwise_conv2d_transpose",
    ),
]


def pool_case(x_shape, attrs, name, dtype="float64", grad=True):
    loose = dtype == "float32"
    return OpCase(
        "pool2d",
        {"X": normal(*x_shape, dtype=dtype)},
        ref_pool2d,
        attrs,
        grad=("X",) if grad else (),
        atol=1e-5 if loose else 1e-12,
        rtol=1e-5 if loose else 1e-12,
        id=f"pool2d-{name}",
    )


def pool_cases():
    cases = []
    for kind in ("max", "avg"):
        base = {"pooling_type": kind}
        cases += [
            pool_case((2, 3, 6, 6), {**base, "ksize": [2, 2], "strides": [2, 2]}, f"{kind}-2x2"),
            pool_case(
                (2, 2, 7, 5),
                {**base, "ksize": [3, 2], "strides": [2, 2], "paddings": [1, 1]},
                f"{kind}-odd_pad",
            ),
            pool_case(
                (1, 2, 7, 6),
                {**base, "ksize": [3, 3], "strides": [2, 2], "paddings": [1, 1], "ceil_mode": True},
                f"{kind}-ceil",
            ),
            pool_case(
                (1, 2, 5, 6),
                {**base, "ksize": [3, 3], "strides": [2, 2], "paddings": [0, 1, 1, 0]},
                f"{kind}-asymmetric",
            ),
            pool_case(
                (2, 3, 4, 5), {**base, "ksize": [1, 1], "global_pooling": True}, f"{kind}-global"
            ),
            pool_case(
                (2, 2, 7, 5), {**base, "ksize": [3, 2], "adaptive": True}, f"{kind}-adaptive"
            ),
            pool_case(
                (1, 2, 7, 6),
                {**base, "ksize": [3, 3], "strides": [2, 2], "padding_algorithm": "SAME"},
                f"{kind}-same",
            ),
            pool_case(
                (1, 5, 4, 3), {**base, "ksize": [2, 2], "data_format": "NHWC"}, f"{kind}-nhwc"
            ),
            pool_case((2, 1, 1, 1), {**base, "ksize": [1, 1]}, f"{kind}-size1"),
            pool_case((0, 2, 4, 4), {**base, "ksize": [2, 2]}, f"{kind}-empty_batch", grad=False),
            pool_case(
                (2, 3, 9, 7),
                {**base, "ksize": [3, 3], "strides": [2, 2], "paddings": [1, 1]},
                f"{kind}-f32",
                dtype="float32",
                grad=False,
            ),
        ]
    cases += [
        pool_case(
            (1, 2, 5, 5),
            {
                "pooling_type": "avg",
                "ksize": [3, 3],
                "strides": [2, 2],
                "paddings": [1, 1],
                "exclusive": False,
            },
            "avg-inclusive",
        ),
        pool_case(
            (1, 2, 6, 6),
            {
                "pooling_type": "avg",
                "ksize": [3, 3],
                "strides": [2, 2],
                "paddings": [1, 1],
                "exclusive": False,
                "ceil_mode": True,
            },
            "avg-inclusive-ceil",
        ),
    ]
    return cases


POOL_CASES = pool_cases()

# Max pooling's gradient goes to the first maximum of a window when several tie (Fluid's rule).
x_ties = np.zeros((1, 1, 4, 4))
x_ties[0, 0, 1, 1] = x_ties[0, 0, 2, 3] = -1.0
POOL_TIES = OpCase(
    "pool2d",
    {"X": x_ties},
    ref_pool2d,
    {"pooling_type": "max", "ksize": [2, 2], "strides": [2, 2]},
    id="pool2d-max-ties",
)

LRN_CASES = [
    OpCase("lrn", {"X": normal(2, 6, 3, 4)}, ref_lrn, {}, grad=("X",), id="lrn-defaults"),
    OpCase(
        "lrn",
        {"X": normal(2, 4, 3, 3)},
        ref_lrn,
        {"n": 3, "k": 1.0, "alpha": 0.5, "beta": 0.6},
        grad=("X",),
        id="lrn-strong",
    ),
    OpCase(
        "lrn",
        {"X": normal(1, 5, 2, 3)},
        ref_lrn,
        {"n": 4, "k": 1.5, "alpha": 0.3, "beta": 0.75},
        grad=("X",),
        grad_outputs=("Out",),
        id="lrn-even_n-out_only",
    ),
    OpCase(
        "lrn",
        {"X": normal(2, 3, 2, 4)},
        ref_lrn,
        {"n": 5, "alpha": 0.2, "data_format": "NHWC"},
        grad=("X",),
        id="lrn-nhwc",
    ),
    OpCase("lrn", {"X": normal(1, 1, 1, 1)}, ref_lrn, {"alpha": 0.5}, grad=("X",), id="lrn-size1"),
    OpCase("lrn", {"X": normal(0, 3, 2, 2)}, ref_lrn, {}, id="lrn-empty_batch"),
    OpCase(
        "lrn",
        {"X": normal(2, 7, 3, 3, dtype="float32")},
        ref_lrn,
        {"alpha": 0.1},
        atol=1e-6,
        id="lrn-f32",
    ),
]

FLATTEN_CASES = [
    OpCase(op, {"X": normal(*shape)}, ref, {"axis": axis}, grad=("X",), id=f"{op}-{shape}-{axis}")
    for op, ref in (("flatten", ref_flatten), ("flatten2", ref_flatten2))
    for shape, axis in (((2, 3, 4), 1), ((2, 3, 4), 0), ((2, 3, 4), 3), ((3, 1, 2, 2), 2))
] + [
    OpCase("flatten2", {"X": normal(0, 3, 2)}, ref_flatten2, {"axis": 1}, id="flatten2-empty"),
    OpCase(
        "flatten",
        {"X": np.arange(6, dtype="int64").reshape(1, 2, 3)},
        ref_flatten,
        {"axis": 2},
        id="flatten-int64",
    ),
]

ALL_CASES = CONV_CASES + POOL_CASES + [POOL_TIES] + LRN_CASES + FLATTEN_CASES


@pytest.mark.parametrize("case", ALL_CASES, ids=case_id)
def test_op(case):
    case.check()


def test_max_pool_ties_route_the_gradient_to_the_first_maximum():
    grad = run_with_grads(
        "pool2d",
        {"X": x_ties},
        {"pooling_type": "max", "ksize": [2, 2], "strides": [2, 2]},
        "Out",
        np.ones((1, 1, 2, 2)),
    )[1]["X"]
    expected = np.zeros((4, 4))
    expected[0, 0] = expected[0, 2] = expected[2, 0] = expected[2, 2] = 1.0
    np.testing.assert_array_equal(grad[0, 0], expected)


# ---- Winograd F(4x4, 3x3): the 3x3 stride-1 path for >= winograd.MIN_CHANNELS channels ----


@pytest.fixture
def winograd_for_any_channels(monkeypatch):
    """Route every eligible conv (3x3, stride 1, one group) through Winograd, whatever its
    channels and output size; counts the Winograd convolutions run."""
    monkeypatch.setattr(winograd, "MIN_CHANNELS", 1)
    monkeypatch.setattr(nn_ops, "_winograd_pays", lambda out_hw, batch: True)
    calls = []
    conv = winograd.conv

    def counted(*args, **kwargs):
        calls.append(args[0].shape)
        return conv(*args, **kwargs)

    monkeypatch.setattr(winograd, "conv", counted)
    return calls


def uses_winograd(case: OpCase) -> bool:
    attrs = case.attrs
    dilated = attrs.get("dilations", [1, 1]) != [1, 1] and attrs.get("padding_algorithm") != "SAME"
    return (
        case.inputs["Filter"].shape[2:] == (3, 3)
        and attrs.get("strides", [1, 1]) == [1, 1]
        and attrs.get("groups", 1) == 1
        and not dilated
    )


WINOGRAD_CASES = [c for c in CONV_CASES if uses_winograd(c)] + [
    conv_case((2, 2, 9, 7), (3, 2, 3, 3), {"paddings": [3, 0, 1, 2]}, "wino_pad3_no_winograd_dx"),
    conv_case((1, 2, 4, 4), (2, 2, 3, 3), {"paddings": [2, 2]}, "wino_pad2"),
    conv_case((2, 3, 13, 10), (2, 3, 3, 3), {"paddings": [1, 1]}, "wino_odd_blocks"),
    conv_case((2, 3, 3, 3), (2, 3, 3, 3), {}, "wino_one_output"),
    conv_case((2, 5, 6, 4), (3, 4, 3, 3), {"data_format": "NHWC", "paddings": [1, 1]}, "wino_nhwc"),
    conv_case((1, 2, 6, 5), (3, 2, 3, 3), {"padding_algorithm": "SAME"}, "wino_same"),
    conv_case(
        (2, 3, 9, 8), (4, 3, 3, 3), {"paddings": [1, 1]}, "wino", dtype="float32", grad=False
    ),
    conv_case((1, 2, 5, 4), (2, 3, 3, 3), {"paddings": [1, 0]}, "wino", op="conv2d_transpose"),
]


@pytest.mark.parametrize("case", WINOGRAD_CASES, ids=case_id)
def test_winograd_path(case, winograd_for_any_channels):
    case.check()
    assert winograd_for_any_channels, "the case did not run the Winograd kernels"


@pytest.mark.parametrize(
    "pads,hw",
    [
        ((1, 1, 1, 1), (9, 7)),
        ((0, 0, 0, 0), (6, 5)),
        ((2, 2, 2, 2), (3, 6)),
        ((2, 0, 1, 2), (5, 4)),
        ((0, 2, 2, 0), (1, 1)),
    ],
)
def test_winograd_gradients_share_the_padded_gradient(pads, hw):
    """padded_grad's array, made once for both gradients, gives filter_grad and input_grad
    the bits they get by laying the gradient out themselves."""
    x = normal(2, 3, *hw, dtype="float32")
    out_hw = (hw[0] + pads[0] + pads[1] - 2, hw[1] + pads[2] + pads[3] - 2)
    w, grad = normal(4, 3, 3, 3, dtype="float32"), normal(2, 4, *out_hw, dtype="float32")
    v = winograd.input_transform(x, pads, out_hw)
    padded = winograd.padded_grad(grad, pads)
    np.testing.assert_array_equal(
        winograd.filter_grad(v, grad, padded, pads), winograd.filter_grad(v, grad)
    )
    np.testing.assert_array_equal(
        winograd.input_grad(grad, w, pads, padded=padded), winograd.input_grad(grad, w, pads)
    )
    assert winograd.padded_grad(grad, (3, 0, 0, 0)) is None


@pytest.mark.parametrize("pooled", [False, True], ids=["whole", "pool"])
def test_conv_grad_lays_the_gradient_out_once_for_both_gradients(pooled, monkeypatch):
    """conv2d's backward, asked for both gradients (its needs also hold Bias and
    ResidualData), gives filter_grad the padded gradient input_grad made: two layout copies
    a batch (the input's and the gradient's), not three."""
    x, w = normal(2, 16, 8, 8, dtype="float32"), normal(16, 16, 3, 3, dtype="float32")
    grad = normal(2, 16, 8, 8, dtype="float32")
    attrs = {**nn_ops._CONV2D_ATTRS, "paddings": [1, 1], "use_cudnn": True}
    monkeypatch.setattr(nn_ops, "_winograd_pays", lambda out_hw, batch: True)
    laid_out = []
    hwn = winograd._hwn
    monkeypatch.setattr(winograd, "_hwn", lambda a, *rest: laid_out.append(a) or hwn(a, *rest))
    device = nf.device_context(nf.CPUPlace()) if pooled else None
    needs = (True, True, False, False)
    dx, dw, _, _ = nn_ops._conv_backward(x, w, None, None, None, grad, False, attrs, needs, device)
    assert len(laid_out) == 2
    monkeypatch.setattr(winograd, "_hwn", hwn)
    want = nn_ops._conv_backward(x, w, None, None, None, grad, False, attrs, needs, device)
    np.testing.assert_array_equal(dx, want[0])
    np.testing.assert_array_equal(dw, want[1])


@pytest.mark.parametrize("size,top,left", [(6, 0, 0), (6, 2, 3), (4, 1, 2), (4, 0, 5)])
def test_winograd_tiles_view_equals_as_strided(size, top, left):
    """_tiles makes its overlapping views of a contiguous NumPy layout with the ndarray
    constructor (as_strided's Python holds the GIL 2 us a call): the tiles equal those read
    through as_strided, which a non-contiguous layout (and a device array) still takes."""
    x = normal(3, 5, 13, 11, dtype="float32")
    blocks = (2, 2)
    padded = winograd._hwn(x, 1, 2, (4 * blocks[0] + 2 + top, 4 * blocks[1] + 2 + left))
    got = winograd._tiles(padded, size, blocks, top, left)
    c, _, _, _, n = padded.shape
    sc, sh, _, sq, sn = padded.strides
    want = np.empty((size, size, c) + blocks + (n,), padded.dtype)
    for j in range(size):
        quad, phase = divmod(left + j, winograd._PHASES)
        column = padded[:, top:, phase, quad:]
        shape, strides = (size, c) + blocks + (n,), (sh, sc, 4 * sh, sq, sn)
        want[:, j] = np.lib.stride_tricks.as_strided(column, shape, strides)
    np.testing.assert_array_equal(got, want.reshape(size * size, -1))
    strided = np.moveaxis(np.moveaxis(padded.copy(), 0, -1).copy(), -1, 0)  # not C-contiguous
    assert not strided.flags.c_contiguous
    np.testing.assert_array_equal(winograd._tiles(strided, size, blocks, top, left), got)


@pytest.mark.parametrize("cols", [0, 1, 37, winograd._KRON_COLUMNS, 2 * winograd._KRON_COLUMNS + 5])
@pytest.mark.parametrize(
    "factor,kron",
    [
        (winograd._BT, winograd._INPUT),
        (winograd._AT, winograd._OUTPUT),
        (winograd._A, winograd._GRAD_INPUT),
    ],
    ids=["input", "output", "filter_grad"],
)
def test_winograd_transforms_run_as_their_two_factors(factor, kron, cols):
    """_kron_product's two passes in column blocks equal the product by the Kronecker matrix,
    at 1 and at 2 threads with the same bits (no column is summed across blocks)."""
    data = normal(factor.shape[1] ** 2, cols, dtype="float64")
    want = kron @ data
    budget, results = nf.get_num_threads(), []
    try:
        for threads in (1, 2):
            nf.set_num_threads(threads)
            got = winograd._kron_product(factor, data, kron)
            assert got.shape == want.shape and got.dtype == np.float64
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
            results.append(got)
    finally:
        nf.set_num_threads(budget)
    np.testing.assert_array_equal(results[0], results[1])
    single = winograd._kron_product(factor, data.astype("float32"), kron)
    assert single.dtype == np.float32


@pytest.mark.parametrize("dtype,tol", [("float64", 1e-12), ("float32", 1e-4)])
def test_winograd_at_its_channel_threshold_agrees_with_im2col(dtype, tol, monkeypatch):
    """16 channels in and out over 128 output blocks (the last cut short: 13 columns) take
    Winograd by default; the im2col kernels (checked above against the references) must give
    the same output and gradients."""
    x, w = normal(8, 16, 16, 13, dtype=dtype), normal(16, 16, 3, 3, dtype=dtype)
    upstream = normal(8, 16, 16, 13, dtype=dtype)
    geo = nn_ops._ConvGeometry((1, 1), (1, 1, 1, 1), (1, 1), 1)
    assert nn_ops._kernel(w.shape, geo, (16, 13), x.dtype, 8) == "winograd"
    inputs, attrs = {"Input": x, "Filter": w}, {"paddings": [1, 1]}
    out, grads = run_with_grads("conv2d", inputs, attrs, "Output", upstream)
    monkeypatch.setattr(winograd, "MIN_CHANNELS", 10**9)
    want_out, want_grads = run_with_grads("conv2d", inputs, attrs, "Output", upstream)
    for got, want in ((out, want_out), (grads["Input"], want_grads["Input"])) + (
        (grads["Filter"], want_grads["Filter"]),
    ):
        assert got.dtype == np.dtype(dtype)
        np.testing.assert_allclose(got, want, rtol=0, atol=tol * np.abs(want).max())


@pytest.mark.parametrize(
    "batch,hw,kernel",
    [
        (1, (7, 7), "im2col"),
        (16, (7, 7), "im2col"),  # 64 blocks computing 8x8 for 7x7: 77% used
        (32, (7, 7), "winograd"),  # 128 blocks
        (1, (13, 12), "im2col"),
        (4, (14, 14), "im2col"),
        (8, (14, 14), "winograd"),
        (32, (4, 4), "im2col"),  # 32 blocks
        (3, (16, 16), "winograd"),  # 48 blocks, every output used
        (12, (8, 8), "winograd"),
        (11, (8, 8), "im2col"),
    ],
)
def test_winograd_takes_only_convs_with_enough_output_blocks(batch, hw, kernel):
    """Below _WINOGRAD_MIN_BLOCKS 4x4 output blocks (over the batch), or below
    _WINOGRAD_ANY_BLOCKS where the blocks compute many outputs the image cuts off, im2col runs
    instead: the filter transform and the tile copies cost more than they save there."""
    geo = nn_ops._ConvGeometry((1, 1), (1, 1, 1, 1), (1, 1), 1)
    assert nn_ops._kernel((32, 32, 3, 3), geo, hw, np.float32, batch) == kernel


@pytest.mark.parametrize("copy_max", [None, 0])
@pytest.mark.parametrize(
    "x_shape,w_shape,strides,groups,kernel",
    [
        ((2, 12, 9, 9), (4, 12, 3, 3), (2, 2), 1, "im2col"),  # 4 x 108 filter rows
        ((2, 6, 8, 8), (4, 3, 3, 3), (1, 1), 2, "im2col"),
        ((2, 24, 16, 16), (8, 24, 1, 1), (1, 1), 1, "pointwise"),
        ((8, 16, 16, 16), (16, 16, 3, 3), (1, 1), 1, "winograd"),
    ],
)
def test_the_filter_gradient_is_c_contiguous_on_every_kernel(
    x_shape, w_shape, strides, groups, kernel, copy_max, monkeypatch
):
    """The optimizer updates a filter gradient elementwise beside the C-contiguous filter: a
    transposed gradient there made W13's SGD update 17x slower. Both ways of making it
    contiguous (a small product copied, a large one computed in its own orientation) give the
    reference's values."""
    if copy_max is not None:
        monkeypatch.setattr(gemm, "TRANSPOSED_COPY_MAX", copy_max)
    x = normal(*x_shape, dtype="float32")
    geo = nn_ops._ConvGeometry(
        strides, (1, 1, 1, 1) if w_shape[2] == 3 else (0,) * 4, (1, 1), groups
    )
    out_hw = geo.out_hw(x_shape[2:], w_shape[2:])
    assert nn_ops._kernel(w_shape, geo, out_hw, x.dtype, x_shape[0]) == kernel
    grad = normal(x_shape[0], w_shape[0], *out_hw, dtype="float32")
    dw = nn_ops._conv_filter_grad(x, grad, w_shape, geo)
    assert dw.shape == w_shape and dw.flags.c_contiguous
    top, _, left, _ = geo.pads
    padded = np.pad(x.astype("float64"), ((0, 0), (0, 0), (top, top), (left, left)))
    m, cg, kh, kw = w_shape
    want = np.zeros(w_shape)
    for g, i, j in itertools.product(range(groups), range(kh), range(kw)):
        window = padded[:, g * cg : (g + 1) * cg, i :: strides[0], j :: strides[1]]
        window = window[:, :, : out_hw[0], : out_hw[1]]
        rows = slice(g * m // groups, (g + 1) * m // groups)
        want[rows, :, i, j] = np.einsum("nmhw,nchw->mc", grad[:, rows], window)
    np.testing.assert_allclose(dw, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


# ---- the fused form: Output = relu(conv + Bias + ResidualData), Fluid's MKL-DNN conv ----


def ref_fused_conv2d(Input, Filter, Bias=None, ResidualData=None, **attrs):
    out = ref_conv2d(Input, Filter, **attrs)["Output"]
    channel_axis = 3 if attrs.get("data_format") == "NHWC" else 1
    if Bias is not None:
        out = out + Bias.reshape([-1 if d == channel_axis else 1 for d in range(4)])
    if ResidualData is not None:
        out = out + ResidualData
    if attrs.get("fuse_relu") or attrs.get("fuse_activation") == "relu":
        out = np.maximum(out, 0)
    return {"Output": out}


def fused_case(x_shape, f_shape, attrs, name, bias=True, residual=None, op="conv2d"):
    """A fused conv over random data; `residual` is ResidualData's shape (None: none)."""
    case = conv_case(x_shape, f_shape, attrs, name, op=op)
    inputs = dict(case.inputs)
    attrs = dict(attrs)
    if bias:
        inputs["Bias"] = normal(f_shape[0])
    if residual is not None:
        inputs["ResidualData"] = normal(*residual)
        attrs["fuse_residual_connection"] = True
    slots = tuple(s for s in ("Input", "Filter", "Bias", "ResidualData") if s in inputs)
    return OpCase(
        op,
        inputs,
        ref_fused_conv2d,
        attrs,
        grad=slots,
        atol=1e-9,
        rtol=1e-9,
        grad_atol=1e-5,
        grad_rtol=1e-5,
        id=f"{op}-fused-{name}",
    )


RELU = {"fuse_activation": "relu"}
FUSED_CASES = [
    fused_case((2, 3, 5, 5), (4, 3, 3, 3), {}, "bias_only"),
    fused_case((2, 3, 5, 5), (4, 3, 3, 3), {"fuse_relu": True}, "bias_relu"),
    fused_case((2, 3, 5, 5), (4, 3, 3, 3), RELU, "relu_only", bias=False),
    fused_case(
        (2, 3, 6, 5), (4, 3, 3, 3), {**RELU, "paddings": [1, 1]}, "all", residual=(2, 4, 6, 5)
    ),
    fused_case(
        (2, 3, 7, 7),
        (4, 3, 3, 3),
        {**RELU, "strides": [2, 2], "paddings": [1, 1]},
        "strided_broadcast_residual",
        residual=(1, 4, 1, 4),
    ),
    fused_case((2, 3, 4, 5), (4, 3, 1, 1), RELU, "pointwise", residual=(2, 4, 4, 5)),
    fused_case(
        (2, 3, 5, 7),
        (4, 3, 1, 1),
        {**RELU, "strides": [2, 3]},
        "pointwise_strided",
        residual=(2, 4, 3, 3),
    ),
    fused_case(
        (2, 6, 5, 5),
        (4, 5, 3, 3),
        {**RELU, "data_format": "NHWC", "paddings": [1, 1]},
        "nhwc",
        residual=(2, 6, 5, 4),
    ),
    fused_case(
        (2, 4, 5, 5),
        (8, 1, 3, 3),
        {**RELU, "groups": 4},
        "depthwise",
        residual=(2, 8, 3, 3),
        op="depthwise_conv2d",
    ),
]


@pytest.mark.parametrize("case", FUSED_CASES, ids=case_id)
@pytest.mark.parametrize(
    "block", [1 << 18, 7, 45], ids=["one_block", "channel_blocks", "image_blocks"]
)
@pytest.mark.parametrize("forced", [False, True], ids=["default", "pointwise_winograd_forced"])
def test_fused_conv(case, block, forced, monkeypatch):
    """Bias, ResidualData and relu over every kernel; the epilogue's blocks of images and of
    channels (a small _EPILOGUE_BLOCK) give the same result."""
    monkeypatch.setattr(nn_ops, "_EPILOGUE_BLOCK", block)
    if forced:  # the tiny cases take Winograd (3x3 stride 1) and the per-image 1x1 GEMMs
        monkeypatch.setattr(winograd, "MIN_CHANNELS", 1)
        monkeypatch.setattr(nn_ops, "_winograd_pays", lambda out_hw, batch: True)
        monkeypatch.setattr(nn_ops, "_POINTWISE_MIN_PIXELS", 1)
    case.check()


def test_fused_conv2d_matches_torch():
    torch = pytest.importorskip("torch")
    x, w, b, r = normal(2, 4, 9, 8), normal(6, 4, 3, 3), normal(6), normal(2, 6, 5, 4)
    attrs = {"strides": [2, 2], "paddings": [1, 1], "fuse_relu": True}
    attrs["fuse_residual_connection"] = True

    def conv(Input, Filter, Bias, ResidualData):
        return torch.relu(torch.nn.functional.conv2d(Input, Filter, Bias, 2, 1) + ResidualData)

    inputs = {"Input": x, "Filter": w, "Bias": b, "ResidualData": r}
    compare_with_torch(torch, "conv2d", inputs, attrs, "Output", conv)


def test_the_fused_conv_checks_residual_data_against_the_output_when_it_runs():
    main = nf.Program()
    with nf.program_guard(main, nf.Program()):
        x = nf.data("x", [-1, 2, 5, 5])
        r = nf.data("r", [-1, 3, 5, 5])
        w = nf.data("w", [3, 2, 1, 1])
        out = main.global_block().create_var("out")
        main.global_block().append_op(
            "conv2d",
            {"Input": [x.name], "Filter": [w.name], "ResidualData": [r.name]},
            {"Output": [out.name]},
            {"fuse_residual_connection": True},
        )
    feed = {"x": np.ones((2, 2, 5, 5), "float32"), "r": np.ones((3, 3, 5, 5), "float32")}
    feed["w"] = np.ones((3, 2, 1, 1), "float32")
    with pytest.raises(NestflowError, match=r"ResidualData \[3, 3, 5, 5\]"):
        nf.Executor().run(main, feed, [out], nf.Scope())


@pytest.mark.parametrize(
    "filter_shape,strides,out_hw,kernel",
    [
        ((256, 64, 1, 1), (1, 1), (14, 14), "pointwise"),  # 3.2M multiply-adds per image
        ((16, 8, 1, 1), (1, 1), (7, 7), "im2col"),  # small GEMMs run better over the batch
        ((16, 8, 1, 1), (2, 2), (16, 16), "pointwise"),
        ((16, 8, 3, 3), (2, 2), (16, 16), "im2col"),
    ],
)
def test_which_convs_take_per_image_gemms(filter_shape, strides, out_hw, kernel):
    geo = nn_ops._ConvGeometry(strides, (0, 0, 0, 0), (1, 1), 1)
    assert nn_ops._kernel(filter_shape, geo, out_hw, np.float32, 8) == kernel


POINTWISE_CASES = [
    conv_case((2, 3, 16, 17), (4, 3, 1, 1), {}, "pointwise_large_image"),
    conv_case((2, 4, 3, 5), (6, 2, 1, 1), {"groups": 2}, "pointwise_groups"),
    conv_case((2, 4, 2, 3), (5, 3, 1, 1), {"data_format": "NHWC"}, "pointwise_nhwc"),
    conv_case((0, 3, 16, 16), (2, 3, 1, 1), {}, "pointwise_empty_batch", grad=False),
    conv_case((2, 3, 16, 16), (3, 1, 1, 1), {"groups": 3}, "pointwise", op="depthwise_conv2d"),
    conv_case((2, 4, 2, 3), (4, 2, 1, 1), {"groups": 2}, "pointwise", op="conv2d_transpose"),
    conv_case((2, 3, 16, 17), (4, 3, 1, 1), {"strides": [2, 3]}, "pointwise_strided"),
    conv_case(
        (2, 4, 5, 6),
        (4, 2, 1, 1),
        {"strides": [2, 2], "groups": 2},
        "strided",
        op="conv2d_transpose",
    ),
]


@pytest.mark.parametrize("case", POINTWISE_CASES, ids=case_id)
def test_pointwise_path(case, monkeypatch):
    """1x1 unpadded convs: one GEMM per image on the data as it lies, or on every stride-th
    pixel (taken on large images; forced here on small ones too)."""
    if case.id != "conv2d-pointwise_large_image":
        monkeypatch.setattr(nn_ops, "_POINTWISE_MIN_PIXELS", 1)
    strides = tuple(case.attrs.get("strides", (1, 1)))
    geo = nn_ops._ConvGeometry(strides, (0, 0, 0, 0), (1, 1), case.attrs.get("groups", 1))
    filter_shape = case.inputs["Filter"].shape
    assert nn_ops._kernel(filter_shape, geo, (16, 17), np.float64, 2) == "pointwise"
    case.check()


@pytest.mark.parametrize(
    "filter_shape,hw",
    [
        ((4, 3, 3, 3), (6, 6)),
        ((4, 3, 1, 1), (16, 16)),
        ((20, 20, 3, 3), (6, 5)),
        ((4, 3, 5, 5), (6, 6)),
    ],
    ids=["im2col-3x3", "pointwise", "winograd", "im2col-5x5"],
)
def test_an_empty_batch_has_zero_filter_gradients(filter_shape, hw):
    x = np.zeros((0, filter_shape[1]) + hw)
    attrs = {"paddings": [filter_shape[2] // 2] * 2}
    upstream = np.zeros((0, filter_shape[0]) + hw)
    out, grads = run_with_grads(
        "conv2d", {"Input": x, "Filter": normal(*filter_shape)}, attrs, "Output", upstream
    )
    assert out.shape == upstream.shape and grads["Input"].shape == x.shape
    np.testing.assert_array_equal(grads["Filter"], np.zeros(filter_shape))


@pytest.mark.parametrize("kind", ("max", "avg"))
@pytest.mark.parametrize("adaptive", (False, True))
def test_an_empty_batch_pools_and_has_an_empty_gradient(kind, adaptive):
    attrs = {"pooling_type": kind, "ksize": [2, 2], "adaptive": adaptive}
    upstream = np.zeros((0, 3, 2, 2) if adaptive else (0, 3, 3, 3))
    out, grads = run_with_grads("pool2d", {"X": np.zeros((0, 3, 4, 4))}, attrs, "Out", upstream)
    assert out.shape == upstream.shape and grads["X"].shape == (0, 3, 4, 4)


# ---- the columns memo: forward's im2col columns / Winograd tiles reused by the gradient ----


def test_columns_memo_entries_die_with_their_arrays_and_respect_the_limit():
    memo = nn_ops._ColumnsMemo(limit=1000)
    a, b, out = np.zeros(3), np.zeros(3), np.zeros(2)
    memo.put(a, out, ("k", np.zeros(100)))  # 800 bytes
    assert memo.take(a, np.zeros(2)) is None  # another output
    assert memo.take(np.zeros(3), out) is None  # another input
    memo.put(b, out, ("k", np.ones(50)))  # 400 more: over the limit, a's entry goes
    assert memo.take(a, out) is None
    assert memo.take(b, out)[1][0] == 1.0
    assert memo.take(b, out) is None  # taken once
    memo.put(a, out, ("k", np.zeros(200)))  # larger than the limit: not kept
    assert memo.take(a, out) is None
    memo.put(a, out, ("k", np.zeros(10)))
    memo.put(b, out, ("k", np.zeros(10)))
    del a
    assert len(memo._entries) == 1 and memo._bytes == 80
    del out
    assert not memo._entries and memo._bytes == 0


@pytest.mark.parametrize(
    "filter_shape", [(16, 16, 3, 3), (4, 16, 5, 5)], ids=["winograd", "im2col"]
)
def test_filter_gradient_is_the_same_with_and_without_the_memo(filter_shape, monkeypatch):
    x, w = normal(2, 16, 8, 7), normal(*filter_shape)
    upstream = normal(2, filter_shape[0], 8, 7)
    attrs = {"paddings": [filter_shape[2] // 2] * 2}
    taken = []
    take = nn_ops._COLUMNS.take

    def counted(x, out):
        got = take(x, out)
        taken.append(got is not None)
        return got

    monkeypatch.setattr(nn_ops._COLUMNS, "take", counted)
    _, with_memo = run_with_grads("conv2d", {"Input": x, "Filter": w}, attrs, "Output", upstream)
    assert taken == [True]
    monkeypatch.setattr(nn_ops._COLUMNS, "limit", 0)
    _, without = run_with_grads("conv2d", {"Input": x, "Filter": w}, attrs, "Output", upstream)
    assert taken == [True, False]
    np.testing.assert_allclose(with_memo["Filter"], without["Filter"], rtol=1e-12, atol=1e-12)


def test_an_inference_conv_keeps_no_columns_and_no_entry_outlives_a_run(monkeypatch):
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        x = nf.data("x", [-1, 3, 6, 6])
        out = nf.layers.conv2d(x, 4, 3, bias_attr=False, name="c")
    test_program = main.clone(for_test=True)
    exe, scope = nf.Executor(), nf.Scope()
    exe.run(startup, scope=scope)
    puts = []
    put = nn_ops._COLUMNS.put
    monkeypatch.setattr(nn_ops._COLUMNS, "put", lambda *args: puts.append(1) or put(*args))
    before = len(nn_ops._COLUMNS._entries)
    feed = normal(2, 3, 6, 6, dtype="float32")
    exe.run(test_program, feed={"x": feed}, fetch_list=[out], scope=scope)
    assert not puts
    exe.run(main, feed={"x": feed}, fetch_list=[out], scope=scope)
    assert puts == [1]  # a training forward keeps them for a gradient ...
    assert len(nn_ops._COLUMNS._entries) == before  # ... but not past its output's life


# ---- PyTorch in float64: forward and gradients over grids of settings ----


def run_with_grads(op_type, inputs, attrs, out_slot, upstream):
    """Run one op and the gradients of sum(output * upstream) w.r.t. each float input."""
    main = nf.Program()
    with nf.program_guard(main, nf.Program()):
        block = main.global_block()
        feeds = {slot: nf.data(f"in_{slot}", list(a.shape), a.dtype) for slot, a in inputs.items()}
        out = append_to(block, op_type, {s: v.name for s, v in feeds.items()}, attrs, out_slot)
        seed = nf.data("seed", list(upstream.shape), upstream.dtype)
        grads = nf.gradients([out], list(feeds.values()), target_gradients=[seed])
    values = nf.Executor().run(
        main,
        {**{f"in_{s}": a for s, a in inputs.items()}, "seed": upstream},
        [out] + grads,
        nf.Scope(),
    )
    return values[0], dict(zip(inputs, values[1:]))


def compare_with_torch(torch, op_type, inputs, attrs, out_slot, torch_fn):
    tensors = {s: torch.tensor(a, requires_grad=True) for s, a in inputs.items()}
    want = torch_fn(**tensors)
    upstream = rng.standard_normal(tuple(want.shape))
    want.backward(torch.from_numpy(upstream))
    got, grads = run_with_grads(op_type, inputs, attrs, out_slot, upstream)
    assert got.shape == tuple(want.shape)
    np.testing.assert_allclose(got, want.detach().numpy(), rtol=0, atol=1e-8)
    for slot, tensor in tensors.items():
        np.testing.assert_allclose(
            grads[slot], tensor.grad.numpy(), rtol=0, atol=1e-8, err_msg=slot
        )


# (stride, padding, dilation, groups, filter size)
CONV_GRID = list(itertools.product((1, 2, 3), (0, 1, 2), (1, 2), (1, 2, 4), (1, 3)))


@pytest.mark.parametrize("stride,padding,dilation,groups,k", CONV_GRID)
def test_conv2d_matches_torch(stride, padding, dilation, groups, k):
    torch = pytest.importorskip("torch")
    x, w = normal(2, 4, 9, 8), normal(8, 4 // groups, k, k)
    attrs = {
        "strides": [stride, stride],
        "paddings": [padding, padding],
        "dilations": [dilation, dilation],
        "groups": groups,
    }

    def conv(Input, Filter):
        return torch.nn.functional.conv2d(Input, Filter, None, stride, padding, dilation, groups)

    compare_with_torch(torch, "conv2d", {"Input": x, "Filter": w}, attrs, "Output", conv)


@pytest.mark.parametrize("multiplier", (1, 2))
@pytest.mark.parametrize("stride,padding", ((1, 1), (2, 0), (2, 2)))
def test_depthwise_conv2d_matches_torch(stride, padding, multiplier):
    torch = pytest.importorskip("torch")
    x, w = normal(2, 3, 7, 8), normal(3 * multiplier, 1, 3, 3)
    attrs = {"strides": [stride, stride], "paddings": [padding, padding], "groups": 3}

    def conv(Input, Filter):
        return torch.nn.functional.conv2d(Input, Filter, None, stride, padding, 1, 3)

    compare_with_torch(torch, "depthwise_conv2d", {"Input": x, "Filter": w}, attrs, "Output", conv)


@pytest.mark.parametrize("padding", (0, 1, 2, 3))
@pytest.mark.parametrize("hw", ((9, 8), (4, 5), (12, 12)))
def test_winograd_conv2d_matches_torch(padding, hw, winograd_for_any_channels):
    torch = pytest.importorskip("torch")
    x, w = normal(2, 5, *hw), normal(6, 5, 3, 3)
    attrs = {"paddings": [padding, padding]}

    def conv(Input, Filter):
        return torch.nn.functional.conv2d(Input, Filter, None, 1, padding)

    compare_with_torch(torch, "conv2d", {"Input": x, "Filter": w}, attrs, "Output", conv)
    assert winograd_for_any_channels


# (stride, padding, dilation, groups, output padding)
TRANSPOSE_GRID = [
    setting
    for setting in itertools.product((1, 2, 3), (0, 1, 2), (1, 2), (1, 2), (0, 1, 2))
    if setting[4]
    < setting[0]  # Fluid's output_size adds at most stride - 1 (PyTorch's limit is wider)
]


@pytest.mark.parametrize("stride,padding,dilation,groups,extra", TRANSPOSE_GRID)
def test_conv2d_transpose_matches_torch(stride, padding, dilation, groups, extra):
    torch = pytest.importorskip("torch")
    x, w = normal(2, 4, 5, 4), normal(4, 6 // groups, 3, 3)
    smallest = [(size - 1) * stride - 2 * padding + dilation * 2 + 1 for size in (5, 4)]
    attrs = {
        "strides": [stride, stride],
        "paddings": [padding, padding],
        "dilations": [dilation, dilation],
        "groups": groups,
    }
    if extra:
        attrs["output_size"] = [s + extra for s in smallest]

    def conv_t(Input, Filter):
        return torch.nn.functional.conv_transpose2d(
            Input, Filter, None, stride, padding, extra, groups, dilation
        )

    compare_with_torch(
        torch, "conv2d_transpose", {"Input": x, "Filter": w}, attrs, "Output", conv_t
    )


@pytest.mark.parametrize("multiplier", (1, 2))
@pytest.mark.parametrize("stride,padding", ((1, 0), (2, 1), (3, 2)))
def test_depthwise_conv2d_transpose_matches_torch(stride, padding, multiplier):
    torch = pytest.importorskip("torch")
    x, w = normal(2, 3, 5, 4), normal(3, multiplier, 3, 3)
    attrs = {"strides": [stride, stride], "paddings": [padding, padding], "groups": 3}

    def conv_t(Input, Filter):
        return torch.nn.functional.conv_transpose2d(Input, Filter, None, stride, padding, 0, 3)

    compare_with_torch(
        torch, "depthwise_conv2d_transpose", {"Input": x, "Filter": w}, attrs, "Output", conv_t
    )


def torch_agrees(size, k, stride, padding, ceil_mode, exclusive):
    """PyTorch's pools follow Fluid's rule here: padding <= k / 2, and for an inclusive
    average no ceil_mode window reaching past the padding (PyTorch divides by the part of
    such a window inside the padded input, Fluid by kh * kw)."""
    if 2 * padding > k:
        return False
    span = size + 2 * padding - k + (stride - 1 if ceil_mode else 0)
    n_out = span // stride + 1
    if (n_out - 1) * stride - padding >= size:
        return False  # a window wholly in the padding: a ShapeError here
    return exclusive or (n_out - 1) * stride + k <= size + 2 * padding


# (pool type, k, stride, padding, ceil_mode, exclusive)
POOL_GRID = [
    s
    for s in itertools.product(
        ("max", "avg"), (2, 3), (1, 2, 3), (0, 1), (False, True), (True, False)
    )
    if (s[0] == "avg" or s[5]) and torch_agrees(7, s[1], s[2], s[3], s[4], s[5])
]


@pytest.mark.parametrize("kind,k,stride,padding,ceil_mode,exclusive", POOL_GRID)
def test_pool2d_matches_torch(kind, k, stride, padding, ceil_mode, exclusive):
    torch = pytest.importorskip("torch")
    x = normal(2, 3, 7, 7)
    attrs = {
        "pooling_type": kind,
        "ksize": [k, k],
        "strides": [stride, stride],
        "paddings": [padding, padding],
        "ceil_mode": ceil_mode,
        "exclusive": exclusive,
    }
    F = torch.nn.functional

    def pool(X):
        if kind == "max":
            return F.max_pool2d(X, k, stride, padding, ceil_mode=ceil_mode)
        return F.avg_pool2d(X, k, stride, padding, ceil_mode, count_include_pad=not exclusive)

    compare_with_torch(torch, "pool2d", {"X": x}, attrs, "Out", pool)


@pytest.mark.parametrize("kind", ("max", "avg"))
@pytest.mark.parametrize("out_hw", ((1, 1), (3, 2), (4, 7)))
def test_adaptive_pool2d_matches_torch(kind, out_hw):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    attrs = {"pooling_type": kind, "ksize": list(out_hw), "adaptive": True}
    pool = F.adaptive_max_pool2d if kind == "max" else F.adaptive_avg_pool2d
    compare_with_torch(
        torch, "pool2d", {"X": normal(2, 3, 7, 5)}, attrs, "Out", lambda X: pool(X, out_hw)
    )


def test_lrn_matches_torch_with_alpha_times_n():
    torch = pytest.importorskip("torch")
    attrs = {"n": 5, "k": 1.5, "alpha": 0.02, "beta": 0.75}

    # PyTorch divides alpha by n; Fluid does not.
    def lrn(X):
        return torch.nn.functional.local_response_norm(X, 5, alpha=0.02 * 5, beta=0.75, k=1.5)

    compare_with_torch(torch, "lrn", {"X": normal(2, 7, 3, 4)}, attrs, "Out", lrn)


# ---- shape inference and build-time errors ----


def append_to(block, op_type, inputs, attrs, out_slot):
    """Append op_type to block with a fresh variable per output slot; returns out_slot's."""
    outs = {s.name: [block.create_var(f"out_{s.name}").name] for s in get_op_def(op_type).outputs}
    block.append_op(op_type, {s: [name] for s, name in inputs.items()}, outs, attrs)
    return block.var(outs[out_slot][0])


def append(op_type, shapes, attrs, out_slot, dtype="float32"):
    """Append op_type over data variables of `shapes` ({slot: shape}); returns out_slot's."""
    main = nf.Program()
    with nf.program_guard(main, nf.Program()):
        block = main.global_block()
        ins = {s: nf.data(f"in_{s}", list(shape), dtype).name for s, shape in shapes.items()}
        return append_to(block, op_type, ins, attrs, out_slot)


def test_unknown_batch_is_inferred_as_unknown():
    conv = append(
        "conv2d", {"Input": [-1, 3, 9, 8], "Filter": [4, 3, 3, 3]}, {"strides": [2, 2]}, "Output"
    )
    assert conv.shape == (-1, 4, 4, 3)
    pool = append("pool2d", {"X": [-1, 3, 9, -1]}, {"pooling_type": "max", "ksize": [2, 2]}, "Out")
    assert pool.shape == (-1, 3, 8, -1)
    glob = append(
        "pool2d",
        {"X": [-1, 3, -1, -1]},
        {"pooling_type": "avg", "ksize": [1, 1], "global_pooling": True},
        "Out",
    )
    assert glob.shape == (-1, 3, 1, 1)
    up = append(
        "conv2d_transpose",
        {"Input": [-1, 3, 4, 5], "Filter": [3, 2, 3, 3]},
        {"strides": [2, 2]},
        "Output",
    )
    assert up.shape == (-1, 2, 9, 11)


BAD = [
    (
        "conv2d",
        {"Input": [2, 5, 8, 8], "Filter": [4, 2, 3, 3]},
        {"groups": 2},
        ShapeError,
        ["5 channels", "groups=2", "[4, 2, 3, 3]"],
    ),
    (
        "conv2d",
        {"Input": [2, 4, 8, 8], "Filter": [3, 2, 3, 3]},
        {"groups": 2},
        ShapeError,
        ["3 output channels", "groups=2"],
    ),
    (
        "conv2d",
        {"Input": [2, 3, 4, 4], "Filter": [2, 3, 5, 5]},
        {},
        ShapeError,
        ["extent 5", "padded input height 4", "[2, 3, 4, 4]"],
    ),
    (
        "conv2d",
        {"Input": [2, 3, 8, 8], "Filter": [2, 3, 3, 3]},
        {"strides": [0, 1]},
        AttrError,
        ["strides"],
    ),
    (
        "conv2d",
        {"Input": [2, 3, 8, 8], "Filter": [2, 3, 3, 3]},
        {"paddings": [1, -1]},
        AttrError,
        ["paddings"],
    ),
    (
        "conv2d",
        {"Input": [2, 3, 8, 8], "Filter": [2, 3, 3, 3]},
        {"padding_algorithm": "FULL"},
        AttrError,
        ["FULL"],
    ),
    ("conv2d", {"Input": [3, 8, 8], "Filter": [2, 3, 3, 3]}, {}, ShapeError, ["4-D", "[3, 8, 8]"]),
    (
        "conv2d",
        {"Input": [2, 3, 8, 8], "Filter": [2, 3, 3, 3]},
        {"fuse_activation": "relu6"},
        AttrError,
        ["fuse_activation 'relu6'"],
    ),
    (
        "conv2d",
        {"Input": [2, 3, 8, 8], "Filter": [2, 3, 3, 3]},
        {"fuse_brelu": True},
        AttrError,
        ["fuse_brelu"],
    ),
    (
        "conv2d",
        {"Input": [2, 3, 8, 8], "Filter": [2, 3, 3, 3], "Bias": [3]},
        {},
        ShapeError,
        ["Bias [3]", "2 output channels"],
    ),
    (
        "conv2d",
        {"Input": [2, 3, 8, 8], "Filter": [2, 3, 3, 3]},
        {"fuse_residual_connection": True},
        AttrError,
        ["ResidualData is absent"],
    ),
    (
        "conv2d",
        {"Input": [2, 3, 8, 8], "Filter": [2, 3, 3, 3], "ResidualData": [2, 2, 6, 6]},
        {},
        AttrError,
        ["ResidualData is given", "fuse_residual_connection is False"],
    ),
    (
        "conv2d",
        {"Input": [2, 3, 8, 8], "Filter": [2, 3, 3, 3], "ResidualData": [2, 2, 8, 8]},
        {"fuse_residual_connection": True},
        ShapeError,
        ["ResidualData [2, 2, 8, 8]", "Output [2, 2, 6, 6]"],
    ),
    (
        "conv2d_transpose",
        {"Input": [2, 3, 4, 4], "Filter": [4, 2, 3, 3]},
        {},
        ShapeError,
        ["3 channels", "[4, 2, 3, 3]"],
    ),
    (
        "conv2d_transpose",
        {"Input": [2, 4, 4, 4], "Filter": [4, 2, 3, 3]},
        {"strides": [2, 2], "output_size": [11, 9]},
        ShapeError,
        ["output_size [11, 9]", "[9, 11)"],
    ),
    (
        "pool2d",
        {"X": [2, 3, 4, 4]},
        {"pooling_type": "max", "ksize": [7, 2], "paddings": [1, 0]},
        ShapeError,
        ["larger than the padded input", "4 + paddings 1 + 1 = 6 < 7"],
    ),
    (
        "pool2d",
        {"X": [2, 3, 4, 4]},
        {"pooling_type": "avg", "ksize": [2, 2], "paddings": [2, 2]},
        ShapeError,
        ["wholly in the padding"],
    ),
    ("pool2d", {"X": [2, 3, 4, 4]}, {"pooling_type": "min", "ksize": [2, 2]}, AttrError, ["'min'"]),
    ("pool2d", {"X": [2, 3, 4, 4]}, {"pooling_type": "max", "ksize": [0, 2]}, AttrError, ["ksize"]),
    ("lrn", {"X": [2, 3, 4]}, {}, ShapeError, ["4-D"]),
    ("lrn", {"X": [2, 3, 4, 4]}, {"n": 0}, AttrError, ["n >= 1"]),
    ("flatten2", {"X": [2, 3]}, {"axis": 3}, AttrError, ["[0, 2]"]),
]


@pytest.mark.parametrize(
    "op_type,shapes,attrs,error,words", BAD, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)]
)
def test_bad_input_is_a_build_time_error_naming_the_problem(op_type, shapes, attrs, error, words):
    out_slot = {"conv2d": "Output", "conv2d_transpose": "Output"}.get(op_type, "Out")
    with pytest.raises(error) as info:
        append(op_type, shapes, attrs, out_slot)
    text = str(info.value)
    assert f"op '{op_type}'" in text and "test_nn.py" in text
    for word in words:
        assert word in text


@pytest.mark.parametrize(
    "op_type,shapes,attrs,out_slot",
    [
        ("conv2d", {"Input": [2, 3, 8, 8], "Filter": [2, 3, 3, 3]}, {}, "Output"),
        ("conv2d_transpose", {"Input": [2, 3, 8, 8], "Filter": [3, 3, 3, 3]}, {}, "Output"),
        ("pool2d", {"X": [2, 3, 8, 8]}, {"pooling_type": "avg", "ksize": [2, 2]}, "Out"),
        ("lrn", {"X": [2, 3, 8, 8]}, {}, "Out"),
    ],
)
def test_integer_input_to_a_float_op_is_a_dtype_error(op_type, shapes, attrs, out_slot):
    with pytest.raises(DTypeError, match="int64"):
        append(op_type, shapes, attrs, out_slot, dtype="int64")


def test_a_pool_window_beyond_a_runtime_size_fails_at_run_time():
    main = nf.Program()
    with nf.program_guard(main, nf.Program()):
        x = nf.data("x", [-1, 1, -1, -1])
        out = main.global_block().create_var("out")
        main.global_block().append_op(
            "pool2d", {"X": [x.name]}, {"Out": [out.name]}, {"pooling_type": "max", "ksize": [3, 3]}
        )
    with pytest.raises(NestflowError, match="larger than the padded input"):
        nf.Executor().run(main, {"x": np.zeros((1, 1, 2, 2), "float32")}, [out], nf.Scope())


def test_flipped_filter_transform_is_the_rotated_filters_transform():
    """The input gradient's filters (rotated, channels swapped) are transformed by reversing
    the transform's columns, no rotated copy: the same U as transforming that copy."""
    w = normal(5, 3, 3, 3)
    rotated = np.ascontiguousarray(w[:, :, ::-1, ::-1].transpose(1, 0, 2, 3))
    np.testing.assert_allclose(
        winograd.transformed_filters(w, flipped=True),
        winograd.transformed_filters(rotated),
        rtol=1e-13,
        atol=1e-13,
    )


def test_filter_transforms_are_made_once_and_not_for_blocked_layers(monkeypatch):
    made = []
    transform = winograd.transformed_filters
    monkeypatch.setattr(
        winograd,
        "transformed_filters",
        lambda w, flipped=False: made.append(flipped) or transform(w, flipped),
    )
    shared = winograd.FilterTransforms(normal(16, 8, 3, 3))
    assert shared.get() is shared.get() and shared.get(True) is shared.get(True)
    assert made == [False, True]
    assert winograd.FilterTransforms(normal(256, 256, 3, 3)).get() is None  # blocked


def test_winograd_in_filter_blocks_agrees_with_im2col_at_any_thread_count(monkeypatch):
    """A 256x256-channel layer runs Winograd a block of filters at a time (forward and filter
    gradient) on the pool: the same results as im2col, and the same bits at 1 and 3 threads."""
    x, w = normal(48, 256, 4, 4, dtype="float32"), normal(256, 256, 3, 3, dtype="float32")
    w /= 48.0
    upstream = normal(48, 256, 4, 4, dtype="float32")
    assert winograd._filter_blocks(256, 256) == 64
    geo = nn_ops._ConvGeometry((1, 1), (1, 1, 1, 1), (1, 1), 1)
    assert nn_ops._kernel(w.shape, geo, (4, 4), x.dtype, 48) == "winograd"
    inputs, attrs = {"Input": x, "Filter": w}, {"paddings": [1, 1]}
    budget = nf.get_num_threads()
    runs = []
    try:
        for threads in (1, 3):
            nf.set_num_threads(threads)
            runs.append(run_with_grads("conv2d", inputs, attrs, "Output", upstream))
    finally:
        nf.set_num_threads(budget)
    (out, grads), (out3, grads3) = runs
    np.testing.assert_array_equal(out, out3)
    np.testing.assert_array_equal(grads["Filter"], grads3["Filter"])
    np.testing.assert_array_equal(grads["Input"], grads3["Input"])
    monkeypatch.setattr(winograd, "MIN_CHANNELS", 10**9)
    want_out, want_grads = run_with_grads("conv2d", inputs, attrs, "Output", upstream)
    for got, want in ((out, want_out), (grads["Input"], want_grads["Input"])) + (
        (grads["Filter"], want_grads["Filter"]),
    ):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-4 * np.abs(want).max())
