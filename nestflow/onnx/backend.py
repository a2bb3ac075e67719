"""nestflow as an ONNX backend (onnx.backend.base.Backend), so that ONNX's own backend tests
run against it:

    import onnx.backend.test
    import nestflow.onnx.backend as backend
    globals().update(onnx.backend.test.BackendTest(backend, __name__).test_cases)

    rep = backend.prepare(model)          # nf.onnx.load into a scope of its own
    outputs = rep.run([x])                # a namedtuple of arrays, one per graph output

Models run on the CPU (NumPy); `supports_device("CPU")` is the only True answer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from onnx.backend.base import Backend, BackendRep, namedtupledict

from nestflow.core.scope import Scope
from nestflow.errors import DTypeError, FeedError, NestflowError


class NestflowRep(BackendRep):
    """A prepared model: its Program, feeds, fetches and the scope holding its parameters."""

    def __init__(self, program, feed_names: list[str], fetch_vars: list, scope: Scope, outputs):
        from nestflow.executor import Executor

        self.program = program
        self.feed_names = feed_names
        self.fetch_vars = fetch_vars
        self.scope = scope
        self.output_names = list(outputs)
        self.executor = Executor()

    def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Run on `inputs`: one array per graph input in order (a list, a tuple, a single
        array), or a dict by input name. Returns the outputs as a namedtuple."""
        if isinstance(inputs, Mapping):
            feed = dict(inputs)
        else:
            values = [inputs] if isinstance(inputs, np.ndarray) else list(inputs)
            if len(values) != len(self.feed_names):
                raise FeedError(
                    f"the model takes {len(self.feed_names)} inputs {self.feed_names}, "
                    f"got {len(values)}"
                )
            feed = dict(zip(self.feed_names, values))
        outputs = self.executor.run(
            self.program, feed=feed, fetch_list=self.fetch_vars, scope=self.scope
        )
        return namedtupledict("Outputs", self.output_names)(*outputs)


class NestflowBackend(Backend):
    """The ONNX backend API over nf.onnx.load and nf.Executor."""

    @classmethod
    def is_compatible(cls, model, device: str = "CPU", **kwargs: Any) -> bool:
        """Whether nestflow imports `model` (every op mapped, opset and dtypes supported)."""
        from nestflow.onnx.importer import load

        if not cls.supports_device(device):
            return False
        try:
            load(model, Scope())
        except NestflowError:
            return False
        return True

    @classmethod
    def prepare(cls, model, device: str = "CPU", **kwargs: Any) -> NestflowRep:
        """Import `model` (a ModelProto, bytes or path) into a fresh scope."""
        from nestflow.onnx.importer import load, read_model

        if not cls.supports_device(device):
            raise NestflowError(f"nestflow runs ONNX models on the CPU only, not on '{device}'")
        proto = read_model(model)
        scope = Scope()
        program, feeds, fetches = load(proto, scope)
        return NestflowRep(program, feeds, fetches, scope, [o.name for o in proto.graph.output])

    @classmethod
    def run_model(cls, model, inputs: Any, device: str = "CPU", **kwargs: Any) -> tuple:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(
        cls,
        node,
        inputs: Any,
        device: str = "CPU",
        outputs_info: Sequence[tuple[Any, tuple[int, ...]]] | None = None,
        **kwargs: Any,
    ) -> tuple:
        """Run one NodeProto on `inputs` (arrays, in the node's input order): a one-node model
        typed from the arrays, at kwargs['opset_version'] (default: the newest nestflow
        imports)."""
        from onnx import helper

        from nestflow.onnx.importer import DTYPE_ELEMENTS, MAX_OPSET

        arrays = [
            np.asarray(a) for a in (inputs.values() if isinstance(inputs, Mapping) else inputs)
        ]
        names = [n for n in node.input if n]
        graph_inputs = []
        for name, array in zip(names, arrays):
            elem = DTYPE_ELEMENTS.get(array.dtype.name)
            if elem is None:
                raise DTypeError(
                    f"input '{name}' is {array.dtype}, which has no ONNX element type nestflow "
                    f"imports ({sorted(DTYPE_ELEMENTS)})"
                )
            graph_inputs.append(helper.make_tensor_value_info(name, elem, array.shape))
        graph_outputs = []
        for k, name in enumerate(n for n in node.output if n):
            if outputs_info is not None and k < len(outputs_info):
                dtype, shape = outputs_info[k]
                elem = DTYPE_ELEMENTS.get(np.dtype(dtype).name, 0)
                graph_outputs.append(helper.make_tensor_value_info(name, elem, shape))
            else:
                graph_outputs.append(helper.make_empty_tensor_value_info(name))
        graph = helper.make_graph([node], f"{node.op_type}_node", graph_inputs, graph_outputs)
        opset = kwargs.get("opset_version", MAX_OPSET)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        return cls.prepare(model, device).run(arrays)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return device.split(":")[0].upper() == "CPU"


is_compatible = NestflowBackend.is_compatible
prepare = NestflowBackend.prepare
run_model = NestflowBackend.run_model
run_node = NestflowBackend.run_node
supports_device = NestflowBackend.supports_device
