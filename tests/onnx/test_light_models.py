"""The 9 "light" model-zoo models shipped in the onnx wheel (onnx/backend/test/data/light):
imported, run on onnx's BackendTest input (arange(n).reshape(shape) / n, float32) and compared
with each model's reference output (rtol 1e-3, atol 1e-4).

The light models are the zoo's networks with every weight a constant (ConstantOfShape of one
value, e.g. 0.02), so the channels of each layer are equal in exact arithmetic. SqueezeNet ends
in a softmax over 1000 logits of about 1e10 that are all equal: its reference (a uniform
0.001) holds only for a runtime whose products give equal channels bit for bit. OpenBLAS's
sgemm does not (its microkernel rounds some rows differently: a row spread of 1 ulp, 1024 at
1e10, turns the softmax into 0s and a 1), so SqueezeNet is checked with its float32 tensors
and weights widened to float64, where the equal channels stay equal after rounding back; the
other eight run in float32.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, numpy_helper  # noqa: E402

import nestflow as nf  # noqa: E402

LIGHT = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
MODELS = [
    "light_bvlc_alexnet",
    "light_densenet121",
    "light_inception_v1",
    "light_inception_v2",
    "light_resnet50",
    "light_shufflenet",
    "light_squeezenet",
    "light_vgg19",
    "light_zfnet512",
]
WIDENED = {"light_squeezenet"}


def backend_test_input(value_info) -> np.ndarray:
    """onnx's BackendTest input for a light model (Runner.generate_dummy_data, random=False)."""
    shape = [d.dim_value for d in value_info.type.tensor_type.shape.dim]
    n = int(np.prod(shape))
    return (np.arange(n).reshape(shape) / n).astype(np.float32)


def widened(proto):
    """The model with its float32 inputs, outputs and constants made float64."""
    proto = onnx.ModelProto.FromString(proto.SerializeToString())
    graph = proto.graph
    for value in [*graph.input, *graph.output, *graph.value_info]:
        if value.type.tensor_type.elem_type == TensorProto.FLOAT:
            value.type.tensor_type.elem_type = TensorProto.DOUBLE
    for k, tensor in enumerate(graph.initializer):
        if tensor.data_type == TensorProto.FLOAT:
            array = numpy_helper.to_array(tensor).astype(np.float64)
            graph.initializer[k].CopyFrom(numpy_helper.from_array(array, tensor.name))
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.TENSOR and attr.t.data_type == TensorProto.FLOAT:
                array = numpy_helper.to_array(attr.t).astype(np.float64)
                attr.t.CopyFrom(numpy_helper.from_array(array, attr.t.name))
    return proto


@pytest.mark.parametrize("name", MODELS)
def test_light_model_reproduces_its_reference_output(name):
    proto = onnx.load(os.path.join(LIGHT, f"{name}.onnx"))
    expected = numpy_helper.to_array(onnx.load_tensor(os.path.join(LIGHT, f"{name}_output_0.pb")))
    if name in WIDENED:
        proto = widened(proto)
    scope = nf.Scope()
    program, feeds, fetches = nf.onnx.load(proto, scope)
    assert len(feeds) == 1 and len(fetches) == 1
    value_info = next(v for v in proto.graph.input if v.name == feeds[0])
    x = backend_test_input(value_info)
    if name in WIDENED:
        x = x.astype(np.float64)
    (out,) = nf.Executor().run(program, feed={feeds[0]: x}, fetch_list=fetches, scope=scope)
    out = out.astype(np.float32)
    assert out.shape == expected.shape
    np.testing.assert_allclose(out, expected, rtol=1e-3, atol=1e-4)
