"""Reductions, indexing and shape layers, with Fluid 1.8's signatures and defaults.

Departures from Fluid 1.8, each for a reason given where it is made: `where(condition, x, y)`
takes DESIGN's three-argument form (the one-argument call still gives Fluid's coordinates);
`one_hot` takes ids of any shape (Fluid 1.8's `one_hot_v2`, not `one_hot`'s [..., 1]);
reductions over every dim give 0-d results (Fluid: [1]).
"""

from __future__ import annotations

import builtins
import math
import numbers
from collections.abc import Sequence
from typing import Any

from nestflow.core.dtype import dtype_name
from nestflow.errors import AttrError, ShapeError
from nestflow.framework import unique_name
from nestflow.framework.program import VarDesc
from nestflow.layers.helper import append_op, as_float, as_int, current_block, layer_error


def _ints(values: Any, what: str) -> list[int]:
    """An int or a sequence of ints as a list; AttrError naming `what` otherwise."""
    if isinstance(values, numbers.Integral) and not isinstance(values, bool):
        return [int(values)]
    if not isinstance(values, Sequence) or isinstance(values, str):
        raise AttrError(f"{what} must be an int or a list of ints, got {values!r}")
    return [as_int(v, what) for v in values]


def _constant(value: Any, dtype: str, what: str) -> VarDesc:
    attrs = {"shape": [1], "dtype": dtype_name(dtype), "value": as_float(value, what)}
    return append_op("fill_constant", {}, attrs, stop_gradient=True)


def _append_with_outputs(op_type, inputs, attrs, slot: str, count: int, name) -> list[VarDesc]:
    """Append an op whose output slot `slot` holds `count` new variables; returns them."""
    block = current_block()
    outs = [
        block.create_var(unique_name.generate(f"{name or op_type}.tmp"))
        for _ in builtins.range(count)
    ]
    try:
        block.append_op(op_type, inputs=inputs, outputs={slot: outs}, attrs=attrs)
    except BaseException:
        for var in outs:
            block.remove_var(var.name)
        raise
    return outs


# ---- reductions ----


def _reduce(op_type: str, input: VarDesc, dim, keep_dim: bool, name) -> VarDesc:
    # Fluid's layer rule: no dim (None or []) reduces every dim through reduce_all.
    dims = [] if dim is None else _ints(dim, f"{op_type}: dim")
    attrs = {"dim": dims or [0], "keep_dim": bool(keep_dim), "reduce_all": not dims}
    return append_op(op_type, {"X": input}, attrs, name=name)


def reduce_sum(input: VarDesc, dim=None, keep_dim: bool = False, name=None) -> VarDesc:
    """The sum of `input` over `dim` (an int or list; None: every dim, a 0-d result);
    `keep_dim` keeps reduced dims as 1. ShapeError for a dim outside the input.

    >>> import nestflow as nf
    >>> x = nf.layers.data("x", [-1, 3, 4])
    >>> nf.layers.reduce_sum(x, dim=[1, 2]).shape, nf.layers.reduce_sum(x).shape
    ((-1,), ())
    """
    return _reduce("reduce_sum", input, dim, keep_dim, name)


def reduce_mean(input: VarDesc, dim=None, keep_dim: bool = False, name=None) -> VarDesc:
    """The mean of a floating-point `input` over `dim` (None: every dim).

    >>> x = nf.data("x", [2, 3])
    >>> feed = {"x": np.array([[1, 2, 3], [4, 5, 6]], "float32")}
    >>> out = nf.layers.reduce_mean(x, dim=1)
    >>> nf.Executor(nf.CPUPlace()).run(feed=feed, fetch_list=[out])[0]
    array([2., 5.], dtype=float32)
    """
    return _reduce("reduce_mean", input, dim, keep_dim, name)


def reduce_max(input: VarDesc, dim=None, keep_dim: bool = False, name=None) -> VarDesc:
    """The largest element over `dim` (None: every dim); its gradient goes to the maximal
    positions, split evenly between ties. ShapeError when reducing an empty dim.

    >>> x = nf.data("x", [2, 3])
    >>> feed = {"x": np.array([[1, 2, 3], [4, 5, 6]], "float32")}
    >>> out = nf.layers.reduce_max(x, dim=0)
    >>> nf.Executor(nf.CPUPlace()).run(feed=feed, fetch_list=[out])[0]
    array([4., 5., 6.], dtype=float32)
    """
    return _reduce("reduce_max", input, dim, keep_dim, name)


