"""Composite networks (Fluid's nets): simple_img_conv_pool."""

from __future__ import annotations

from typing import Any

from nestflow import layers
from nestflow.framework.program import VarDesc

__all__ = ["simple_img_conv_pool"]


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
