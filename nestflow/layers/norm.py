"""Normalisation layers: batch_norm, layer_norm (Fluid 1.8's arguments and defaults)."""

from __future__ import annotations

import math
from typing import Any

from nestflow.errors import AttrError, ShapeError
from nestflow.framework import unique_name
from nestflow.framework.program import VarDesc
from nestflow.layers.helper import (
    as_float,
    as_int,
    create_parameter,
    current_block,
    layer_error,
    parameter_from_attr,
    require_float_input,
)
from nestflow.layers.initializer import Constant
from nestflow.layers.nn import activation

__all__ = ["batch_norm", "group_norm", "instance_norm", "layer_norm"]


def _append(op_type: str, prefix: str, inputs: dict, outputs: dict, attrs: dict) -> VarDesc:
    """Append the op writing its Y and temporaries (fresh variables) and the given outputs;
    if it is rejected no fresh variable is left behind. Returns Y."""
    block = current_block()
    fresh = {}
    for slot in ("Y", *(s for s, v in outputs.items() if v is None)):
        stop = slot != "Y"  # statistics of the batch: no gradient flows through them
        fresh[slot] = block.create_var(unique_name.generate(f"{prefix}.tmp"), stop_gradient=stop)
    try:
        block.append_op(op_type, inputs=inputs, outputs={**outputs, **fresh}, attrs=attrs)
    except BaseException:
        for var in fresh.values():
            block.remove_var(var.name)
        raise
    return fresh["Y"]


def batch_norm(
    input: VarDesc,
    act: str | None = None,
    is_test: bool = False,
    momentum: float | VarDesc = 0.9,
    epsilon: float = 1e-5,
    param_attr: Any = None,
    bias_attr: Any = None,
    data_layout: str = "NCHW",
    in_place: bool = False,
    name: str | None = None,
    moving_mean_name: str | None = None,
    moving_variance_name: str | None = None,
    do_model_average_for_mean_and_var: bool = True,
    use_global_stats: bool = False,
) -> VarDesc:
    """act(batch normalisation of `input`) per channel: dim 1 for NCHW, the last for NHWC;
    `input` of rank 2 to 5 ([N, C] for a fully connected layer), floating point.

    Makes the parameters `<name>.w` (scale, ones) and `<name>.b` (shift, zeros) and the
    running statistics `<name>.mean` (zeros) and `<name>.variance` (ones), or
    moving_mean_name / moving_variance_name: persistable, initialised by the startup program
    and saved with the parameters, but not trainable (no gradient, no optimizer update). In
    training (is_test False) the batch's statistics normalise and the running ones move,
    `running = momentum * running + (1 - momentum) * batch` (the variance biased, as Fluid);
    with is_test or use_global_stats the running ones normalise. `Program.clone(for_test=True)`
    sets is_test. `momentum` may be a one-element variable. `in_place` is accepted for Fluid
    programs; the output is always a new variable (the executor reuses buffers itself).
    `do_model_average_for_mean_and_var` has no effect (nestflow has no ModelAverage).
    Raises DTypeError for a non-float input, ShapeError for a wrong rank or unknown channels.

    >>> x = nf.data("x", [-1, 3, 8, 8])
    >>> nf.layers.batch_norm(x, act="relu").shape
    (-1, 3, 8, 8)
    """
    prefix = name or unique_name.generate("batch_norm")
    require_float_input(input, "batch_norm")
    if data_layout not in ("NCHW", "NHWC"):
        raise layer_error(
            AttrError, "batch_norm", f"data_layout must be 'NCHW' or 'NHWC', got {data_layout!r}"
        )
    if not 2 <= input.ndim <= 5:
        raise layer_error(
            ShapeError,
            "batch_norm",
            f"input '{input.name}' {list(input.shape)} has rank {input.ndim}; batch_norm takes "
            "rank 2 to 5 ([N, C] or [N, C, ...] for NCHW)",
        )
    axis = 1 if data_layout == "NCHW" else input.ndim - 1
    channels = input.shape[axis]
    if channels <= 0:
        raise layer_error(
            ShapeError,
            "batch_norm",
            f"input '{input.name}' {list(input.shape)} needs a known channel count in dim "
            f"{axis} ({data_layout})",
        )
    dtype = input.dtype
    shape = [channels]
    scale = parameter_from_attr(param_attr, shape, dtype, f"{prefix}.w", Constant(1.0))
    bias = parameter_from_attr(bias_attr, shape, dtype, f"{prefix}.b", Constant(0.0))
    if scale is None or bias is None:
        raise layer_error(
            AttrError, "batch_norm", "param_attr and bias_attr cannot be False: the op needs both"
        )
    running = []
    for given, what, value in (
        (moving_mean_name, "mean", 0.0),
        (moving_variance_name, "variance", 1.0),
    ):
        stat = create_parameter(
            shape,
            dtype,
            name=given or f"{prefix}.{what}",
            initializer=Constant(value),
            trainable=False,
        )
        stat.stop_gradient = True
        running.append(stat)
    mean, variance = running
    inputs = {"X": input, "Scale": scale, "Bias": bias, "Mean": mean, "Variance": variance}
    attrs = {
        "epsilon": as_float(epsilon, "batch_norm: epsilon"),
        "is_test": bool(is_test),
        "data_layout": data_layout,
        "use_global_stats": bool(use_global_stats),
    }
    if isinstance(momentum, VarDesc):
        inputs["MomentumTensor"] = momentum
    else:
        attrs["momentum"] = as_float(momentum, "batch_norm: momentum")
    outputs = {"MeanOut": mean, "VarianceOut": variance, "SavedMean": None, "SavedVariance": None}
    out = _append("batch_norm", prefix, inputs, outputs, attrs)
    return activation(out, act)