def reduce_min(input: VarDesc, dim=None, keep_dim: bool = False, name=None) -> VarDesc:
    """The smallest element over `dim` (None: every dim); gradient as reduce_max's.

    >>> x = nf.data("x", [2, 3])
    >>> feed = {"x": np.array([[1, 2, 3], [4, 5, 6]], "float32")}
    >>> out = nf.layers.reduce_min(x, dim=1, keep_dim=True)
    >>> nf.Executor(nf.CPUPlace()).run(feed=feed, fetch_list=[out])[0]
    array([[1.],
           [4.]], dtype=float32)
    """
    return _reduce("reduce_min", input, dim, keep_dim, name)


def reduce_prod(input: VarDesc, dim=None, keep_dim: bool = False, name=None) -> VarDesc:
    """The product over `dim` (None: every dim); its gradient is exact with zeros.

    >>> x = nf.data("x", [2, 3])
    >>> feed = {"x": np.array([[1, 2, 3], [4, 5, 6]], "float32")}
    >>> out = nf.layers.reduce_prod(x, dim=1)
    >>> nf.Executor(nf.CPUPlace()).run(feed=feed, fetch_list=[out])[0]
    array([  6., 120.], dtype=float32)
    """
    return _reduce("reduce_prod", input, dim, keep_dim, name)


def reduce_all(input: VarDesc, dim=None, keep_dim: bool = False, name=None) -> VarDesc:
    """Whether every element of a bool `input` over `dim` is True (None: every dim).

    >>> b = nf.data("b", [2, 2], "bool")
    >>> out = nf.layers.reduce_all(b, dim=1)
    >>> nf.Executor(nf.CPUPlace()).run(feed={"b": np.array([[True, True], [True, False]])},
    ...     fetch_list=[out])[0]
    array([ True, False])
    """
    out = _reduce("reduce_all", input, dim, keep_dim, name)
    out.stop_gradient = True
    return out


def reduce_any(input: VarDesc, dim=None, keep_dim: bool = False, name=None) -> VarDesc:
    """Whether any element of a bool `input` over `dim` is True (None: every dim).

    >>> b = nf.data("b", [2, 2], "bool")
    >>> out = nf.layers.reduce_any(b, dim=1)
    >>> nf.Executor(nf.CPUPlace()).run(feed={"b": np.array([[False, False], [True, False]])},
    ...     fetch_list=[out])[0]
    array([False,  True])
    """
    out = _reduce("reduce_any", input, dim, keep_dim, name)
    out.stop_gradient = True
    return out


# ---- search: argmax, argmin, topk, where ----


def argmax(x: VarDesc, axis: int = 0) -> VarDesc:
    """int64 positions of the largest elements along `axis` (that dim removed); the first of
    equal elements wins, NaN counts as largest.

    >>> import nestflow as nf
    >>> nf.layers.argmax(nf.layers.data("x", [-1, 10]), axis=1).shape
    (-1,)
    """
    attrs = {"axis": as_int(axis, "argmax: axis")}
    return append_op("arg_max", {"X": x}, attrs, stop_gradient=True)


def argmin(x: VarDesc, axis: int = 0) -> VarDesc:
    """int64 positions of the smallest elements along `axis` (that dim removed).

    >>> x = nf.data("x", [2, 3])
    >>> feed = {"x": np.array([[1, 2, 3], [4, 5, 6]], "float32")}
    >>> out = nf.layers.argmin(x, axis=1)
    >>> nf.Executor(nf.CPUPlace()).run(feed=feed, fetch_list=[out])[0]
    array([0, 0])
    """
    attrs = {"axis": as_int(axis, "argmin: axis")}
    return append_op("arg_min", {"X": x}, attrs, stop_gradient=True)


