"""Sequence layers for networks (Fluid 1.8's arguments, plus `lengths` where Fluid reads a LoD
tensor's sequence boundaries): sequence_conv, sequence_softmax, sequence_expand."""

from __future__ import annotations

from typing import Any

from nestflow.errors import AttrError, ShapeError
from nestflow.framework import unique_name
from nestflow.framework.program import VarDesc
from nestflow.layers.helper import (
    append_op,
    as_int,
    layer_error,
    parameter_from_attr,
    require_float_input,
    zeros_initializer,
)
from nestflow.layers.initializer import Xavier
from nestflow.layers.nn import activation
from nestflow.layers.sequence import _padded, check_lengths


def sequence_conv(
    input: VarDesc,
    num_filters: int,
    filter_size: int = 3,
    filter_stride: int = 1,
    padding: bool = True,
    padding_start: int | None = None,
    bias_attr: Any = None,
    param_attr: Any = None,
    act: str | None = None,
    name: str | None = None,
    lengths: VarDesc | None = None,
) -> VarDesc:
    """A 1-D convolution along time inside each row of the padded `input` [N, T, D]: step t
    sees steps t + padding_start ... t + padding_start + filter_size - 1 of its own row (zeros
    outside it), times a [filter_size * D, num_filters] filter, plus the bias, through `act`.
    Returns [N, T, num_filters]. `padding_start` defaults to -(filter_size // 2) (a centred
    window); `filter_stride` must be 1 and `padding` is accepted for Fluid programs (rows are
    always padded with zeros, as Fluid's untrainable padding). `lengths` (int [N]): each
    row's steps (None: all T).

    >>> x = nf.data("x", [-1, 6, 4]); n = nf.data("n", [-1], "int64")
    >>> nf.layers.sequence_conv(x, num_filters=8, filter_size=3, act="tanh", lengths=n).shape
    (-1, 6, 8)
    """
    x = _padded("sequence_conv", input)
    require_float_input(x, "sequence_conv")
    if len(x.shape) != 3 or x.shape[2] < 1:
        raise layer_error(
            ShapeError,
            "sequence_conv",
            f"input '{x.name}' has shape {list(x.shape)}; it must be [batch, time, features] "
            "with the features known",
        )
    filter_size = as_int(filter_size, "sequence_conv: filter_size")
    num_filters = as_int(num_filters, "sequence_conv: num_filters")
    if filter_size < 1 or num_filters < 1:
        raise layer_error(
            AttrError,
            "sequence_conv",
            f"filter_size and num_filters must be >= 1, got {filter_size} and {num_filters}",
        )
    if as_int(filter_stride, "sequence_conv: filter_stride") != 1:
        raise layer_error(
            AttrError, "sequence_conv", f"filter_stride must be 1 (as Fluid's), got {filter_stride}"
        )
    start = -(filter_size // 2) if padding_start is None else as_int(padding_start, "padding_start")
    prefix = name or unique_name.generate("sequence_conv")
    shape = [filter_size * x.shape[2], num_filters]
    weight = parameter_from_attr(param_attr, shape, x.dtype, f"{prefix}.w", Xavier())
    inputs = {"X": x, "Filter": weight, "Length": check_lengths("sequence_conv", x, lengths)}
    attrs = {"contextLength": filter_size, "contextStart": start, "contextStride": 1}
    out = append_op("sequence_conv", inputs, attrs, name=prefix)
    bias = parameter_from_attr(
        bias_attr, [num_filters], x.dtype, f"{prefix}.b", zeros_initializer()
    )
    if bias is not None:
        out = append_op("elementwise_add", {"X": out, "Y": bias}, {"axis": 2}, name=prefix)
    return activation(out, act)


def sequence_softmax(
    input: VarDesc,
    use_cudnn: bool = False,
    name: str | None = None,
    lengths: VarDesc | None = None,
) -> VarDesc:
    """Softmax over time inside each row of the padded `input` [N, T] (or [N, T, ...]: one
    softmax per trailing index) over its first `lengths[n]` steps; padding steps give 0.
    `use_cudnn` is accepted for Fluid programs.

    >>> x = nf.data("x", [-1, 4]); n = nf.data("n", [-1], "int64")
    >>> y = nf.layers.sequence_softmax(x, lengths=n)
    >>> out = nf.Executor().run(feed={"x": np.zeros((2, 4), "float32"), "n": np.array([4, 2])},
    ...                         fetch_list=[y])[0]
    >>> out.tolist()
    [[0.25, 0.25, 0.25, 0.25], [0.5, 0.5, 0.0, 0.0]]
    """
    x = _padded("sequence_softmax", input)
    require_float_input(x, "sequence_softmax")
    inputs = {"X": x, "Length": check_lengths("sequence_softmax", x, lengths)}
    return append_op("sequence_softmax", inputs, name=name)


def sequence_expand(
    x: VarDesc,
    y: VarDesc,
    ref_level: int = -1,
    name: str | None = None,
    lengths: VarDesc | None = None,
) -> VarDesc:
    """Row n of `x` [N, ...] repeated over the steps of sequence n of the padded `y`
    [N, T, ...] (the first `lengths[n]` steps; 0 in the padding): [N, T, ...x's]. The usual
    Fluid use, one vector per sequence broadcast along it (an encoder state to every decoder
    step); `ref_level` must be -1 or 0 (a padded batch has one level of sequences).

    >>> h = nf.data("h", [-1, 2]); y = nf.data("y", [-1, 3, 5]); n = nf.data("n", [-1], "int64")
    >>> e = nf.layers.sequence_expand(h, y, lengths=n)
    >>> out = nf.Executor().run(feed={"h": np.array([[1, 2], [3, 4]], "float32"),
    ...     "y": np.zeros((2, 3, 5), "float32"), "n": np.array([3, 1])}, fetch_list=[e])[0]
    >>> out[:, :, 0].tolist()
    [[1.0, 1.0, 1.0], [3.0, 0.0, 0.0]]
    """
    y = _padded("sequence_expand", y)
    if not isinstance(x, VarDesc):
        raise layer_error(AttrError, "sequence_expand", f"x must be a variable, got {x!r}")
    inputs = {"X": x, "Y": y, "Length": check_lengths("sequence_expand", y, lengths)}
    attrs = {"ref_level": as_int(ref_level, "sequence_expand: ref_level")}
    return append_op("sequence_expand", inputs, attrs, name=name)


__all__ = ["sequence_conv", "sequence_expand", "sequence_softmax"]
