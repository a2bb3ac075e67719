"""ONNX mappers of nestflow.ops.nn: conv2d (and depthwise), conv2d_transpose, pool2d, lrn,
flatten. Channel-last (NHWC) data is transposed to NCHW around the ONNX op."""

from __future__ import annotations

import numpy as np

from nestflow.errors import ShapeError
from nestflow.onnx.exporters.graph import OpContext, exports
from nestflow.ops.nn import _conv_geometry, _fused_relu, _pool_geometry, _pool_pads


def _to_nchw(ctx: OpContext, x: str) -> str:
    return ctx.node("Transpose", [x], perm=[0, 3, 1, 2])


def _from_nchw(ctx: OpContext, y: str) -> str:
    return ctx.node("Transpose", [y], perm=[0, 2, 3, 1])


def _channel_last(ctx: OpContext) -> bool:
    return ctx.attrs["data_format"] == "NHWC"


def _spatial(ctx: OpContext, slot: str) -> tuple[int, int]:
    shape = ctx.in_var(slot).shape
    return (shape[1], shape[2]) if _channel_last(ctx) else (shape[2], shape[3])


def _onnx_pads(pads: tuple[int, int, int, int]) -> list[int]:
    """Fluid's [top, bottom, left, right] as ONNX's [top, left, bottom, right]."""
    top, bottom, left, right = pads
    return [top, left, bottom, right]


@exports("conv2d", "depthwise_conv2d")
def conv2d(ctx: OpContext) -> None:
    x, w = ctx.input("Input"), ctx.input("Filter")
    w_shape = ctx.in_var("Filter").shape
    in_hw = _spatial(ctx, "Input")
    geo = _conv_geometry(ctx.attrs, in_hw, w_shape[2:])
    if _channel_last(ctx):
        x = _to_nchw(ctx, x)
    if ctx.op.type == "depthwise_conv2d" and ctx.attrs["fuse_relu_before_depthwise_conv"]:
        x = ctx.node("Relu", [x])
    attrs = {
        "strides": list(geo.strides),
        "dilations": list(geo.dilations),
        "group": geo.groups,
        "kernel_shape": list(w_shape[2:]),
    }
    if ctx.attrs["padding_algorithm"] == "SAME" and min(in_hw) < 0:
        attrs["auto_pad"] = "SAME_UPPER"  # the sizes are known only at run time
    else:
        attrs["pads"] = _onnx_pads(geo.pads)
    # the fused form: act(conv + Bias + ResidualData) (Bias is Conv's own B input)
    bias = [ctx.input("Bias")] if ctx.has_input("Bias") else []
    y = ctx.node("Conv", [x, w, *bias], **attrs)
    y = _from_nchw(ctx, y) if _channel_last(ctx) else y
    if ctx.has_input("ResidualData"):
        y = ctx.node("Add", [y, ctx.input("ResidualData")])
    if _fused_relu(ctx.attrs):
        y = ctx.node("Relu", [y])
    ctx.set_output("Output", y)


@exports("conv2d_transpose", "depthwise_conv2d_transpose")
def conv2d_transpose(ctx: OpContext) -> None:
    x, w = ctx.input("Input"), ctx.input("Filter")
    w_shape = ctx.in_var("Filter").shape
    in_hw = _spatial(ctx, "Input")
    a = ctx.attrs
    if a["padding_algorithm"] == "SAME" and min(in_hw) < 0:
        raise ShapeError(
            "conv2d_transpose with padding_algorithm SAME pads by the input's height and "
            f"width, unknown when the program was built (Input {list(ctx.in_var('Input').shape)})"
        )
    geo = _conv_geometry(a, in_hw, w_shape[2:])
    extra = [0, 0]
    if a["output_size"]:
        if min(in_hw) < 0:
            raise ShapeError(
                "conv2d_transpose with output_size needs the input's height and width known "
                f"when the program is built (Input {list(ctx.in_var('Input').shape)})"
            )
        smallest = geo.transposed_hw(in_hw, w_shape[2:])
        extra = [a["output_size"][d] - smallest[d] for d in range(2)]
    if _channel_last(ctx):
        x = _to_nchw(ctx, x)
    y = ctx.node(
        "ConvTranspose",
        [x, w],
        strides=list(geo.strides),
        dilations=list(geo.dilations),
        group=geo.groups,
        kernel_shape=list(w_shape[2:]),
        pads=_onnx_pads(geo.pads),
        output_padding=extra if any(extra) else None,
    )
    ctx.set_output("Output", _from_nchw(ctx, y) if _channel_last(ctx) else y)


@exports("pool2d")
def pool2d(ctx: OpContext) -> None:
    x = ctx.input("X")
    dtype = ctx.in_var("X").dtype
    a = ctx.attrs
    in_hw = _spatial(ctx, "X")
    if _channel_last(ctx):
        x = _to_nchw(ctx, x)
    kind = a["pooling_type"]
    if a["global_pooling"]:
        y = ctx.node("GlobalMaxPool" if kind == "max" else "GlobalAveragePool", [x])
    elif a["adaptive"]:
        y = _adaptive_pool(ctx, x, in_hw, kind)
    else:
        if a["padding_algorithm"] == "SAME" and min(in_hw) < 0:
            raise ShapeError(
                "pool2d with padding_algorithm SAME pads by the input's height and width, "
                f"unknown when the program was built (X {list(ctx.in_var('X').shape)})"
            )
        y = _window_pool(ctx, x, in_hw, kind, dtype)
    ctx.set_output("Out", _from_nchw(ctx, y) if _channel_last(ctx) else y)


