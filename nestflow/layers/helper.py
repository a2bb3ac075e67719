"""What every layer uses: append one op to the current block, make parameters."""

from __future__ import annotations

import functools
import inspect
import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from nestflow.core.dtype import dtype_name, is_floating
from nestflow.errors import (
    AttrError,
    ControlFlowError,
    DTypeError,
    NestflowError,
    OpLocation,
    ShapeError,
    TypeMismatchError,
)
from nestflow.framework import unique_name
from nestflow.framework.program import (
    Block,
    VarDesc,
    default_main_program,
    default_startup_program,
    in_user_code,
    user_source_line,
)
from nestflow.layers.initializer import Constant, Initializer, ParamAttr, Xavier


def as_float(value: Any, what: str) -> float:
    """`value` (a Python or NumPy number) as a float; AttrError naming `what` otherwise."""
    if isinstance(value, numbers.Real):
        return float(value)
    raise AttrError(f"{what} must be a number, got {type(value).__name__} ({value!r})")


def literal_array(values: Any, dtype: Any, what: str) -> np.ndarray:
    """`values` given literally (a NumPy array, nested lists, a number) as an array of `dtype`
    (None: the values' own, a list of Python floats being float32): ShapeError if ragged,
    DTypeError if they do not convert."""
    try:
        array = np.asarray(values)
    except ValueError as exc:
        raise ShapeError(f"{what}: {values!r} is not a rectangular array ({exc})") from None
    if dtype is None:
        from_python = not isinstance(values, np.ndarray)
        dtype = "float32" if array.dtype == np.float64 and from_python else array.dtype
    dtype = dtype_name(dtype)
    try:
        return array.astype(dtype)
    except (TypeError, ValueError) as exc:
        raise DTypeError(f"{what}: {values!r} cannot be converted to {dtype} ({exc})") from None


def as_int(value: Any, what: str) -> int:
    """`value` (a Python or NumPy integer) as an int; AttrError naming `what` otherwise."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    raise AttrError(f"{what} must be an int, got {type(value).__name__} ({value!r})")


def layer_error(kind: type[NestflowError], layer: str, message: str) -> NestflowError:
    """An error a layer finds before appending its op, located at the user's source line."""
    return kind(message, location=OpLocation(layer, source=user_source_line()))


def public_layer(layer: Callable) -> Callable:
    """`layer` as nf.layers exports it: a bare TypeError, AttributeError, ValueError,
    IndexError or KeyError that bad arguments cause inside nestflow becomes an nf.errors error
    (TypeMismatchError, or AttrError for a bad value) naming the layer, the arguments' types
    and the user's source line, chained to the original. An error raised by the user's own
    code that the layer calls (a cond branch, an RNN cell) passes through unchanged."""

    @functools.wraps(layer)
    def checked(*args: Any, **kwargs: Any) -> Any:
        try:
            return layer(*args, **kwargs)
        except (TypeError, AttributeError, ValueError, IndexError, KeyError) as exc:
            if isinstance(exc, NestflowError) or _raised_by_user_code(exc):
                raise
            kind = TypeMismatchError if isinstance(exc, TypeError | AttributeError) else AttrError
            raise layer_error(
                kind,
                layer.__name__,
                f"bad arguments ({_arguments(layer, args, kwargs)}): {type(exc).__name__}: {exc}",
            ) from exc

    return checked


def _raised_by_user_code(exc: BaseException) -> bool:
    """Whether a frame of `exc`'s traceback below the layer is the user's own code."""
    tb = exc.__traceback__.tb_next if exc.__traceback__ is not None else None
    while tb is not None:
        if in_user_code(tb.tb_frame.f_code.co_filename):
            return True
        tb = tb.tb_next
    return False


def _arguments(layer: Callable, args: tuple, kwargs: dict) -> str:
    """'input=NoneType None, size=int 3': what a layer was called with, briefly."""
    try:
        bound = inspect.signature(layer).bind_partial(*args, **kwargs).arguments
    except TypeError:
        bound = {**{f"#{i}": a for i, a in enumerate(args)}, **kwargs}

    def brief(value: Any) -> str:
        if isinstance(value, VarDesc):
            return f"Variable '{value.name}' {value.dtype}{list(value.shape)}"
        text = repr(value)
        return f"{type(value).__name__} {text if len(text) <= 40 else text[:37] + '...'}"

    return ", ".join(f"{name}={brief(value)}" for name, value in bound.items())


