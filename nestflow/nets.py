"""Composite networks (Fluid's nets): simple_img_conv_pool, img_conv_group,
sequence_conv_pool."""

from __future__ import annotations

from typing import Any

from nestflow import layers
from nestflow.errors import AttrError
from nestflow.framework.program import VarDesc

__all__ = ["img_conv_group", "sequence_conv_pool", "simple_img_conv_pool"]


def simple_img_conv_pool(
    input: VarDesc,
    num_filters: int,
    filter_size: int | list[int],
    pool_size: int | list[int],
    pool_stride: int | list[int],
    pool_padding: int | list[int] = 0,
    pool_type: str = "max",
    global_pooling: bool = False,
    conv_stride: int | list[int] = 1,
    conv_padding: int | list[int] = 0,
    conv_dilation: int | list[int] = 1,
    conv_groups: int = 1,
    param_attr: Any = None,
    bias_attr: Any = None,
    act: str | None = None,
    use_cudnn: bool = True,
) -> VarDesc:
    """pool2d(conv2d(input)): a convolution (with its bias and activation `act`) followed by
    a pooling, as Fluid 1.8's `nets.simple_img_conv_pool`. `input` is NCHW float; the
    result is [N, num_filters, H', W'] with H' and W' as conv2d then pool2d make them.
    `use_cudnn` is accepted for Fluid programs and passed on (nestflow has one CPU kernel).
    Bad arguments raise what conv2d and pool2d raise.

    >>> img = nf.data("img", [-1, 1, 8, 8])
    >>> nf.nets.simple_img_conv_pool(img, 4, 3, pool_size=2, pool_stride=2, conv_padding=1).shape
    (-1, 4, 4, 4)
    """
    conv_out = layers.conv2d(
        input=input,
        num_filters=num_filters,
        filter_size=filter_size,
        stride=conv_stride,
        padding=conv_padding,
        dilation=conv_dilation,
        groups=conv_groups,
        param_attr=param_attr,
        bias_attr=bias_attr,
        act=act,
        use_cudnn=use_cudnn,
    )
    return layers.pool2d(
        input=conv_out,
        pool_size=pool_size,
        pool_type=pool_type,
        pool_stride=pool_stride,
        pool_padding=pool_padding,
        global_pooling=global_pooling,
        use_cudnn=use_cudnn,
    )


def img_conv_group(
    input: VarDesc,
    conv_num_filter: list[int] | tuple[int, ...],
    pool_size: int | list[int],
    conv_padding: Any = 1,
    conv_filter_size: Any = 3,
    conv_act: str | None = None,
    param_attr: Any = None,
    conv_with_batchnorm: Any = False,
    conv_batchnorm_drop_rate: Any = 0.0,
    pool_stride: int | list[int] = 1,
    pool_type: str = "max",
    use_cudnn: bool = True,
) -> VarDesc:
    """A VGG block, as Fluid 1.8's `nets.img_conv_group`: one conv2d per entry of
    `conv_num_filter` (each through `conv_act`, or through batch_norm with `conv_act` and then
    dropout of `conv_batchnorm_drop_rate` where `conv_with_batchnorm`), then one pool2d.
    `conv_padding`, `conv_filter_size`, `param_attr`, `conv_with_batchnorm` and
    `conv_batchnorm_drop_rate` are one value for every conv or a list with one per conv.

    >>> img = nf.data("img", [-1, 3, 8, 8])
    >>> nf.nets.img_conv_group(img, [8, 8], pool_size=2, pool_stride=2, conv_act="relu",
    ...                        conv_with_batchnorm=True, conv_batchnorm_drop_rate=[0.3, 0]).shape
    (-1, 8, 4, 4)
    """
    if not isinstance(conv_num_filter, (list, tuple)) or not conv_num_filter:
        raise AttrError(
            f"img_conv_group: conv_num_filter must be a non-empty list of filter counts (one "
            f"conv each), got {conv_num_filter!r}"
        )
    count = len(conv_num_filter)

    def per_conv(value: Any, what: str) -> list:
        if not isinstance(value, (list, tuple)):
            return [value] * count
        if len(value) != count:
            raise AttrError(
                f"img_conv_group: {what} has {len(value)} entries but conv_num_filter has "
                f"{count} convs"
            )
        return list(value)

    paddings = per_conv(conv_padding, "conv_padding")
    sizes = per_conv(conv_filter_size, "conv_filter_size")
    attrs = per_conv(param_attr, "param_attr")
    with_bn = per_conv(conv_with_batchnorm, "conv_with_batchnorm")
    drop_rates = per_conv(conv_batchnorm_drop_rate, "conv_batchnorm_drop_rate")
    out = input
    for i, filters in enumerate(conv_num_filter):
        out = layers.conv2d(
            input=out,
            num_filters=filters,
            filter_size=sizes[i],
            padding=paddings[i],
            param_attr=attrs[i],
            act=None if with_bn[i] else conv_act,
            use_cudnn=use_cudnn,
        )
        if with_bn[i]:
            out = layers.batch_norm(input=out, act=conv_act)
            if abs(drop_rates[i]) > 1e-5:
                out = layers.dropout(x=out, dropout_prob=drop_rates[i])
    return layers.pool2d(
        input=out,
        pool_size=pool_size,
        pool_type=pool_type,
        pool_stride=pool_stride,
        use_cudnn=use_cudnn,
    )


def sequence_conv_pool(
    input: VarDesc,
    num_filters: int,
    filter_size: int,
    param_attr: Any = None,
    act: str = "sigmoid",
    pool_type: str = "max",
    bias_attr: Any = None,
    lengths: VarDesc | None = None,
) -> VarDesc:
    """sequence_pool(sequence_conv(input)), as Fluid 1.8's `nets.sequence_conv_pool`: a
    convolution along time of the padded `input` [N, T, D] (`num_filters` filters of
    `filter_size` steps, through `act`) pooled over each row's first `lengths[n]` steps by
    `pool_type` ("max", "average", "sum", ...): [N, num_filters].

    >>> words = nf.data("words", [-1, 7, 16]); n = nf.data("n", [-1], "int64")
    >>> nf.nets.sequence_conv_pool(words, num_filters=32, filter_size=3, lengths=n).shape
    (-1, 32)
    """
    conv = layers.sequence_conv(
        input=input,
        num_filters=num_filters,
        filter_size=filter_size,
        param_attr=param_attr,
        bias_attr=bias_attr,
        act=act,
        lengths=lengths,
    )
    return layers.sequence_pool(conv, pool_type, lengths)
