"""The layer catalogue: each layer appends one op (or composes a few) to the current block.

Layers take and return VarDescs. Most are one line over `append_op`; `fc` composes
mul + elementwise_add + activation rather than having its own kernel.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any

from nestflow.core.dtype import dtype_name
from nestflow.errors import AttrError, DTypeError, ShapeError, TypeMismatchError
from nestflow.framework import unique_name
from nestflow.framework.program import VarDesc
from nestflow.layers.helper import (
    append_op,
    as_float,
    as_int,
    create_parameter,
    current_block,
    layer_error,
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
    if isinstance(shape, (str, bytes)) or not isinstance(shape, Sequence):
        raise ShapeError(
            f"data '{name}': shape must be a list of ints (-1 or None: any size), got "
            f"{type(shape).__name__} {shape!r}"
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
    """A tensor of `shape` and `dtype` filled with `value` (no gradient).

    >>> c = nf.layers.fill_constant([2, 3], "float32", 1.5)
    >>> c.shape, c.dtype
    ((2, 3), 'float32')
    """
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

    >>> x = nf.data("x", shape=[-1, 3], dtype="float32")
    >>> y = nf.layers.fc(x, size=2, act="relu", name="fc")
    >>> tuple(y.shape), [p.name for p in nf.default_main_program().all_parameters()]
    ((-1, 2), ['fc.w', 'fc.b'])
    >>> exe = nf.Executor()
    >>> _ = exe.run(nf.default_startup_program())
    >>> exe.run(feed={"x": np.ones((4, 3), "float32")}, fetch_list=[y])[0].shape
    (4, 2)
    """
    size = as_int(size, "fc: size")
    if size < 1:
        raise AttrError(f"fc: size must be a positive number of output features, got {size}")
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
    Another name is an AttrError listing them.

    >>> x = nf.data("x", [-1, 4])
    >>> out = nf.layers.activation(x, "relu")
    >>> nf.Executor(nf.CPUPlace()).run(feed={"x": np.array([[-1, 1, 2, -2]], "float32")}, fetch_list=[out])[0]
    array([[0., 1., 2., 0.]], dtype=float32)
    """
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
    """x + y elementwise, Fluid's broadcasting: y's dims align with x's from `axis` (-1: trailing
    dims), then `act` applied. `y` may be a Python number. Shapes that do not broadcast are a
    ShapeError.

    >>> x, b = nf.data("x", [-1, 3]), nf.data("b", [3])
    >>> out = nf.layers.elementwise_add(x, b)
    >>> nf.Executor(nf.CPUPlace()).run(feed={"x": np.ones((2, 3), "float32"),
    ...     "b": np.arange(3, dtype="float32")}, fetch_list=[out])[0]
    array([[1., 2., 3.],
           [1., 2., 3.]], dtype=float32)
    """
    return activation(_binary("elementwise_add", x, y, axis, name), act)


def elementwise_sub(x, y, axis: int = -1, act: str | None = None, name=None) -> VarDesc:
    """x - y elementwise, broadcast as in elementwise_add (y aligned with x from `axis`), then
    `act`.

    >>> x, y = nf.data("x", [-1, 3]), nf.data("y", [-1, 3])
    >>> nf.layers.elementwise_sub(x, y, act="relu").shape
    (-1, 3)
    """
    return activation(_binary("elementwise_sub", x, y, axis, name), act)


def elementwise_mul(x, y, axis: int = -1, act: str | None = None, name=None) -> VarDesc:
    """x * y elementwise, broadcast as in elementwise_add (y aligned with x from `axis`), then
    `act`.

    >>> x, y = nf.data("x", [-1, 3, 4]), nf.data("y", [3])
    >>> nf.layers.elementwise_mul(x, y, axis=1).shape
    (-1, 3, 4)
    """
    return activation(_binary("elementwise_mul", x, y, axis, name), act)


def elementwise_div(x, y, axis: int = -1, act: str | None = None, name=None) -> VarDesc:
    """x / y elementwise, broadcast as in elementwise_add (y aligned with x from `axis`), then
    `act`.

    >>> x = nf.data("x", [-1, 3])
    >>> nf.layers.elementwise_div(x, 2.0).shape
    (-1, 3)
    """
    return activation(_binary("elementwise_div", x, y, axis, name), act)


def add_scalar(x: VarDesc, y: Any, name=None) -> VarDesc:
    """x + y for a scalar y: a Python number, or a [1]-shaped variable broadcast over x.

    >>> x = nf.data("x", [-1, 2])
    >>> out = nf.layers.add_scalar(x, 1.0)
    >>> nf.Executor(nf.CPUPlace()).run(feed={"x": np.zeros((1, 2), "float32")}, fetch_list=[out])[0]
    array([[1., 1.]], dtype=float32)
    """
    if isinstance(y, Number):
        return scale(x, 1.0, float(y), name=name)
    return append_op("elementwise_add", {"X": x, "Y": y}, name=name)


def scale(
    x: VarDesc, scale: float = 1.0, bias: float = 0.0, bias_after_scale: bool = True, name=None
) -> VarDesc:
    """scale * x + bias (or scale * (x + bias) with bias_after_scale=False), elementwise.

    >>> x = nf.data("x", [-1, 2])
    >>> out = nf.layers.scale(x, scale=2.0, bias=1.0)
    >>> nf.Executor(nf.CPUPlace()).run(feed={"x": np.ones((1, 2), "float32")}, fetch_list=[out])[0]
    array([[3., 3.]], dtype=float32)
    """
    attrs = {
        "scale": as_float(scale, "scale: scale"),
        "bias": as_float(bias, "scale: bias"),
        "bias_after_scale": bias_after_scale,
    }
    return append_op("scale", {"X": x}, attrs, name=name)


def matmul(
    x, y, transpose_x: bool = False, transpose_y: bool = False, alpha: float = 1.0, name=None
) -> VarDesc:
    """alpha * x @ y (each optionally transposed in its last two dims), batched over leading dims as
    numpy.matmul; mismatched inner dims are a ShapeError.

    >>> x, y = nf.data("x", [-1, 2, 3]), nf.data("y", [-1, 4, 3])
    >>> nf.layers.matmul(x, y, transpose_y=True).shape
    (-1, 2, 4)
    """
    attrs = {
        "transpose_X": transpose_x,
        "transpose_Y": transpose_y,
        "alpha": as_float(alpha, "matmul: alpha"),
    }
    return append_op("matmul", {"X": x, "Y": y}, attrs, name=name)


def mul(x, y, x_num_col_dims: int = 1, y_num_col_dims: int = 1, name=None) -> VarDesc:
    """Fluid's mul: x flattened to a matrix at `x_num_col_dims`, times y flattened at
    `y_num_col_dims`; the result keeps x's leading and y's trailing dims.

    >>> x, w = nf.data("x", [-1, 2, 3]), nf.data("w", [6, 5])
    >>> nf.layers.mul(x, w).shape
    (-1, 5)
    """
    attrs = {"x_num_col_dims": x_num_col_dims, "y_num_col_dims": y_num_col_dims}
    return append_op("mul", {"X": x, "Y": y}, attrs, name=name)


def sums(inputs: Sequence[VarDesc], name=None) -> VarDesc:
    """The elementwise sum of a list of variables of one shape (the `sum` op).

    >>> a, b = nf.data("a", [-1, 3]), nf.data("b", [-1, 3])
    >>> out = nf.layers.sums([a, b, a])
    >>> nf.Executor(nf.CPUPlace()).run(feed={"a": np.ones((1, 3), "float32"),
    ...     "b": np.full((1, 3), 2, "float32")}, fetch_list=[out])[0]
    array([[4., 4., 4.]], dtype=float32)
    """
    return append_op("sum", {"X": list(inputs)}, name=name)


def relu(x, name=None) -> VarDesc:
    """max(x, 0) elementwise.

    >>> x = nf.data("x", [-1, 3])
    >>> out = nf.layers.relu(x)
    >>> nf.Executor(nf.CPUPlace()).run(feed={"x": np.array([[-1, 0, 2]], "float32")}, fetch_list=[out])[0]
    array([[0., 0., 2.]], dtype=float32)
    """
    return append_op("relu", {"X": x}, name=name)


def sigmoid(x, name=None) -> VarDesc:
    """1 / (1 + exp(-x)) elementwise.

    >>> x = nf.data("x", [-1, 1])
    >>> out = nf.layers.sigmoid(x)
    >>> nf.Executor(nf.CPUPlace()).run(feed={"x": np.zeros((1, 1), "float32")}, fetch_list=[out])[0]
    array([[0.5]], dtype=float32)
    """
    return append_op("sigmoid", {"X": x}, name=name)


def tanh(x, name=None) -> VarDesc:
    """tanh(x) elementwise.

    >>> x = nf.data("x", [-1, 1])
    >>> out = nf.layers.tanh(x)
    >>> nf.Executor(nf.CPUPlace()).run(feed={"x": np.zeros((1, 1), "float32")}, fetch_list=[out])[0]
    array([[0.]], dtype=float32)
    """
    return append_op("tanh", {"X": x}, name=name)


def softmax(x, axis: int = -1, name=None) -> VarDesc:
    """exp(x) / sum(exp(x)) along `axis` (computed stably, max subtracted).

    >>> x = nf.data("x", [-1, 2])
    >>> out = nf.layers.softmax(x)
    >>> nf.Executor(nf.CPUPlace()).run(feed={"x": np.zeros((1, 2), "float32")}, fetch_list=[out])[0]
    array([[0.5, 0.5]], dtype=float32)
    """
    return append_op("softmax", {"X": x}, {"axis": axis}, name=name)


def cross_entropy(
    input, label, soft_label: bool = False, ignore_index: int = -100, name=None
) -> VarDesc:
    """-log(input[label]) per row, for probabilities `input` [N, C] and int64 labels [N, 1].

    >>> prob, label = nf.data("prob", [-1, 2]), nf.data("label", [-1, 1], "int64")
    >>> loss = nf.layers.cross_entropy(prob, label)
    >>> nf.Executor(nf.CPUPlace()).run(feed={"prob": np.array([[0.5, 0.5]], "float32"),
    ...     "label": np.array([[1]])}, fetch_list=[loss])[0].round(4)
    array([[0.6931]], dtype=float32)
    """
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
    """Numerically stable softmax + cross entropy on logits; loss shape [N, 1].

    >>> logits, label = nf.data("logits", [-1, 10]), nf.data("label", [-1, 1], "int64")
    >>> nf.layers.softmax_with_cross_entropy(logits, label).shape
    (-1, 1)
    """
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
    """x * x elementwise.

    >>> x = nf.data("x", [-1, 2])
    >>> out = nf.layers.square(x)
    >>> nf.Executor(nf.CPUPlace()).run(feed={"x": np.array([[2, -3]], "float32")}, fetch_list=[out])[0]
    array([[4., 9.]], dtype=float32)
    """
    return append_op("square", {"X": x}, name=name)


def mean(x, name=None) -> VarDesc:
    """The mean of all elements, a 0-d tensor.

    >>> x = nf.data("x", [-1, 2])
    >>> out = nf.layers.mean(x)
    >>> nf.Executor(nf.CPUPlace()).run(feed={"x": np.array([[1, 2], [3, 4]], "float32")}, fetch_list=[out])[0]
    array(2.5, dtype=float32)
    """
    return append_op("mean", {"X": x}, name=name)


def _compare(op_type, x, y, out, name):
    if isinstance(y, Number):
        y = fill_constant([1], x.dtype, y)
    return append_op(op_type, {"X": x, "Y": y}, name=name, out=out, stop_gradient=True)


def greater_than(x, y, out: VarDesc | None = None, name=None) -> VarDesc:
    """x > y elementwise (bool); y may be a number.

    >>> x = nf.data("x", [-1])
    >>> out = nf.layers.greater_than(x, 1.0)
    >>> nf.Executor(nf.CPUPlace()).run(feed={"x": np.array([0, 2], "float32")}, fetch_list=[out])[0]
    array([False,  True])
    """
    return _compare("greater_than", x, y, out, name)


def less_than(x, y, out: VarDesc | None = None, name=None) -> VarDesc:
    """x < y elementwise (bool, no gradient); y may be a number; written into `out` when given (a
    While's condition).

    >>> x = nf.data("x", [-1])
    >>> out = nf.layers.less_than(x, 1.0)
    >>> nf.Executor(nf.CPUPlace()).run(feed={"x": np.array([0, 2], "float32")}, fetch_list=[out])[0]
    array([ True, False])
    """
    return _compare("less_than", x, y, out, name)


def equal(x, y, out: VarDesc | None = None, name=None) -> VarDesc:
    """x == y elementwise (bool, no gradient); y may be a number; written into `out` when given.

    >>> x = nf.data("x", [-1], "int64")
    >>> out = nf.layers.equal(x, 2)
    >>> nf.Executor(nf.CPUPlace()).run(feed={"x": np.array([1, 2])}, fetch_list=[out])[0]
    array([False,  True])
    """
    return _compare("equal", x, y, out, name)


def logical_and(x, y, out=None, name=None) -> VarDesc:
    """x and y elementwise for bool variables; written into `out` when given.

    >>> a, b = nf.data("a", [-1], "bool"), nf.data("b", [-1], "bool")
    >>> out = nf.layers.logical_and(a, b)
    >>> nf.Executor(nf.CPUPlace()).run(feed={"a": np.array([True, True]),
    ...     "b": np.array([True, False])}, fetch_list=[out])[0]
    array([ True, False])
    """
    return append_op("logical_and", {"X": x, "Y": y}, name=name, out=out, stop_gradient=True)


def logical_or(x, y, out=None, name=None) -> VarDesc:
    """x or y elementwise for bool variables; written into `out` when given.

    >>> a, b = nf.data("a", [-1], "bool"), nf.data("b", [-1], "bool")
    >>> out = nf.layers.logical_or(a, b)
    >>> nf.Executor(nf.CPUPlace()).run(feed={"a": np.array([False, False]),
    ...     "b": np.array([True, False])}, fetch_list=[out])[0]
    array([ True, False])
    """
    return append_op("logical_or", {"X": x, "Y": y}, name=name, out=out, stop_gradient=True)


def logical_not(x, out=None, name=None) -> VarDesc:
    """not x elementwise for a bool variable; written into `out` when given.

    >>> a = nf.data("a", [-1], "bool")
    >>> out = nf.layers.logical_not(a)
    >>> nf.Executor(nf.CPUPlace()).run(feed={"a": np.array([True, False])}, fetch_list=[out])[0]
    array([False,  True])
    """
    return append_op("logical_not", {"X": x}, name=name, out=out, stop_gradient=True)


def cast(x, dtype, name=None) -> VarDesc:
    """x converted to `dtype` (a name such as 'float64' or a NumPy dtype); the gradient is cast
    back.

    >>> x = nf.data("x", [-1, 2])
    >>> nf.layers.cast(x, "int64").dtype
    'int64'
    """
    return append_op("cast", {"X": x}, {"out_dtype": dtype_name(dtype)}, name=name)


def slice(x, axes: Sequence[int], starts: Sequence[int], ends: Sequence[int], name=None) -> VarDesc:
    """x[starts[i]:ends[i]] along each of `axes` (negative indices count from the end).

    >>> x = nf.data("x", [-1, 5])
    >>> nf.layers.slice(x, axes=[1], starts=[1], ends=[-1]).shape
    (-1, 3)
    """
    attrs = {"axes": list(axes), "starts": list(starts), "ends": list(ends)}
    return append_op("slice", {"Input": x}, attrs, name=name)


def concat(input: Sequence[VarDesc], axis: int = 0, name=None) -> VarDesc:
    """The variables of `input` joined along `axis`; the other dims must agree (ShapeError).

    >>> a, b = nf.data("a", [-1, 2]), nf.data("b", [-1, 3])
    >>> nf.layers.concat([a, b], axis=1).shape
    (-1, 5)
    """
    return append_op("concat", {"X": list(input)}, {"axis": axis}, name=name)


def split(input, num_or_sections, dim: int = -1, name=None) -> list[VarDesc]:
    """Split along `dim` into `num` equal parts, or parts of the given sizes.

    >>> x = nf.data("x", [-1, 6])
    >>> [v.shape for v in nf.layers.split(x, [2, 4], dim=1)]
    [(-1, 2), (-1, 4)]
    """
    if isinstance(dim, bool) or not isinstance(dim, int):
        # Fluid's check_type: a float dim is a TypeError, as Fluid's split test expects.
        raise layer_error(
            TypeMismatchError, "split", f"dim must be an int, got {type(dim).__name__} ({dim!r})"
        )
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
    """0 copies the input's dim, -1 is inferred from the rest.

    >>> x = nf.data("x", [-1, 2, 3])
    >>> nf.layers.reshape(x, [0, -1]).shape
    (-1, 6)
    """
    return append_op("reshape", {"X": x}, {"shape": list(shape)}, name=name)


def transpose(x, perm: Sequence[int], name=None) -> VarDesc:
    """x with its dims permuted: output dim i is input dim perm[i].

    >>> x = nf.data("x", [-1, 2, 3])
    >>> nf.layers.transpose(x, [0, 2, 1]).shape
    (-1, 3, 2)
    """
    return append_op("transpose", {"X": x}, {"axis": list(perm)}, name=name)


def embedding(
    input,
    size: Sequence[int],
    is_sparse: bool = False,
    is_distributed: bool = False,
    padding_idx: int | None = None,
    param_attr=None,
    dtype: Any = "float32",
    name=None,
) -> VarDesc:
    """Rows of a [vocab, dim] table (`size`) picked by int64 ids, as Fluid 1.8's
    `fluid.layers.embedding` (lookup_table): ids ending in a dim of 1 have it replaced by dim
    ([N, 1] -> [N, dim], [N, T, 1] -> [N, T, dim]), other ids get dim appended ([N, T] ->
    [N, T, dim]). `padding_idx` rows come out as zeros and get no gradient. With `is_sparse`
    the table's gradient is an nf.SelectedRows (the looked-up rows and their gradients, ids x
    dim, never the table), which the optimizers' updates, the regularizers and gradient
    clipping take as it is (see the training guide's "Sparse embedding gradients").
    `is_distributed` (Fluid's parameter-server table) is refused with an AttrError.

    >>> ids = nf.data("ids", [-1, 1], "int64")
    >>> nf.layers.embedding(ids, size=[100, 8]).shape
    (-1, 8)
    >>> nf.layers.embedding(nf.data("words", [-1, 5], "int64"), size=[100, 8]).shape
    (-1, 5, 8)
    >>> emb = nf.layers.embedding(ids, size=[100_000, 8], is_sparse=True)
    >>> (_, g), = nf.append_backward(nf.layers.mean(emb))
    >>> g.type
    'selected_rows'
    """
    prefix = name or unique_name.generate("embedding")
    w = parameter_from_attr(param_attr, list(size), dtype_name(dtype), f"{prefix}.w", Xavier())
    pad = -1 if padding_idx is None else padding_idx
    attrs = {"padding_idx": pad, "is_sparse": bool(is_sparse), "is_distributed": is_distributed}
    return append_op("lookup_table", {"W": w, "Ids": input}, attrs, name=prefix)


def dropout(
    x,
    dropout_prob: float = 0.5,
    is_test: bool = False,
    seed: int = 0,
    name=None,
    dropout_implementation: str = "downgrade_in_infer",
) -> VarDesc:
    """Zero each element with probability p in training, as Fluid 1.x: with
    `dropout_implementation` "downgrade_in_infer" (Fluid's default) the kept elements pass
    unscaled and inference multiplies by (1 - p); with "upscale_in_train" (PyTorch's) the
    kept elements are scaled by 1/(1 - p) in training and inference is the identity.

    >>> x = nf.data("x", [-1, 4])
    >>> out = nf.layers.dropout(x, 0.5, is_test=True)  # Fluid's default: x * (1 - p) at test time
    >>> nf.Executor(nf.CPUPlace()).run(feed={"x": np.ones((1, 4), "float32")}, fetch_list=[out])[0]
    array([[0.5, 0.5, 0.5, 0.5]], dtype=float32)
    >>> same = nf.layers.dropout(x, 0.5, is_test=True, dropout_implementation="upscale_in_train")
    >>> nf.Executor(nf.CPUPlace()).run(feed={"x": np.ones((1, 4), "float32")}, fetch_list=[same])[0]
    array([[1., 1., 1., 1.]], dtype=float32)
    """
    prob = as_float(dropout_prob, "dropout: dropout_prob")
    attrs = {
        "dropout_prob": prob,
        "is_test": is_test,
        "seed": 0 if seed is None else seed,
        "dropout_implementation": dropout_implementation,
    }
    out, _mask = append_op("dropout", {"X": x}, attrs, outputs=("Out", "Mask"), name=name)
    return out


def accuracy(input, label, k: int = 1, name=None) -> VarDesc:
    """Fraction of rows whose label is among the top-k scores of `input`.

    >>> scores, label = nf.data("scores", [-1, 3]), nf.data("label", [-1, 1], "int64")
    >>> acc = nf.layers.accuracy(scores, label)
    >>> nf.Executor(nf.CPUPlace()).run(feed={"scores": np.eye(3, dtype="float32"),
    ...     "label": np.array([[0], [1], [0]])}, fetch_list=[acc])[0]
    array(0.6666667, dtype=float32)
    """
    return append_op(
        "accuracy",
        {"X": input, "Label": label},
        {"k": k},
        outputs=("Accuracy",),
        name=name,
        stop_gradient=True,
    )


def increment(x, value: float = 1.0, in_place: bool = True, name=None) -> VarDesc:
    """x + value; in place by default (the loop counter of a While).

    >>> i = nf.layers.fill_constant([1], "int64", 0)
    >>> i = nf.layers.increment(i)
    >>> nf.Executor(nf.CPUPlace()).run(fetch_list=[i])[0]
    array([1])
    """
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
    `output` (a new variable if None).

    >>> out = nf.layers.assign(np.array([[1.0, 2.0]], "float32"))
    >>> nf.Executor(nf.CPUPlace()).run(fetch_list=[out])[0]
    array([[1., 2.]], dtype=float32)
    """
    if isinstance(input, VarDesc):
        return append_op("assign", {"X": input}, name=name, out=output)
    values = literal_array(input, None, "assign")
    if values.dtype.kind not in "biuf":
        raise layer_error(
            DTypeError,
            "assign",
            f"input must be a Variable or numbers (an array, nested lists), got "
            f"{type(input).__name__} {input!r}",
        )
    attrs = {
        "shape": list(values.shape),
        "dtype": dtype_name(values.dtype),
        "values": values.ravel().tolist(),
    }
    return append_op("assign_value", {}, attrs, name=name, out=output)


def Print(
    input, message: str = "", summarize: int = 20, print_phase: str = "both", name=None
) -> VarDesc:
    """Print the value and shape of `input` when the op runs (and of its gradient, by phase).

    >>> x = nf.data("x", [-1, 2])
    >>> nf.layers.Print(x, message="x:").shape
    (-1, 2)
    """
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