def layer_norm(
    input: VarDesc,
    scale: bool = True,
    shift: bool = True,
    begin_norm_axis: int = 1,
    epsilon: float = 1e-5,
    param_attr: Any = None,
    bias_attr: Any = None,
    act: str | None = None,
    name: str | None = None,
) -> VarDesc:
    """act(layer normalisation of `input`): each row of `input` flattened to 2-D at
    `begin_norm_axis` (in [1, rank)) is normalised by its own mean and (biased) variance, then
    scaled by `<name>.w` (ones) if `scale` and shifted by `<name>.b` (zeros) if `shift`, both of
    the size of a row. Raises DTypeError for a non-float input and ShapeError for a
    begin_norm_axis out of range or unknown dims from it on.

    >>> x = nf.data("x", [-1, 4, 6])
    >>> nf.layers.layer_norm(x, begin_norm_axis=2).shape
    (-1, 4, 6)
    """
    prefix = name or unique_name.generate("layer_norm")
    require_float_input(input, "layer_norm")
    if isinstance(begin_norm_axis, bool) or not isinstance(begin_norm_axis, int):
        raise layer_error(
            AttrError, "layer_norm", f"begin_norm_axis must be an int, got {begin_norm_axis!r}"
        )
    if not 1 <= begin_norm_axis < input.ndim:
        raise layer_error(
            ShapeError,
            "layer_norm",
            f"begin_norm_axis={begin_norm_axis} is out of range for input '{input.name}' "
            f"{list(input.shape)}: it must lie in [1, {input.ndim})",
        )
    row = input.shape[begin_norm_axis:]
    if any(d < 0 for d in row):
        raise layer_error(
            ShapeError,
            "layer_norm",
            f"input '{input.name}' {list(input.shape)} needs known dims from dim "
            f"{begin_norm_axis} on (the normalised row)",
        )
    shape = [math.prod(row)]
    inputs = {"X": input}
    for wanted, attr, slot, suffix, value in (
        (scale, param_attr, "Scale", "w", 1.0),
        (shift, bias_attr, "Bias", "b", 0.0),
    ):
        if not wanted:
            continue
        if attr is False:
            raise layer_error(
                AttrError,
                "layer_norm",
                f"{'param_attr' if slot == 'Scale' else 'bias_attr'} is False but "
                f"{'scale' if slot == 'Scale' else 'shift'}=True needs the parameter",
            )
        default = Constant(value)
        inputs[slot] = parameter_from_attr(attr, shape, input.dtype, f"{prefix}.{suffix}", default)
    attrs = {
        "epsilon": as_float(epsilon, "layer_norm: epsilon"),
        "begin_norm_axis": begin_norm_axis,
    }
    out = _append("layer_norm", prefix, inputs, {"Mean": None, "Variance": None}, attrs)
    return activation(out, act)


