"""Issue 32's hostile ONNX models (tests/onnx/hostile_models.py) in this process: a Loop with
a constant trip count or condition runs as onnxruntime does; external data is read only from
the model's directory or base_dir; Conv attributes, values assigned twice, negative dims and
deep nesting are nf.errors errors. The constant bombs run only in the fuzz worker, under its
memory cap (test_fuzz_onnx.py), as do all of these cases again."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

import nestflow as nf  # noqa: E402
from nestflow import errors  # noqa: E402
from nestflow.onnx.importer import MAX_SUBGRAPH_DEPTH  # noqa: E402
from tests.onnx import hostile_models as hostile  # noqa: E402


def load_and_run(model, feed, base_dir=None):
    scope = nf.Scope()
    program, _, fetches = nf.onnx.load(model, scope, base_dir=base_dir)
    return nf.Executor().run(program, feed=feed, fetch_list=fetches, scope=scope)


def onnxruntime_outputs(model, feed, base_dir=None):
    if isinstance(model, str):
        return ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feed)
    proto = onnx.ModelProto.FromString(model) if isinstance(model, bytes) else model
    onnx.external_data_helper.load_external_data_for_model(proto, base_dir)
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feed)


@pytest.mark.parametrize(
    "name", [n for n in hostile.CASES if not n.startswith(("huge_", "external_data_as_"))]
)
def test_hostile_model(name, tmp_path, monkeypatch):
    """Each case as issue 32 gives it: run and equal to onnxruntime, or the nf.errors error
    named (never a hang, a bare exception or a file read outside the model's directory)."""
    monkeypatch.chdir(tmp_path)  # holds SECRET, which no case may read
    model, feed, base_dir = hostile.build(name, tmp_path / "model")
    expected = hostile.CASES[name]
    if expected == "ok":
        got = load_and_run(model, feed, base_dir)
        for a, b in zip(got, onnxruntime_outputs(model, feed, base_dir), strict=True):
            np.testing.assert_array_equal(a, b)
    else:
        with pytest.raises(getattr(errors, expected)):
            load_and_run(model, feed, base_dir)


@pytest.mark.parametrize("how", ["bytes", "proto"])
def test_external_data_of_bytes_or_a_proto_needs_base_dir(how, tmp_path, monkeypatch):
    """Without base_dir nothing is read from the working directory (which holds the file the
    model names); with it, the data comes from there and a given ModelProto is left as it
    was."""
    monkeypatch.chdir(tmp_path)
    model, feed, _ = hostile.build(f"external_data_as_{how}", tmp_path / "model")
    before = model.SerializeToString() if how == "proto" else model
    with pytest.raises(errors.ProgramDecodeError, match="base_dir"):
        load_and_run(model, feed)
    with pytest.raises(errors.ProgramDecodeError, match="external data"):
        load_and_run(model, feed, base_dir=tmp_path / "model")  # '../secret.bin': refused
    (out,) = load_and_run(model, feed, base_dir=tmp_path)  # where secret.bin is
    np.testing.assert_array_equal(out, feed["x"])
    if how == "proto":
        assert model.SerializeToString() == before


def test_an_external_tensor_in_a_constant_node_is_not_read_from_the_working_directory(
    tmp_path, monkeypatch
):
    """A Constant node's tensor (not an initializer) with external data: refused too."""
    monkeypatch.chdir(tmp_path)
    hostile.build("loop_constant_condition", tmp_path / "model")  # writes SECRET
    value = onnx.numpy_helper.from_array(np.ones(4, np.float32), "v")
    value.ClearField("raw_data")
    value.data_location = onnx.TensorProto.EXTERNAL
    value.external_data.add(key="location", value=hostile.SECRET)
    node = onnx.helper.make_node("Constant", [], ["y"], value=value)
    proto = hostile.model([node], [], [hostile.tensor("y", [4])])
    with pytest.raises(errors.ProgramDecodeError, match="base_dir"):
        nf.onnx.load(proto, nf.Scope())


def test_subgraphs_nested_to_the_limit_import_and_past_it_are_refused():
    proto = hostile.nested_if_model(MAX_SUBGRAPH_DEPTH)
    (out,) = load_and_run(proto, {"c": np.array(True)})
    np.testing.assert_array_equal(out, [1.0])
    with pytest.raises(errors.ProgramDecodeError, match="nests subgraphs"):
        nf.onnx.load(hostile.nested_if_model(MAX_SUBGRAPH_DEPTH + 1), nf.Scope())


def test_a_value_written_twice_in_a_subgraph_is_refused():
    then = onnx.helper.make_graph(
        [hostile.constant("t", np.float32([1])), hostile.constant("t", np.float32([2]))],
        "then",
        [],
        [hostile.tensor("t", [1])],
    )
    other = onnx.helper.make_graph(
        [hostile.constant("e", np.float32([0]))], "else", [], [hostile.tensor("e", [1])]
    )
    node = onnx.helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)
    proto = hostile.model(
        [node], [hostile.tensor("c", [], hostile.BOOL)], [hostile.tensor("y", [1])]
    )
    with pytest.raises(errors.ProgramDecodeError, match="subgraph 'then'.*writes 't'"):
        nf.onnx.load(proto, nf.Scope())


@pytest.mark.parametrize(
    ("attrs", "message"),
    [
        ({"strides": [0, 0]}, r"strides=\[0, 0\] must be 2 ints >= 1"),
        ({"strides": [1]}, r"strides=\[1\] must be 2 ints"),
        ({"dilations": [1, -2]}, "dilations"),
        ({"pads": [0, 0, 0]}, "pads"),
        ({"kernel_shape": [0, 3]}, "kernel_shape"),
        ({"group": -1}, "group=-1"),
    ],
)
def test_conv_attributes_are_checked_with_the_node_named(attrs, message):
    with pytest.raises(errors.AttrError, match=message) as caught:
        nf.onnx.load(hostile.conv_model(**attrs), nf.Scope())
    assert "(Conv)" in str(caught.value)


def test_conv_transpose_and_pool_attributes_are_checked():
    x = hostile.tensor("x", [1, 2, 6, 6])
    w = onnx.numpy_helper.from_array(np.ones([2, 1, 3, 3], np.float32), "w")
    node = onnx.helper.make_node("ConvTranspose", ["x", "w"], ["y"], strides=[0, 1])
    with pytest.raises(errors.AttrError, match="strides"):
        nf.onnx.load(hostile.model([node], [x], [hostile.tensor("y", None)], [w]), nf.Scope())
    node = onnx.helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], strides=[0, 2])
    with pytest.raises(errors.AttrError, match="strides"):
        nf.onnx.load(hostile.model([node], [x], [hostile.tensor("y", None)]), nf.Scope())
