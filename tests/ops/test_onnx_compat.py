"""The onnx_* ops (nestflow.ops.onnx_compat): ONNX semantics with attribute-like operands read at
run time. NumPy references (ONNX's rules spelled out), float64 central-difference gradients,
edge shapes (size 1, empty, 0-d), PyTorch where it has the op, and errors."""

from __future__ import annotations

import math

import numpy as np
import pytest

import nestflow as nf
from nestflow.core.place import StandInPlace
from nestflow.errors import DTypeError, ExecutionError, ShapeError
from tests.ops.harness import OpCase, case_id

R = np.random.default_rng(2024)


def rand(*shape, dtype="float32"):
    return R.standard_normal(shape).astype(dtype)


def ints(*values):
    return np.asarray(values, np.int64)


# ---- references ----


def ref_erf(X):
    return {"Out": np.vectorize(math.erf, otypes=[np.float64])(X).astype(X.dtype)}


def ref_log_softmax(X, axis=-1):
    shifted = X - X.max(axis=axis, keepdims=True)
    return {"Out": shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))}


def ref_reshape(X, Shape, allowzero=False):
    dims = [X.shape[i] if d == 0 and not allowzero else d for i, d in enumerate(Shape)]
    return {"Out": X.reshape(dims)}


def ref_constant_of_shape(Input, value=0.0, dtype="float32"):
    return {"Out": np.full(tuple(Input), value, dtype)}


def ref_unsqueeze(X, Axes):
    rank = X.ndim + len(Axes)
    return {"Out": np.expand_dims(X, tuple(sorted(a % rank for a in Axes)))}


def ref_squeeze(X, Axes=None):
    return {"Out": np.squeeze(X) if Axes is None else np.squeeze(X, tuple(Axes))}


def ref_tile(X, Repeats):
    return {"Out": np.tile(X, Repeats)}


def ref_slice(Input, Starts, Ends, Axes=None, Steps=None):
    """ONNX Slice written out: negative bounds count from the end, then clamp."""
    axes = range(len(Starts)) if Axes is None else Axes
    steps = [1] * len(Starts) if Steps is None else Steps
    index = [slice(None)] * Input.ndim
    for start, end, axis, step in zip(Starts, Ends, axes, steps):
        dim = Input.shape[axis]
        start, end = (v + dim if v < 0 else v for v in (start, end))
        if step > 0:
            start, end = np.clip(start, 0, dim), np.clip(end, 0, dim)
        else:
            start, end = np.clip(start, 0, dim - 1), np.clip(end, -1, dim - 1)
        index[axis] = slice(int(start), None if end < 0 else int(end), int(step))
    return {"Out": Input[tuple(index)]}


def ref_gather(X, Index, axis=0):
    index = np.where(Index < 0, Index + X.shape[axis], Index)
    return {"Out": np.take(X, index, axis=axis)}