def topk(input: VarDesc, k, name=None) -> tuple[VarDesc, VarDesc]:
    """(values, indices): the k largest entries along the last axis, largest first (ties: the
    smaller index first), and their int64 positions. `k` is an int or a 1-element int
    variable. ShapeError when k exceeds the last dim.

    >>> import nestflow as nf
    >>> values, indices = nf.layers.topk(nf.layers.data("x", [-1, 10]), k=3)
    >>> values.shape, indices.dtype
    ((-1, 3), 'int64')
    """
    inputs: dict[str, Any] = {"X": input}
    attrs = {}
    if isinstance(k, VarDesc):
        inputs["K"] = k
    else:
        attrs["k"] = as_int(k, "topk: k")
    values, indices = append_op("top_k", inputs, attrs, outputs=("Out", "Indices"), name=name)
    indices.stop_gradient = True
    return values, indices


def where(condition: VarDesc, x: Any = None, y: Any = None, name: str | None = None) -> VarDesc:
    """x where `condition` (bool) holds, else y, elementwise with broadcasting; x or y may be a
    Python number (taking the other's dtype). With neither x nor y, Fluid 1.8's
    `where(condition)`: the int64 coordinates [count, rank] of the true elements.

    >>> import nestflow as nf
    >>> c = nf.layers.data("c", [-1, 3], "bool"); a = nf.layers.data("a", [-1, 3])
    >>> nf.layers.where(c, a, 0.0).shape
    (-1, 3)
    """
    if x is None and y is None:
        return append_op("where_index", {"Condition": condition}, name=name, stop_gradient=True)
    if isinstance(x, numbers.Real) and isinstance(y, VarDesc):
        x = _constant(x, y.dtype, "where: x")
    if isinstance(y, numbers.Real) and isinstance(x, VarDesc):
        y = _constant(y, x.dtype, "where: y")
    return append_op("where", {"Condition": condition, "X": x, "Y": y}, name=name)


# ---- gather / scatter / one_hot ----


def gather(input: VarDesc, index: VarDesc, overwrite: bool = True) -> VarDesc:
    """Rows of `input` picked by int `index` [N] (or [N, 1]): shape [N] + input.shape[1:].
    With `overwrite` (Fluid's default) a row picked twice gets only its last pick's gradient;
    pass overwrite=False to add them. An index outside the rows is an ExecutionError at run
    time naming it.

    >>> x = nf.data("x", [2, 3])
    >>> feed = {"x": np.array([[1, 2, 3], [4, 5, 6]], "float32")}
    >>> index = nf.layers.assign(np.array([1, 0], "int64"))
    >>> out = nf.layers.gather(x, index)
    >>> nf.Executor(nf.CPUPlace()).run(feed=feed, fetch_list=[out])[0]
    array([[4., 5., 6.],
           [1., 2., 3.]], dtype=float32)
    """
    return append_op("gather", {"X": input, "Index": index}, {"overwrite": bool(overwrite)})


def gather_nd(input: VarDesc, index: VarDesc, name=None) -> VarDesc:
    """`input` at the coordinates in the last dim of int `index` [..., k]: shape
    index.shape[:-1] + input.shape[k:].

    >>> x = nf.data("x", [2, 3])
    >>> feed = {"x": np.array([[1, 2, 3], [4, 5, 6]], "float32")}
    >>> index = nf.layers.assign(np.array([[0, 2], [1, 1]], "int64"))
    >>> out = nf.layers.gather_nd(x, index)
    >>> nf.Executor(nf.CPUPlace()).run(feed=feed, fetch_list=[out])[0]
    array([3., 5.], dtype=float32)
    """
    return append_op("gather_nd", {"X": input, "Index": index}, name=name)


def scatter(
    input: VarDesc, index: VarDesc, updates: VarDesc, name=None, overwrite: bool = True
) -> VarDesc:
    """A copy of `input` whose rows `index` [N] are replaced by the rows of `updates`
    [N, ...]; with overwrite=False the named rows are zeroed and the updates added (repeated
    indexes accumulate).

    >>> x = nf.data("x", [2, 3])
    >>> feed = {"x": np.array([[1, 2, 3], [4, 5, 6]], "float32")}
    >>> index = nf.layers.assign(np.array([1], "int64"))
    >>> updates = nf.layers.fill_constant([1, 3], "float32", 0.0)
    >>> out = nf.layers.scatter(x, index, updates)
    >>> nf.Executor(nf.CPUPlace()).run(feed=feed, fetch_list=[out])[0]
    array([[1., 2., 3.],
           [0., 0., 0.]], dtype=float32)
    """
    inputs = {"X": input, "Ids": index, "Updates": updates}
    return append_op("scatter", inputs, {"overwrite": bool(overwrite)}, name=name)


