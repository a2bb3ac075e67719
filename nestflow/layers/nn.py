"""The layer catalogue: each layer appends one op (or composes a few) to the current block.

Layers take and return VarDescs. Most are one line over `append_op`; `fc` composes
mul + elementwise_add + activation rather than having its own kernel.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any

from nestflow.core.dtype import dtype_name
from nestflow.errors import AttrError, ShapeError
from nestflow.framework import unique_name
from nestflow.framework.program import VarDesc
from nestflow.layers.helper import (
    append_op,
    as_float,
    as_int,
    create_parameter,
    current_block,
    literal_array,
    parameter_from_attr,
    require_float_input,
    zeros_initializer,
)
from nestflow.layers.initializer import Xavier
from nestflow.layers.tensor import reduce_mean, reduce_sum  # noqa: F401 (moved to tensor.py)
from nestflow.ops.activation import ACTIVATIONS

Number = (int, float)


def data(
    name: str,
    shape: Sequence[int],
    dtype: Any = "float32",
    append_batch_size: bool = False,
    lod_level: int = 0,
    stop_gradient: bool = True,
) -> VarDesc:
    """A variable the user feeds at run time; -1 (or None) marks a dimension of any size.

    Declared in the program's global block wherever it is called (as PaddlePaddle's
    `layers.data` does), since feeds bind there: one made inside a sub-block can still be fed.
    `append_batch_size=True` prepends a -1 batch dimension, as Fluid's `layers.data` does by
    default (nestflow's default is False: the shape is taken as given). `lod_level` is accepted
    for Fluid programs and must be 0 (sequences are padded `[batch, time, ...]` + lengths).

    >>> x = nf.data("x", [784], append_batch_size=True)
    >>> x.shape
    (-1, 784)
    """
    if lod_level != 0:
        raise AttrError(
            f"data '{name}': lod_level={lod_level}; nestflow has no LoD tensors, feed padded "
            "[batch, time, ...] arrays with an int64 lengths variable instead"
        )
    if append_batch_size:
        shape = [-1, *shape]
    if any(d is not None and not isinstance(d, numbers.Integral) for d in shape):
        raise ShapeError(
            f"data '{name}': shape {list(shape)} must hold ints (-1 or None: any size)"
        )
    shape = [-1 if d is None else int(d) for d in shape]
    block = current_block().program.global_block()
    known = block.vars.get(name)
    if known is not None and (
        list(known.shape) != shape or known.dtype != dtype_name(dtype) or known.persistable
    ):
        raise ShapeError(
            f"data '{name}' {shape} {dtype_name(dtype)}: the program already has a variable "
            f"'{name}' ({known.dtype}{list(known.shape)}"
            f"{', persistable' if known.persistable else ''}); give the data another name"
        )
    return block.create_var(name, shape, dtype, stop_gradient=bool(stop_gradient))


def fill_constant(
    shape: Sequence[int], dtype: Any = "float32", value: float = 0.0, name: str | None = None
) -> VarDesc:
    value = as_float(value, "fill_constant: value")
    attrs = {"shape": list(shape), "dtype": dtype_name(dtype), "value": value}
    return append_op("fill_constant", {}, attrs, name=name, stop_gradient=True)


def fc(
    input: VarDesc,
    size: int,
    act: str | None = None,
    param_attr: Any = None,
    bias_attr: Any = None,
    name: str | None = None,
    num_flatten_dims: int = 1,
) -> VarDesc:
    """act(flatten(input) @ W + b) with W [in_features, size] (Xavier) and b [size] (zeros).

    Parameters are named `<name>.w` and `<name>.b` (name defaults to a unique `fc_N`).
    DTypeError for an integer `input` (its parameters would be integers too).
    """
    size = as_int(size, "fc: size")
    require_float_input(input, "fc")
    prefix = name or unique_name.generate("fc")
    in_features = 1
    for d in input.shape[num_flatten_dims:]:
        if d < 0:
            raise ShapeError(
                f"fc '{prefix}': input '{input.name}' {list(input.shape)} needs known feature "
                f"dims after dim {num_flatten_dims}"
            )
        in_features *= d
    w = parameter_from_attr(param_attr, [in_features, size], input.dtype, f"{prefix}.w", Xavier())
    out = append_op("mul", {"X": input, "Y": w}, {"x_num_col_dims": num_flatten_dims}, name=prefix)
    b = parameter_from_attr(bias_attr, [size], input.dtype, f"{prefix}.b", zeros_initializer())
    if b is not None:
        out = append_op(
            "elementwise_add", {"X": out, "Y": b}, {"axis": num_flatten_dims}, name=prefix
        )
    return activation(out, act)


def activation(x: VarDesc, act: str | None) -> VarDesc:
    """x through `act`: None (x itself) or an activation op's name (relu, sigmoid, tanh,
    softmax, gelu, leaky_relu, elu, swish, softplus, ...; its attrs at their defaults).
    Another name is an AttrError listing them."""
    if act is None:
        return x
    op_type = act.lower() if isinstance(act, str) else act
    if op_type not in ACTIVATIONS:
        raise AttrError(f"act={act!r} is not an activation; act takes one of {sorted(ACTIVATIONS)}")
    return append_op(op_type, {"X": x})


def _binary(op_type: str, x: VarDesc, y: Any, axis: int = -1, name: str | None = None):
    if isinstance(y, Number):
        y = fill_constant([1], x.dtype, y)
    return append_op(op_type, {"X": x, "Y": y}, {"axis": axis}, name=name)


def elementwise_add(x, y, axis: int = -1, act: str | None = None, name=None) -> VarDesc:
    return activation(_binary("elementwise_add", x, y, axis, name), act)


def elementwise_sub(x, y, axis: int = -1, act: str | None = None, name=None) -> VarDesc:
    return activation(_binary("elementwise_sub", x, y, axis, name), act)


def elementwise_mul(x, y, axis: int = -1, act: str | None = None, name=None) -> VarDesc:
    return activation(_binary("elementwise_mul", x, y, axis, name), act)


def elementwise_div(x, y, axis: int = -1, act: str | None = None, name=None) -> VarDesc:
    return activation(_binary("elementwise_div", x, y, axis, name), act)


def add_scalar(x: VarDesc, y: Any, name=None) -> VarDesc:
    """x + y for a scalar y: a Python number, or a [1]-shaped variable broadcast over x."""
    if isinstance(y, Number):
        return scale(x, 1.0, float(y), name=name)
    return append_op("elementwise_add", {"X": x, "Y": y}, name=name)


def scale(
    x: VarDesc, scale: float = 1.0, bias: float = 0.0, bias_after_scale: bool = True, name=None
) -> VarDesc:
    attrs = {
        "scale": as_float(scale, "scale: scale"),
        "bias": as_float(bias, "scale: bias"),
        "bias_after_scale": bias_after_scale,
    }
    return append_op("scale", {"X": x}, attrs, name=name)


def matmul(
    x, y, transpose_x: bool = False, transpose_y: bool = False, alpha: float = 1.0, name=None
) -> VarDesc:
    attrs = {
        "transpose_X": transpose_x,
        "transpose_Y": transpose_y,
        "alpha": as_float(alpha, "matmul: alpha"),
    }
    return append_op("matmul", {"X": x, "Y": y}, attrs, name=name)


def mul(x, y, x_num_col_dims: int = 1, y_num_col_dims: int = 1, name=None) -> VarDesc:
    attrs = {"x_num_col_dims": x_num_col_dims, "y_num_col_dims": y_num_col_dims}
    return append_op("mul", {"X": x, "Y": y}, attrs, name=name)


def sums(inputs: Sequence[VarDesc], name=None) -> VarDesc:
    return append_op("sum", {"X": list(inputs)}, name=name)


def relu(x, name=None) -> VarDesc:
    return append_op("relu", {"X": x}, name=name)


def sigmoid(x, name=None) -> VarDesc:
    return append_op("sigmoid", {"X": x}, name=name)


def tanh(x, name=None) -> VarDesc:
    return append_op("tanh", {"X": x}, name=name)


def softmax(x, axis: int = -1, name=None) -> VarDesc:
    return append_op("softmax", {"X": x}, {"axis": axis}, name=name)


def cross_entropy(
    input, label, soft_label: bool = False, ignore_index: int = -100, name=None
) -> VarDesc:
    """-log(input[label]) per row, for probabilities `input` [N, C] and int64 labels [N, 1]."""
    attrs = {"soft_label": soft_label, "ignore_index": ignore_index}
    return append_op(
        "cross_entropy", {"X": input, "Label": label}, attrs, outputs=("Y",), name=name
    )


def softmax_with_cross_entropy(
    logits,
    label,
    soft_label: bool = False,
    axis: int = -1,
    ignore_index: int = -100,
    return_softmax: bool = False,
    name=None,
):
    """Numerically stable softmax + cross entropy on logits; loss shape [N, 1]."""
    attrs = {"soft_label": soft_label, "axis": axis, "ignore_index": ignore_index}
    softmax_out, loss = append_op(
        "softmax_with_cross_entropy",
        {"Logits": logits, "Label": label},
        attrs,
        outputs=("Softmax", "Loss"),
        name=name,
    )
    return (loss, softmax_out) if return_softmax else loss


def square(x, name=None) -> VarDesc:
    return append_op("square", {"X": x}, name=name)


def mean(x, name=None) -> VarDesc:
    """The mean of all elements, a 0-d tensor."""
    return append_op("mean", {"X": x}, name=name)


def _compare(op_type, x, y, out, name):
    if isinstance(y, Number):
        y = fill_constant([1], x.dtype, y)
    return append_op(op_type, {"X": x, "Y": y}, name=name, out=out, stop_gradient=True)


def greater_than(x, y, out: VarDesc | None = None, name=None) -> VarDesc:
    """x > y elementwise (bool); y may be a number."""
    return _compare("greater_than", x, y, out, name)


def less_than(x, y, out: VarDesc | None = None, name=None) -> VarDesc:
    return _compare("less_than", x, y, out, name)


def equal(x, y, out: VarDesc | None = None, name=None) -> VarDesc:
    return _compare("equal", x, y, out, name)


def logical_and(x, y, out=None, name=None) -> VarDesc:
    return append_op("logical_and", {"X": x, "Y": y}, name=name, out=out, stop_gradient=True)


def logical_or(x, y, out=None, name=None) -> VarDesc:
    return append_op("logical_or", {"X": x, "Y": y}, name=name, out=out, stop_gradient=True)


def logical_not(x, out=None, name=None) -> VarDesc:
    return append_op("logical_not", {"X": x}, name=name, out=out, stop_gradient=True)


def cast(x, dtype, name=None) -> VarDesc:
    return append_op("cast", {"X": x}, {"out_dtype": dtype_name(dtype)}, name=name)


def slice(x, axes: Sequence[int], starts: Sequence[int], ends: Sequence[int], name=None) -> VarDesc:
    """x[starts[i]:ends[i]] along each of `axes` (negative indices count from the end)."""
    attrs = {"axes": list(axes), "starts": list(starts), "ends": list(ends)}
    return append_op("slice", {"Input": x}, attrs, name=name)


def concat(input: Sequence[VarDesc], axis: int = 0, name=None) -> VarDesc:
    return append_op("concat", {"X": list(input)}, {"axis": axis}, name=name)


def split(input, num_or_sections, dim: int = -1, name=None) -> list[VarDesc]:
    """Split along `dim` into `num` equal parts, or parts of the given sizes."""
    if isinstance(num_or_sections, int):
        count, attrs = num_or_sections, {"num": num_or_sections, "sections": [], "axis": dim}
    else:
        count = len(num_or_sections)
        attrs = {"num": 0, "sections": list(num_or_sections), "axis": dim}
    block = current_block()
    outs = [block.create_var(unique_name.generate(f"{name or 'split'}.tmp")) for _ in range(count)]
    try:
        block.append_op("split", inputs={"X": input}, outputs={"Out": outs}, attrs=attrs)
    except BaseException:
        for var in outs:
            block.remove_var(var.name)
        raise
    return outs


def reshape(x, shape: Sequence[int], name=None) -> VarDesc:
    """0 copies the input's dim, -1 is inferred from the rest."""
    return append_op("reshape", {"X": x}, {"shape": list(shape)}, name=name)


