"""Vision layers (NCHW): conv2d, conv2d_transpose, pool2d, lrn, flatten, conv1d (over conv2d),
conv3d, pool3d, image_resize (interpolate, resize_bilinear, resize_nearest), pixel_shuffle
(Fluid 1.8's arguments and defaults).

A convolution layer appends its conv op over a filter parameter `<name>.w` and, unless
bias_attr is False, an elementwise_add of a bias `<name>.b` [num_filters] along the channel
axis, then the activation. What the layer can check before making parameters (dtype, rank,
channels against groups, sizes) it checks first, so a rejected layer leaves no parameter behind.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from nestflow.errors import AttrError, ShapeError
from nestflow.framework import unique_name
from nestflow.framework.program import VarDesc
from nestflow.layers.helper import (
    append_op,
    as_float,
    as_int,
    layer_error,
    parameter_from_attr,
    require_float_input,
    zeros_initializer,
)
from nestflow.layers.initializer import Normal, Xavier
from nestflow.layers.nn import activation

__all__ = [
    "conv1d",
    "conv2d",
    "conv2d_transpose",
    "conv3d",
    "flatten",
    "image_resize",
    "interpolate",
    "lrn",
    "pixel_shuffle",
    "pool2d",
    "pool3d",
    "resize_bilinear",
    "resize_nearest",
]


def _pair(value: Any, layer: str, what: str, low: int = 1) -> list[int]:
    """Fluid's convert_to_list(value, 2): an int for both dims, or two ints (each >= low)."""
    values = [value, value] if isinstance(value, int) and not isinstance(value, bool) else value
    if (
        not isinstance(values, (list, tuple))
        or len(values) != 2
        or any(isinstance(v, bool) or not isinstance(v, int) or v < low for v in values)
    ):
        raise layer_error(
            AttrError, layer, f"{what} must be an int or 2 ints, each >= {low}; got {value!r}"
        )
    return list(values)


def _padding(padding: Any, data_format: str, layer: str) -> tuple[list[int], str]:
    """Fluid's padding spellings -> (paddings attr, padding_algorithm): "SAME"/"VALID"; an int;
    [pad_h, pad_w]; [top, bottom, left, right]; or 4 pairs per NCHW/NHWC dim with zeros for
    the batch and channel dims."""
    if isinstance(padding, str):
        algorithm = padding.upper()
        if algorithm not in ("SAME", "VALID"):
            raise layer_error(
                AttrError, layer, f"padding must be 'SAME', 'VALID' or sizes, got {padding!r}"
            )
        return [0, 0], algorithm
    if (
        isinstance(padding, (list, tuple))
        and len(padding) == 4
        and all(isinstance(p, (list, tuple)) for p in padding)
    ):
        spatial = (2, 3) if data_format == "NCHW" else (1, 2)
        others = [list(padding[d]) for d in range(4) if d not in spatial]
        if others != [[0, 0], [0, 0]]:
            raise layer_error(
                AttrError,
                layer,
                f"padding {padding!r} pads the batch or channel dims; only height and width "
                "may be padded",
            )
        padding = [p for d in spatial for p in padding[d]]
    if isinstance(padding, (list, tuple)) and len(padding) == 4:
        if any(isinstance(p, bool) or not isinstance(p, int) or p < 0 for p in padding):
            raise layer_error(AttrError, layer, f"padding must hold ints >= 0, got {padding!r}")
        if padding[0] == padding[1] and padding[2] == padding[3]:
            return [padding[0], padding[2]], "EXPLICIT"
        return list(padding), "EXPLICIT"
    return _pair(padding, layer, "padding", low=0), "EXPLICIT"


def _located(convert, value: Any, layer: str, what: str):
    """as_int / as_float, their AttrError located at the user's line."""
    try:
        return convert(value, f"{layer}: {what}")
    except AttrError as exc:
        raise layer_error(AttrError, layer, exc.message) from None


def _flag(value: Any, layer: str, what: str) -> bool:
    if not isinstance(value, bool):
        raise layer_error(AttrError, layer, f"{what} must be True or False, got {value!r}")
    return value


