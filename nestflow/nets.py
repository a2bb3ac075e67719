"""Composite networks (Fluid's nets): simple_img_conv_pool, img_conv_group,
sequence_conv_pool; and Transformer layers (PyTorch's): transformer_encoder_layer,
transformer_decoder_layer, transformer_encoder."""

from __future__ import annotations

from typing import Any

from nestflow import layers
from nestflow.errors import AttrError, ShapeError
from nestflow.framework import unique_name
from nestflow.framework.program import VarDesc
from nestflow.layers.attention import part_attr
from nestflow.layers.helper import append_op, layer_error
from nestflow.ops.registry import get_op_def

__all__ = [
    "img_conv_group",
    "sequence_conv_pool",
    "simple_img_conv_pool",
    "transformer_decoder_layer",
    "transformer_encoder",
    "transformer_encoder_layer",
]


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


# ---- Transformer layers (PyTorch's nn.TransformerEncoderLayer / DecoderLayer, batch first) ----


def _dropout(x: VarDesc, rate: float) -> VarDesc:
    """Upscale-in-train dropout (PyTorch's), nothing at all when rate is 0."""
    if rate == 0.0:
        return x
    attrs: dict[str, Any] = {"dropout_prob": rate, "is_test": False, "seed": 0}
    if "dropout_implementation" in get_op_def("dropout").attrs:
        attrs["dropout_implementation"] = "upscale_in_train"
    out, _mask = append_op("dropout", {"X": x}, attrs, outputs=("Out", "Mask"))
    return out


def _layer_norm(x: VarDesc, eps: float, prefix: str, part: str) -> VarDesc:
    return layers.layer_norm(x, begin_norm_axis=2, epsilon=eps, name=f"{prefix}.{part}")


def _feed_forward(
    x, dim_feedforward, dropout, activation, param_attr, bias_attr, prefix
) -> VarDesc:
    d_model = x.shape[-1]
    hidden = layers.fc(
        x,
        dim_feedforward,
        act=activation,
        param_attr=part_attr(param_attr, prefix, "linear1", "w"),
        bias_attr=part_attr(bias_attr, prefix, "linear1", "b"),
        num_flatten_dims=2,
        name=f"{prefix}.linear1",
    )
    return layers.fc(
        _dropout(hidden, dropout),
        d_model,
        param_attr=part_attr(param_attr, prefix, "linear2", "w"),
        bias_attr=part_attr(bias_attr, prefix, "linear2", "b"),
        num_flatten_dims=2,
        name=f"{prefix}.linear2",
    )


def _check_transformer_args(layer: str, x: VarDesc, nhead, dropout, activation) -> float:
    if activation not in ("relu", "gelu"):
        raise AttrError(f"{layer}: activation must be 'relu' or 'gelu', got {activation!r}")
    rate = float(dropout)
    if not 0.0 <= rate < 1.0:
        raise AttrError(f"{layer}: dropout must be in [0, 1), got {dropout}")
    if not isinstance(x, VarDesc) or x.ndim != 3 or x.shape[-1] < 0:
        shape = list(x.shape) if isinstance(x, VarDesc) else type(x).__name__
        raise layer_error(
            ShapeError,
            layer,
            f"the input must be [batch, time, d_model] with d_model known, got {shape}",
        )
    return rate