def transpose(x, perm: Sequence[int], name=None) -> VarDesc:
    return append_op("transpose", {"X": x}, {"axis": list(perm)}, name=name)


def embedding(
    input,
    size: Sequence[int],
    padding_idx: int | None = None,
    param_attr=None,
    dtype: Any = "float32",
    name=None,
) -> VarDesc:
    """Rows of a [vocab, dim] table picked by int64 ids; output shape ids.shape + [dim]."""
    prefix = name or unique_name.generate("embedding")
    w = parameter_from_attr(param_attr, list(size), dtype_name(dtype), f"{prefix}.w", Xavier())
    pad = -1 if padding_idx is None else padding_idx
    return append_op("lookup_table", {"W": w, "Ids": input}, {"padding_idx": pad}, name=prefix)


def dropout(
    x, dropout_prob: float = 0.5, is_test: bool = False, seed: int = 0, name=None
) -> VarDesc:
    """Zero elements with probability p during training, scaling the rest by 1/(1-p)."""
    prob = as_float(dropout_prob, "dropout: dropout_prob")
    attrs = {"dropout_prob": prob, "is_test": is_test, "seed": seed}
    out, _mask = append_op("dropout", {"X": x}, attrs, outputs=("Out", "Mask"), name=name)
    return out


def accuracy(input, label, k: int = 1, name=None) -> VarDesc:
    """Fraction of rows whose label is among the top-k scores of `input`."""
    return append_op(
        "accuracy",
        {"X": input, "Label": label},
        {"k": k},
        outputs=("Accuracy",),
        name=name,
        stop_gradient=True,
    )