def _image_input(input: VarDesc, data_format: str, layer: str) -> int:
    """Checks a 4-D float image input; returns its channel count (which must be known)."""
    require_float_input(input, layer)
    if data_format not in ("NCHW", "NHWC"):
        raise layer_error(
            AttrError, layer, f"data_format must be 'NCHW' or 'NHWC', got {data_format!r}"
        )
    if input.ndim != 4:
        raise layer_error(
            ShapeError,
            layer,
            f"input '{input.name}' {list(input.shape)} must be a 4-D {data_format} image batch",
        )
    channels = input.shape[1] if data_format == "NCHW" else input.shape[3]
    if channels < 1:
        raise layer_error(
            ShapeError,
            layer,
            f"input '{input.name}' {list(input.shape)} needs a known channel count ({data_format})",
        )
    return channels


def _groups(groups: Any, channels: int, num_filters: int, input: VarDesc, layer: str) -> int:
    groups = 1 if groups is None else _located(as_int, groups, layer, "groups")
    if groups < 1:
        raise layer_error(AttrError, layer, f"groups must be >= 1, got {groups}")
    if channels % groups:
        raise layer_error(
            ShapeError,
            layer,
            f"the {channels} channels of input '{input.name}' {list(input.shape)} do not "
            f"divide by groups={groups}",
        )
    if num_filters % groups:
        raise layer_error(
            ShapeError, layer, f"num_filters={num_filters} does not divide by groups={groups}"
        )
    return groups


def _conv_arguments(input, num_filters, groups, stride, dilation, padding, data_format, layer):
    """The arguments both conv layers check alike: (channels, num_filters, groups, strides,
    dilations, paddings, padding_algorithm)."""
    channels = _image_input(input, data_format, layer)
    num_filters = _located(as_int, num_filters, layer, "num_filters")
    if num_filters < 1:
        raise layer_error(AttrError, layer, f"num_filters must be >= 1, got {num_filters}")
    groups = _groups(groups, channels, num_filters, input, layer)
    stride = _pair(stride, layer, "stride")
    dilation = _pair(dilation, layer, "dilation")
    paddings, algorithm = _padding(padding, data_format, layer)
    return channels, num_filters, groups, stride, dilation, paddings, algorithm


def _biased(out: VarDesc, bias_attr: Any, num_filters: int, data_format: str, prefix: str):
    """out + bias [num_filters] along the channel axis, unless bias_attr is False."""
    b = parameter_from_attr(bias_attr, [num_filters], out.dtype, f"{prefix}.b", zeros_initializer())
    if b is None:
        return out
    axis = 1 if data_format == "NCHW" else 3
    return append_op("elementwise_add", {"X": out, "Y": b}, {"axis": axis}, name=prefix)


