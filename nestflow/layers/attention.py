"""Attention layers: multi_head_attention (PyTorch's nn.MultiheadAttention math, batch first).

The heads run in one scaled_dot_product_attention op (nestflow/ops/attention.py); the layer adds
the projections, the head split and merge, and the masks.
"""

from __future__ import annotations

from typing import Any

from nestflow.errors import AttrError, DTypeError, ShapeError
from nestflow.framework import unique_name
from nestflow.framework.program import VarDesc
from nestflow.layers.helper import (
    append_op,
    as_float,
    as_int,
    layer_error,
    require_float_input,
)
from nestflow.layers.initializer import ParamAttr
from nestflow.layers.nn import elementwise_add, fc, fill_constant, split

__all__ = ["multi_head_attention"]

_LAYER = "multi_head_attention"


def part_attr(attr: Any, prefix: str, part: str, kind: str) -> Any:
    """The ParamAttr of one parameter of a composite layer: the user's attr (initializer,
    trainable, regularizer) named `<attr name or prefix>.<part>.<kind>`; False stays False."""
    spec = ParamAttr.of(attr)
    if spec is None:
        return False
    return ParamAttr(
        name=f"{spec.name or prefix}.{part}.{kind}",
        initializer=spec.initializer,
        trainable=spec.trainable,
        regularizer=spec.regularizer,
    )


def _split_heads(x: VarDesc, heads: int, size: int) -> VarDesc:
    """[B, T, heads * size] -> [B, heads, T, size]."""
    x = append_op("reshape", {"X": x}, {"shape": [0, 0, heads, size]})
    return append_op("transpose", {"X": x}, {"axis": [0, 2, 1, 3]})


def _additive(mask: VarDesc, dtype: str) -> VarDesc:
    """A bool mask (True: masked) as 0 / -inf of `dtype`; a float mask as it is."""
    if mask.dtype == "bool":
        return append_op(
            "where",
            {
                "Condition": mask,
                "X": fill_constant([1], dtype, float("-inf")),
                "Y": fill_constant([1], dtype, 0.0),
            },
            stop_gradient=True,
        )
    if mask.dtype != dtype:
        raise layer_error(
            DTypeError,
            _LAYER,
            f"attn_mask '{mask.name}' is {mask.dtype}; it must be bool (True: masked) or the "
            f"queries' {dtype} (added to the scores)",
        )
    return mask


def _padding_mask(lengths: VarDesc, keys: VarDesc) -> VarDesc:
    """[B, 1, 1, Tk]: 0 for the first lengths[b] keys of row b, -inf after."""
    if lengths.dtype not in ("int32", "int64"):
        raise layer_error(
            DTypeError,
            _LAYER,
            f"key_padding_lengths '{lengths.name}' must be int32 or int64, got {lengths.dtype}",
        )
    steps = keys.shape[1]
    inputs: dict[str, Any] = {"X": lengths}
    attrs: dict[str, Any] = {"out_dtype": "bool", "maxlen": steps}
    if steps < 0:  # Tk known only when the program runs: read it from keys' shape
        shape = append_op("shape", {"Input": keys}, stop_gradient=True)
        inputs["MaxLenTensor"] = append_op(
            "slice",
            {"Input": shape},
            {"axes": [0], "starts": [1], "ends": [2]},
            stop_gradient=True,
        )
        attrs["maxlen"] = -1
    valid = append_op("sequence_mask", inputs, attrs, outputs=("Y",), stop_gradient=True)
    additive = append_op(
        "where",
        {
            "Condition": valid,
            "X": fill_constant([1], keys.dtype, 0.0),
            "Y": fill_constant([1], keys.dtype, float("-inf")),
        },
        stop_gradient=True,
    )
    out, _ = append_op("unsqueeze2", {"X": additive}, {"axes": [1, 2]}, outputs=("Out", "XShape"))
    return out


def _add_masks(a: VarDesc, b: VarDesc) -> VarDesc:
    """a + b broadcast both ways (the one of higher rank goes first, as elementwise_add
    aligns Y to X)."""
    x, y = (a, b) if a.ndim >= b.ndim else (b, a)
    return elementwise_add(x, y)