def _window_pool(ctx: OpContext, x: str, in_hw, kind: str, dtype: str) -> str:
    a = ctx.attrs
    geo = _pool_geometry(in_hw, a)  # (an unknown size gives -1 output dims, unused here)
    pads = geo.pads
    attrs = {"kernel_shape": list(geo.ksize), "strides": list(geo.strides)}
    if a["ceil_mode"]:
        if min(in_hw) < 0:
            raise ShapeError(
                "pool2d with ceil_mode needs the input's height and width known when the "
                f"program is built (X {list(ctx.in_var('X').shape)})"
            )
        pads = _pool_pads(in_hw, geo)  # grown to where the last window reaches
    if kind == "avg" and a["exclusive"]:
        # each window divided by the input elements it covers: pads are not counted
        return ctx.node("AveragePool", [x], pads=_onnx_pads(pads), count_include_pad=0, **attrs)
    if any(pads):
        # max: -inf padding never wins; avg (not exclusive): zeros, divided by kh * kw
        fill = ctx.scalar(-np.inf if kind == "max" else 0, dtype)
        top, bottom, left, right = pads
        x = ctx.node("Pad", [x, ctx.ints([0, 0, top, left, 0, 0, bottom, right]), fill])
    return ctx.node("MaxPool" if kind == "max" else "AveragePool", [x], **attrs)


def _adaptive_pool(ctx: OpContext, x: str, in_hw, kind: str) -> str:
    """Adaptive pooling: output cell (a, b) pools rows [a*H//OH, ceil((a+1)*H/OH)) and the
    same for columns; a plain pool when the sizes divide, else one reduction per cell."""
    if min(in_hw) < 0:
        raise ShapeError(
            "adaptive pool2d windows depend on the input's height and width, unknown when "
            f"the program was built (X {list(ctx.in_var('X').shape)})"
        )
    out_hw = ctx.attrs["ksize"]
    if in_hw[0] % out_hw[0] == 0 and in_hw[1] % out_hw[1] == 0:
        k = [in_hw[0] // out_hw[0], in_hw[1] // out_hw[1]]
        op_type = "MaxPool" if kind == "max" else "AveragePool"
        return ctx.node(op_type, [x], kernel_shape=k, strides=k)
    reduce = "ReduceMax" if kind == "max" else "ReduceMean"
    rows = []
    for a in range(out_hw[0]):
        h0, h1 = (a * in_hw[0]) // out_hw[0], -((-(a + 1) * in_hw[0]) // out_hw[0])
        cells = []
        for b in range(out_hw[1]):
            w0, w1 = (b * in_hw[1]) // out_hw[1], -((-(b + 1) * in_hw[1]) // out_hw[1])
            window = ctx.node(
                "Slice", [x, ctx.ints([h0, w0]), ctx.ints([h1, w1]), ctx.ints([2, 3])]
            )
            cells.append(ctx.reduce(reduce, window, [2, 3], keepdims=True))
        rows.append(ctx.node("Concat", cells, axis=3))
    return ctx.node("Concat", rows, axis=2)


@exports("lrn")
def lrn(ctx: OpContext) -> None:
    """ONNX's LRN divides alpha by the window size; Fluid's does not."""
    x = ctx.input("X")
    a = ctx.attrs
    n, k, alpha, beta = a["n"], a["k"], a["alpha"], a["beta"]
    channel_last = a["data_format"] == "NHWC"
    if channel_last:
        x = _to_nchw(ctx, x)
    y = ctx.node("LRN", [x], size=n, alpha=float(alpha * n), beta=float(beta), bias=float(k))
    ctx.set_output("Out", _from_nchw(ctx, y) if channel_last else y)
    if ctx.has_output("MidOut"):
        mid = _lrn_mid(ctx, x, n, k, alpha, ctx.in_var("X").dtype)
        ctx.set_output("MidOut", _from_nchw(ctx, mid) if channel_last else mid)


def _lrn_mid(ctx: OpContext, x: str, n: int, k: float, alpha: float, dtype: str) -> str:
    """k + alpha * (the sum of squares over each channel's window): a 3-D convolution of
    the squares [N, 1, C, H, W] with ones over n channels."""
    squares = ctx.unsqueeze(ctx.node("Mul", [x, x]), [1])
    before = (n - 1) // 2
    ones = ctx.const(np.ones((1, 1, n, 1, 1), dtype))
    total = ctx.node(
        "Conv", [squares, ones], kernel_shape=[n, 1, 1], pads=[before, 0, 0, n - 1 - before, 0, 0]
    )
    scaled = ctx.node("Mul", [ctx.squeeze(total, [1]), ctx.scalar(alpha, dtype)])
    return ctx.node("Add", [scaled, ctx.scalar(k, dtype)])


@exports("flatten", "flatten2")
def flatten(ctx: OpContext) -> None:
    ctx.set_output("Out", ctx.node("Flatten", [ctx.input("X")], axis=ctx.attrs["axis"]))
    if ctx.has_output("XShape"):
        x = ctx.input("X")
        shape = ctx.node("Concat", [ctx.ints([0]), ctx.shape(x)], axis=0)
        ctx.set_output("XShape", ctx.fill(shape, 0, ctx.in_var("X").dtype))
