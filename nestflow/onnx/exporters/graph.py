"""The machinery the op mappers write ONNX with: values, environments, graphs, the mapper table.

A nestflow block rewrites variables (an optimizer's ParamOut, `x = x + 1` in a While body, a
feed overwritten by an op); ONNX graphs assign every name once. So each (sub)graph has an
`Env`, nestflow name -> the ONNX `Value` holding the variable's current value, falling back to
the enclosing graph's Env (ONNX subgraphs see their outer graph's values); writing a variable
binds a fresh ONNX name. Every ONNX name is unique across the whole model (onnx.checker
wants SSA across nested graphs too), made by one `Names`.

A mapper is a function `(ctx: OpContext) -> None` registered for one or more op types with
`@exports("relu")`; it reads its inputs with `ctx.input("X")`, emits nodes with
`ctx.node("Relu", [x])` and binds outputs with `ctx.set_output("Out", y)`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from nestflow.errors import NestflowError, ShapeError, UnknownOpError
from nestflow.framework.program import Block, OpDesc, VarDesc

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1


def onnx_dtype(dtype: str) -> int:
    """The TensorProto element type of a NumPy dtype name."""
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


@dataclass(frozen=True)
class Value:
    """An ONNX value standing for a nestflow variable: its name, element dtype, and whether it
    is a sequence (a tensor array) rather than a tensor."""

    name: str
    dtype: str
    sequence: bool = False

    def value_info(self, name: str | None = None, rank: int | None = None) -> onnx.ValueInfoProto:
        """A ValueInfoProto of this value's type: of `rank` with every dim left open (shapes
        vary by feed; shape inference fills in what it can), or of any rank (subgraphs)."""
        elem = onnx_dtype(self.dtype)
        shape = None if rank is None else [None] * rank
        if self.sequence:
            return helper.make_tensor_sequence_value_info(name or self.name, elem, shape)
        return helper.make_tensor_value_info(name or self.name, elem, shape)


class Env:
    """nestflow variable name -> its current Value, per graph; lookups fall back to the parent
    (the enclosing graph, or the enclosing block inlined into the same graph)."""

    def __init__(self, parent: Env | None = None):
        self.parent = parent
        self.values: dict[str, Value] = {}

    def find(self, name: str) -> Value | None:
        env: Env | None = self
        while env is not None:
            value = env.values.get(name)
            if value is not None:
                return value
            env = env.parent
        return None

    def bind(self, name: str, value: Value) -> None:
        self.values[name] = value


class Names:
    """Unique ONNX names: `fresh(base)` gives `base` the first time, then `base_1`, ..."""

    def __init__(self, reserved: set[str] | None = None):
        self.used: set[str] = set()
        self.reserved = set(reserved or ())  # kept for the graph outputs (fetch names)
        self.counts: dict[str, int] = {}

    def fresh(self, base: str) -> str:
        name = base
        while name in self.used or name in self.reserved:
            self.counts[base] = self.counts.get(base, 0) + 1
            name = f"{base}_{self.counts[base]}"
        self.used.add(name)
        return name


@dataclass
class Graph:
    """One ONNX graph being built: the main graph or a subgraph (If branch, Loop body)."""

    name: str
    nodes: list[onnx.NodeProto] = field(default_factory=list)
    inputs: list[onnx.ValueInfoProto] = field(default_factory=list)
    outputs: list[onnx.ValueInfoProto] = field(default_factory=list)

    def to_proto(self, initializers: Sequence[onnx.TensorProto] = ()) -> onnx.GraphProto:
        return helper.make_graph(
            self.nodes, self.name, self.inputs, self.outputs, initializer=list(initializers)
        )


Mapper = Callable[["OpContext"], None]
MAPPERS: dict[str, Mapper] = {}


def exports(*op_types: str) -> Callable[[Mapper], Mapper]:
    """Register the decorated function as the ONNX mapper of each of `op_types`."""

    def register(fn: Mapper) -> Mapper:
        for op_type in op_types:
            if op_type in MAPPERS:
                raise NestflowError(f"op '{op_type}' has two ONNX mappers")
            MAPPERS[op_type] = fn
        return fn

    return register


class Emitter:
    """Writes nodes into one graph, reading and binding variables in one Env."""

    def __init__(self, model: Any, graph: Graph, env: Env, base: str):
        self.model = model  # the ModelBuilder (nestflow.onnx.exporter)
        self.graph = graph
        self.env = env
        self.base = base  # what new names are derived from

    @property
    def opset(self) -> int:
        return self.model.opset

    # ---- nodes and constants ----

    def node(self, op_type: str, inputs: Sequence[str], outputs: int = 1, **attrs: Any) -> Any:
        """Append an `op_type` node; returns its output name (a list when `outputs` > 1).
        Attributes that are None are left out."""
        names = [self.model.names.fresh(f"{self.base}:{op_type}") for _ in range(outputs)]
        attrs = {k: v for k, v in attrs.items() if v is not None}
        node = helper.make_node(
            op_type,
            list(inputs),
            names,
            name=self.model.names.fresh(f"{self.base}/{op_type}"),
            **attrs,
        )
        self.graph.nodes.append(node)
        return names[0] if outputs == 1 else names

    def const(self, value: Any, dtype: str | None = None) -> str:
        """A constant (an initializer of the main graph, visible to every subgraph)."""
        return self.model.constant(np.asarray(value, dtype=dtype))

    def ints(self, values: Sequence[int]) -> str:
        """An int64 vector constant (shapes, axes, pads)."""
        return self.const(np.asarray(list(values), np.int64).reshape(-1))

    def scalar(self, value: Any, dtype: str) -> str:
        return self.const(np.asarray(value, dtype=dtype).reshape(()))

    # ---- shapes ----

    def shape(self, x: str, start: int | None = None, end: int | None = None) -> str:
        """int64 [rank] (or a slice of it) of x's shape at run time."""
        if self.opset >= 15 and (start is not None or end is not None):
            return self.node("Shape", [x], start=start, end=end)
        shape = self.node("Shape", [x])
        if start is None and end is None:
            return shape
        starts = self.ints([start or 0])
        ends = self.ints([INT64_MAX if end is None else end])
        return self.node("Slice", [shape, starts, ends, self.ints([0])])

    def dim(self, x: str, axis: int) -> str:
        """int64 [1]: x's size along `axis` at run time."""
        return self.shape(x, axis, axis + 1 if axis != -1 else None)

    def reshape(self, x: str, dims: Sequence[int] | str) -> str:
        """x reshaped to `dims`: ints (0 copies x's dim, -1 is inferred: Fluid's and ONNX's
        rule) or a run-time int64 shape tensor, whose 0s are sizes (allowzero, opset 14+;
        opset 13 reads them as copies, which differs only where a size is 0)."""
        if isinstance(dims, str):
            return self.node("Reshape", [x, dims], allowzero=1 if self.opset >= 14 else None)
        return self.node("Reshape", [x, self.ints(dims)])

    def unsqueeze(self, x: str, axes: Sequence[int]) -> str:
        return self.node("Unsqueeze", [x, self.ints(axes)])

    def squeeze(self, x: str, axes: Sequence[int] | None = None) -> str:
        return self.node("Squeeze", [x] + ([self.ints(axes)] if axes is not None else []))

    def cast(self, x: str, dtype: str) -> str:
        return self.node("Cast", [x], to=onnx_dtype(dtype))

    def to_scalar(self, x: str) -> str:
        """A one-element tensor as a 0-d one."""
        return self.reshape(x, [])

    def reduce(self, op_type: str, x: str, axes: Sequence[int] | None, keepdims: bool) -> str:
        """A Reduce* node over `axes` (None: every axis), axes as an input where the opset
        wants one (ReduceSum from 13, the others from 18)."""
        keep = int(keepdims)
        if axes is None:
            return self.node(op_type, [x], keepdims=keep)
        as_input = op_type == "ReduceSum" or self.opset >= 18
        if as_input:
            return self.node(op_type, [x, self.ints(axes)], keepdims=keep)
        return self.node(op_type, [x], axes=list(axes), keepdims=keep)

    def mean(self, x: str, axes: Sequence[int] | None, keepdims: bool, dtype: str) -> str:
        """The mean over `axes` (None: all) as sum / count: NaN over no elements, as NumPy
        (onnxruntime's ReduceMean gives 0 there)."""
        total = self.reduce("ReduceSum", x, axes, keepdims)
        if axes is None:
            count = self.node("Size", [x])
        else:
            count = self.reduce(
                "ReduceProd", self.node("Gather", [self.shape(x), self.ints(axes)]), None, False
            )
        return self.node("Div", [total, self.cast(count, dtype)])

    def split(self, x: str, axis: int, sizes: Sequence[int] | str | None, count: int) -> list[str]:
        """x split along `axis` into `count` parts: of `sizes` (ints or an int64 tensor), or
        equal parts when sizes is None."""
        inputs = [x]
        num_outputs = None
        if sizes is not None:
            inputs.append(sizes if isinstance(sizes, str) else self.ints(sizes))
        elif self.opset >= 18:
            num_outputs = count
        parts = self.node("Split", inputs, outputs=count, axis=axis, num_outputs=num_outputs)
        return [parts] if count == 1 else parts

    def zeros_like(self, x: str, dtype: str, value: float = 0.0) -> str:
        """A tensor of x's shape filled with `value` of `dtype`."""
        fill = numpy_helper.from_array(np.asarray([value], dtype=dtype))
        return self.node("ConstantOfShape", [self.shape(x)], value=fill)

    def fill(self, shape: str, value: Any, dtype: str) -> str:
        """A tensor of the run-time `shape` (int64 [rank]) filled with `value`."""
        fill = numpy_helper.from_array(np.asarray([value], dtype=dtype))
        return self.node("ConstantOfShape", [shape], value=fill)

    # ---- variables ----

    def lookup(self, name: str, user: OpDesc | None = None) -> Value:
        """The current Value of nestflow variable `name`; a parameter is loaded from the
        scope on first use."""
        return self.model.lookup(self.env, name, user)

    def bind(self, name: str, onnx_name: str, dtype: str, sequence: bool = False) -> Value:
        value = Value(onnx_name, dtype, sequence)
        self.env.bind(name, value)
        return value

    def child(self, graph: Graph, env: Env) -> Emitter:
        return Emitter(self.model, graph, env, self.base)


