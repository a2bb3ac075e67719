"""The hostile ONNX models of issue 32, built with onnx.helper: each `build(name, directory)`
gives what nf.onnx.load is handed (a ModelProto, its bytes or a file written into
`directory`), the feed, the base_dir to load with and the outcome expected: "ok" (runs and
equals onnxruntime) or the nf.errors class raised by the import or the run.

Used by the regression tests (test_import_hostile.py) and, one child process for many
cases, by the ONNX fuzz (test_fuzz_onnx.py): the same cases under a time bound and a memory
cap. Every file a case reads lies in `directory`; a file named SECRET outside it (in its
parent, and in the fuzz worker's working directory) must never be read.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

F, I64, BOOL = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
SECRET = "secret.bin"
HUGE = [10**6, 10**6]


def model(nodes, inputs, outputs, initializers=(), opset=17):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def tensor(name, shape, elem=F):
    return helper.make_tensor_value_info(name, elem, shape)


def constant(name, array):
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(array, name))


def loop_model(condition: bool, body_condition_constant: bool = False):
    """for i in range(5): acc += [1, 2] (no condition input: how exporters write it), or
    with a constant condition; the body's condition passed through or a constant."""
    body_nodes = [helper.make_node("Add", ["acc_in", "step"], ["acc_out"])]
    if body_condition_constant:
        body_nodes.append(constant("cond_out", np.array(True)))
    else:
        body_nodes.append(helper.make_node("Identity", ["cond_in"], ["cond_out"]))
    body = helper.make_graph(
        body_nodes,
        "body",
        [tensor("i", [], I64), tensor("cond_in", [], BOOL), tensor("acc_in", [2])],
        [tensor("cond_out", [], BOOL), tensor("acc_out", [2])],
        [numpy_helper.from_array(np.float32([1, 2]), "step")],
    )
    nodes = [
        constant("n", np.array(5, np.int64)),
        constant("c", np.array(True)),
        helper.make_node("Loop", ["n", "c" if condition else "", "x"], ["y"], body=body),
    ]
    return model(nodes, [tensor("x", [2])], [tensor("y", [2])])


def external_data_model(location: str):
    """A MatMul whose weight's data lies in external file `location` (relative to the
    model's directory)."""
    weight = numpy_helper.from_array(np.eye(4, dtype=np.float32), "w")
    weight.ClearField("raw_data")
    weight.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", "0"), ("length", "64")):
        weight.external_data.add(key=key, value=value)
    node = helper.make_node("MatMul", ["x", "w"], ["y"])
    return model([node], [tensor("x", [1, 4])], [tensor("y", [1, 4])], [weight])


def huge_model(op: str):
    """A constant of 10**6 x 10**6 elements (or more) made by `op` from constant inputs."""
    if op == "ConstantOfShape":
        nodes = [constant("s", np.int64(HUGE)), helper.make_node(op, ["s"], ["y"])]
    elif op == "Expand":
        nodes = [
            constant("x", np.ones([1, 1], np.float32)),
            constant("s", np.int64(HUGE)),
            helper.make_node(op, ["x", "s"], ["y"]),
        ]
    elif op == "Tile":
        nodes = [
            constant("x", np.ones([2, 2], np.float32)),
            constant("r", np.int64(HUGE)),
            helper.make_node(op, ["x", "r"], ["y"]),
        ]
    elif op == "Range":
        nodes = [
            constant("a", np.float32(0)),
            constant("b", np.float32(1e12)),
            constant("d", np.float32(1)),
            helper.make_node(op, ["a", "b", "d"], ["y"]),
        ]
    elif op == "Pad":
        nodes = [
            constant("x", np.ones([2, 2], np.float32)),
            constant("p", np.int64([10**6, 10**6, 0, 0])),
            helper.make_node(op, ["x", "p"], ["y"]),
        ]
    elif op == "OneHot":
        nodes = [
            constant("i", np.arange(1000, dtype=np.int64)),
            constant("d", np.int64(10**9)),
            constant("v", np.float32([0, 1])),
            helper.make_node(op, ["i", "d", "v"], ["y"]),
        ]
    else:  # Resize
        nodes = [
            constant("x", np.ones([1, 1, 2, 2], np.float32)),
            constant("s", np.float32([1, 1, 1e6, 1e6])),
            helper.make_node(op, ["x", "", "s"], ["y"]),
        ]
    return model(nodes, [], [tensor("y", None)])


def nested_if_model(depth: int):
    """If inside If, `depth` deep, on a fed condition: built in place (onnx.helper copies a
    subgraph through protobuf's parser, which stops at about 30 levels)."""
    proto = model([], [tensor("c", [], BOOL)], [tensor("o0", [1])])
    graph = proto.graph
    for level in range(depth):
        node = graph.node.add(op_type="If", input=["c"], output=[f"o{level}"])
        other = node.attribute.add(name="else_branch", type=onnx.AttributeProto.GRAPH).g
        other.CopyFrom(
            helper.make_graph(
                [constant(f"e{level}", np.float32([0]))],
                f"else{level}",
                [],
                [tensor(f"e{level}", [1])],
            )
        )
        graph = node.attribute.add(name="then_branch", type=onnx.AttributeProto.GRAPH).g
        graph.name = f"then{level}"
        graph.output.add().CopyFrom(tensor(f"o{level + 1}", [1]))
    graph.node.add().CopyFrom(constant(f"o{depth}", np.float32([1])))
    return proto


def conv_model(**attrs):
    node = helper.make_node("Conv", ["x", "w"], ["y"], **attrs)
    weight = numpy_helper.from_array(np.ones([2, 1, 3, 3], np.float32), "w")
    return model([node], [tensor("x", [1, 1, 6, 6])], [tensor("y", None)], [weight])