def transformer_encoder_layer(
    src: VarDesc,
    nhead: int,
    dim_feedforward: int = 2048,
    dropout: float = 0.1,
    activation: str = "relu",
    normalize_before: bool = False,
    src_mask: VarDesc | None = None,
    src_key_padding_lengths: VarDesc | None = None,
    causal: bool = False,
    layer_norm_eps: float = 1e-5,
    param_attr: Any = None,
    bias_attr: Any = None,
    name: str | None = None,
) -> VarDesc:
    """One Transformer encoder layer over `src` [B, T, d_model] (float), PyTorch's
    nn.TransformerEncoderLayer(batch_first=True): self-attention (`nhead` heads,
    layers.multi_head_attention with `src_mask`, `src_key_padding_lengths`, `causal`), then a
    feed-forward block linear1 (dim_feedforward) -> `activation` ("relu" or "gelu") -> linear2,
    each added to its input; `normalize_before` (PyTorch's norm_first) puts layer_norm before
    each block (pre-norm), else after each sum (post-norm). `dropout` drops the attention
    probabilities, the feed-forward hidden layer and each block's output in training (upscale
    in train; a program cloned for test keeps everything). Returns [B, T, d_model].

    Parameters, PyTorch's state_dict names with W transposed: `<name>.self_attn.in_proj.w`
    / `.b`, `<name>.self_attn.out_proj.w` / `.b`, `<name>.linear1.w` / `.b`,
    `<name>.linear2.w` / `.b`, `<name>.norm1.w` / `.b`, `<name>.norm2.w` / `.b`.
    Raises AttrError for another activation or dropout outside [0, 1), ShapeError for an input
    that is not [B, T, d_model], and what multi_head_attention raises.

    >>> src = nf.data("src", [-1, 6, 16])
    >>> out = nf.nets.transformer_encoder_layer(src, nhead=4, dim_feedforward=32, name="enc")
    >>> out.shape
    (-1, 6, 16)
    >>> exe = nf.Executor()
    >>> _ = exe.run(nf.default_startup_program())
    >>> exe.run(feed={"src": np.ones((2, 6, 16), "float32")}, fetch_list=[out])[0].shape
    (2, 6, 16)
    """
    rate = _check_transformer_args("transformer_encoder_layer", src, nhead, dropout, activation)
    prefix = name or unique_name.generate("transformer_encoder_layer")

    def attend(x):
        return layers.multi_head_attention(
            x,
            x,
            x,
            nhead,
            dropout_rate=rate,
            attn_mask=src_mask,
            key_padding_lengths=src_key_padding_lengths,
            causal=causal,
            param_attr=param_attr,
            bias_attr=bias_attr,
            name=f"{prefix}.self_attn",
        )

    def feed_forward(x):
        return _feed_forward(x, dim_feedforward, rate, activation, param_attr, bias_attr, prefix)

    x = src
    if normalize_before:
        x = x + _dropout(attend(_layer_norm(x, layer_norm_eps, prefix, "norm1")), rate)
        return x + _dropout(feed_forward(_layer_norm(x, layer_norm_eps, prefix, "norm2")), rate)
    x = _layer_norm(x + _dropout(attend(x), rate), layer_norm_eps, prefix, "norm1")
    return _layer_norm(x + _dropout(feed_forward(x), rate), layer_norm_eps, prefix, "norm2")


