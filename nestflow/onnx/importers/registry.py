"""The mapper table and `Node`, what a mapper sees of the ONNX node it imports.

    @mapper("Relu")
    def relu(node: Node) -> None:
        node.op("relu", {"X": node.input(0)}, out=0)

A mapper reads the node's inputs (`input(i)`: a variable name; `const(i)`: the value when it
is known at import, else None), its attributes (`attr`), appends nestflow ops with `op` (which
folds an op whose inputs are all constants into a constant instead) and binds each ONNX output
to a variable with `out=` or `set_output`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from nestflow.errors import AttrError, ProgramDecodeError, ShapeError
from nestflow.ops.registry import VarInfo

MAPPERS: dict[str, Callable[[Node], None]] = {}


def mapper(*op_types: str) -> Callable:
    """Register the decorated function as the mapper of ONNX op types `op_types`."""

    def register(fn: Callable[[Node], None]) -> Callable[[Node], None]:
        for op_type in op_types:
            MAPPERS[op_type] = fn
        return fn

    return register


def _attr_value(attr, where: str) -> Any:
    import onnx

    from nestflow.onnx.importer import tensor_array

    kinds = onnx.AttributeProto
    kind = attr.type
    if kind == kinds.FLOAT:
        return float(attr.f)
    if kind == kinds.INT:
        return int(attr.i)
    if kind == kinds.STRING:
        return attr.s.decode("utf-8", "replace")
    if kind == kinds.TENSOR:
        return tensor_array(attr.t, f"{where}: attribute '{attr.name}'")
    if kind == kinds.GRAPH:
        return attr.g
    if kind == kinds.FLOATS:
        return [float(v) for v in attr.floats]
    if kind == kinds.INTS:
        return [int(v) for v in attr.ints]
    if kind == kinds.STRINGS:
        return [s.decode("utf-8", "replace") for s in attr.strings]
    if kind == kinds.GRAPHS:
        return list(attr.graphs)
    raise AttrError(
        f"{where}: attribute '{attr.name}' is of type {kinds.AttributeType.Name(kind)}, which "
        f"the importer does not read"
    )


class Node:
    """One ONNX node being imported (see the module docstring)."""

    def __init__(self, graph, proto, where: str):
        self.graph = graph
        self.proto = proto
        self.where = where
        self.op_type = proto.op_type
        self.opset = graph.opset
        self._attrs = {a.name: a for a in proto.attribute}
        self.base = proto.name or proto.op_type.lower()

    # ---- attributes ----
    def attr(self, name: str, default: Any = None) -> Any:
        attr = self._attrs.get(name)
        return default if attr is None else _attr_value(attr, self.where)

    def has_attr(self, name: str) -> bool:
        return name in self._attrs

    def unsupported(self, what: str) -> AttrError:
        """The error for an attribute value (or combination) the mapper does not import."""
        return AttrError(f"{what} is not supported by nestflow's importer")

    # ---- inputs ----
    @property
    def num_inputs(self) -> int:
        return len(self.proto.input)

    def has_input(self, i: int) -> bool:
        return i < len(self.proto.input) and bool(self.proto.input[i])

    def name_of(self, i: int) -> str:
        if not self.has_input(i):  # a mapper asking for it needs it
            raise ProgramDecodeError(f"input {i}, which {self.op_type} needs, is missing")
        return self.graph.lookup(self.proto.input[i])

    def name_of_output(self, k: int) -> str:
        """The variable (or constant) output `k` is bound to."""
        return self.graph.lookup(self.proto.output[k])

    def input(self, i: int) -> str | None:
        """Input `i` as a variable name ops can read (None if the node omits it)."""
        if not self.has_input(i):
            return None
        return self.graph.var(self.name_of(i))

    def inputs(self) -> list[str]:
        return [self.input(i) for i in range(self.num_inputs) if self.has_input(i)]

    def const(self, i: int) -> np.ndarray | None:
        """Input `i`'s value when known at import (a constant or a parameter's initial
        value), else None."""
        if not self.has_input(i):
            return None
        name = self.name_of(i)
        value = self.graph.consts.get(name)
        return self.graph.params.get(name) if value is None else value

    def fixed(self, i: int) -> np.ndarray | None:
        """Input `i`'s value when it is a constant (never a trainable parameter), else None."""
        return self.graph.consts.get(self.name_of(i)) if self.has_input(i) else None

    def ints(self, i: int, what: str) -> list[int] | None:
        """Input `i` as a list of ints when known at import, else None."""
        value = self.const(i)
        return None if value is None else [int(v) for v in np.asarray(value).reshape(-1)]

    def required_ints(self, i: int, what: str) -> list[int]:
        value = self.ints(i, what)
        if value is None:
            raise ShapeError(
                f"input {i} ('{self.proto.input[i]}', {what}) must be known when the model is "
                f"imported (a constant or initializer), but is computed at run time"
            )
        return value

    def info(self, i: int) -> VarInfo:
        return self.graph.info(self.name_of(i))

    def shape(self, i: int) -> tuple[int, ...]:
        return self.info(i).shape

    def rank(self, i: int) -> int:
        return len(self.info(i).shape)

    def dtype(self, i: int) -> str:
        return self.info(i).dtype

    # ---- outputs ----
    @property
    def num_outputs(self) -> int:
        return len(self.proto.output)

    def wants_output(self, k: int) -> bool:
        return k < len(self.proto.output) and bool(self.proto.output[k])

    def sole_reader(self, k: int):
        """The one node reading output `k` (None if none, several, or a graph output does)."""
        readers = self.graph.readers.get(self.proto.output[k], []) if self.wants_output(k) else []
        return readers[0] if len(readers) == 1 else None

    def set_output(self, k: int, name: str) -> None:
        """Bind ONNX output `k` to variable (or constant) `name`."""
        if self.wants_output(k):
            self.graph.bind(self.proto.output[k], name)

    def const_output(self, k: int, value: Any) -> None:
        """Bind ONNX output `k` to a constant."""
        if self.wants_output(k):
            name = self.graph.new_const(self.proto.output[k], np.asarray(value))
            self.graph.bind(self.proto.output[k], name)

    def constant(self, value: Any, dtype: str | None = None) -> str:
        """A constant (not yet a variable) holding `value`; its name."""
        array = np.asarray(value) if dtype is None else np.asarray(value, dtype)
        return self.graph.new_const(f"{self.base}.const", array)

    # ---- ops ----
    def op(
        self,
        op_type: str,
        inputs: dict[str, Any],
        attrs: dict[str, Any] | None = None,
        outputs: Sequence[str | tuple[str, int]] = ("Out",),
        out: int | None | Sequence[int | None] = None,
        fold: bool = True,
    ) -> Any:
        """Append nestflow op `op_type` reading `inputs` (slot -> variable or constant name,
        a list of them, or None for an absent optional slot). `outputs` names the output
        slots to create (a ("Out", n) pair for a duplicable slot of n variables); `out` binds
        them to ONNX outputs (an index per slot, None for none). An op whose inputs are all
        constants is folded (unless `fold` is False): its outputs are constants. Returns the output name (a tuple of
        them for several slots, a list for a duplicable slot)."""
        graph = self.graph
        attrs = dict(attrs or {})
        slots = {k: v for k, v in inputs.items() if v is not None}
        flat = [n for v in slots.values() for n in (v if isinstance(v, list) else [v])]
        specs = [(s, None) if isinstance(s, str) else s for s in outputs]
        binds = list(out) if isinstance(out, (list, tuple)) else [out] + [None] * (len(specs) - 1)
        results: list[Any] = []
        if flat and fold and graph.foldable(op_type, flat):
            values = graph.fold(op_type, slots, attrs)
            for _spec, value, k in zip(specs, values, binds):
                base = self._out_base(k, op_type)
                if isinstance(value, list):
                    results.append([graph.new_const(base, v) for v in value])
                else:
                    results.append(graph.new_const(base, value))
        else:
            reads = {
                k: [graph.var(n) for n in v] if isinstance(v, list) else [graph.var(v)]
                for k, v in slots.items()
            }
            created, writes = [], {}
            block = graph.block
            for (slot, count), k in zip(specs, binds):
                if count is None:
                    name = self._out_name(k, op_type)
                    block.create_var(name)
                    created.append(name)
                    writes[slot] = [name]
                    results.append(name)
                else:
                    names = [graph.fresh(f"{self.base}.{op_type}") for _ in range(count)]
                    for name in names:
                        block.create_var(name)
                    created.extend(names)
                    writes[slot] = names
                    results.append(names)
            try:
                block.append_op(op_type, reads, writes, attrs)
            except BaseException:
                for name in created:
                    block.remove_var(name)
                raise
        for result, k in zip(results, binds):
            if k is not None and not isinstance(result, list):
                self.set_output(k, result)
        return results[0] if len(results) == 1 else tuple(results)

    def _out_base(self, k: int | None, op_type: str) -> str:
        if k is not None and self.wants_output(k):
            return self.proto.output[k]
        return f"{self.base}.{op_type}"

    def _out_name(self, k: int | None, op_type: str) -> str:
        if k is not None and self.wants_output(k):
            return self.graph.claim(self.proto.output[k], f"{self.base}.{op_type}")
        return self.graph.fresh(f"{self.base}.{op_type}")