def forbidden_graph(kind: str):
    """A graph ONNX forbids: a value written twice, a graph input overwritten, an
    initializer with a negative dim."""
    if kind == "two_writers":
        nodes = [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Neg", ["x"], ["y"])]
        return model(nodes, [tensor("x", [2])], [tensor("y", [2])])
    if kind == "input_overwritten":
        nodes = [helper.make_node("Neg", ["x"], ["x"]), helper.make_node("Relu", ["x"], ["y"])]
        return model(nodes, [tensor("x", [2])], [tensor("y", [2])])
    weight = numpy_helper.from_array(np.ones([2, 4], np.float32), "w")
    weight.dims[:] = [-1, 4]
    node = helper.make_node("Add", ["x", "w"], ["y"])
    return model([node], [tensor("x", [2, 4])], [tensor("y", [2, 4])], [weight])


X2 = {"x": np.float32([0.5, -1.0])}
X4 = {"x": np.arange(4, dtype=np.float32).reshape(1, 4)}
X6 = {"x": np.linspace(-1, 1, 36, dtype=np.float32).reshape(1, 1, 6, 6)}

# name -> expected outcome; build(name, directory) makes the case.
CASES = {
    "loop_constant_trip_count": "ok",
    "loop_constant_trip_count_constant_body_condition": "ok",
    "loop_constant_condition": "ok",
    "external_data_in_directory": "ok",
    "external_data_as_bytes": "ProgramDecodeError",
    "external_data_as_proto": "ProgramDecodeError",
    "external_data_as_bytes_with_base_dir": "ok",
    "external_data_parent": "ProgramDecodeError",
    "external_data_absolute": "ProgramDecodeError",
    "external_data_symlink": "ProgramDecodeError",
    "external_data_fifo": "ProgramDecodeError",
    "external_data_directory": "ProgramDecodeError",
    "huge_ConstantOfShape": "ExecutionError",
    "huge_Expand": "ExecutionError",
    "huge_Tile": "ShapeError",
    "huge_Range": "ShapeError",
    "huge_Pad": "ShapeError",
    "huge_OneHot": "ShapeError",
    "huge_Resize": "ShapeError",
    "nested_if_200_in_memory": "ProgramDecodeError",
    "nested_if_200_as_bytes": "ProgramDecodeError",
    "conv_strides_0": "AttrError",
    "conv_dilations_0": "AttrError",
    "conv_pads_negative": "AttrError",
    "conv_kernel_shape_wrong": "AttrError",
    "conv_group_0": "AttrError",
    "conv_group_3": "AttrError",
    "two_writers": "ProgramDecodeError",
    "input_overwritten": "ProgramDecodeError",
    "initializer_negative_dim": "ProgramDecodeError",
}


def _external(directory: Path, location: str, how: str = "file"):
    """external_data_model(location) as a ModelProto, its bytes or a file in `directory`."""
    proto = external_data_model(location)
    if how == "proto":
        return proto
    if how == "bytes":
        return proto.SerializeToString()
    path = directory / "model.onnx"
    path.write_bytes(proto.SerializeToString())
    return str(path)


def build(name: str, directory: str | os.PathLike):
    """(model, feed, base_dir) of hostile case `name`: its files written into `directory`
    (whose parent holds SECRET: a case reading it reads outside the model's directory)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    data = np.eye(4, dtype=np.float32).tobytes()
    (directory / "weights.bin").write_bytes(data)
    (directory.parent / SECRET).write_bytes(data)
    if name == "loop_constant_trip_count":
        return loop_model(False), X2, None
    if name == "loop_constant_trip_count_constant_body_condition":
        return loop_model(False, body_condition_constant=True), X2, None
    if name == "loop_constant_condition":
        return loop_model(True), X2, None
    if name == "external_data_in_directory":
        return _external(directory, "weights.bin"), X4, None
    if name in ("external_data_as_bytes", "external_data_as_proto"):
        # the working directory may hold SECRET: without base_dir nothing may be read there
        return _external(directory, SECRET, name.rsplit("_", 1)[1]), X4, None
    if name == "external_data_as_bytes_with_base_dir":
        return _external(directory, "weights.bin", "bytes"), X4, str(directory)
    if name.startswith("external_data_"):
        kind = name.removeprefix("external_data_")
        if kind == "parent":
            location = f"../{SECRET}"
        elif kind == "absolute":
            location = str(directory.parent / SECRET)
        elif kind == "symlink":
            location = "link.bin"
            os.symlink(directory.parent / SECRET, directory / location)
        elif kind == "fifo":
            location = "fifo.bin"
            os.mkfifo(directory / location)
        else:
            location = "subdir"
            (directory / location).mkdir()
        return _external(directory, location), X4, None
    if name.startswith("huge_"):
        return huge_model(name.removeprefix("huge_")), {}, None
    if name.startswith("nested_if_200"):
        proto = nested_if_model(200)
        if name.endswith("as_bytes"):
            return proto.SerializeToString(), {"c": np.array(True)}, None
        return proto, {"c": np.array(True)}, None
    if name.startswith("conv_"):
        attrs = {
            "conv_strides_0": {"strides": [0, 0]},
            "conv_dilations_0": {"dilations": [0, 1]},
            "conv_pads_negative": {"pads": [-1, 0, 0, 0]},
            "conv_kernel_shape_wrong": {"kernel_shape": [5, 5]},
            "conv_group_0": {"group": 0},
            "conv_group_3": {"group": 3},
        }[name]
        return conv_model(**attrs), X6, None
    return forbidden_graph(name), X2, None