def _channel_params(input, channels, param_attr, bias_attr, prefix) -> dict:
    """Scale `<prefix>.w` (ones) and Bias `<prefix>.b` (zeros) [channels], each left out when
    its attr is False (Fluid's group_norm/instance_norm)."""
    inputs = {"X": input}
    for attr, slot, suffix, value in (
        (param_attr, "Scale", "w", 1.0),
        (bias_attr, "Bias", "b", 0.0),
    ):
        param = parameter_from_attr(
            attr, [channels], input.dtype, f"{prefix}.{suffix}", Constant(value)
        )
        if param is not None:
            inputs[slot] = param
    return inputs


def _known_channels(layer: str, input: VarDesc, axis: int) -> int:
    require_float_input(input, layer)
    if input.ndim < 3 or input.shape[axis] < 1:
        raise layer_error(
            ShapeError,
            layer,
            f"input '{input.name}' {list(input.shape)} must be [N, C, ...] (rank >= 3) with the "
            "channels known",
        )
    return input.shape[axis]


def group_norm(
    input: VarDesc,
    groups: int,
    epsilon: float = 1e-5,
    param_attr: Any = None,
    bias_attr: Any = None,
    act: str | None = None,
    data_layout: str = "NCHW",
    name: str | None = None,
) -> VarDesc:
    """act(group normalisation of `input` [N, C, ...]): the C channels split into `groups`
    groups, each (sample, group) normalised by its own mean and biased variance, then scaled by
    `<name>.w` [C] (ones) and shifted by `<name>.b` [C] (zeros), each left out when its attr is
    False. data_layout "NHWC" for channel-last input. ShapeError when C does not divide by
    groups; DTypeError for a non-float input.

    >>> x = nf.data("x", [-1, 8, 5, 5])
    >>> nf.layers.group_norm(x, groups=4).shape
    (-1, 8, 5, 5)
    """
    layer = "group_norm"
    if data_layout not in ("NCHW", "NHWC"):
        raise layer_error(
            AttrError, layer, f"data_layout must be 'NCHW' or 'NHWC', got {data_layout!r}"
        )
    channels = _known_channels(layer, input, -1 if data_layout == "NHWC" else 1)
    groups = as_int(groups, "group_norm: groups")
    if groups < 1 or channels % groups:
        raise layer_error(
            ShapeError,
            layer,
            f"the {channels} channels of input '{input.name}' {list(input.shape)} do not divide "
            f"into groups={groups}",
        )
    prefix = name or unique_name.generate(layer)
    inputs = _channel_params(input, channels, param_attr, bias_attr, prefix)
    attrs = {
        "epsilon": as_float(epsilon, "group_norm: epsilon"),
        "groups": groups,
        "data_layout": data_layout,
    }
    out = _append(layer, prefix, inputs, {"Mean": None, "Variance": None}, attrs)
    return activation(out, act)


def instance_norm(
    input: VarDesc,
    epsilon: float = 1e-5,
    param_attr: Any = None,
    bias_attr: Any = None,
    name: str | None = None,
) -> VarDesc:
    """Instance normalisation of `input` [N, C, ...]: each (sample, channel) normalised over
    its spatial positions by its own mean and biased variance, then scaled by `<name>.w` [C]
    (ones) and shifted by `<name>.b` [C] (zeros), each left out when its attr is False.
    DTypeError for a non-float input; ShapeError for a rank below 3.

    >>> x = nf.data("x", [-1, 3, 8, 8])
    >>> nf.layers.instance_norm(x).shape
    (-1, 3, 8, 8)
    """
    layer = "instance_norm"
    channels = _known_channels(layer, input, 1)
    prefix = name or unique_name.generate(layer)
    inputs = _channel_params(input, channels, param_attr, bias_attr, prefix)
    attrs = {"epsilon": as_float(epsilon, "instance_norm: epsilon")}
    return _append(layer, prefix, inputs, {"SavedMean": None, "SavedVariance": None}, attrs)