def ref_split(X, Split=None, axis=0, num=1):
    dim = X.shape[axis]
    if Split is None:
        part = -(-dim // num)
        Split = [min(part, max(dim - part * i, 0)) for i in range(num)]
    return {"Out": np.split(X, np.cumsum(Split)[:-1], axis=axis)}


def ref_pad(X, Pads, Value=None, Axes=None, mode="constant"):
    axes = list(range(X.ndim)) if Axes is None else [a % X.ndim for a in Axes]
    pairs = [[0, 0] for _ in range(X.ndim)]
    for k, axis in enumerate(axes):
        pairs[axis] = [int(Pads[k]), int(Pads[k + len(axes)])]
    out = X
    # crop the negative pads, then pad the positive ones
    index = tuple(slice(max(-b, 0), d - max(-a, 0)) for (b, a), d in zip(pairs, X.shape))
    out = out[index]
    positive = [(max(b, 0), max(a, 0)) for b, a in pairs]
    if mode == "constant":
        fill = 0 if Value is None else Value.reshape(-1)[0]
        return {"Out": np.pad(out, positive, mode="constant", constant_values=fill)}
    return {
        "Out": np.pad(
            out, positive, mode={"reflect": "reflect", "edge": "edge", "wrap": "wrap"}[mode]
        )
    }


def ref_reduce(X, Axes=None, kind="sum", keepdims=True, noop_with_empty_axes=False):
    axes = None if Axes is None or not len(Axes) else tuple(int(a) for a in Axes)
    if axes is None and noop_with_empty_axes:
        return {"Out": X}
    fn = {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min, "prod": np.prod}[kind]
    return {"Out": np.asarray(fn(X, axis=axes, keepdims=keepdims), X.dtype)}


CASES = [
    # erf, log_softmax
    OpCase("onnx_erf", {"X": rand(3, 4)}, ref_erf, grad=("X",), id="erf"),
    OpCase("onnx_erf", {"X": rand(0, 2)}, ref_erf, id="erf_empty"),
    OpCase("onnx_erf", {"X": np.asarray(0.3, np.float64)}, ref_erf, grad=("X",), id="erf_0d"),
    OpCase("onnx_log_softmax", {"X": rand(2, 5)}, ref_log_softmax, grad=("X",), id="log_softmax"),
    OpCase(
        "onnx_log_softmax",
        {"X": rand(2, 3, 4)},
        ref_log_softmax,
        {"axis": 1},
        grad=("X",),
        id="log_softmax_axis1",
    ),
    OpCase("onnx_log_softmax", {"X": rand(1, 1)}, ref_log_softmax, id="log_softmax_size1"),
    # shapes from tensors
    OpCase(
        "onnx_reshape",
        {"X": rand(2, 3, 4), "Shape": ints(0, -1)},
        ref_reshape,
        grad=("X",),
        id="reshape_zero_copies",
    ),
    OpCase(
        "onnx_reshape",
        {"X": rand(0, 3), "Shape": ints(3, 0)},
        ref_reshape,
        {"allowzero": True},
        id="reshape_allowzero",
    ),
    OpCase(
        "onnx_reshape",
        {"X": rand(6), "Shape": np.asarray([2, 3], np.int32)},
        ref_reshape,
        id="reshape_int32_shape",
    ),
    OpCase(
        "onnx_constant_of_shape",
        {"Input": ints(2, 3)},
        ref_constant_of_shape,
        {"value": 1.5, "dtype": "float64"},
        id="constant_of_shape",
    ),
    OpCase(
        "onnx_constant_of_shape",
        {"Input": ints(0, 2)},
        ref_constant_of_shape,
        {"value": 7.0, "dtype": "int32"},
        id="constant_of_shape_empty",
    ),
    OpCase(
        "onnx_unsqueeze",
        {"X": rand(3, 4), "Axes": ints(-1, 0)},
        ref_unsqueeze,
        grad=("X",),
        id="unsqueeze_unsorted_negative",
    ),
    OpCase("onnx_unsqueeze", {"X": rand(), "Axes": ints(0)}, ref_unsqueeze, id="unsqueeze_0d"),
    OpCase(
        "onnx_squeeze",
        {"X": rand(1, 3, 1), "Axes": ints(-1)},
        ref_squeeze,
        grad=("X",),
        id="squeeze",
    ),
    OpCase("onnx_squeeze", {"X": rand(1, 3, 1)}, ref_squeeze, id="squeeze_all"),
    OpCase("onnx_tile", {"X": rand(2, 3), "Repeats": ints(2, 1)}, ref_tile, grad=("X",), id="tile"),
    OpCase("onnx_tile", {"X": rand(2, 1), "Repeats": ints(0, 3)}, ref_tile, id="tile_zero"),
    # indexing
    OpCase(
        "onnx_slice",
        {"Input": rand(5, 6), "Starts": ints(1, -2), "Ends": ints(4, 100), "Axes": ints(0, 1)},
        ref_slice,
        grad=("Input",),
        id="slice",
    ),
    OpCase(
        "onnx_slice",
        {
            "Input": rand(5, 6),
            "Starts": ints(-1, 0),
            "Ends": ints(-100, 6),
            "Axes": ints(0, -1),
            "Steps": ints(-2, 3),
        },
        ref_slice,
        grad=("Input",),
        id="slice_negative_steps",
    ),
    OpCase(
        "onnx_slice",
        {"Input": rand(4, 3), "Starts": ints(10), "Ends": ints(20)},
        ref_slice,
        id="slice_out_of_bounds_is_empty",
    ),
    OpCase(
        "onnx_gather",
        {"X": rand(4, 3), "Index": ints(3, -1, 0, 3)},
        ref_gather,
        grad=("X",),
        id="gather_repeated_negative",
    ),
    OpCase(
        "onnx_gather",
        {"X": rand(2, 5, 3), "Index": np.asarray([[1, 4], [0, -5]], np.int32)},
        ref_gather,
        {"axis": 1},
        grad=("X",),
        id="gather_axis1_2d_index",
    ),
    OpCase(
        "onnx_gather",
        {"X": rand(3, 2), "Index": np.asarray(2, np.int64)},
        ref_gather,
        grad=("X",),
        id="gather_0d_index",
    ),
    OpCase(
        "onnx_split",
        {"X": rand(5, 2), "Split": ints(1, 0, 4)},
        ref_split,
        {"num": 3},
        grad=("X",),
        id="split_sizes_with_zero",
    ),
    OpCase(
        "onnx_split",
        {"X": rand(2, 7)},
        ref_split,
        {"axis": 1, "num": 3},
        grad=("X",),
        id="split_uneven",
    ),
    # pad
    OpCase(
        "onnx_pad",
        {"X": rand(2, 3), "Pads": ints(1, 0, 2, 1), "Value": np.asarray(2.5, np.float32)},
        ref_pad,
        grad=("X",),
        id="pad_constant",
    ),
    OpCase(
        "onnx_pad",
        {"X": rand(3, 4), "Pads": ints(-1, 2, 0, -2)},
        ref_pad,
        grad=("X",),
        id="pad_negative_crops",
    ),
    OpCase(
        "onnx_pad",
        {"X": rand(3, 4), "Pads": ints(2, 3, 1, 2)},
        ref_pad,
        {"mode": "reflect"},
        grad=("X",),
        id="pad_reflect",
    ),
    OpCase(
        "onnx_pad",
        {"X": rand(2, 3), "Pads": ints(3, 1, 0, 4)},
        ref_pad,
        {"mode": "edge"},
        grad=("X",),
        id="pad_edge",
    ),
    OpCase(
        "onnx_pad",
        {"X": rand(2, 3), "Pads": ints(1, 4, 2, 0)},
        ref_pad,
        {"mode": "wrap"},
        grad=("X",),
        id="pad_wrap",
    ),
    OpCase(
        "onnx_pad",
        {"X": rand(2, 3, 2), "Pads": ints(1, 2), "Axes": ints(-2)},
        ref_pad,
        grad=("X",),
        id="pad_axes",
    ),
    OpCase(
        "onnx_pad",
        {"X": rand(1, 3), "Pads": ints(2, 0, 1, 0)},
        ref_pad,
        {"mode": "reflect"},
        id="pad_reflect_size1",
    ),
    # reductions over run-time axes
    *[
        OpCase(
            "onnx_reduce",
            {
                "X": rand(2, 3, 4, dtype="float64") + (3 if kind == "prod" else 0),
                "Axes": ints(-1, 0),
            },
            ref_reduce,
            {"kind": kind, "keepdims": keep},
            grad=("X",),
            id=f"reduce_{kind}_{'keep' if keep else 'drop'}",
        )
        for kind in ("sum", "mean", "max", "min", "prod")
        for keep in (True, False)
    ],
    OpCase(
        "onnx_reduce",
        {"X": rand(2, 3), "Axes": np.zeros(0, np.int64)},
        ref_reduce,
        {"kind": "sum", "noop_with_empty_axes": True},
        grad=("X",),
        id="reduce_empty_axes_noop",
    ),
    OpCase(
        "onnx_reduce",
        {"X": rand(2, 3)},
        ref_reduce,
        {"kind": "mean", "keepdims": False},
        id="reduce_all_dims",
    ),
    OpCase(
        "onnx_reduce",
        {"X": rand(2, 0), "Axes": ints(1)},
        lambda X, Axes, **a: {"Out": np.full((2, 1), -np.inf, np.float32)},
        {"kind": "max"},
        id="reduce_max_of_nothing_is_-inf",
    ),
]


def away_from_steps(*shape):
    """Values at least 0.1 from every integer and half-integer (floor/ceil/round are flat
    there, so central differences see their zero slope)."""
    return (R.integers(-20, 20, shape) * 0.5 + 0.25 + R.uniform(-0.1, 0.1, shape)).astype("float64")


UNARY = {
    "floor": (np.floor, away_from_steps),
    "ceil": (np.ceil, away_from_steps),
    "round": (np.round, away_from_steps),
    "sin": (np.sin, rand),
    "cos": (np.cos, rand),
    "tan": (np.tan, lambda *s: R.uniform(-1.2, 1.2, s)),
    "asin": (np.arcsin, lambda *s: R.uniform(-0.9, 0.9, s)),
    "acos": (np.arccos, lambda *s: R.uniform(-0.9, 0.9, s)),
    "atan": (np.arctan, rand),
    "sinh": (np.sinh, rand),
    "cosh": (np.cosh, rand),
    "asinh": (np.arcsinh, rand),
    "acosh": (np.arccosh, lambda *s: R.uniform(1.2, 4.0, s)),
    "atanh": (np.arctanh, lambda *s: R.uniform(-0.9, 0.9, s)),
}

CASES += [
    OpCase(
        f"onnx_{name}",
        {"X": np.asarray(make(3, 4), np.float64)},
        lambda X, fn=fn: {"Out": fn(X)},
        grad=("X",),
        id=name,
    )
    for name, (fn, make) in UNARY.items()
]
CASES += [
    OpCase(
        "onnx_round",
        {"X": np.asarray([0.5, 1.5, -2.5, 2.4], np.float32)},
        lambda X: {"Out": np.asarray([0.0, 2.0, -2.0, 2.0], np.float32)},
        id="round_half_to_even",
    ),
    OpCase("onnx_sin", {"X": rand(0, 3)}, lambda X: {"Out": np.sin(X)}, id="sin_empty"),
    OpCase(
        "onnx_isnan",
        {"X": np.asarray([1.0, np.nan, np.inf], np.float32)},
        lambda X: {"Out": np.isnan(X)},
        id="isnan",
    ),
    OpCase(
        "onnx_isinf",
        {"X": np.asarray([1.0, np.nan, np.inf, -np.inf], np.float32)},
        lambda X, detect_positive=True, detect_negative=True: {
            "Out": np.asarray([False, False, detect_positive, detect_negative])
        },
        {"detect_negative": False},
        id="isinf_positive_only",
    ),
    OpCase(
        "onnx_mod",
        {"X": ints(-7, 7, -7, 7, 0), "Y": ints(3, -3, -3, 3, 5)},
        lambda X, Y, fmod=False: {"Out": np.fmod(X, Y) if fmod else np.mod(X, Y)},
        id="mod_sign_of_divisor",
    ),
    OpCase(
        "onnx_mod",
        {"X": rand(2, 3), "Y": np.asarray([0.7, -0.4, 1.3], np.float32)},
        lambda X, Y, fmod=False: {"Out": np.fmod(X, Y) if fmod else np.mod(X, Y)},
        {"fmod": True},
        id="fmod_broadcast",
    ),
    OpCase(
        "onnx_trilu",
        {"X": rand(2, 4, 5), "K": ints(1)},
        lambda X, K, upper=True: {"Out": np.triu(X, 1) if upper else np.tril(X, 1)},
        grad=("X",),
        id="triu_k1",
    ),
    OpCase(
        "onnx_trilu",
        {"X": rand(3, 3)},
        lambda X, upper=True: {"Out": np.triu(X) if upper else np.tril(X)},
        {"upper": False},
        grad=("X",),
        id="tril",
    ),
    OpCase(
        "onnx_cumsum",
        {"X": rand(3, 4), "Axis": ints(-1)},
        lambda X, Axis, exclusive=False, reverse=False: {
            "Out": np.flip(np.cumsum(np.flip(X, -1), -1) - np.flip(X, -1), -1)
        },
        {"exclusive": True, "reverse": True},
        grad=("X",),
        id="cumsum_exclusive_reverse",
    ),
    OpCase(
        "onnx_gather_elements",
        {"X": rand(3, 4), "Index": np.asarray([[0, 3, -1], [2, 2, 0]], np.int64)},
        # Index may be smaller than X along the other dims: it reads their first positions
        lambda X, Index, axis=0: {
            "Out": np.take_along_axis(X[: Index.shape[0]], Index % X.shape[axis], axis)
        },
        {"axis": 1},
        grad=("X",),
        id="gather_elements_repeated_negative",
    ),
    OpCase(
        "onnx_scatter_elements",
        {
            "X": rand(3, 3),
            "Index": np.asarray([[1, 0, 2], [0, 2, 1]], np.int64),
            "Updates": rand(2, 3),
        },
        lambda X, Index, Updates, axis=0, reduction="none": {
            "Out": _scatter_reference(X, Index, Updates, axis, reduction)
        },
        id="scatter_elements",
    ),
    OpCase(
        "onnx_scatter_elements",
        {"X": rand(1, 5), "Index": np.asarray([[1, 3, 1]], np.int64), "Updates": rand(1, 3)},
        lambda X, Index, Updates, axis=0, reduction="none": {
            "Out": _scatter_reference(X, Index, Updates, axis, reduction)
        },
        {"axis": 1, "reduction": "add"},
        id="scatter_elements_add_repeated",
    ),
    OpCase(
        "onnx_scatter_nd",
        {"X": rand(4, 3), "Index": np.asarray([[3], [0]], np.int64), "Updates": rand(2, 3)},
        lambda X, Index, Updates, reduction="none": {
            "Out": _scatter_nd_reference(X, Index, Updates, reduction)
        },
        id="scatter_nd_rows",
    ),
    OpCase(
        "onnx_scatter_nd",
        {"X": rand(2, 2), "Index": np.asarray([[0, 1], [0, 1]], np.int64), "Updates": rand(2)},
        lambda X, Index, Updates, reduction="none": {
            "Out": _scatter_nd_reference(X, Index, Updates, reduction)
        },
        {"reduction": "mul"},
        id="scatter_nd_mul_repeated",
    ),
    OpCase(
        "onnx_one_hot",
        {
            "Indices": np.asarray([[1, -1], [0, 5]], np.int64),
            "Depth": np.asarray(3, np.int64),
            "Values": np.asarray([2.0, 7.0], np.float32),
        },
        lambda Indices, Depth, Values, axis=-1: {
            "Out": np.moveaxis(
                np.where((Indices % 3)[..., None] == np.arange(3), 7.0, 2.0)
                * ((Indices >= -3) & (Indices < 3))[..., None]
                + 2.0 * ~((Indices >= -3) & (Indices < 3))[..., None],
                -1,
                axis,
            ).astype(np.float32)
        },
        {"axis": 1},
        id="one_hot_axis1_negative_and_out_of_range",
    ),
    OpCase(
        "onnx_einsum",
        {"Inputs": [rand(2, 3, 4), rand(2, 4, 5)]},
        lambda Inputs, equation: {"Out": np.einsum(equation, *Inputs)},
        {"equation": "bij,bjk->bik"},
        id="einsum_batch_matmul",
    ),
    OpCase(
        "onnx_einsum",
        {"Inputs": [rand(3, 3)]},
        lambda Inputs, equation: {"Out": np.asarray(np.einsum(equation, *Inputs))},
        {"equation": "ii"},
        id="einsum_trace_implicit",
    ),
]


CASES += [
    OpCase(
        f"onnx_{name}",
        {"X": np.asarray([[12, 5], [7, 0]], dtype), "Y": np.asarray([3, 1], dtype)},
        lambda X, Y, fn=fn: {"Out": fn(X, Y)},
        id=f"{name}_{dtype}",
    )
    for name, fn in (
        ("bitwise_and", np.bitwise_and),
        ("bitwise_or", np.bitwise_or),
        ("bitwise_xor", np.bitwise_xor),
        ("shift_left", np.left_shift),
        ("shift_right", np.right_shift),
    )
    for dtype in ("uint8", "int64")
]
CASES += [
    OpCase(
        "onnx_bitwise_not",
        {"X": np.asarray([0, 1, 255], np.uint8)},
        lambda X: {"Out": np.invert(X)},
        id="bitwise_not",
    ),
    OpCase(
        "onnx_cumprod",
        {"X": np.asarray([[1, 2, 3], [4, 5, 6]], np.int64), "Axis": ints(1)},
        lambda X, Axis, exclusive=False, reverse=False: {
            "Out": np.asarray([[6, 3, 1], [30, 6, 1]], np.int64)
        },
        {"exclusive": True, "reverse": True},
        id="cumprod_exclusive_reverse",
    ),
    OpCase(
        "onnx_cumprod",
        {"X": rand(2, 3), "Axis": ints(0)},
        lambda X, Axis, **a: {"Out": np.cumprod(X, axis=0)},
        id="cumprod",
    ),
]


def _interp_axis(x, axis, positions):
    """Linear interpolation of x along `axis` at `positions` (edge values outside)."""
    grid = np.arange(x.shape[axis])
    return np.apply_along_axis(lambda row: np.interp(positions, grid, row), axis, x)


def ref_resize_linear(X, Scales=None, Sizes=None, Roi=None, **attrs):
    """Linear resize of the last two dims, half_pixel or align_corners coordinates."""
    out = X.astype(np.float64)
    sizes = (
        Sizes[-2:] if Sizes is not None else [int(s * n) for s, n in zip(Scales[-2:], X.shape[-2:])]
    )
    for axis, (n, size) in zip((-2, -1), zip(X.shape[-2:], sizes)):
        i = np.arange(size)
        if attrs.get("coordinate_transformation_mode") == "align_corners":
            positions = i * (n - 1) / max(size - 1, 1)
        else:
            positions = (i + 0.5) * n / size - 0.5
        out = _interp_axis(out, axis, positions)
    return {"Out": out.astype(X.dtype)}


def ref_resize_onnx(X, Roi=None, Scales=None, Sizes=None, **attrs):
    """ONNX's own reference implementation (onnx.reference)."""
    op_resize = pytest.importorskip("onnx.reference.ops.op_resize")
    run = op_resize.Resize._run
    none = np.zeros(0, np.float32)
    args = (X, none if Roi is None else Roi, Scales, Sizes)
    axes = attrs.pop("axes", []) or None
    (out,) = run(None, *args, axes=axes, **attrs)
    return {"Out": out}


_RESIZE_DEFAULTS = {
    "coordinate_transformation_mode": "half_pixel",
    "nearest_mode": "round_prefer_floor",
    "cubic_coeff_a": -0.75,
    "exclude_outside": False,
    "extrapolation_value": 0.0,
    "antialias": False,
    "keep_aspect_ratio_policy": "stretch",
}

CASES += [
    OpCase(
        "onnx_resize",
        {"X": rand(1, 2, 3, 4), "Scales": np.asarray([1, 1, 2, 1.5], np.float32)},
        ref_resize_linear,
        {"mode": "linear"},
        grad=("X",),
        id="resize_linear_half_pixel_up",
    ),
    OpCase(
        "onnx_resize",
        {"X": rand(2, 1, 5, 4), "Sizes": ints(2, 1, 3, 7)},
        ref_resize_linear,
        {"mode": "linear", "coordinate_transformation_mode": "align_corners"},
        grad=("X",),
        id="resize_linear_align_corners_sizes",
    ),
    OpCase(
        "onnx_resize",
        {
            "X": np.arange(6, dtype=np.int32).reshape(1, 1, 2, 3),
            "Scales": np.asarray([1, 1, 2, 2], np.float32),
        },
        lambda X, Scales, **a: {"Out": X.repeat(2, axis=2).repeat(2, axis=3)},
        {
            "mode": "nearest",
            "coordinate_transformation_mode": "asymmetric",
            "nearest_mode": "floor",
        },
        id="resize_nearest_int_keeps_values",
    ),
    *[
        OpCase(
            "onnx_resize",
            {"X": rand(1, 1, 6, 5), "Roi": np.asarray(roi, np.float32), "Sizes": ints(1, 1, 4, 3)},
            ref_resize_onnx,
            {**_RESIZE_DEFAULTS, **attrs, "axes": []},
            grad=("X",),
            id=name,
        )
        for name, roi, attrs in [
            ("resize_cubic_exclude_outside", [], {"mode": "cubic", "exclude_outside": True}),
            ("resize_cubic_antialias_down", [], {"mode": "cubic", "antialias": True}),
            ("resize_linear_antialias_down", [], {"mode": "linear", "antialias": True}),
            (
                "resize_tf_crop_and_resize_extrapolates",
                [0, 0, -0.2, 0.1, 1, 1, 0.9, 1.3],
                {
                    "mode": "linear",
                    "coordinate_transformation_mode": "tf_crop_and_resize",
                    "extrapolation_value": 9.0,
                },
            ),
        ]
    ],
]


def _scatter_reference(X, Index, Updates, axis, reduction):
    out = X.copy()
    for position in np.ndindex(Index.shape):
        target = list(position)
        target[axis] = Index[position]
        if reduction == "add":
            out[tuple(target)] += Updates[position]
        else:
            out[tuple(target)] = Updates[position]
    return out


def _scatter_nd_reference(X, Index, Updates, reduction):
    out = X.copy()
    for position in np.ndindex(Index.shape[:-1]):
        target = tuple(Index[position])
        if reduction == "mul":
            out[target] *= Updates[position]
        else:
            out[target] = Updates[position]
    return out


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_op(case):
    case.check()


def test_erf_and_log_softmax_equal_torch():
    torch = pytest.importorskip("torch")
    x = rand(4, 7, dtype="float64")
    main = nf.Program()
    block = main.global_block()
    block.create_var("x", x.shape, "float64")
    for name, op in (("e", "onnx_erf"), ("l", "onnx_log_softmax")):
        block.create_var(name)
        block.append_op(op, {"X": ["x"]}, {"Out": [name]})
    e, ls = nf.Executor().run(main, feed={"x": x}, fetch_list=["e", "l"], scope=nf.Scope())
    np.testing.assert_allclose(e, torch.erf(torch.from_numpy(x)).numpy(), rtol=1e-12, atol=1e-14)
    expected = torch.log_softmax(torch.from_numpy(x), dim=-1).numpy()
    np.testing.assert_allclose(ls, expected, rtol=1e-12, atol=1e-14)


def test_device_erf_equals_math_erf():
    # a device has no math.erf: onnx_erf computes Cephes' rational approximation there
    from nestflow.core import standin
    from nestflow.ops.activation import erf as _erf

    x = np.concatenate([np.linspace(-8, 8, 200001), [0.0, -0.0, np.inf, -np.inf, 1e300, 5e-324]])
    got = standin.asnumpy(_erf(standin.xp.asarray(x), standin.xp))
    want = np.array([math.erf(v) for v in x])
    np.testing.assert_allclose(got, want, rtol=4e-16, atol=4e-16)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))
    assert np.isnan(standin.asnumpy(_erf(standin.xp.asarray([np.nan]), standin.xp))).all()