def increment(x, value: float = 1.0, in_place: bool = True, name=None) -> VarDesc:
    """x + value; in place by default (the loop counter of a While)."""
    out = x if in_place else None
    return append_op(
        "increment",
        {"X": x},
        {"step": as_float(value, "increment: value")},
        name=name,
        out=out,
        stop_gradient=True,
    )


def assign(input, output: VarDesc | None = None, name=None) -> VarDesc:
    """A copy of `input` (a variable, or a NumPy array / nested list given literally) in
    `output` (a new variable if None)."""
    if isinstance(input, VarDesc):
        return append_op("assign", {"X": input}, name=name, out=output)
    values = literal_array(input, None, "assign")
    attrs = {
        "shape": list(values.shape),
        "dtype": dtype_name(values.dtype),
        "values": values.ravel().tolist(),
    }
    return append_op("assign_value", {}, attrs, name=name, out=output)


def Print(
    input, message: str = "", summarize: int = 20, print_phase: str = "both", name=None
) -> VarDesc:
    """Print the value and shape of `input` when the op runs (and of its gradient, by phase)."""
    attrs = {"message": message, "summarize": summarize, "print_phase": print_phase}
    return append_op("print", {"In": input}, attrs, name=name)


__all__ = [
    "Print",
    "accuracy",
    "activation",
    "add_scalar",
    "assign",
    "cast",
    "concat",
    "create_parameter",
    "cross_entropy",
    "data",
    "dropout",
    "elementwise_add",
    "elementwise_div",
    "elementwise_mul",
    "elementwise_sub",
    "embedding",
    "equal",
    "fc",
    "fill_constant",
    "greater_than",
    "increment",
    "less_than",
    "logical_and",
    "logical_not",
    "logical_or",
    "matmul",
    "mean",
    "mul",
    "relu",
    "reshape",
    "scale",
    "sigmoid",
    "slice",
    "softmax",
    "softmax_with_cross_entropy",
    "split",
    "square",
    "sums",
    "tanh",
    "transpose",
]