def one_hot(input: VarDesc, depth, allow_out_of_range: bool = False) -> VarDesc:
    """float32 one-hot rows for int ids `input` [..., 1] (Fluid 1.8's `fluid.layers.one_hot`):
    the last dim of 1 becomes `depth`, so [N, 1] ids give [N, depth]. For ids of any shape
    (one_hot_v2: [N] -> [N, depth], [N, 1] -> [N, 1, depth]) use `nf.one_hot`. `depth` is
    an int or a 1-element int variable. An id outside [0, depth) is an ExecutionError naming
    it, or an all-zero row with `allow_out_of_range`.

    >>> ids = nf.data("ids", [-1, 1], "int64")
    >>> out = nf.layers.one_hot(ids, depth=3)
    >>> nf.Executor(nf.CPUPlace()).run(feed={"ids": np.array([[2], [0]])}, fetch_list=[out])[0]
    array([[0., 0., 1.],
           [1., 0., 0.]], dtype=float32)
    """
    shape = getattr(input, "shape", None)
    if isinstance(input, VarDesc) and (len(shape) < 2 or shape[-1] not in (1, -1)):
        raise layer_error(
            ShapeError,
            "one_hot",
            f"input '{input.name}' has shape {list(shape)}; Fluid 1.8's one_hot takes ids "
            "[..., 1] (the last dim becomes depth). For ids of any shape use nf.one_hot "
            "(one_hot_v2: input.shape + [depth])",
        )
    return _one_hot("one_hot", input, depth, allow_out_of_range)


def one_hot_v2(input: VarDesc, depth, allow_out_of_range: bool = False) -> VarDesc:
    """float32 one-hot rows for int ids of any shape: shape input.shape + [depth] (Fluid 1.8's
    `fluid.one_hot`, the one_hot_v2 op; nf.one_hot). `depth` is an int or a 1-element int
    variable. An id outside [0, depth) is an ExecutionError naming it, or an all-zero row with
    `allow_out_of_range`.

    >>> ids = nf.data("ids", [-1], "int64")
    >>> out = nf.one_hot(ids, depth=3)
    >>> nf.Executor(nf.CPUPlace()).run(feed={"ids": np.array([2, 0])}, fetch_list=[out])[0]
    array([[0., 0., 1.],
           [1., 0., 0.]], dtype=float32)
    """
    return _one_hot("one_hot_v2", input, depth, allow_out_of_range)


def _one_hot(op_type: str, input: VarDesc, depth, allow_out_of_range: bool) -> VarDesc:
    inputs: dict[str, Any] = {"X": input}
    attrs: dict[str, Any] = {"allow_out_of_range": bool(allow_out_of_range)}
    if isinstance(depth, VarDesc):
        inputs["depth_tensor"] = depth
    else:
        attrs["depth"] = as_int(depth, "one_hot: depth")
    return append_op(op_type, inputs, attrs, stop_gradient=True)


# ---- shape and layout ----


def pad(x: VarDesc, paddings: Sequence[int], pad_value: float = 0.0, name=None) -> VarDesc:
    """`x` padded with `pad_value`: paddings [before_0, after_0, before_1, ...], 2 per dim.

    >>> x = nf.data("x", [2, 3])
    >>> feed = {"x": np.array([[1, 2, 3], [4, 5, 6]], "float32")}
    >>> out = nf.layers.pad(x, paddings=[0, 0, 1, 0])
    >>> nf.Executor(nf.CPUPlace()).run(feed=feed, fetch_list=[out])[0]
    array([[0., 1., 2., 3.],
           [0., 4., 5., 6.]], dtype=float32)
    """
    attrs = {
        "paddings": _ints(paddings, "pad: paddings"),
        "pad_value": as_float(pad_value, "pad: pad_value"),
    }
    return append_op("pad", {"X": x}, attrs, name=name)


def expand(x: VarDesc, expand_times: Sequence[int], name=None) -> VarDesc:
    """`x` tiled expand_times[i] times along each dim i (one number per dim).

    >>> x = nf.data("x", [2, 3])
    >>> nf.layers.expand(x, expand_times=[2, 1]).shape
    (4, 3)
    """
    attrs = {"expand_times": _ints(expand_times, "expand: expand_times")}
    return append_op("expand", {"X": x}, attrs, name=name)


