"""Sequence layers over padded `[batch, time, ...]` tensors with an integer `[batch]` lengths
variable: sequence_pool, sequence_mask, sequence_reverse (Fluid 1.x arguments, plus `lengths`
where Fluid reads a LoD tensor's sequence boundaries)."""

from __future__ import annotations

from typing import Any

from nestflow.core.dtype import dtype_name
from nestflow.errors import AttrError, DTypeError, ShapeError
from nestflow.framework.program import VarDesc
from nestflow.layers.helper import append_op, as_float, as_int, layer_error
from nestflow.ops.sequence import POOL_TYPES


def check_lengths(layer: str, x: VarDesc, lengths: Any) -> list[VarDesc]:
    """`lengths` as an op's "Length" slot ([] for None): an integer [batch] variable whose
    batch, when known, is `x`'s. DTypeError/ShapeError at the user's line otherwise."""
    if lengths is None:
        return []
    if not isinstance(lengths, VarDesc):
        raise layer_error(
            AttrError,
            layer,
            f"lengths must be an int32/int64 [batch] variable, got {type(lengths).__name__} "
            f"({lengths!r})",
        )
    if lengths.dtype not in ("int32", "int64"):
        raise layer_error(
            DTypeError,
            layer,
            f"lengths '{lengths.name}' is {lengths.dtype}{list(lengths.shape)}; it must be an "
            "int32 or int64 [batch] variable",
        )
    if len(lengths.shape) != 1:
        raise layer_error(
            ShapeError,
            layer,
            f"lengths '{lengths.name}' has shape {list(lengths.shape)}; it must be [batch]",
        )
    if -1 not in (lengths.shape[0], x.shape[0] if x.shape else -1) and (
        lengths.shape[0] != x.shape[0]
    ):
        raise layer_error(
            ShapeError,
            layer,
            f"lengths '{lengths.name}' {list(lengths.shape)} has {lengths.shape[0]} lengths but "
            f"'{x.name}' {list(x.shape)} has {x.shape[0]} rows",
        )
    return [lengths]


def _padded(layer: str, x: Any) -> VarDesc:
    if not isinstance(x, VarDesc):
        raise layer_error(AttrError, layer, f"input must be a variable, got {type(x).__name__}")
    if len(x.shape) < 2:
        raise layer_error(
            ShapeError,
            layer,
            f"input '{x.name}' has shape {list(x.shape)}; a padded sequence batch is "
            "[batch, time, ...]",
        )
    return x


def sequence_pool(
    input: VarDesc,
    pool_type: str,
    lengths: VarDesc | None = None,
    is_test: bool = False,
    pad_value: float = 0.0,
) -> VarDesc:
    """Pool each row of the padded `input` [N, T, ...] over its first `lengths[n]` steps:
    `pool_type` is "sum", "average", "sqrt" (sum / sqrt(length)), "max", "first" or "last";
    returns [N, ...]. A row of length 0 gives `pad_value`. `lengths` (int32/int64 [N]):
    None pools all T steps of every row. Lengths outside [0, T] fail at run time
    (ExecutionError naming the row).

    >>> x = nf.data("x", [-1, 5, 3]); n = nf.data("n", [-1], "int64")
    >>> nf.layers.sequence_pool(x, "max", n).shape
    (-1, 3)
    """
    x = _padded("sequence_pool", input)
    if not isinstance(pool_type, str) or pool_type.upper() not in POOL_TYPES:
        raise layer_error(
            AttrError,
            "sequence_pool",
            f"pool_type must be one of {[p.lower() for p in POOL_TYPES]}, got {pool_type!r}",
        )
    attrs = {
        "pooltype": pool_type.upper(),
        "is_test": bool(is_test),
        "pad_value": as_float(pad_value, "sequence_pool: pad_value"),
    }
    inputs = {"X": x, "Length": check_lengths("sequence_pool", x, lengths)}
    out, _index = append_op("sequence_pool", inputs, attrs, outputs=("Out", "MaxIndex"))
    return out


def sequence_mask(
    x: VarDesc, maxlen: int | VarDesc | None = None, dtype: Any = "int64", name: str | None = None
) -> VarDesc:
    """mask[..., j] = j < x[...] as `dtype`, for lengths `x` (int32/int64, any shape): the
    result has a last dim of `maxlen` (an int, a 1-element int variable, or None: max(x)).

    >>> n = nf.data("n", [-1], "int64")
    >>> nf.layers.sequence_mask(n, maxlen=6, dtype="float32").shape
    (-1, 6)
    """
    if not isinstance(x, VarDesc):
        raise layer_error(
            AttrError, "sequence_mask", f"x must be a lengths variable, got {type(x).__name__}"
        )
    inputs: dict[str, Any] = {"X": x}
    attrs: dict[str, Any] = {"out_dtype": dtype_name(dtype), "maxlen": -1}
    if isinstance(maxlen, VarDesc):
        inputs["MaxLenTensor"] = maxlen
    elif maxlen is not None:
        attrs["maxlen"] = as_int(maxlen, "sequence_mask: maxlen")
        if attrs["maxlen"] < 0:
            raise layer_error(AttrError, "sequence_mask", f"maxlen must be >= 0, got {maxlen}")
    return append_op("sequence_mask", inputs, attrs, outputs=("Y",), name=name, stop_gradient=True)


def sequence_reverse(
    x: VarDesc, lengths: VarDesc | None = None, name: str | None = None
) -> VarDesc:
    """Each row of the padded `x` [N, T, ...] with its first `lengths[n]` steps reversed; the
    padding stays in place (None: whole rows reversed).

    >>> x = nf.data("x", [-1, 5, 3]); n = nf.data("n", [-1], "int64")
    >>> nf.layers.sequence_reverse(x, n).shape
    (-1, 5, 3)
    """
    x = _padded("sequence_reverse", x)
    inputs = {"X": x, "Length": check_lengths("sequence_reverse", x, lengths)}
    return append_op("sequence_reverse", inputs, outputs=("Y",), name=name)


__all__ = ["sequence_mask", "sequence_pool", "sequence_reverse"]
