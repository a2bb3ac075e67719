"""ONNX op mappers of the importer, one module per op family: importing the package fills
MAPPERS (ONNX op type -> mapper function)."""

from nestflow.onnx.importers import (  # noqa: F401  (registers the mappers)
    control_flow,
    logic,
    loss,
    math,
    nn,
    reduce,
    rnn,
    tensor,
)
from nestflow.onnx.importers.registry import MAPPERS, Node, mapper

__all__ = ["MAPPERS", "Node", "mapper"]