def transformer_decoder_layer(
    tgt: VarDesc,
    memory: VarDesc,
    nhead: int,
    dim_feedforward: int = 2048,
    dropout: float = 0.1,
    activation: str = "relu",
    normalize_before: bool = False,
    tgt_mask: VarDesc | None = None,
    memory_mask: VarDesc | None = None,
    tgt_key_padding_lengths: VarDesc | None = None,
    memory_key_padding_lengths: VarDesc | None = None,
    tgt_causal: bool = False,
    layer_norm_eps: float = 1e-5,
    param_attr: Any = None,
    bias_attr: Any = None,
    name: str | None = None,
) -> VarDesc:
    """One Transformer decoder layer, PyTorch's nn.TransformerDecoderLayer(batch_first=True):
    self-attention over `tgt` [B, T, d_model] (`tgt_mask`, `tgt_key_padding_lengths`,
    `tgt_causal` for a causal decoder), cross-attention of the result over `memory`
    [B, S, d_model] (`memory_mask`, `memory_key_padding_lengths`), then the feed-forward block;
    pre- or post-norm, dropout and activation as transformer_encoder_layer. Returns
    [B, T, d_model].

    Parameters: `<name>.self_attn.*`, `<name>.multihead_attn.q_proj.*` / `.k_proj.*` /
    `.v_proj.*` / `.out_proj.*` (PyTorch's multihead_attn.in_proj_weight split in three, each
    transposed), `<name>.linear1.*`, `<name>.linear2.*`, `<name>.norm1.*` .. `norm3.*`.
    Raises what transformer_encoder_layer raises.

    >>> tgt, memory = nf.data("tgt", [-1, 4, 8]), nf.data("memory", [-1, 6, 8])
    >>> nf.nets.transformer_decoder_layer(tgt, memory, nhead=2, dim_feedforward=16,
    ...                                   tgt_causal=True).shape
    (-1, 4, 8)
    """
    rate = _check_transformer_args("transformer_decoder_layer", tgt, nhead, dropout, activation)
    _check_transformer_args("transformer_decoder_layer", memory, nhead, dropout, activation)
    prefix = name or unique_name.generate("transformer_decoder_layer")

    def self_attend(x):
        return layers.multi_head_attention(
            x,
            x,
            x,
            nhead,
            dropout_rate=rate,
            attn_mask=tgt_mask,
            key_padding_lengths=tgt_key_padding_lengths,
            causal=tgt_causal,
            param_attr=param_attr,
            bias_attr=bias_attr,
            name=f"{prefix}.self_attn",
        )

    def cross_attend(x):
        return layers.multi_head_attention(
            x,
            memory,
            memory,
            nhead,
            dropout_rate=rate,
            attn_mask=memory_mask,
            key_padding_lengths=memory_key_padding_lengths,
            param_attr=param_attr,
            bias_attr=bias_attr,
            name=f"{prefix}.multihead_attn",
        )

    def feed_forward(x):
        return _feed_forward(x, dim_feedforward, rate, activation, param_attr, bias_attr, prefix)

    def norm(x, part):
        return _layer_norm(x, layer_norm_eps, prefix, part)

    x = tgt
    if normalize_before:
        x = x + _dropout(self_attend(norm(x, "norm1")), rate)
        x = x + _dropout(cross_attend(norm(x, "norm2")), rate)
        return x + _dropout(feed_forward(norm(x, "norm3")), rate)
    x = norm(x + _dropout(self_attend(x), rate), "norm1")
    x = norm(x + _dropout(cross_attend(x), rate), "norm2")
    return norm(x + _dropout(feed_forward(x), rate), "norm3")


def transformer_encoder(
    src: VarDesc,
    num_layers: int,
    nhead: int,
    dim_feedforward: int = 2048,
    dropout: float = 0.1,
    activation: str = "relu",
    normalize_before: bool = False,
    src_mask: VarDesc | None = None,
    src_key_padding_lengths: VarDesc | None = None,
    causal: bool = False,
    final_norm: bool = False,
    layer_norm_eps: float = 1e-5,
    param_attr: Any = None,
    bias_attr: Any = None,
    name: str | None = None,
) -> VarDesc:
    """`num_layers` transformer_encoder_layer's stacked over `src` [B, T, d_model] (PyTorch's
    nn.TransformerEncoder), layer i named `<name>.layers.<i>`; `final_norm` adds a last
    layer_norm `<name>.norm` (PyTorch's norm=, usual with pre-norm layers). The masks apply
    to every layer. Returns [B, T, d_model]; AttrError for num_layers < 1.

    >>> src = nf.data("src", [-1, 5, 8])
    >>> lengths = nf.data("lengths", [-1], "int64")
    >>> out = nf.nets.transformer_encoder(src, 2, nhead=2, dim_feedforward=16,
    ...     src_key_padding_lengths=lengths, normalize_before=True, final_norm=True, name="enc")
    >>> out.shape, nf.default_main_program().global_block().has_var("enc.layers.1.norm2.w")
    ((-1, 5, 8), True)
    """
    if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 1:
        raise AttrError(f"transformer_encoder: num_layers must be an int >= 1, got {num_layers!r}")
    prefix = name or unique_name.generate("transformer_encoder")
    x = src
    for i in range(num_layers):
        x = transformer_encoder_layer(
            x,
            nhead,
            dim_feedforward,
            dropout,
            activation,
            normalize_before,
            src_mask,
            src_key_padding_lengths,
            causal,
            layer_norm_eps,
            param_attr,
            bias_attr,
            name=f"{prefix}.layers.{i}",
        )
    return _layer_norm(x, layer_norm_eps, prefix, "norm") if final_norm else x
