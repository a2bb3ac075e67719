"""nestflow: a define-then-run deep-learning framework of nested blocks and scopes.

import nestflow as nf
main, startup = nf.Program(), nf.Program()
with nf.program_guard(main, startup):
    x = nf.data("x", shape=[-1, 784])
    p = nf.layers.fc(x, size=10, act="softmax")
exe = nf.Executor(nf.CPUPlace())
"""

from typing import TYPE_CHECKING

from nestflow import (
    amp,
    errors,
    layers,
    ops,  # noqa: E402  (registers every operator)
    optimizer,
)
from nestflow.core import (
    CPUPlace,
    CUDAPlace,
    DeviceContext,
    Place,
    Scope,
    SelectedRows,
    Tensor,
    Variable,
    default_place,
    device_context,
    is_compiled_with_cuda,
    set_default_place,
)
from nestflow.core.threads import get_num_threads, set_num_threads
from nestflow.executor import (
    ExecutionStrategy,
    Executor,
    Net,
    PlainNet,
    append_backward,
    global_scope,
    gradients,
    prune,
)
from nestflow.executor.recurrent_net import RecurrentNet
from nestflow.flags import get_flags, set_flags
from nestflow.framework import (
    Block,
    OpDesc,
    Program,
    VarDesc,
    default_main_program,
    default_startup_program,
    program_guard,
    unique_name,
)
from nestflow.layers import ParamAttr, data, initializer
from nestflow.layers.net_builder import NetBuilder
from nestflow.layers.seed_api import get_variable, minibatch, sequence, var
from nestflow.layers.tensor import one_hot_v2 as one_hot
from nestflow.ops import seed

layer = layers
add = layers.elementwise_add
sigmoid = layers.sigmoid
ifelse = layers.IfElse
BlockOp = layers.BlockOp
While = layers.While
rnn = layers.RNN

__version__ = "0.1.0"

if TYPE_CHECKING:
    from nestflow import clip, cuda, distributed, io, metric, nets, onnx, profiler, regularizer
    from nestflow.hapi import InputSpec, Model, callbacks

# Imported on first use (safetensors, tempfile): most programs never save or load a file.
_LAZY_MODULES = (
    "io",
    "cuda",
    "nets",
    "regularizer",
    "clip",
    "metric",
    "profiler",
    "onnx",
    "distributed",
)
# Names of the high-level API (nestflow.hapi), imported on first use as well.
_LAZY_HAPI = ("Model", "InputSpec", "callbacks")


def __getattr__(name: str):
    if name in _LAZY_MODULES:
        import importlib

        return importlib.import_module(f"nestflow.{name}")
    if name in _LAZY_HAPI:
        import nestflow.hapi

        value = globals()[name] = getattr(nestflow.hapi, name)
        return value
    from nestflow.errors import UnknownNameError, suggest_names

    raise UnknownNameError(
        f"module 'nestflow' has no attribute '{name}'{suggest_names(name, __dir__())}; "
        "layers live in nf.layers, optimizers in nf.optimizer"
    )


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY_MODULES, *_LAZY_HAPI})


__all__ = [
    "Block",
    "CPUPlace",
    "CUDAPlace",
    "DeviceContext",
    "ExecutionStrategy",
    "Executor",
    "InputSpec",
    "Model",
    "Net",
    "NetBuilder",
    "PlainNet",
    "RecurrentNet",
    "OpDesc",
    "ParamAttr",
    "Place",
    "Program",
    "Scope",
    "SelectedRows",
    "Tensor",
    "VarDesc",
    "Variable",
    "While",
    "add",
    "append_backward",
    "gradients",
    "data",
    "default_place",
    "device_context",
    "is_compiled_with_cuda",
    "set_default_place",
    "default_main_program",
    "default_startup_program",
    "errors",
    "get_variable",
    "get_flags",
    "get_num_threads",
    "ifelse",
    "BlockOp",
    "rnn",
    "minibatch",
    "one_hot",
    "sequence",
    "var",
    "global_scope",
    "initializer",
    "io",
    "cuda",
    "nets",
    "regularizer",
    "callbacks",
    "clip",
    "metric",
    "profiler",
    "onnx",
    "distributed",
    "layer",
    "layers",
    "ops",
    "optimizer",
    "amp",
    "program_guard",
    "prune",
    "seed",
    "set_flags",
    "set_num_threads",
    "sigmoid",
    "unique_name",
]