class OpContext(Emitter):
    """What a mapper sees of the op it exports: its slots, attrs and declared variables."""

    def __init__(self, model: Any, graph: Graph, env: Env, op: OpDesc):
        outs = [n for n in op.output_names() if n]
        super().__init__(model, graph, env, outs[0] if outs else op.type)
        self.op = op
        self.attrs = op.attrs

    @property
    def block(self) -> Block:
        return self.op.block

    def has_input(self, slot: str, index: int = 0) -> bool:
        names = self.op.input(slot)
        return index < len(names) and bool(names[index])

    def has_output(self, slot: str, index: int = 0) -> bool:
        names = self.op.output(slot)
        return index < len(names) and bool(names[index])

    def input(self, slot: str, index: int = 0) -> str | None:
        """The ONNX name of the slot's `index`-th input, None when the slot is empty."""
        if not self.has_input(slot, index):
            return None
        return self.lookup(self.op.input(slot)[index], self.op).name

    def inputs(self, slot: str) -> list[str]:
        return [self.lookup(n, self.op).name for n in self.op.input(slot)]

    def var(self, name: str) -> VarDesc:
        found = self.block.find_var(name)
        if found is None:
            raise NestflowError(f"variable '{name}' is not declared in block {self.block.idx}")
        return found

    def in_var(self, slot: str, index: int = 0) -> VarDesc:
        return self.var(self.op.input(slot)[index])

    def out_var(self, slot: str, index: int = 0) -> VarDesc:
        return self.var(self.op.output(slot)[index])

    def set_output(self, slot: str, onnx_name: str, index: int = 0) -> None:
        """Bind the slot's `index`-th output variable to `onnx_name` (nothing if unnamed)."""
        if not self.has_output(slot, index):
            return
        var = self.out_var(slot, index)
        self.bind(var.name, onnx_name, var.dtype, var.type == "tensor_array")

    def static_dim(self, slot: str, axis: int, what: str) -> int:
        """The build-time size of the input's dim `axis`; ShapeError when it is unknown."""
        var = self.in_var(slot)
        size = var.shape[axis]
        if size < 0:
            raise ShapeError(
                f"exporting to ONNX needs dim {axis} of {slot} '{var.name}' "
                f"{list(var.shape)} known when the program is built ({what}); it is -1"
            )
        return size

    def unsupported(self, why: str) -> UnknownOpError:
        return UnknownOpError(f"'{self.op.type}' cannot be exported to ONNX: {why}")