def require_float_input(input: VarDesc, layer: str) -> None:
    """DTypeError unless `input` is floating point: `layer` makes float parameters (of the
    input's dtype) that the input is multiplied with, so an integer input would give integer
    parameters and truncated results."""
    if not isinstance(input, VarDesc):
        raise layer_error(
            TypeMismatchError,
            layer,
            f"input must be a Variable of the program, got {type(input).__name__} {input!r}",
        )
    if not is_floating(input.dtype):
        raise layer_error(
            DTypeError,
            layer,
            f"input '{input.name}' is {input.dtype}{list(input.shape)}; {layer} makes float "
            "parameters and needs a floating-point input (cast it first)",
        )


def current_block() -> Block:
    return default_main_program().current_block()


def require_current_block(parent: Block, kind: str, what: str) -> None:
    """ControlFlowError unless `parent` (the block a control-flow builder of `kind` was made in)
    is the current block: `what` (e.g. "IfElse 'ie_0': true_block()") may only be used there."""
    if current_block() is not parent:
        raise ControlFlowError(
            f"{what} must be used in the block the {kind} was made in (block {parent.idx}), "
            f"not block {current_block().idx}"
        )


def append_op(
    op_type: str,
    inputs: Mapping[str, Any],
    attrs: Mapping[str, Any] | None = None,
    outputs: Sequence[str] = ("Out",),
    name: str | None = None,
    out: VarDesc | None = None,
    stop_gradient: bool = False,
) -> Any:
    """Append `op_type` to the current block with fresh output variables; returns the output
    VarDesc (or a tuple of them, one per output slot). Shapes and dtypes come from the op's
    inference; if the op is rejected no variable is left behind."""
    block = current_block()
    prefix = name or op_type
    created = []
    out_vars = {}
    for slot in outputs:
        if out is not None and len(outputs) == 1:
            out_vars[slot] = out
            continue
        var = block.create_var(unique_name.generate(f"{prefix}.tmp"), stop_gradient=stop_gradient)
        created.append(var.name)
        out_vars[slot] = var
    try:
        block.append_op(op_type, inputs=inputs, outputs=out_vars, attrs=dict(attrs or {}))
    except BaseException:
        for var_name in created:
            block.remove_var(var_name)
        raise
    values = tuple(out_vars[s] for s in outputs)
    return values[0] if len(values) == 1 else values


def create_parameter(
    shape: Sequence[int],
    dtype: Any = "float32",
    name: str | None = None,
    initializer: Initializer | None = None,
    trainable: bool = True,
    default_initializer: Initializer | None = None,
) -> VarDesc:
    """A parameter in the main program's global block, initialised by an op in the startup
    program (Xavier by default for weights).

    >>> w = nf.layers.create_parameter([3, 2], "float32", name="w",
    ...                                initializer=nf.initializer.Constant(0.1))
    >>> tuple(w.shape), w.persistable, w.trainable
    ((3, 2), True, True)
    >>> exe = nf.Executor()
    >>> _ = exe.run(nf.default_startup_program())  # runs w's initializer op
    >>> exe.run(fetch_list=[w])[0]
    array([[0.1, 0.1],
           [0.1, 0.1],
           [0.1, 0.1]], dtype=float32)
    """
    if isinstance(shape, (str, bytes)) or not isinstance(shape, Sequence):
        raise layer_error(
            ShapeError,
            "create_parameter",
            f"shape must be a list of ints, got {type(shape).__name__} {shape!r}",
        )
    main = default_main_program()
    name = name or unique_name.generate("param")
    existing = main.global_block().find_var(name)
    if existing is not None:
        return existing
    param = main.global_block().create_parameter(name, shape, dtype, trainable=trainable)
    startup_block = default_startup_program().global_block()
    startup_var = startup_block.create_var(name, shape, dtype, persistable=True)
    init = initializer or default_initializer or Xavier()
    init(startup_var, startup_block)
    return param


def parameter_from_attr(
    attr: Any, shape: Sequence[int], dtype: str, default_name: str, default_init: Initializer
) -> VarDesc | None:
    spec = ParamAttr.of(attr)
    if spec is None:
        return None
    param = create_parameter(
        shape,
        dtype,
        name=spec.name or default_name,
        initializer=spec.initializer,
        trainable=spec.trainable,
        default_initializer=default_init,
    )
    if spec.regularizer is not None:
        param.regularizer = spec.regularizer  # read by the optimizer's regularization pass
    return param


def zeros_initializer() -> Initializer:
    return Constant(0.0)