def squeeze(input: VarDesc, axes: Sequence[int], name=None) -> VarDesc:
    """`input` without the dims of size 1 listed in `axes` (every dim of 1 when empty); a
    listed dim of another size is kept, as in Fluid 1.8.

    >>> x = nf.data("x", [2, 1, 3])
    >>> nf.layers.squeeze(x, axes=[1]).shape
    (2, 3)
    """
    attrs = {"axes": _ints(axes, "squeeze: axes")}
    out, _ = append_op("squeeze2", {"X": input}, attrs, outputs=("Out", "XShape"), name=name)
    return out


def unsqueeze(input: VarDesc, axes, name=None) -> VarDesc:
    """`input` with a dim of 1 inserted at each of `axes` (an int or list) in turn.

    >>> x = nf.data("x", [2, 3])
    >>> nf.layers.unsqueeze(x, axes=[0]).shape
    (1, 2, 3)
    """
    attrs = {"axes": _ints(axes, "unsqueeze: axes")}
    out, _ = append_op("unsqueeze2", {"X": input}, attrs, outputs=("Out", "XShape"), name=name)
    return out


def stack(x, axis: int = 0, name=None) -> VarDesc:
    """The variables of `x` (one shape and dtype) stacked along a new dim `axis`.

    >>> a, b = nf.data("a", [-1, 3]), nf.data("b", [-1, 3])
    >>> nf.layers.stack([a, b], axis=1).shape
    (-1, 2, 3)
    """
    items = [x] if isinstance(x, VarDesc) else list(x)
    attrs = {"axis": as_int(axis, "stack: axis")}
    return append_op("stack", {"X": items}, attrs, outputs=("Y",), name=name)


def unstack(x: VarDesc, axis: int = 0, num: int | None = None) -> list[VarDesc]:
    """The slices of `x` along `axis`, each without that dim; `num` defaults to the dim's
    size, which must then be known.

    >>> x = nf.data("x", [2, 3])
    >>> [v.shape for v in nf.layers.unstack(x, axis=1)]
    [(2,), (2,), (2,)]
    """
    axis = as_int(axis, "unstack: axis")
    if not -x.ndim <= axis < x.ndim:
        raise ShapeError(f"unstack: axis {axis} is out of range for '{x.name}' {list(x.shape)}")
    if num is None:
        num = x.shape[axis]
        if num < 0:
            raise ShapeError(
                f"unstack: dim {axis} of '{x.name}' {list(x.shape)} is unknown; give num"
            )
    attrs = {"axis": axis, "num": as_int(num, "unstack: num")}
    return _append_with_outputs("unstack", {"X": x}, attrs, "Y", num, None)


def cumsum(x: VarDesc, axis: int | None = None, exclusive=None, reverse=None) -> VarDesc:
    """Running sums along `axis` (None: the last); `exclusive` leaves each element out of its
    own sum; `reverse` sums from the end.

    >>> x = nf.data("x", [2, 3])
    >>> feed = {"x": np.array([[1, 2, 3], [4, 5, 6]], "float32")}
    >>> out = nf.layers.cumsum(x, axis=1)
    >>> nf.Executor(nf.CPUPlace()).run(feed=feed, fetch_list=[out])[0]
    array([[ 1.,  3.,  6.],
           [ 4.,  9., 15.]], dtype=float32)
    """
    attrs: dict[str, Any] = {}
    if axis is not None:
        attrs["axis"] = as_int(axis, "cumsum: axis")
    if exclusive is not None:
        attrs["exclusive"] = bool(exclusive)
    if reverse is not None:
        attrs["reverse"] = bool(reverse)
    return append_op("cumsum", {"X": x}, attrs)