def conv2d(
    input: VarDesc,
    num_filters: int,
    filter_size: int | Sequence[int],
    stride: int | Sequence[int] = 1,
    padding: int | str | Sequence = 0,
    dilation: int | Sequence[int] = 1,
    groups: int | None = None,
    param_attr: Any = None,
    bias_attr: Any = None,
    use_cudnn: bool = True,
    act: str | None = None,
    name: str | None = None,
    data_format: str = "NCHW",
) -> VarDesc:
    """act(conv2d(input, W) + b): input [N, C, H, W] (or NHWC) floating point, W
    [num_filters, C / groups, kh, kw] initialised N(0, sqrt(2 / (kh * kw * C))) as Fluid's
    default, b [num_filters] zeros. `padding`: an int, [pad_h, pad_w], [top, bottom, left,
    right] or "SAME"/"VALID". Appends depthwise_conv2d when groups == C, num_filters is a
    multiple of C and use_cudnn is False (Fluid's choice), conv2d otherwise.

    Raises DTypeError for a non-float input; ShapeError when the channels or num_filters do
    not divide by groups or the filter is larger than the padded input; AttrError for
    non-positive sizes.

    >>> import nestflow as nf
    >>> x = nf.data("x", [-1, 3, 32, 32])
    >>> nf.layers.conv2d(x, 8, 3, padding=1, act="relu").shape
    (-1, 8, 32, 32)
    """
    layer = "conv2d"
    channels, num_filters, groups, stride, dilation, paddings, algorithm = _conv_arguments(
        input, num_filters, groups, stride, dilation, padding, data_format, layer
    )
    filter_size = _pair(filter_size, layer, "filter_size")
    prefix = name or unique_name.generate("conv2d")
    op_type = "conv2d"
    if channels == groups and num_filters % channels == 0 and not use_cudnn:
        op_type = "depthwise_conv2d"
    std = (2.0 / (filter_size[0] * filter_size[1] * channels)) ** 0.5
    shape = [num_filters, channels // groups] + filter_size
    attrs = {
        "strides": stride,
        "paddings": paddings,
        "padding_algorithm": algorithm,
        "dilations": dilation,
        "groups": groups,
        "use_cudnn": _flag(use_cudnn, layer, "use_cudnn"),
        "data_format": data_format,
    }
    return _conv_layer(
        op_type, input, shape, attrs, param_attr, bias_attr, Normal(0.0, std), act, prefix
    )


def _conv_layer(op_type, input, shape, attrs, param_attr, bias_attr, init, act, prefix):
    if param_attr is False:
        raise layer_error(AttrError, op_type, "param_attr cannot be False: the op needs a filter")
    w = parameter_from_attr(param_attr, shape, input.dtype, f"{prefix}.w", init)
    out = append_op(op_type, {"Input": input, "Filter": w}, attrs, ("Output",), name=prefix)
    num_filters = out.shape[1] if attrs["data_format"] == "NCHW" else out.shape[3]
    return activation(_biased(out, bias_attr, num_filters, attrs["data_format"], prefix), act)


def conv2d_transpose(
    input: VarDesc,
    num_filters: int,
    output_size: int | Sequence[int] | None = None,
    filter_size: int | Sequence[int] | None = None,
    padding: int | str | Sequence = 0,
    stride: int | Sequence[int] = 1,
    dilation: int | Sequence[int] = 1,
    groups: int | None = None,
    param_attr: Any = None,
    bias_attr: Any = None,
    use_cudnn: bool = True,
    act: str | None = None,
    name: str | None = None,
    data_format: str = "NCHW",
) -> VarDesc:
    """act(conv2d_transpose(input, W) + b): input [N, C, H, W] (or NHWC) floating point, W
    [C, num_filters / groups, kh, kw] (Xavier), b [num_filters] zeros. Output height
    (H - 1) * stride - pad_top - pad_bottom + dilation * (kh - 1) + 1, or `output_size`
    (at most stride - 1 more). With filter_size None it is derived from output_size, as in
    Fluid. Appends depthwise_conv2d_transpose when groups == C == num_filters and use_cudnn is
    False. Errors as conv2d's; AttrError when both filter_size and output_size are None.

    >>> import nestflow as nf
    >>> x = nf.data("x", [-1, 4, 7, 7])
    >>> nf.layers.conv2d_transpose(x, 2, filter_size=3, stride=2, padding=1).shape
    (-1, 2, 13, 13)
    """
    layer = "conv2d_transpose"
    channels, num_filters, groups, stride, dilation, paddings, algorithm = _conv_arguments(
        input, num_filters, groups, stride, dilation, padding, data_format, layer
    )
    four = paddings * 1 if len(paddings) == 4 else [paddings[0]] * 2 + [paddings[1]] * 2
    if output_size is not None:
        output_size = _pair(output_size, layer, "output_size")
    if filter_size is None:
        if output_size is None:
            raise layer_error(
                AttrError, layer, "output_size must be given when filter_size is None"
            )
        in_hw = input.shape[2:] if data_format == "NCHW" else input.shape[1:3]
        if min(in_hw) < 1:
            raise layer_error(
                ShapeError,
                layer,
                f"filter_size None needs the known height and width of input '{input.name}' "
                f"{list(input.shape)}",
            )
        filter_size = [
            (output_size[d] - (in_hw[d] - 1) * stride[d] + four[2 * d] + four[2 * d + 1] - 1)
            // dilation[d]
            + 1
            for d in range(2)
        ]
    filter_size = _pair(filter_size, layer, "filter_size")
    prefix = name or unique_name.generate("conv2d_transpose")
    op_type = layer
    if channels == groups == num_filters and not use_cudnn:
        op_type = "depthwise_conv2d_transpose"
    attrs = {
        "output_size": output_size or [],
        "strides": stride,
        "paddings": paddings,
        "padding_algorithm": algorithm,
        "dilations": dilation,
        "groups": groups,
        "use_cudnn": _flag(use_cudnn, layer, "use_cudnn"),
        "data_format": data_format,
    }
    shape = [channels, num_filters // groups] + filter_size
    return _conv_layer(op_type, input, shape, attrs, param_attr, bias_attr, Xavier(), act, prefix)


def pool2d(
    input: VarDesc,
    pool_size: int | Sequence[int] = -1,
    pool_type: str = "max",
    pool_stride: int | Sequence[int] = 1,
    pool_padding: int | str | Sequence = 0,
    global_pooling: bool = False,
    use_cudnn: bool = True,
    ceil_mode: bool = False,
    name: str | None = None,
    exclusive: bool = True,
    data_format: str = "NCHW",
) -> VarDesc:
    """Max or average pooling of input [N, C, H, W] (or NHWC) over pool_size windows every
    pool_stride, padded by pool_padding (spelled as conv2d's padding); global_pooling pools the
    whole image; ceil_mode rounds the output size up; `exclusive` averages over the window's
    input elements only (padding left out).

    Raises AttrError for an unknown pool_type, a missing pool_size (without global_pooling),
    "VALID" with ceil_mode or non-positive sizes; DTypeError for a non-float input; ShapeError
    when the window is larger than the padded input.

    >>> import nestflow as nf
    >>> x = nf.data("x", [-1, 3, 28, 28])
    >>> nf.layers.pool2d(x, pool_size=2, pool_stride=2).shape
    (-1, 3, 14, 14)
    """
    layer = "pool2d"
    if pool_type not in ("max", "avg"):
        raise layer_error(AttrError, layer, f"pool_type must be 'max' or 'avg', got {pool_type!r}")
    _image_input(input, data_format, layer)
    if not global_pooling and pool_size == -1:
        raise layer_error(AttrError, layer, "pool_size must be given when global_pooling is False")
    pool_size = [-1, -1] if pool_size == -1 else _pair(pool_size, layer, "pool_size")
    pool_stride = _pair(pool_stride, layer, "pool_stride")
    paddings, algorithm = _padding(pool_padding, data_format, layer)
    if algorithm == "VALID" and ceil_mode:
        raise layer_error(AttrError, layer, 'pool_padding "VALID" needs ceil_mode False')
    attrs = {
        "pooling_type": pool_type,
        "ksize": pool_size,
        "global_pooling": bool(global_pooling),
        "strides": pool_stride,
        "paddings": paddings,
        "padding_algorithm": algorithm,
        "use_cudnn": _flag(use_cudnn, layer, "use_cudnn"),
        "ceil_mode": bool(ceil_mode),
        "exclusive": bool(exclusive),
        "data_format": data_format,
    }
    return append_op("pool2d", {"X": input}, attrs, name=name or "pool2d")


def lrn(
    input: VarDesc,
    n: int = 5,
    k: float = 1.0,
    alpha: float = 1e-4,
    beta: float = 0.75,
    name: str | None = None,
    data_format: str = "NCHW",
) -> VarDesc:
    """Local response normalisation across channels: input / (k + alpha * sum of input^2 over
    n neighbouring channels)^beta, input [N, C, H, W] (or NHWC) floating point. As Fluid's,
    alpha is not divided by n. AttrError for n < 1 or k, alpha, beta <= 0; ShapeError for a
    rank other than 4.

    >>> import nestflow as nf
    >>> x = nf.data("x", [-1, 8, 5, 5])
    >>> nf.layers.lrn(x).shape
    (-1, 8, 5, 5)
    """
    layer = "lrn"
    _image_input(input, data_format, layer)
    attrs = {
        "n": _located(as_int, n, layer, "n"),
        "k": _located(as_float, k, layer, "k"),
        "alpha": _located(as_float, alpha, layer, "alpha"),
        "beta": _located(as_float, beta, layer, "beta"),
        "data_format": data_format,
    }
    prefix = name or "lrn"
    out, mid = append_op("lrn", {"X": input}, attrs, ("Out", "MidOut"), name=prefix)
    mid.stop_gradient = True
    return out


def flatten(x: VarDesc, axis: int = 1, name: str | None = None) -> VarDesc:
    """x as a matrix [prod(x.shape[:axis]), prod(x.shape[axis:])], axis in [0, rank]
    (-1 where a flattened dim is unknown). Appends Fluid's flatten2. AttrError for an axis out
    of range.

    >>> import nestflow as nf
    >>> x = nf.data("x", [-1, 16, 4, 4])
    >>> nf.layers.flatten(x).shape
    (-1, 256)
    """
    if isinstance(axis, bool) or not isinstance(axis, int) or not 0 <= axis <= x.ndim:
        raise layer_error(
            AttrError,
            "flatten",
            f"axis must be an int in [0, {x.ndim}] for x '{x.name}' {list(x.shape)}, got {axis!r}",
        )
    out, xshape = append_op("flatten2", {"X": x}, {"axis": axis}, ("Out", "XShape"), name=name)
    xshape.stop_gradient = True
    return out


# ---- 1-D and 3-D convolution and pooling ----


def _triple(value: Any, layer: str, what: str, low: int = 1) -> list[int]:
    """An int for all three dims (depth, height, width), or three ints (each >= low)."""
    values = [value] * 3 if isinstance(value, int) and not isinstance(value, bool) else value
    if (
        not isinstance(values, (list, tuple))
        or len(values) != 3
        or any(isinstance(v, bool) or not isinstance(v, int) or v < low for v in values)
    ):
        raise layer_error(
            AttrError, layer, f"{what} must be an int or 3 ints, each >= {low}; got {value!r}"
        )
    return list(values)


def _padding3(padding: Any, layer: str) -> tuple[list[int], str]:
    """ "SAME"/"VALID", an int, [d, h, w] or [front, back, top, bottom, left, right]."""
    if isinstance(padding, str):
        if padding.upper() not in ("SAME", "VALID"):
            raise layer_error(
                AttrError, layer, f"padding must be 'SAME', 'VALID' or sizes, got {padding!r}"
            )
        return [0, 0, 0], padding.upper()
    if isinstance(padding, (list, tuple)) and len(padding) == 6:
        if any(isinstance(p, bool) or not isinstance(p, int) or p < 0 for p in padding):
            raise layer_error(AttrError, layer, f"padding must hold ints >= 0, got {padding!r}")
        return list(padding), "EXPLICIT"
    return _triple(padding, layer, "padding", low=0), "EXPLICIT"


def _volume_input(input: VarDesc, data_format: str, layer: str) -> int:
    """Checks a 5-D float volume input; returns its channel count (which must be known)."""
    require_float_input(input, layer)
    if data_format not in ("NCDHW", "NDHWC"):
        raise layer_error(
            AttrError, layer, f"data_format must be 'NCDHW' or 'NDHWC', got {data_format!r}"
        )
    channels = input.shape[1 if data_format == "NCDHW" else -1] if input.ndim == 5 else -1
    if input.ndim != 5 or channels < 1:
        raise layer_error(
            ShapeError,
            layer,
            f"input '{input.name}' {list(input.shape)} must be a 5-D {data_format} volume batch "
            "with its channels known",
        )
    return channels


def conv3d(
    input: VarDesc,
    num_filters: int,
    filter_size: int | Sequence[int],
    stride: int | Sequence[int] = 1,
    padding: int | str | Sequence = 0,
    dilation: int | Sequence[int] = 1,
    groups: int | None = None,
    param_attr: Any = None,
    bias_attr: Any = None,
    use_cudnn: bool = True,
    act: str | None = None,
    name: str | None = None,
    data_format: str = "NCDHW",
) -> VarDesc:
    """act(conv3d(input, W) + b): input [N, C, D, H, W] (or NDHWC) floating point, W
    [num_filters, C / groups, kd, kh, kw] initialised N(0, sqrt(2 / (kd * kh * kw * C))) as
    Fluid's default, b [num_filters] zeros. `padding`: an int, [d, h, w], [front, back, top,
    bottom, left, right] or "SAME"/"VALID". Raises DTypeError for a non-float input;
    ShapeError when the channels or num_filters do not divide by groups or the filter is larger
    than the padded input; AttrError for non-positive sizes.

    >>> x = nf.data("x", [-1, 2, 8, 16, 16])
    >>> nf.layers.conv3d(x, 4, 3, padding=1, act="relu").shape
    (-1, 4, 8, 16, 16)
    """
    layer = "conv3d"
    channels = _volume_input(input, data_format, layer)
    num_filters = _located(as_int, num_filters, layer, "num_filters")
    if num_filters < 1:
        raise layer_error(AttrError, layer, f"num_filters must be >= 1, got {num_filters}")
    groups = _groups(groups, channels, num_filters, input, layer)
    filter_size = _triple(filter_size, layer, "filter_size")
    paddings, algorithm = _padding3(padding, layer)
    attrs = {
        "strides": _triple(stride, layer, "stride"),
        "paddings": paddings,
        "padding_algorithm": algorithm,
        "dilations": _triple(dilation, layer, "dilation"),
        "groups": groups,
        "use_cudnn": _flag(use_cudnn, layer, "use_cudnn"),
        "data_format": data_format,
    }
    prefix = name or unique_name.generate(layer)
    std = (2.0 / (filter_size[0] * filter_size[1] * filter_size[2] * channels)) ** 0.5
    if param_attr is False:
        raise layer_error(AttrError, layer, "param_attr cannot be False: the op needs a filter")
    shape = [num_filters, channels // groups] + filter_size
    w = parameter_from_attr(param_attr, shape, input.dtype, f"{prefix}.w", Normal(0.0, std))
    out = append_op(layer, {"Input": input, "Filter": w}, attrs, ("Output",), name=prefix)
    b = parameter_from_attr(bias_attr, [num_filters], out.dtype, f"{prefix}.b", zeros_initializer())
    if b is not None:
        axis = 1 if data_format == "NCDHW" else 4
        out = append_op("elementwise_add", {"X": out, "Y": b}, {"axis": axis}, name=prefix)
    return activation(out, act)


def pool3d(
    input: VarDesc,
    pool_size: int | Sequence[int] = -1,
    pool_type: str = "max",
    pool_stride: int | Sequence[int] = 1,
    pool_padding: int | str | Sequence = 0,
    global_pooling: bool = False,
    use_cudnn: bool = True,
    ceil_mode: bool = False,
    name: str | None = None,
    exclusive: bool = True,
    data_format: str = "NCDHW",
) -> VarDesc:
    """Max or average pooling of input [N, C, D, H, W] (or NDHWC) over pool_size windows every
    pool_stride, padded by pool_padding (spelled as conv3d's padding); global_pooling pools the
    whole volume; ceil_mode rounds the output size up; `exclusive` averages over the window's
    input elements only. AttrError for an unknown pool_type or a missing pool_size; ShapeError
    when the window is larger than the padded input.

    >>> x = nf.data("x", [-1, 3, 8, 8, 8])
    >>> nf.layers.pool3d(x, pool_size=2, pool_stride=2, pool_type="avg").shape
    (-1, 3, 4, 4, 4)
    """
    layer = "pool3d"
    if pool_type not in ("max", "avg"):
        raise layer_error(AttrError, layer, f"pool_type must be 'max' or 'avg', got {pool_type!r}")
    _volume_input(input, data_format, layer)
    if not global_pooling and pool_size == -1:
        raise layer_error(AttrError, layer, "pool_size must be given when global_pooling is False")
    pool_size = [-1, -1, -1] if pool_size == -1 else _triple(pool_size, layer, "pool_size")
    paddings, algorithm = _padding3(pool_padding, layer)
    if algorithm == "VALID" and ceil_mode:
        raise layer_error(AttrError, layer, 'pool_padding "VALID" needs ceil_mode False')
    attrs = {
        "pooling_type": pool_type,
        "ksize": [max(k, 1) for k in pool_size],
        "global_pooling": bool(global_pooling),
        "strides": _triple(pool_stride, layer, "pool_stride"),
        "paddings": paddings,
        "padding_algorithm": algorithm,
        "use_cudnn": _flag(use_cudnn, layer, "use_cudnn"),
        "ceil_mode": bool(ceil_mode),
        "exclusive": bool(exclusive),
        "data_format": data_format,
    }
    return append_op(layer, {"X": input}, attrs, name=name or layer)


def conv1d(
    input: VarDesc,
    num_filters: int,
    filter_size: int,
    stride: int = 1,
    padding: int | str = 0,
    dilation: int = 1,
    groups: int | None = None,
    param_attr: Any = None,
    bias_attr: Any = None,
    act: str | None = None,
    name: str | None = None,
    data_format: str = "NCL",
) -> VarDesc:
    """act(1-D convolution of input [N, C, L] (or NLC) + b): conv2d over the input seen as
    [N, C, 1, L] with a [num_filters, C / groups, 1, filter_size] filter `<name>.w`, then the
    height of 1 squeezed away: [N, num_filters, OL], OL = (L + 2 * padding - dilation *
    (filter_size - 1) - 1) // stride + 1. `padding`: an int or "SAME"/"VALID". Errors as
    conv2d's (ShapeError for an input other than 3-D).

    >>> x = nf.data("x", [-1, 4, 20])
    >>> nf.layers.conv1d(x, 6, 3, padding=1, act="relu").shape
    (-1, 6, 20)
    """
    layer = "conv1d"
    if data_format not in ("NCL", "NLC"):
        raise layer_error(
            AttrError, layer, f"data_format must be 'NCL' or 'NLC', got {data_format!r}"
        )
    if input.ndim != 3:
        raise layer_error(
            ShapeError,
            layer,
            f"input '{input.name}' {list(input.shape)} must be [N, C, L] ({data_format})",
        )
    one = [
        _located(as_int, v, layer, what) for v, what in ((stride, "stride"), (dilation, "dilation"))
    ]
    size = _located(as_int, filter_size, layer, "filter_size")
    pad = padding if isinstance(padding, str) else [0, _located(as_int, padding, layer, "padding")]
    axis = 2 if data_format == "NCL" else 1
    image, xshape = append_op("unsqueeze2", {"X": input}, {"axes": [axis]}, ("Out", "XShape"))
    xshape.stop_gradient = True
    out = conv2d(
        image,
        num_filters,
        [1, size],
        stride=[1, one[0]],
        padding=pad,
        dilation=[1, one[1]],
        groups=groups,
        param_attr=param_attr,
        bias_attr=bias_attr,
        act=act,
        name=name,
        data_format="NCHW" if data_format == "NCL" else "NHWC",
    )
    out, xshape = append_op("squeeze2", {"X": out}, {"axes": [axis]}, ("Out", "XShape"))
    xshape.stop_gradient = True
    return out


# ---- resizing ----


def _resize(
    layer: str,
    input,
    out_shape,
    scale,
    resample,
    align_corners,
    align_mode,
    data_format,
    actual_shape,
    name,
):
    _image_input(input, data_format, layer)
    if actual_shape is not None:
        raise layer_error(
            AttrError,
            layer,
            "actual_shape (a run-time output size) is not supported: give out_shape or scale",
        )
    attrs = {
        "align_corners": _flag(align_corners, layer, "align_corners"),
        "align_mode": _located(as_int, align_mode, layer, "align_mode"),
        "data_layout": data_format,
    }
    if out_shape is not None:
        if (
            not isinstance(out_shape, (list, tuple))
            or len(out_shape) != 2
            or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in out_shape)
        ):
            raise layer_error(
                AttrError,
                layer,
                f"out_shape must be 2 ints >= 1 (height, width), got {out_shape!r}",
            )
        attrs["out_h"], attrs["out_w"] = out_shape
    elif scale is not None:
        attrs["scale"] = _located(as_float, scale, layer, "scale")
        if attrs["scale"] <= 0:
            raise layer_error(AttrError, layer, f"scale must be > 0, got {scale!r}")
    else:
        raise layer_error(AttrError, layer, "give out_shape or scale")
    method = {"BILINEAR": "bilinear", "NEAREST": "nearest"}.get(str(resample).upper())
    if method is None:
        raise layer_error(
            AttrError, layer, f"resample must be 'BILINEAR' or 'NEAREST', got {resample!r}"
        )
    attrs["interp_method"] = method
    return append_op(f"{method}_interp", {"X": input}, attrs, name=name or layer)


def image_resize(
    input: VarDesc,
    out_shape: Sequence[int] | None = None,
    scale: float | None = None,
    name: str | None = None,
    resample: str = "BILINEAR",
    actual_shape: Any = None,
    align_corners: bool = True,
    align_mode: int = 1,
    data_format: str = "NCHW",
) -> VarDesc:
    """input [N, C, H, W] (or NHWC) resized to out_shape [out_h, out_w] (or by `scale`:
    int(H * scale)) with resample "BILINEAR" or "NEAREST", Fluid 1.8's rules:
    align_corners (the default) maps corner pixels onto corner pixels; without it, bilinear's
    align_mode 0 takes half-pixel centres (PyTorch's align_corners=False) and align_mode 1
    src = dst * in / out; nearest takes int(dst * in / out) (PyTorch's mode="nearest").
    AttrError when neither out_shape nor scale is given or for actual_shape (a run-time size).

    >>> x = nf.data("x", [-1, 3, 8, 8])
    >>> nf.layers.image_resize(x, out_shape=[16, 12]).shape
    (-1, 3, 16, 12)
    """
    return _resize(
        "image_resize",
        input,
        out_shape,
        scale,
        resample,
        align_corners,
        align_mode,
        data_format,
        actual_shape,
        name,
    )


def interpolate(
    input: VarDesc,
    out_shape: Sequence[int] | None = None,
    scale: float | None = None,
    name: str | None = None,
    resample: str = "BILINEAR",
    actual_shape: Any = None,
    align_corners: bool = True,
    align_mode: int = 1,
    data_format: str = "NCHW",
) -> VarDesc:
    """The same layer as image_resize (Fluid's other name for it): input resized to out_shape
    or by scale with resample "BILINEAR" or "NEAREST".

    >>> x = nf.data("x", [-1, 3, 8, 8])
    >>> nf.layers.interpolate(x, scale=2.0, resample="NEAREST", align_corners=False).shape
    (-1, 3, 16, 16)
    """
    return _resize(
        "interpolate",
        input,
        out_shape,
        scale,
        resample,
        align_corners,
        align_mode,
        data_format,
        actual_shape,
        name,
    )


def resize_bilinear(
    input: VarDesc,
    out_shape: Sequence[int] | None = None,
    scale: float | None = None,
    name: str | None = None,
    actual_shape: Any = None,
    align_corners: bool = True,
    align_mode: int = 1,
    data_format: str = "NCHW",
) -> VarDesc:
    """image_resize with resample "BILINEAR" (Fluid's bilinear_interp op).

    >>> x = nf.data("x", [-1, 3, 5, 5])
    >>> nf.layers.resize_bilinear(x, out_shape=[9, 9], align_corners=False, align_mode=0).shape
    (-1, 3, 9, 9)
    """
    return _resize(
        "resize_bilinear",
        input,
        out_shape,
        scale,
        "BILINEAR",
        align_corners,
        align_mode,
        data_format,
        actual_shape,
        name,
    )


def resize_nearest(
    input: VarDesc,
    out_shape: Sequence[int] | None = None,
    scale: float | None = None,
    name: str | None = None,
    actual_shape: Any = None,
    align_corners: bool = True,
    data_format: str = "NCHW",
) -> VarDesc:
    """image_resize with resample "NEAREST" (Fluid's nearest_interp op).

    >>> x = nf.data("x", [-1, 3, 5, 5])
    >>> nf.layers.resize_nearest(x, scale=2.0).shape
    (-1, 3, 10, 10)
    """
    return _resize(
        "resize_nearest",
        input,
        out_shape,
        scale,
        "NEAREST",
        align_corners,
        1,
        data_format,
        actual_shape,
        name,
    )


def pixel_shuffle(x: VarDesc, upscale_factor: int) -> VarDesc:
    """x [N, C * r * r, H, W] rearranged to [N, C, H * r, W * r], r = upscale_factor (the
    sub-pixel convolution's shuffle; PyTorch's F.pixel_shuffle). ShapeError when the channels
    do not divide by r * r; AttrError for r < 1.

    >>> x = nf.data("x", [-1, 12, 4, 4])
    >>> nf.layers.pixel_shuffle(x, 2).shape
    (-1, 3, 8, 8)
    """
    r = _located(as_int, upscale_factor, "pixel_shuffle", "upscale_factor")
    return append_op("pixel_shuffle", {"X": x}, {"upscale_factor": r}, name="pixel_shuffle")
