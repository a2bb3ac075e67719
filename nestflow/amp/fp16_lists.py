"""The op lists of automatic mixed precision (Fluid 1.8's contrib.mixed_precision.fp16_lists).

White ops (the matrix products) run in the low dtype, black ops (exp, log, softmax, the losses,
mean and sum: the ones that overflow or lose precision in it) in float32, gray ops in the low
dtype when an input already is low and in float32 otherwise. Any other op runs in float32.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable

from nestflow.errors import AttrError

white_list = {"conv2d", "matmul", "mul"}

black_list = {
    "exp",
    "square",
    "log",
    "mean",
    "sum",
    "cos_sim",
    "softmax",
    "softmax_with_cross_entropy",
    "sigmoid_cross_entropy_with_logits",
    "cross_entropy",
    "cross_entropy2",
}

gray_list = {
    "elementwise_add",
    "elementwise_sub",
    "elementwise_mul",
    "elementwise_div",
    "elementwise_max",
    "elementwise_min",
    "elementwise_pow",
    "elementwise_mod",
    "elementwise_floordiv",
    "batch_norm",
    "layer_norm",
    "tanh",
    "sigmoid",
    "lookup_table",
    "top_k",
    "pool2d",
    "pool3d",
    "dropout",
    "relu",
    "relu6",
    "leaky_relu",
    "soft_relu",
    "flatten2",
    "stack",
    "unstack",
    "uniform_random_batch_size_like",
    "gaussian_random",
    "gaussian_random_batch_size_like",
    "slice",
    "rank",
    "scale",
    "transpose2",
    "reshape2",
    "gather",
    "fill_constant",
    "get_tensor_from_selected_rows",
    "sign",
    "cast",
    "fused_bn_add_activation",
}

# Ops with no low-precision kernel: none here (every kernel takes float16 and bfloat16).
unsupported_fp16_list: set[str] = set()


class AutoMixedPrecisionLists:
    """The white, black and gray op lists `nf.amp.decorate` rewrites a program by, with
    `custom_white_list` ops moved to the white list, `custom_black_list` ops to the black list,
    and the ops reading a variable of `custom_black_varnames` run in float32. An op in both
    custom lists is an AttrError.

    >>> lists = nf.amp.AutoMixedPrecisionLists(custom_white_list={"tanh"},
    ...                                        custom_black_list={"conv2d"})
    >>> "tanh" in lists.white_list, "conv2d" in lists.black_list, "conv2d" in lists.white_list
    (True, True, False)
    """

    def __init__(
        self,
        custom_white_list: Iterable[str] | None = None,
        custom_black_list: Iterable[str] | None = None,
        custom_black_varnames: Iterable[str] | None = None,
    ):
        self._custom_white_list = set(custom_white_list or ())
        self._custom_black_list = set(custom_black_list or ())
        self.white_list = copy.copy(white_list)
        self.black_list = copy.copy(black_list)
        self.gray_list = copy.copy(gray_list)
        self.unsupported_list = copy.copy(unsupported_fp16_list)
        self.black_varnames = set(custom_black_varnames or ())
        both = sorted(self._custom_white_list & self._custom_black_list)
        if both:
            raise AttrError(
                f"AutoMixedPrecisionLists: {both} in both custom_white_list and "
                "custom_black_list; an op runs in one precision"
            )
        for op_type in self._custom_white_list:
            self.black_list.discard(op_type)
            self.gray_list.discard(op_type)
            self.white_list.add(op_type)
        for op_type in self._custom_black_list:
            self.white_list.discard(op_type)
            self.gray_list.discard(op_type)
            self.black_list.add(op_type)