def _one_op(op_type, inputs, attrs=None, out_count=None):
    main = nf.Program()
    block = main.global_block()
    for name, value in inputs.items():
        block.create_var(name, np.shape(value), np.asarray(value).dtype)
    outs = ["out"] if out_count is None else [f"out{i}" for i in range(out_count)]
    for name in outs:
        block.create_var(name)
    slots = {k: [k] for k in inputs}
    block.append_op(op_type, slots, {"Out": outs}, attrs or {})
    return main


@pytest.mark.parametrize("place", [nf.CPUPlace(), StandInPlace(0)], ids=str)
def test_run_time_errors_name_the_values(place):
    # on a device, out-of-range indices are found by an explicit check (CuPy wraps them)
    def run(op_type, feed, attrs=None):
        nf.Executor(place).run(_one_op(op_type, feed, attrs), feed=feed, scope=nf.Scope())

    with pytest.raises(ExecutionError, match="index 3"):
        run("onnx_gather", {"X": rand(3, 2), "Index": ints(0, 3)})
    with pytest.raises(ExecutionError, match=r"index -1 at position \[1, 0\]"):
        run("onnx_gather_elements", {"X": rand(3, 2), "Index": np.array([[0, 1], [-4, 0]])})
    updates = {"Updates": rand(2, 2)}
    with pytest.raises(ExecutionError, match="index 2"):
        run(
            "onnx_scatter_elements",
            {"X": rand(2, 2), "Index": np.array([[0, 2], [1, 0]]), **updates},
        )
    with pytest.raises(ExecutionError, match="index 5"):
        run("onnx_scatter_nd", {"X": rand(4, 2), "Index": np.array([[1], [5]]), **updates})
    with pytest.raises(ShapeError, match="cannot reshape"):
        run("onnx_reshape", {"X": rand(2, 3), "Shape": ints(4, -1)})
    with pytest.raises(ShapeError, match="not of size 1"):
        run("onnx_squeeze", {"X": rand(2, 3), "Axes": ints(0)})


def test_build_time_errors():
    with pytest.raises(DTypeError, match="Shape must hold integers"):
        _one_op("onnx_reshape", {"X": rand(2, 3), "Shape": rand(2)})
    with pytest.raises(DTypeError, match="floating-point"):
        _one_op("onnx_erf", {"X": ints(1, 2)})
    with pytest.raises(ShapeError, match="Repeats holds 3 values"):
        _one_op("onnx_tile", {"X": rand(2, 3), "Repeats": ints(1, 2, 3)})