def range(start, end, step, dtype, name=None) -> VarDesc:
    """[start, start + step, ...) up to `end`, of `dtype`; each bound is a number or a
    1-element variable (cast to `dtype` when it differs). With three numbers the length is
    known at build time.

    >>> import nestflow as nf
    >>> nf.layers.range(0, 10, 3, "int64").shape
    (4,)
    """
    dtype = dtype_name(dtype)
    bounds = []
    for what, value in (("start", start), ("end", end), ("step", step)):
        if isinstance(value, VarDesc):
            if value.dtype != dtype:
                value = append_op("cast", {"X": value}, {"out_dtype": dtype})
        else:
            value = _constant(value, dtype, f"range: {what}")
        bounds.append(value)
    out = append_op(
        "range",
        dict(zip(("Start", "End", "Step"), bounds)),
        name=name,
        stop_gradient=True,
    )
    if not any(isinstance(v, VarDesc) for v in (start, end, step)):
        if step == 0:
            raise AttrError(f"range: step is 0 (start {start}, end {end})")
        out.shape = (max(0, math.ceil((end - start) / step)),)
    return out


def shape(input: VarDesc) -> VarDesc:
    """The shape of `input` at run time, an int32 vector [rank].

    >>> x = nf.data("x", [2, 3])
    >>> feed = {"x": np.array([[1, 2, 3], [4, 5, 6]], "float32")}
    >>> out = nf.layers.shape(x)
    >>> nf.Executor(nf.CPUPlace()).run(feed=feed, fetch_list=[out])[0]
    array([2, 3], dtype=int32)
    """
    return append_op("shape", {"Input": input}, stop_gradient=True)


def fill_constant_batch_size_like(
    input: VarDesc,
    shape: Sequence[int],
    dtype: Any,
    value: float,
    input_dim_idx: int = 0,
    output_dim_idx: int = 0,
    force_cpu: bool = False,
) -> VarDesc:
    """`value` in `shape`, whose dim `output_dim_idx` is the run-time size of `input`'s dim
    `input_dim_idx` (e.g. zeros of the batch size of `input`).

    >>> x = nf.data("x", [-1, 3])
    >>> out = nf.layers.fill_constant_batch_size_like(x, [-1, 2], "float32", 1.0)
    >>> nf.Executor(nf.CPUPlace()).run(feed={"x": np.zeros((4, 3), "float32")},
    ...     fetch_list=[out])[0].shape
    (4, 2)
    """
    attrs = {
        "shape": _ints(shape, "fill_constant_batch_size_like: shape"),
        "dtype": dtype_name(dtype),
        "value": as_float(value, "fill_constant_batch_size_like: value"),
        "input_dim_idx": as_int(input_dim_idx, "fill_constant_batch_size_like: input_dim_idx"),
        "output_dim_idx": as_int(output_dim_idx, "fill_constant_batch_size_like: output_dim_idx"),
        "force_cpu": bool(force_cpu),
    }
    return append_op("fill_constant_batch_size_like", {"Input": input}, attrs, stop_gradient=True)


def strided_slice(
    input: VarDesc,
    axes: Sequence[int],
    starts: Sequence[int],
    ends: Sequence[int],
    strides: Sequence[int],
) -> VarDesc:
    """input[starts:ends:strides] along each of `axes` (Python slicing; as in Fluid an end of
    -1 with a negative stride runs through index 0).

    >>> x = nf.data("x", [2, 3])
    >>> feed = {"x": np.array([[1, 2, 3], [4, 5, 6]], "float32")}
    >>> out = nf.layers.strided_slice(x, axes=[1], starts=[0], ends=[3], strides=[2])
    >>> nf.Executor(nf.CPUPlace()).run(feed=feed, fetch_list=[out])[0]
    array([[1., 3.],
           [4., 6.]], dtype=float32)
    """
    attrs = {
        "axes": _ints(axes, "strided_slice: axes"),
        "starts": _ints(starts, "strided_slice: starts"),
        "ends": _ints(ends, "strided_slice: ends"),
        "strides": _ints(strides, "strided_slice: strides"),
    }
    return append_op("strided_slice", {"Input": input}, attrs)


__all__ = [
    "argmax",
    "argmin",
    "cumsum",
    "expand",
    "fill_constant_batch_size_like",
    "gather",
    "gather_nd",
    "one_hot",
    "pad",
    "range",
    "reduce_all",
    "reduce_any",
    "reduce_max",
    "reduce_mean",
    "reduce_min",
    "reduce_prod",
    "reduce_sum",
    "scatter",
    "shape",
    "squeeze",
    "stack",
    "strided_slice",
    "topk",
    "unsqueeze",
    "unstack",
    "where",
]
