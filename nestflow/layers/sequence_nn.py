"""Sequence layers for networks (Fluid 1.8's arguments, plus `lengths` where Fluid reads a LoD
tensor's sequence boundaries): sequence_conv, sequence_softmax, sequence_expand, dynamic_lstm,
dynamic_gru."""

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


__all__ = [
    "dynamic_gru",
    "dynamic_lstm",
    "sequence_conv",
    "sequence_expand",
    "sequence_softmax",
]


def _recurrent_input(layer: str, input: VarDesc, width: int, what: str) -> VarDesc:
    x = _padded(layer, input)
    require_float_input(x, layer)
    if len(x.shape) != 3 or x.shape[2] != width:
        raise layer_error(
            ShapeError,
            layer,
            f"input '{x.name}' has shape {list(x.shape)}; it must be [batch, time, {width}] "
            f"({what}, already projected: Fluid's dynamic form)",
        )
    return x


def dynamic_lstm(
    input: VarDesc,
    size: int,
    h_0: VarDesc | None = None,
    c_0: VarDesc | None = None,
    param_attr: Any = None,
    bias_attr: Any = None,
    use_peepholes: bool = True,
    is_reverse: bool = False,
    gate_activation: str = "sigmoid",
    cell_activation: str = "tanh",
    candidate_activation: str = "tanh",
    dtype: str = "float32",
    name: str | None = None,
    lengths: VarDesc | None = None,
) -> tuple[VarDesc, VarDesc]:
    """Fluid's dynamic_lstm over the padded `input` [N, T, size], size = 4 * D: each step's
    gates already projected (an fc of size 4 * D before it, as in Fluid), in Fluid's order
    candidate, input, forget, output. Adds the recurrent weight `<name>.w` [D, 4D] and the bias
    `<name>.b` [1, 4D] ([1, 7D] with use_peepholes: the peephole weights follow). h_0/c_0
    [N, D] start each row; is_reverse runs each row from its last valid step. `lengths` (int
    [N]): each row's steps (None: all T). Returns (hidden, cell), each [N, T, D], zero at
    padding steps. ShapeError when the input's last dim is not `size` or size % 4 != 0.

    >>> x = nf.data("x", [-1, 6, 8]); n = nf.data("n", [-1], "int64")
    >>> proj = nf.layers.fc(x, size=4 * 5, num_flatten_dims=2)
    >>> hidden, cell = nf.layers.dynamic_lstm(proj, size=4 * 5, lengths=n)
    >>> hidden.shape, cell.shape
    ((-1, 6, 5), (-1, 6, 5))
    """
    layer = "dynamic_lstm"
    size = as_int(size, "dynamic_lstm: size")
    if size < 4 or size % 4:
        raise layer_error(AttrError, layer, f"size must be 4 * hidden size (>= 4), got {size}")
    x = _recurrent_input(layer, input, size, "4 * hidden size")
    d = size // 4
    if bias_attr is False:
        raise layer_error(AttrError, layer, "bias_attr cannot be False: the lstm op needs a bias")
    prefix = name or unique_name.generate(layer)
    weight = parameter_from_attr(param_attr, [d, size], x.dtype, f"{prefix}.w", Xavier())
    width = 7 * d if use_peepholes else size
    bias = parameter_from_attr(bias_attr, [1, width], x.dtype, f"{prefix}.b", zeros_initializer())
    inputs = {
        "Input": x,
        "Weight": weight,
        "Bias": bias,
        "Length": check_lengths(layer, x, lengths),
    }
    if h_0 is not None:
        inputs["H0"] = h_0
    if c_0 is not None:
        inputs["C0"] = c_0
    attrs = {
        "use_peepholes": bool(use_peepholes),
        "is_reverse": bool(is_reverse),
        "gate_activation": gate_activation,
        "cell_activation": cell_activation,
        "candidate_activation": candidate_activation,
    }
    outputs = ("Hidden", "Cell", "BatchGate", "BatchCellPreAct")
    hidden, cell, gate, pre = append_op("lstm", inputs, attrs, outputs, name=prefix)
    gate.stop_gradient = pre.stop_gradient = True
    return hidden, cell


def dynamic_gru(
    input: VarDesc,
    size: int,
    param_attr: Any = None,
    bias_attr: Any = None,
    is_reverse: bool = False,
    gate_activation: str = "sigmoid",
    candidate_activation: str = "tanh",
    h_0: VarDesc | None = None,
    origin_mode: bool = False,
    lengths: VarDesc | None = None,
) -> VarDesc:
    """Fluid's dynamic_gru over the padded `input` [N, T, 3 * size]: each step's update, reset
    and candidate inputs already projected (an fc of size 3 * size before it, as in Fluid).
    Adds the recurrent weight [size, 3 * size] (Fluid's layout: the [D, 2D] update/reset
    weights, then the [D, D] candidate weights) and the bias [1, 3 * size] (unless bias_attr is
    False). h' = (1 - u) * h + u * c, or u * h + (1 - u) * c with origin_mode. h_0 [N, size]
    starts each row; `lengths` (int [N]): each row's steps (None: all T). Returns hidden
    [N, T, size], zero at padding steps.

    >>> x = nf.data("x", [-1, 6, 8]); n = nf.data("n", [-1], "int64")
    >>> proj = nf.layers.fc(x, size=3 * 5, num_flatten_dims=2)
    >>> nf.layers.dynamic_gru(proj, size=5, lengths=n, is_reverse=True).shape
    (-1, 6, 5)
    """
    layer = "dynamic_gru"
    size = as_int(size, "dynamic_gru: size")
    if size < 1:
        raise layer_error(AttrError, layer, f"size must be >= 1, got {size}")
    x = _recurrent_input(layer, input, 3 * size, "3 * size")
    prefix = unique_name.generate(layer)
    weight = parameter_from_attr(param_attr, [size, 3 * size], x.dtype, f"{prefix}.w", Xavier())
    bias = parameter_from_attr(
        bias_attr, [1, 3 * size], x.dtype, f"{prefix}.b", zeros_initializer()
    )
    inputs = {"Input": x, "Weight": weight, "Length": check_lengths(layer, x, lengths)}
    if bias is not None:
        inputs["Bias"] = bias
    if h_0 is not None:
        inputs["H0"] = h_0
    attrs = {
        "activation": candidate_activation,
        "gate_activation": gate_activation,
        "is_reverse": bool(is_reverse),
        "origin_mode": bool(origin_mode),
    }
    outputs = ("BatchGate", "BatchResetHiddenPrev", "BatchHidden", "Hidden")
    gate, reset, batch_hidden, hidden = append_op("gru", inputs, attrs, outputs, name=prefix)
    gate.stop_gradient = reset.stop_gradient = batch_hidden.stop_gradient = True
    return hidden
