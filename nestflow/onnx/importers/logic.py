"""Mappers of ONNX's comparisons and logical ops (bool outputs, NumPy broadcasting)."""

from __future__ import annotations

from nestflow.onnx.importers.registry import Node, mapper

_COMPARE = {
    "Equal": "equal",
    "Less": "less_than",
    "LessOrEqual": "less_equal",
    "Greater": "greater_than",
    "GreaterOrEqual": "greater_equal",
    "And": "logical_and",
    "Or": "logical_or",
    "Xor": "logical_xor",
}


@mapper(*_COMPARE)
def compare(node: Node) -> None:
    node.op(_COMPARE[node.op_type], {"X": node.input(0), "Y": node.input(1)}, out=0)


@mapper("Not")
def logical_not(node: Node) -> None:
    node.op("logical_not", {"X": node.input(0)}, out=0)