def multi_head_attention(
    queries: VarDesc,
    keys: VarDesc,
    values: VarDesc,
    num_heads: int,
    d_key: int | None = None,
    d_value: int | None = None,
    dropout_rate: float = 0.0,
    attn_mask: VarDesc | None = None,
    key_padding_lengths: VarDesc | None = None,
    causal: bool = False,
    param_attr: Any = None,
    bias_attr: Any = None,
    name: str | None = None,
) -> VarDesc:
    """Multi-head attention of `queries` [B, Tq, E] over `keys` [B, Tk, Ek] and `values`
    [B, Tk, Ev] (float, batch first), PyTorch's nn.MultiheadAttention: in-projections to
    `num_heads` heads of `d_key` (queries, keys) and `d_value` (values) features (default
    E / num_heads each), scaled dot-product attention per head (scale 1/sqrt(d_key)), heads
    concatenated, out-projection back to E. Returns [B, Tq, E].

    Masks, all optional and combined: `attn_mask` broadcastable to [B, num_heads, Tq, Tk]
    (e.g. [Tq, Tk]; PyTorch's 3-D [B * num_heads, Tq, Tk] reshaped to 4-D), bool (True:
    masked, as PyTorch) or float (added to the scores); `key_padding_lengths` (int [B]) masks
    the keys from lengths[b] on; `causal` masks key j > query i. A query whose keys are all
    masked gets zeros (PyTorch gives NaN). `dropout_rate` drops attention probabilities in
    training (off when the program is cloned for test).

    Parameters (W in [in, out] layout, the transpose of PyTorch's): for self-attention
    (queries, keys and values the same variable) one `<name>.in_proj.w` [E, 2*H*d_key +
    H*d_value] and `.b` (PyTorch's in_proj_weight.T and in_proj_bias); otherwise
    `<name>.q_proj.w`, `<name>.k_proj.w`, `<name>.v_proj.w` and biases; then
    `<name>.out_proj.w` [H*d_value, E] and `.b`. A named `param_attr` / `bias_attr` names
    them `<its name>.<part>.w` / `.b`; bias_attr=False drops the biases.

    Raises ShapeError for inputs not [B, T, features] with known features or E not divisible
    by num_heads, AttrError for num_heads < 1 or dropout_rate outside [0, 1), DTypeError for
    non-float inputs or a mask of another dtype.

    >>> x = nf.data("x", [-1, 5, 8])
    >>> out = nf.layers.multi_head_attention(x, x, x, num_heads=2, causal=True, name="mha")
    >>> out.shape
    (-1, 5, 8)
    >>> sorted(p.name for p in nf.default_main_program().all_parameters())
    ['mha.in_proj.b', 'mha.in_proj.w', 'mha.out_proj.b', 'mha.out_proj.w']
    >>> exe = nf.Executor()
    >>> _ = exe.run(nf.default_startup_program())
    >>> exe.run(feed={"x": np.ones((2, 5, 8), "float32")}, fetch_list=[out])[0].shape
    (2, 5, 8)
    """
    heads = as_int(num_heads, f"{_LAYER}: num_heads")
    if heads < 1:
        raise layer_error(AttrError, _LAYER, f"num_heads must be >= 1, got {num_heads}")
    rate = as_float(dropout_rate, f"{_LAYER}: dropout_rate")
    if not 0.0 <= rate < 1.0:
        raise layer_error(AttrError, _LAYER, f"dropout_rate must be in [0, 1), got {rate}")
    for what, var in (("queries", queries), ("keys", keys), ("values", values)):
        if not isinstance(var, VarDesc):
            raise layer_error(
                DTypeError, _LAYER, f"{what} must be a variable, got {type(var).__name__}"
            )
        require_float_input(var, _LAYER)
        if var.ndim != 3 or var.shape[-1] < 0:
            raise layer_error(
                ShapeError,
                _LAYER,
                f"{what} '{var.name}' {list(var.shape)} must be [batch, time, features] with "
                "known features",
            )
    embed = queries.shape[-1]
    if (d_key is None or d_value is None) and embed % heads:
        raise layer_error(
            ShapeError,
            _LAYER,
            f"queries' {embed} features do not split into num_heads={heads} heads; give "
            "d_key and d_value",
        )
    dk = embed // heads if d_key is None else as_int(d_key, f"{_LAYER}: d_key")
    dv = embed // heads if d_value is None else as_int(d_value, f"{_LAYER}: d_value")
    prefix = name or unique_name.generate(_LAYER)

    def project(x: VarDesc, size: int, part: str) -> VarDesc:
        w = part_attr(param_attr, prefix, part, "w")
        b = part_attr(bias_attr, prefix, part, "b")
        return fc(x, size, param_attr=w, bias_attr=b, num_flatten_dims=2, name=f"{prefix}.{part}")

    if queries is keys and keys is values:
        qkv = project(queries, 2 * heads * dk + heads * dv, "in_proj")
        q, k, v = split(qkv, [heads * dk, heads * dk, heads * dv], dim=2)
    else:
        q = project(queries, heads * dk, "q_proj")
        k = project(keys, heads * dk, "k_proj")
        v = project(values, heads * dv, "v_proj")
    q, k, v = _split_heads(q, heads, dk), _split_heads(k, heads, dk), _split_heads(v, heads, dv)

    mask = None if attn_mask is None else _additive(attn_mask, queries.dtype)
    if key_padding_lengths is not None:
        padding = _padding_mask(key_padding_lengths, keys)
        mask = padding if mask is None else _add_masks(mask, padding)
    inputs = {"Q": q, "K": k, "V": v}
    if mask is not None:
        inputs["Mask"] = mask
    attrs = {"causal": bool(causal), "dropout_rate": rate}
    outputs = ("Out", "Softmax", "DropoutMask") if rate > 0 else ("Out", "Softmax")
    attended = append_op("scaled_dot_product_attention", inputs, attrs, outputs, name=prefix)[0]
    merged = append_op("transpose", {"X": attended}, {"axis": [0, 2, 1, 3]})
    merged = append_op("reshape", {"X": merged}, {"shape": [0, 0, heads * dv]})
    return project(merged, embed, "out_proj")
