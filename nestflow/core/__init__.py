"""The runtime core: Place, Tensor, Variable, Scope. Knows nothing of protobuf or operators."""

from nestflow.core.place import CPUPlace, CUDAPlace, Place, is_compiled_with_cuda
from nestflow.core.scope import Scope, live_scope_count
from nestflow.core.tensor import Tensor
from nestflow.core.variable import Variable

__all__ = [
    "CPUPlace",
    "CUDAPlace",
    "Place",
    "Scope",
    "Tensor",
    "Variable",
    "is_compiled_with_cuda",
    "live_scope_count",
]
