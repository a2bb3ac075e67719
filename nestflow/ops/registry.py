"""The operator registry: each op is one class, registered by one decorator.

    @register_op
    class relu:
        inputs, outputs = ("X",), ("Out",)
        infer = same_as("X")
        def forward(X):
            return np.maximum(X, 0)
        def backward(X, Out, Out_grad):
            return (Out_grad * (Out > 0),)

The class body holds everything about the op (JAX-style): slot names, attribute defaults, shape
and dtype inference, the kernel and the gradient. Kernels are written once against `xp`, the
array module of the place they run on (bound by the executor: NumPy on CPUPlace, CuPy on
CUDAPlace); see `place_args`. Defining `backward` also registers the
gradient op `relu_grad` and the default grad maker; an op with unusual gradient wiring defines
`grad_maker` instead. Control-flow and other scope-aware ops define `run(ctx)` instead of
`forward`, and get the executor's run context. An op may also define `specialize(**attrs)`
returning a faster kernel for those attrs (e.g. `np.add` when no axis alignment is needed), or
None to keep `forward`; the executor binds it once when it prepares a plan.

A gradient op is an op too: `double_backward` (with `double_grad`, the gradient op's input
slots it differentiates) is the gradient op's own `backward`, registered as `<type>_grad_grad`,
so gradients of gradients (a gradient penalty, a Hessian-vector product) can be taken; an op
may instead give its gradient op a grad maker of its own (`double_grad_maker`).

`inplace = {"Out": "X"}` (and `grad_inplace` for the gradient op) says the kernel accepts
`out=` and may write that output into the input's buffer. The executor passes `out=` only when
it owns the buffer outright: a temporary of the run, read by no later op, referenced by nothing
else (no other variable, view or user reference), of the output's shape and dtype.

`grad_no_need_buffer = ("X", "Y")` names forward input/output slots whose values the gradient
kernel never reads (only their shape and dtype, or nothing), as Fluid's
DECLARE_NO_NEED_BUFFER_VARS_INFERER; `no_need_buffer` says the same of the op's own input slots
(for an op with `run`). The executor then drops such a value once no op needs more than its
shape, keeping a zero-stride stand-in of its shape and dtype (nestflow.executor.plan), and a
loop op keeps stand-ins in its step scopes (nestflow.ops.recurrent).

Slot spelling: "X" one variable, "X*" a list of variables (duplicable), "X?" optional.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import numpy as np

from nestflow.core.device_context import DeviceContext, device_context
from nestflow.core.dtype import dtype_name
from nestflow.errors import AttrError, DTypeError, NestflowError, ShapeError, UnknownOpError
from nestflow.framework.program import GRAD_SUFFIX, OpDesc, install_op_validator


class VarInfo(NamedTuple):
    """What shape inference sees of a variable: its shape (-1 = unknown) and dtype name."""

    shape: tuple[int, ...]
    dtype: str

    @property
    def ndim(self) -> int:
        return len(self.shape)


@dataclass(frozen=True)
class Slot:
    name: str
    duplicable: bool = False
    optional: bool = False

    @classmethod
    def parse(cls, spec: str) -> Slot:
        if spec.endswith("*"):
            return cls(spec[:-1], duplicable=True, optional=True)
        if spec.endswith("?"):
            return cls(spec[:-1], optional=True)
        return cls(spec)


class Required:
    """Marks an attribute with no default; `kind` is the Python type it must have."""

    def __init__(self, kind: type):
        self.kind = kind

    def __repr__(self) -> str:
        return f"Required({self.kind.__name__})"


@dataclass(frozen=True)
class AttrSpec:
    name: str
    kind: type | None  # None: any value
    default: Any
    required: bool

    def coerce(self, value: Any) -> Any:
        kind = self.kind
        if kind is None or value is None:
            return value
        if kind is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if kind is int and isinstance(value, int) and not isinstance(value, bool):
            return value
        if kind is int and hasattr(value, "item") and not isinstance(value, bool):
            return int(value.item())
        if kind is list and isinstance(value, (list, tuple)):
            return list(value)
        if kind is list and hasattr(value, "tolist") and getattr(value, "ndim", 0) == 1:
            return value.tolist()  # a 1-D NumPy array, as Fluid's op tests pass lists
        if kind is str and self.name in ("dtype", "out_dtype") and not isinstance(value, str):
            return dtype_name(value)
        if kind is str and self.name in ("dtype", "out_dtype"):
            return dtype_name(value)
        if isinstance(value, kind) and not (kind is not bool and isinstance(value, bool)):
            return value
        raise AttrError(
            f"attribute '{self.name}' must be {kind.__name__}, got {type(value).__name__} "
            f"({value!r})"
        )


@dataclass
class OpDef:
    """Everything known about one operator type."""

    type: str
    inputs: tuple[Slot, ...]
    outputs: tuple[Slot, ...]
    attrs: dict[str, AttrSpec]
    infer: Callable | None = None
    infer_op: Callable | None = None
    forward: Callable | None = None
    specialize: Callable | None = None
    # a fused CUDA kernel (forward's signature) used on CUDAPlace; NotImplemented: forward's
    forward_cuda: Callable | None = None
    run: Callable | None = None
    backward: Callable | None = None
    grad_maker: Callable | None = None
    no_grad_inputs: frozenset[str] = frozenset()
    forward_type: str | None = None  # set on generated gradient ops
    backward_wants_needs: bool = False
    inplace: dict[str, str] = field(default_factory=dict)  # output slot -> input slot
    # input slots whose values the kernel reads for their shape and dtype at most
    no_need_buffer: frozenset[str] = frozenset()
    # output slot -> attrs listing, index by index, what each of its outputs is made from
    # (a control-flow op's names inside its sub-block): prune drops an unneeded output and
    # its entries together, and then prunes the sub-block to what is left
    output_attrs: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # input slot -> bool attr: when the attr is set, the slot's gradient is a SelectedRows
    sparse_grad: dict[str, str] = field(default_factory=dict)
    doc: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def has_gradient(self) -> bool:
        return self.grad_maker is not None

    @property
    def grad_inputs(self) -> tuple[Slot, ...]:
        """The input slots that receive gradients."""
        return tuple(s for s in self.inputs if s.name not in self.no_grad_inputs)

    def input_slot(self, name: str) -> Slot | None:
        return next((s for s in self.inputs if s.name == name), None)

    def output_slot(self, name: str) -> Slot | None:
        return next((s for s in self.outputs if s.name == name), None)

    def check_attrs(self, attrs: dict[str, Any]) -> dict[str, Any]:
        """Attributes with defaults filled in and values coerced; raises AttrError."""
        unknown = set(attrs) - set(self.attrs) - _FRAMEWORK_ATTRS
        if unknown:
            raise AttrError(
                f"unknown attribute(s) {sorted(unknown)}; '{self.type}' takes {sorted(self.attrs)}"
            )
        checked = {k: v for k, v in attrs.items() if k in _FRAMEWORK_ATTRS}
        for name, spec in self.attrs.items():
            if name in attrs:
                checked[name] = spec.coerce(attrs[name])
            elif spec.required:
                raise AttrError(f"attribute '{name}' is required")
            else:
                checked[name] = spec.default
        return checked


# Attributes any op may carry that belong to the framework, not the op.
_FRAMEWORK_ATTRS = frozenset({"op_role", "op_namescope"})

_REGISTRY: dict[str, OpDef] = {}


def get_op_def(op_type: str) -> OpDef:
    op_def = _REGISTRY.get(op_type)
    if op_def is None:
        raise UnknownOpError(f"no operator named '{op_type}' is registered")
    return op_def


def has_op(op_type: str) -> bool:
    return op_type in _REGISTRY


def registered_ops() -> dict[str, OpDef]:
    return dict(_REGISTRY)


def _attr_specs(raw: dict[str, Any]) -> dict[str, AttrSpec]:
    specs = {}
    for name, default in raw.items():
        if isinstance(default, Required):
            specs[name] = AttrSpec(name, default.kind, None, True)
        elif default is None:
            specs[name] = AttrSpec(name, None, None, False)
        else:
            kind = type(default)
            kind = list if kind is tuple else kind
            specs[name] = AttrSpec(name, kind, default, False)
    return specs


def _plain(cls: type, name: str) -> Any:
    value = cls.__dict__.get(name)
    return value.__func__ if isinstance(value, staticmethod) else value


def register_op(cls: type) -> type:
    """Register the op described by class `cls` (and its gradient op if it has `backward`).

    The class body describes the op; its name is the op type (or a `type` attribute):

    - `inputs`, `outputs`: slot names; "X" one variable, "X*" a list (duplicable), "X?"
      optional.
    - `attrs`: `{name: default}` for every attribute; the default's type is the attr's type
      (`Required(float)` marks one without a default, None one of any type).
    - `infer(**slot_infos, **attrs)`: gets a VarInfo(shape, dtype) per input slot (-1: unknown
      dim) and returns the outputs' VarInfos; it runs when the op is appended, so bad input
      raises an nf.errors class at build time, and the registry adds the op's source line.
      `infer_op(op)` instead sees the whole OpDesc.
    - `forward(**inputs, **attrs)`: the kernel, returning the output(s); kernels never
      write their inputs. A kernel declaring `xp` gets the array module of the place it runs
      on (NumPy, CuPy, the stand-in device) and is written once against it; one declaring
      `device` gets that place's DeviceContext (scatter-add, random draws, a host read the
      op's meaning needs). `backward` and `specialize` may declare them too.
    - `backward(**inputs, **outputs, <Out>_grad, **attrs)`: one gradient per input slot (None
      for none). Defining it also registers the gradient op `<type>_grad` and the default
      `grad_maker`; an op with unusual gradient wiring defines `grad_maker(op, ctx)` itself, and
      `no_grad_inputs` names input slots that never get a gradient, and
      `grad_no_need_buffer` the forward slots whose values `backward` never reads (at most
      their shape and dtype); `no_need_buffer` names the op's own such input slots.
    - `sparse_grad = {"W": "is_sparse"}`: when the bool attr is set, the gradient of input
      slot W is a SelectedRows (`backward` returns one) and its variable is typed so.
    - `inplace = {"Out": "X"}`: `forward` accepts `out=` and may write Out into X's buffer
      (the executor passes it only when it owns that buffer outright); `grad_inplace` likewise
      for the gradient op.
    - `specialize(**slot_infos, **attrs)`: called once when a plan is prepared; returns a
      faster kernel taking the inputs (and `out=`) for these attrs, or None to keep `forward`.
    - `forward_cuda` / `backward_cuda`: a fused CUDA kernel (a `cupy.ElementwiseKernel` or
      `RawKernel` from the DeviceContext's `elementwise` / `raw_kernel`, built once) with the
      signature of `forward` / `backward`, run instead of it on CUDAPlace; it returns
      NotImplemented for the inputs it does not cover (a dtype, an attr), and `forward` /
      `backward` runs then. The op stays one class: the xp body is the reference the CUDA
      kernel is tested against.
    - `run(ctx)`: instead of `forward`, for scope-aware ops (control flow, feed/fetch); gets
      the executor's RunContext.
    - `double_backward(*grad_op_inputs, *grad_op_outputs, *their_grads, **attrs)`: the
      gradient op's gradient (second order), positional in the gradient op's slot order:
      the forward inputs, outputs and output gradients (`Out@GRAD`), then the gradient op's
      outputs (`X@GRAD`, values never read) and their gradients (`X@GRAD@GRAD`, None where
      none flows back). `double_grad` names the gradient op's input slots it returns
      gradients for, in order (default: the output gradients alone, as a linear op's); it is
      registered as `<type>_grad_grad`. `double_grad_maker(op, ctx)` instead gives the
      gradient op a grad maker of its own; `double_unsupported(attrs)` may return why some
      attrs have no second order (the walk raises then).

    Raises NestflowError for an op type registered twice or a class with neither forward nor
    run. Returns `cls`.

    >>> from nestflow.ops.registry import VarInfo, register_op
    >>> from nestflow.layers.helper import append_op
    >>> @register_op
    ... class doc_softplus:
    ...     '''Out = log(1 + exp(beta * X)) / beta.'''
    ...     inputs, outputs = ("X",), ("Out",)
    ...     attrs = {"beta": 1.0}
    ...     inplace = {"Out": "X"}
    ...     def infer(X, beta):
    ...         if beta <= 0:
    ...             raise nf.errors.AttrError(f"beta must be > 0, got {beta}")
    ...         return VarInfo(X.shape, X.dtype)
    ...     def forward(X, beta, out=None):
    ...         return np.divide(np.logaddexp(0.0, beta * X), beta, out=out)
    ...     def specialize(X, beta):  # attrs bound: the kernel takes the inputs only
    ...         return (lambda X, out=None: np.logaddexp(0.0, X, out=out)) if beta == 1 else None
    ...     def backward(X, Out, Out_grad, beta):
    ...         return (Out_grad / (1.0 + np.exp(-beta * X)),)
    >>> x = nf.data("x", [-1, 2], "float64")
    >>> x.stop_gradient = False
    >>> y = append_op("doc_softplus", {"X": x}, {"beta": 2.0})
    >>> (dx,) = nf.gradients(nf.layers.reduce_sum(y), x)
    >>> out, grad = nf.Executor().run(feed={"x": np.array([[0.0, 1.0]])}, fetch_list=[y, dx])
    >>> out.round(4).tolist(), grad.round(4).tolist()
    ([[0.3466, 1.0635]], [[0.5, 0.8808]])
    >>> from nestflow.ops import registry  # (doctest only: leave the registry as it was)
    >>> _ = [registry._REGISTRY.pop(t) for t in ("doc_softplus", "doc_softplus_grad")]
    """
    op_type = cls.__dict__.get("type", cls.__name__)
    if op_type in _REGISTRY:
        raise NestflowError(f"operator '{op_type}' is registered twice")
    backward = _plain(cls, "backward")
    op_def = OpDef(
        type=op_type,
        inputs=tuple(Slot.parse(s) for s in cls.__dict__.get("inputs", ())),
        outputs=tuple(Slot.parse(s) for s in cls.__dict__.get("outputs", ())),
        attrs=_attr_specs(cls.__dict__.get("attrs", {})),
        infer=_plain(cls, "infer"),
        infer_op=_plain(cls, "infer_op"),
        forward=_plain(cls, "forward"),
        specialize=_plain(cls, "specialize"),
        forward_cuda=_plain(cls, "forward_cuda"),
        run=_plain(cls, "run"),
        backward=backward,
        grad_maker=_plain(cls, "grad_maker"),
        no_grad_inputs=frozenset(cls.__dict__.get("no_grad_inputs", ())),
        inplace=dict(cls.__dict__.get("inplace", {})),
        output_attrs=dict(cls.__dict__.get("output_attrs", {})),
        sparse_grad=dict(cls.__dict__.get("sparse_grad", {})),
        doc=inspect.cleandoc(cls.__doc__ or ""),
    )
    if op_def.forward is None and op_def.run is None:
        raise NestflowError(f"operator '{op_type}' defines neither forward nor run")
    op_def.no_need_buffer = _no_need_buffer(
        op_def, cls.__dict__.get("no_need_buffer", ()), op_def.inputs, "input slots"
    )
    grad_no_need_buffer = cls.__dict__.get("grad_no_need_buffer", ())
    if grad_no_need_buffer and backward is None:
        raise NestflowError(f"operator '{op_type}': grad_no_need_buffer needs a backward")
    grad_no_need_buffer = _no_need_buffer(
        op_def, grad_no_need_buffer, op_def.inputs + op_def.outputs, "input or output slots"
    )
    _REGISTRY[op_type] = op_def
    double = _plain(cls, "double_backward")
    double_maker = _plain(cls, "double_grad_maker")
    if (double is not None or double_maker is not None) and backward is None:
        raise NestflowError(f"operator '{op_type}': a second order needs a backward")
    if backward is not None:
        grad_def = _gradient_op_def(
            op_def, dict(cls.__dict__.get("grad_inplace", {})), grad_no_need_buffer
        )
        grad_def.forward_cuda = _plain(cls, "backward_cuda")
        _REGISTRY[grad_def.type] = grad_def
        if op_def.grad_maker is None:
            op_def.grad_maker = default_grad_maker
        if double is not None:
            slots = cls.__dict__.get(
                "double_grad", tuple(grad_slot(s.name) for s in op_def.outputs)
            )
            _register_double(grad_def, double, slots)
        elif double_maker is not None:
            grad_def.grad_maker = double_maker
        grad_def.extra["double_unsupported"] = _plain(cls, "double_unsupported")
    cls.op_def = op_def
    return cls


# The fused CUDA ElementwiseKernels ops define (forward_cuda / backward_cuda), by name: their
# (in_params, out_params, operation), defined once at import next to the op that runs them and
# built on a GPU on first use (`fused_kernel`); tests compile every one of them.
CUDA_ELEMENTWISE: dict[str, tuple[str, str, str]] = {}


def cuda_elementwise(name: str, in_params: str, out_params: str, operation: str) -> str:
    """Define the CUDA ElementwiseKernel `name` (unique across ops); returns the name."""
    if CUDA_ELEMENTWISE.get(name, (in_params, out_params, operation)) != (
        in_params,
        out_params,
        operation,
    ):
        raise NestflowError(f"CUDA kernel '{name}' is defined twice")
    CUDA_ELEMENTWISE[name] = (in_params, out_params, operation)
    return name


def fused_kernel(device: DeviceContext, name: str) -> Any:
    """The CUDA ElementwiseKernel `name` on `device` (a CUDADeviceContext), built once."""
    return device.elementwise(name, *CUDA_ELEMENTWISE[name])


def place_args(function: Callable, device: DeviceContext | None = None) -> dict[str, Any]:
    """The place arguments `function` (a kernel or `specialize`) declares: `xp`, the array
    module of `device`'s place, and `device`, the DeviceContext itself (default: CPUPlace's).
    How the executor binds them; a caller running a kernel by hand passes them the same way:
    `op_def.forward(X, **attrs, **place_args(op_def.forward))`."""
    wants = _PLACE_PARAMS.get(function)
    if wants is None:
        try:
            parameters = inspect.signature(function).parameters
        except (TypeError, ValueError):  # a ufunc, a builtin
            parameters = {}
        wants = _PLACE_PARAMS[function] = ("xp" in parameters, "device" in parameters)
    if not (wants[0] or wants[1]):
        return {}
    device = device if device is not None else device_context()
    args: dict[str, Any] = {"xp": device.xp} if wants[0] else {}
    if wants[1]:
        args["device"] = device
    return args


_PLACE_PARAMS: dict[Callable, tuple[bool, bool]] = {}


def shape_stand_in(value: Any) -> Any:
    """For an array whose value nothing reads any more (only its shape and dtype: see
    no_need_buffer), a read-only zero-stride array of that shape and dtype, so the array's own
    memory can go; anything else as it is. Stand-ins are shared (one per shape and dtype)."""
    if type(value) is not np.ndarray:
        return value
    key = (value.shape, value.dtype)
    stand_in = _STAND_INS.get(key)
    if stand_in is None:
        if len(_STAND_INS) >= 1024:  # shapes that come and go: bounded, refilled on demand
            _STAND_INS.clear()
        stand_in = _STAND_INS[key] = np.broadcast_to(np.zeros((), value.dtype), value.shape)
    return stand_in


_STAND_INS: dict[tuple, np.ndarray] = {}


def _no_need_buffer(
    op_def: OpDef, slots: Sequence[str], known: Sequence[Slot], what: str
) -> frozenset[str]:
    unknown = sorted(set(slots) - {s.name for s in known})
    if unknown:
        raise NestflowError(
            f"operator '{op_def.type}': no_need_buffer names {unknown}, which are not its {what}"
        )
    return frozenset(slots)


def grad_slot(slot: str) -> str:
    return slot + GRAD_SUFFIX


def _gradient_op_def(fwd: OpDef, inplace: dict[str, str], no_need_buffer: frozenset[str]) -> OpDef:
    """The `<type>_grad` op: reads forward inputs, outputs and output grads; writes input grads."""
    grad_outputs = tuple(
        Slot(grad_slot(s.name), s.duplicable, optional=True) for s in fwd.grad_inputs
    )
    inputs = (
        tuple(Slot(s.name, s.duplicable, optional=True) for s in fwd.inputs)
        + tuple(Slot(s.name, s.duplicable, optional=True) for s in fwd.outputs)
        + tuple(Slot(grad_slot(s.name), s.duplicable, optional=True) for s in fwd.outputs)
    )
    return OpDef(
        type=fwd.type + "_grad",
        inputs=inputs,
        outputs=grad_outputs,
        attrs=dict(fwd.attrs),
        infer_op=_infer_grad_like_forward,
        forward=fwd.backward,
        forward_type=fwd.type,
        backward_wants_needs="needs" in inspect.signature(fwd.backward).parameters,
        inplace=inplace,
        no_need_buffer=no_need_buffer,
        sparse_grad=dict(fwd.sparse_grad),
    )


def _register_double(grad_def: OpDef, double: Callable, slots: Sequence[str]) -> None:
    """Make `double` the backward of the gradient op `grad_def`: registers
    `<type>_grad_grad`, whose outputs are the gradients of the gradient op's input `slots`."""
    unknown = sorted(set(slots) - {s.name for s in grad_def.inputs})
    if unknown:
        raise NestflowError(
            f"operator '{grad_def.forward_type}': double_grad names {unknown}, which are not "
            f"input slots of {grad_def.type}"
        )
    grad_def.backward = double
    grad_def.no_grad_inputs = frozenset(s.name for s in grad_def.inputs if s.name not in slots)
    # The kernel answers in the gradient op's slot order, which is what `slots` must list.
    if [s.name for s in grad_def.grad_inputs] != list(slots):
        raise NestflowError(
            f"operator '{grad_def.forward_type}': double_grad must list {sorted(slots)} in the "
            f"order of {grad_def.type}'s slots"
        )
    # (The gradient op's own outputs, X@GRAD, are wired in but never read: they stay alive
    # for the ops that take them anyway, so no stand-in is declared for them.)
    double_def = _gradient_op_def(grad_def, {}, frozenset())
    _REGISTRY[double_def.type] = double_def
    grad_def.grad_maker = default_grad_maker


def _infer_grad_like_forward(op: OpDesc) -> None:
    """A gradient has the shape and dtype of the variable it is the gradient of."""
    block = op.block
    sparse = get_op_def(op.type).sparse_grad
    for slot, names in op.outputs.items():
        fwd_slot = slot[: -len(GRAD_SUFFIX)]
        fwd_names = op.inputs.get(fwd_slot, [])
        for name, fwd_name in zip(names, fwd_names):
            if not name:
                continue  # "": a gradient nobody takes, no variable
            fwd_var = block.find_var(fwd_name)
            var = block.find_var(name) or block.create_var(name)
            if fwd_var is not None:
                var.shape, var.dtype = fwd_var.shape, fwd_var.dtype
            if fwd_slot in sparse and op.attrs.get(sparse[fwd_slot]):
                var.type = "selected_rows"


@dataclass
class GradOpSpec:
    """A gradient op to append: what a grad maker returns."""

    type: str
    inputs: dict[str, list[str]]
    outputs: dict[str, list[str]]
    attrs: dict[str, Any] = field(default_factory=dict)


class GradContext(Protocol):
    """What append_backward offers a grad maker (defined in nestflow.executor.backward)."""

    def grad_of(self, name: str) -> str | None:
        """For a forward input: the gradient name to produce, or None if none is needed.
        For a forward output: the gradient name that flows back, or None if none does."""

    def backward_block(
        self, sub_block: Any, out_grads: dict[str, str], wanted: list[str]
    ) -> tuple[Any, dict[str, str]]:
        """Build the gradient block of `sub_block` (a new block of the same program): given
        gradient names available for some of its variables (`out_grads`: var -> grad var),
        produce gradients for the `wanted` variables. Returns the block and, for each wanted
        variable that received a gradient, its gradient name inside that block."""


def default_grad_maker(op: OpDesc, ctx: GradContext) -> list[GradOpSpec]:
    """One `<type>_grad` op reading the forward inputs, outputs and output gradients."""
    grad_of = ctx.grad_of
    op_def = get_op_def(op.type)
    inputs: dict[str, list[str]] = {}
    for slot in op_def.inputs + op_def.outputs:
        if op.inputs.get(slot.name) or op.outputs.get(slot.name):
            inputs[slot.name] = list(op.inputs.get(slot.name) or op.outputs.get(slot.name))
    any_out_grad = False
    for slot in op_def.outputs:
        names = op.outputs.get(slot.name, [])
        grads = [grad_of(n) for n in names]
        if any(g is not None for g in grads):
            any_out_grad = True
            inputs[grad_slot(slot.name)] = [g if g is not None else "" for g in grads]
    outputs: dict[str, list[str]] = {}
    for slot in op_def.grad_inputs:
        grads = [grad_of(n) for n in op.inputs.get(slot.name, [])]
        if any(g is not None for g in grads):
            outputs[grad_slot(slot.name)] = [g if g is not None else "" for g in grads]
    if not any_out_grad or not outputs:
        return []
    return [GradOpSpec(op.type + "_grad", inputs, outputs, dict(op.attrs))]


# ---- second order: kernels of gradient ops' gradients ----


def _zeros_for(value: Any, like: Any, xp: Any) -> Any:
    """`value`, or zeros shaped like `like` where no gradient flowed back (None)."""
    if isinstance(like, list):
        value = value or [None] * len(like)
        return [_zeros_for(v, x, xp) for v, x in zip(value, like)]
    return xp.zeros(like.shape, like.dtype) if value is None else value


def linear_double(forward: Callable, inputs: int = 1) -> Callable:
    """`double_backward` of an op linear in its `inputs` (leading) input slots (reshape, sum,
    concat, slice): its gradient op is linear in Out@GRAD alone, and the gradient of
    <X@GRAD, G> with respect to Out@GRAD is the op applied to G (its JVP)."""

    def double_backward(*args, xp, device, **attrs):
        values = args[:inputs]
        grads = [_zeros_for(g, x, xp) for g, x in zip(args[-inputs:], values)]
        return (forward(*grads, **attrs, **place_args(forward, device)),)

    return double_backward


def bilinear_double(product: Callable, grads: Callable, x, y, dout, ggx, ggy, needs, xp):
    """Gradients of <dX, ggX> + <dY, ggY> for a bilinear Out = product(X, Y) whose gradient op
    is `grads(X, Y, dOut, needs) -> (dX, dY)`: with respect to X, Y and dOut, in that order.
    d/dX = grads(X, ggY, dOut).dX, d/dY = grads(ggX, Y, dOut).dY, d/d dOut = product(ggX, Y)
    + product(X, ggY) (None where `needs` says no one takes it)."""
    dx = dy = ddout = None
    if needs[0]:
        dx = grads(x, ggy, dout, (True, False))[0] if ggy is not None else xp.zeros_like(x)
    if needs[1]:
        dy = grads(ggx, y, dout, (False, True))[1] if ggx is not None else xp.zeros_like(y)
    if needs[2]:
        terms = [product(ggx, y)] if ggx is not None else []
        terms += [product(x, ggy)] if ggy is not None else []
        ddout = terms[0] + terms[1] if len(terms) == 2 else (terms or [xp.zeros_like(dout)])[0]
    return dx, dy, ddout


# ---- build-time validation and shape inference ----


def validate_op(op: OpDesc) -> None:
    """Check `op` against its definition and infer its outputs' shapes and dtypes (in place)."""
    try:
        op_def = get_op_def(op.type)
    except UnknownOpError as exc:
        raise UnknownOpError(exc.message, location=op.location()) from None
    try:
        _check_slots(op, op_def)
        op.attrs = op_def.check_attrs(op.attrs)
        if op_def.infer_op is not None:
            op_def.infer_op(op)
        elif op_def.infer is not None:
            _run_infer(op, op_def)
    except NestflowError as exc:
        if exc.location is not None:
            raise
        raise type(exc)(exc.message, location=op.location()) from None


def _check_slots(op: OpDesc, op_def: OpDef) -> None:
    for kind, given, slots in (
        ("input", op.inputs, op_def.inputs),
        ("output", op.outputs, op_def.outputs),
    ):
        known = {s.name: s for s in slots}
        for name in given:
            if name not in known:
                raise AttrError(f"unknown {kind} slot '{name}'; '{op.type}' has {sorted(known)}")
        for slot in slots:
            names = given.get(slot.name, [])
            if not slot.optional and not any(names):  # "" names no variable
                raise AttrError(f"{kind} slot '{slot.name}' needs a variable")
            if not slot.duplicable and len(names) > 1:
                raise AttrError(f"{kind} slot '{slot.name}' takes one variable, got {names}")
    block = op.block
    for name in op.input_names():
        if name and block.find_var(name) is None:
            raise NestflowError(f"input variable '{name}' is not declared in block {block.idx}")


def var_info(block, name: str) -> VarInfo | None:
    var = block.find_var(name)
    return None if var is None else VarInfo(var.shape, var.dtype)


def _slot_infos(block, names: list[str], slot: Slot):
    if slot.duplicable:
        return [var_info(block, n) for n in names]
    return var_info(block, names[0]) if names else None


def _run_infer(op: OpDesc, op_def: OpDef) -> None:
    block = op.block
    args = [_slot_infos(block, op.inputs.get(s.name, []), s) for s in op_def.inputs]
    attrs = {k: v for k, v in op.attrs.items() if k in op_def.attrs}
    result = op_def.infer(*args, **attrs)
    outs = result if isinstance(result, tuple) and not isinstance(result, VarInfo) else (result,)
    for slot, info in zip(op_def.outputs, outs):
        names = op.outputs.get(slot.name, [])
        infos = info if slot.duplicable else [info]
        for name, one in zip(names, infos):
            if one is None or not name:
                continue  # "": an output nobody takes
            var = block.find_var(name) or block.create_var(name)
            var.shape, var.dtype = tuple(one.shape), one.dtype


install_op_validator(validate_op)


# ---- helpers for writing infer functions ----


def fail(message: str) -> None:
    raise ShapeError(message)


def same_as(slot_index: int = 0) -> Callable:
    """infer: the (only) output is shaped like the `slot_index`-th input."""

    def infer(*args, **_attrs):
        return args[slot_index]

    return infer


def numeric_same_as(slot_index: int = 0) -> Callable:
    """infer: like same_as, for kernels whose arithmetic turns bool into an integer type (so
    a bool X could not keep its declared dtype): bool X is a DTypeError."""

    def infer(*args, **_attrs):
        info = args[slot_index]
        if info.dtype == "bool":
            raise DTypeError("X is bool, which this op's arithmetic does not keep; cast it first")
        return info

    return infer


def broadcast_shapes(a: Sequence[int], b: Sequence[int], what: str = "X and Y") -> tuple[int, ...]:
    """NumPy broadcasting of two shapes in which -1 means unknown."""
    out = []
    for i in range(1, max(len(a), len(b)) + 1):
        x = a[-i] if i <= len(a) else 1
        y = b[-i] if i <= len(b) else 1
        if x == 1:
            out.append(y)
        elif y == 1 or x == y:
            out.append(x)
        elif x == -1 or y == -1:
            out.append(max(x, y))
        else:
            raise ShapeError(
                f"{what} do not broadcast: shapes {list(a)} and {list(b)} differ in dim -{i} "
                f"({x} vs {y})"
            )
    return tuple(reversed(out))
