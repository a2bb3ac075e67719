"""ONNX mappers of nestflow's ops, one module per op family (as nestflow.ops): importing the
package registers every mapper in MAPPERS (op type -> mapper function)."""

from nestflow.onnx.exporters import (  # noqa: F401  (registers the mappers)
    activation,
    control_flow,
    indexing,
    logic,
    loss,
    math,
    nn,
    norm,
    onnx_compat,
    reduce,
    schedule,
    sequence,
    tensor,
)
from nestflow.onnx.exporters.graph import MAPPERS

__all__ = ["MAPPERS"]
