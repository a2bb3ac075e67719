"""The runtime core: Place, Tensor, Variable, Scope. Knows nothing of protobuf or operators."""

from nestflow.core.device_context import DeviceContext, device_context
from nestflow.core.place import (
    CPUPlace,
    CUDAPlace,
    Place,
    StandInPlace,
    default_place,
    is_compiled_with_cuda,
    set_default_place,
)
from nestflow.core.scope import Scope, live_scope_count
from nestflow.core.selected_rows import SelectedRows
from nestflow.core.tensor import Tensor
from nestflow.core.variable import Variable

__all__ = [
    "CPUPlace",
    "CUDAPlace",
    "DeviceContext",
    "Place",
    "Scope",
    "SelectedRows",
    "StandInPlace",
    "Tensor",
    "Variable",
    "default_place",
    "set_default_place",
    "device_context",
    "is_compiled_with_cuda",
    "live_scope_count",
]
