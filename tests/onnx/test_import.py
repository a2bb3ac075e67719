"""nf.onnx.load: models built with onnx.helper, compared with onnx's reference evaluator;
constant folding of shape arithmetic; initializers as trainable parameters (a training step);
If/Loop; the backend API; and every kind of bad input as an nf.errors class."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

import nestflow as nf  # noqa: E402
import nestflow.onnx.backend as backend  # noqa: E402
from nestflow.errors import (  # noqa: E402
    AttrError,
    DTypeError,
    ProgramDecodeError,
    ShapeError,
    UnknownOpError,
)

F = TensorProto.FLOAT
I64 = TensorProto.INT64
R = np.random.default_rng(11)


def model(nodes, inputs, outputs, initializers=(), opset=17):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def tensor(name, shape, elem=F):
    return helper.make_tensor_value_info(name, elem, shape)


def init(name, array):
    return numpy_helper.from_array(np.asarray(array), name)


def run(proto, feed, scope=None):
    scope = nf.Scope() if scope is None else scope
    program, feeds, fetches = nf.onnx.load(proto, scope)
    outs = nf.Executor().run(program, feed=feed, fetch_list=fetches, scope=scope)
    return program, outs


def reference(proto, feed):
    return ReferenceEvaluator(proto).run(None, feed)


def check_against_reference(proto, feed, rtol=1e-5, atol=1e-6):
    program, outs = run(proto, feed)
    for got, want in zip(outs, reference(proto, feed)):
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)
    return program


# ---- a small model end to end ----


def mlp_model(batch="N"):
    w1, b1 = R.standard_normal((4, 8)).astype("float32"), R.standard_normal(8).astype("float32")
    w2, b2 = R.standard_normal((3, 8)).astype("float32"), R.standard_normal(3).astype("float32")
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="fc1"),
        helper.make_node("Add", ["h", "b1"], ["h1"]),
        helper.make_node("Relu", ["h1"], ["a"]),
        helper.make_node("Gemm", ["a", "w2", "b2"], ["y"], transB=1, alpha=0.5, beta=2.0),
        helper.make_node("Softmax", ["y"], ["p"], axis=-1),
    ]
    inits = [init("w1", w1), init("b1", b1), init("w2", w2), init("b2", b2)]
    return model(nodes, [tensor("x", [batch, 4])], [tensor("p", [batch, 3])], inits)


def test_mlp_matches_the_reference_for_any_batch():
    proto = mlp_model()
    for batch in (1, 5, 0):
        check_against_reference(proto, {"x": R.standard_normal((batch, 4)).astype("float32")})


def test_initializers_become_parameters_in_the_scope():
    scope = nf.Scope()
    proto = mlp_model()
    program, feeds, fetches = nf.onnx.load(proto, scope)
    assert feeds == ["x"] and [v.name for v in fetches] == ["p"]
    params = {v.name: v for v in program.all_parameters()}
    assert set(params) == {"w1", "b1", "w2", "b2"}
    assert all(v.persistable and v.trainable for v in params.values())
    assert program.global_block().var("x").shape == (-1, 4)
    stored = scope.find_var("w1").get(nf.Tensor).numpy()
    np.testing.assert_array_equal(stored, numpy_helper.to_array(proto.graph.initializer[0]))


def test_a_training_step_on_an_imported_model_lowers_the_loss():
    """Backward + SGD appended to the imported program: the parameters get the gradient of a
    squared error, checked against NumPy's own gradient of the same model."""
    w = R.standard_normal((3, 2)).astype("float64")
    b = R.standard_normal(2).astype("float64")
    nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["y"])]
    proto = model(
        nodes,
        [tensor("x", ["N", 3], TensorProto.DOUBLE)],
        [tensor("y", ["N", 2], TensorProto.DOUBLE)],
        [init("w", w), init("b", b)],
    )
    scope = nf.Scope()
    program, feeds, (y,) = nf.onnx.load(proto, scope)
    startup = nf.Program()
    with nf.program_guard(program, startup):
        label = nf.data("label", [-1, 2], "float64")
        loss = nf.layers.mean(nf.layers.square(y - label))
        nf.optimizer.SGD(learning_rate=0.1).minimize(loss)
    x = R.standard_normal((5, 3))
    t = R.standard_normal((5, 2))
    exe = nf.Executor()
    exe.run(startup, scope=scope)
    (before,) = exe.run(program, feed={"x": x, "label": t}, fetch_list=[loss], scope=scope)
    grad_y = 2 * (x @ w + b - t) / t.size
    np.testing.assert_allclose(scope.find_var("w").get(nf.Tensor).numpy(), w - 0.1 * x.T @ grad_y)
    np.testing.assert_allclose(scope.find_var("b").get(nf.Tensor).numpy(), b - 0.1 * grad_y.sum(0))
    (after,) = exe.run(program, feed={"x": x, "label": t}, fetch_list=[loss], scope=scope)
    assert after < before


# ---- constant folding of shape arithmetic ----


def flatten_by_shape_model(batch):
    """PyTorch's x.view(x.size(0), -1): Shape -> Gather -> Unsqueeze -> Concat -> Reshape."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Constant", [], ["zero"], value=init("zero", np.asarray(0))),
        helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "axes"], ["n1"]),
        helper.make_node("Concat", ["n1", "minus1"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["y"]),
        helper.make_node("Relu", ["y"], ["z"]),
    ]
    inits = [init("axes", np.asarray([0])), init("minus1", np.asarray([-1]))]
    return model(nodes, [tensor("x", [batch, 3, 4])], [tensor("z", [batch, 12])], inits)


def test_shape_arithmetic_on_known_shapes_folds_into_one_reshape():
    program = check_against_reference(
        flatten_by_shape_model(2), {"x": R.standard_normal((2, 3, 4)).astype("float32")}
    )
    ops = [op.type for op in program.global_block().ops]
    assert ops == ["reshape", "relu"]
    assert program.global_block().var("z").shape == (2, 12)


def test_shape_arithmetic_on_a_dynamic_batch_runs_at_run_time():
    proto = flatten_by_shape_model("N")
    for batch in (1, 3):
        program = check_against_reference(
            proto, {"x": R.standard_normal((batch, 3, 4)).astype("float32")}
        )
    ops = [op.type for op in program.global_block().ops]
    assert "shape" in ops and "onnx_reshape" in ops


def test_input_shapes_fix_a_dynamic_dim_and_folding_follows():
    program, feeds, fetches = nf.onnx.load(
        flatten_by_shape_model("N"), nf.Scope(), input_shapes={"x": [4, 3, 4]}
    )
    assert [op.type for op in program.global_block().ops] == ["reshape", "relu"]
    assert fetches[0].shape == (4, 12)


def test_constant_outputs_and_inputs_passed_through_are_fetchable():
    nodes = [
        helper.make_node("Constant", [], ["c"], value_floats=[1.0, 2.0]),
        helper.make_node("Identity", ["x"], ["x_copy"]),
    ]
    proto = model(nodes, [tensor("x", [2])], [tensor("c", [2]), tensor("x_copy", [2])])
    check_against_reference(proto, {"x": np.asarray([3.0, 4.0], np.float32)})


# ---- recurrent and control flow ----


def test_loop_with_carried_values_and_scan_outputs():
    body = helper.make_graph(
        [
            helper.make_node("Add", ["acc_in", "x"], ["acc"]),
            helper.make_node("Cast", ["i"], ["i_f"], to=F),
            helper.make_node("Mul", ["acc", "i_f"], ["scan"]),
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
        ],
        "body",
        [tensor("i", [], I64), tensor("cond_in", [], TensorProto.BOOL), tensor("acc_in", [2])],
        [tensor("cond_out", [], TensorProto.BOOL), tensor("acc", [2]), tensor("scan", [2])],
    )
    nodes = [helper.make_node("Loop", ["trips", "", "start"], ["final", "scans"], body=body)]
    proto = model(
        nodes,
        [tensor("x", [2]), tensor("start", [2]), tensor("trips", [], I64)],
        [tensor("final", [2]), tensor("scans", [None, 2])],
    )
    x, start = np.asarray([1.0, -2.0], np.float32), np.asarray([0.5, 0.25], np.float32)
    for trips in (1, 4):
        feed = {"x": x, "start": start, "trips": np.asarray(trips, np.int64)}
        program, (final, scans) = run(proto, feed)
        # (onnx's reference evaluator fails on a Loop without a condition input)
        sums = [start + (k + 1) * x for k in range(trips)]
        np.testing.assert_allclose(final, sums[-1])
        np.testing.assert_allclose(scans, np.stack([s * k for k, s in enumerate(sums)]))
    assert "while" in [op.type for op in program.global_block().ops]


def test_loop_stopped_by_its_condition():
    body = helper.make_graph(
        [
            helper.make_node("Mul", ["v_in", "two"], ["v"]),
            helper.make_node("ReduceSum", ["v"], ["total"], keepdims=0),
            helper.make_node("Less", ["total", "limit"], ["go"]),
        ],
        "body",
        [tensor("i", [], I64), tensor("c", [], TensorProto.BOOL), tensor("v_in", [3])],
        [tensor("go", [], TensorProto.BOOL), tensor("v", [3])],
    )
    nodes = [helper.make_node("Loop", ["", "c0", "v0"], ["v_final"], body=body)]
    proto = model(
        nodes,
        [tensor("v0", [3]), tensor("c0", [], TensorProto.BOOL), tensor("limit", [])],
        [tensor("v_final", [3])],
        [init("two", np.float32(2.0))],
    )
    feed = {
        "v0": np.asarray([1.0, 2.0, 0.5], np.float32),
        "c0": np.asarray(True),
        "limit": np.asarray(50.0, np.float32),
    }
    check_against_reference(proto, feed)


def if_model(cond_source):
    then = helper.make_graph(
        [helper.make_node("Mul", ["x", "x"], ["t"])], "then", [], [tensor("t", [3])]
    )
    orelse = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["e"])], "else", [], [tensor("e", [3])]
    )
    nodes = [helper.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=orelse)]
    inputs, inits = [tensor("x", [3])], []
    if cond_source == "input":
        inputs.append(tensor("cond", [1], TensorProto.BOOL))
    else:
        inits.append(init("cond", np.asarray([cond_source])))
    return model(nodes, inputs, [tensor("y", [3])], inits)


def test_if_on_a_run_time_condition_runs_either_branch():
    proto = if_model("input")
    x = np.asarray([1.0, -2.0, 3.0], np.float32)
    for cond in (True, False):
        program = check_against_reference(proto, {"x": x, "cond": np.asarray([cond])})
    assert "conditional_block" in [op.type for op in program.global_block().ops]


def test_if_on_a_constant_condition_imports_the_taken_branch_inline():
    x = np.asarray([1.0, -2.0, 3.0], np.float32)
    for cond, op_type in ((True, "elementwise_mul"), (False, "scale")):
        program = check_against_reference(if_model(cond), {"x": x})
        assert [op.type for op in program.global_block().ops] == [op_type]


def test_lstm_with_sequence_lengths_initial_states_and_peepholes_matches_reference():
    hidden, inputs = 3, 2
    w = R.standard_normal((2, 4 * hidden, inputs)).astype("float32")
    r = R.standard_normal((2, 4 * hidden, hidden)).astype("float32")
    b = R.standard_normal((2, 8 * hidden)).astype("float32")
    p = R.standard_normal((2, 3 * hidden)).astype("float32")
    node = helper.make_node(
        "LSTM",
        ["x", "w", "r", "b", "lens", "h0", "c0", "p"],
        ["y", "y_h", "y_c"],
        hidden_size=hidden,
        direction="bidirectional",
    )
    proto = model(
        [node],
        [
            tensor("x", [4, 3, inputs]),
            tensor("lens", [3], TensorProto.INT32),
            tensor("h0", [2, 3, hidden]),
            tensor("c0", [2, 3, hidden]),
        ],
        [tensor("y", None), tensor("y_h", None), tensor("y_c", None)],
        [init("w", w), init("r", r), init("b", b), init("p", p)],
    )
    feed = {
        "x": R.standard_normal((4, 3, inputs)).astype("float32"),
        "lens": np.asarray([4, 2, 3], np.int32),
        "h0": R.standard_normal((2, 3, hidden)).astype("float32"),
        "c0": R.standard_normal((2, 3, hidden)).astype("float32"),
    }
    program, outs = run(proto, feed)
    # onnx's reference LSTM ignores sequence_lens: compare rows of full length, and the
    # shorter rows against a reference run on the row cut to its length
    ref = reference(proto, feed)
    np.testing.assert_allclose(outs[0][:, :, 0], ref[0][:, :, 0], rtol=1e-5, atol=1e-6)
    for row, length in ((1, 2), (2, 3)):
        cut = dict(feed, x=feed["x"][:length, row : row + 1], lens=feed["lens"][row : row + 1])
        cut["h0"], cut["c0"] = feed["h0"][:, row : row + 1], feed["c0"][:, row : row + 1]
        want = reference(proto, cut)
        np.testing.assert_allclose(outs[0][:length, :, row], want[0][:, :, 0], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(outs[0][length:, :, row], 0.0)
        np.testing.assert_allclose(outs[1][:, row], want[1][:, 0], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(outs[2][:, row], want[2][:, 0], rtol=1e-5, atol=1e-6)


# ---- the backend API ----


def test_backend_prepare_run_model_run_node_and_devices():
    proto = mlp_model()
    x = R.standard_normal((2, 4)).astype("float32")
    rep = backend.prepare(proto)
    (p,) = rep.run([x])
    np.testing.assert_allclose(p, reference(proto, {"x": x})[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(rep.run({"x": x}).p, p)
    np.testing.assert_array_equal(backend.run_model(proto, [x])[0], p)
    node = helper.make_node("Transpose", ["a"], ["b"], perm=[1, 0])
    a = R.standard_normal((2, 3)).astype("float32")
    np.testing.assert_array_equal(backend.run_node(node, [a])[0], a.T)
    assert backend.supports_device("CPU") and not backend.supports_device("CUDA")
    assert backend.is_compatible(proto)
    unsupported = model(
        [helper.make_node("NonMaxSuppression", ["x", "x"], ["y"])],
        [tensor("x", [1])],
        [tensor("y", [1])],
    )
    assert not backend.is_compatible(unsupported)


# ---- bad input ----


def test_bytes_that_are_no_model_are_a_decode_error(tmp_path):
    with pytest.raises(ProgramDecodeError, match="not an ONNX model"):
        nf.onnx.load(b"\x08\x07garbage bytes \xff\xfe", nf.Scope())
    with pytest.raises(ProgramDecodeError, match="not an ONNX model"):
        nf.onnx.load(b"", nf.Scope())
    truncated = mlp_model().SerializeToString()[:-7]
    with pytest.raises(ProgramDecodeError):
        nf.onnx.load(truncated, nf.Scope())
    text = tmp_path / "model.onnx"
    text.write_text("this is not protobuf")
    with pytest.raises(ProgramDecodeError, match="model.onnx"):
        nf.onnx.load(text, nf.Scope())
    with pytest.raises(ProgramDecodeError, match="cannot read"):
        nf.onnx.load(tmp_path / "missing.onnx", nf.Scope())
    with pytest.raises(ProgramDecodeError, match="takes a path"):
        nf.onnx.load(42, nf.Scope())


def test_a_saved_file_loads(tmp_path):
    path = tmp_path / "mlp.onnx"
    onnx.save(mlp_model(), str(path))
    program, feeds, fetches = nf.onnx.load(str(path), nf.Scope())
    assert feeds == ["x"]


def test_an_unsupported_op_is_named_with_its_node():
    proto = model(
        [helper.make_node("NonMaxSuppression", ["b", "s"], ["y"], name="nms_1")],
        [tensor("b", [1, 1, 4]), tensor("s", [1, 1, 1])],
        [tensor("y", [None, 3], I64)],
    )
    with pytest.raises(UnknownOpError, match="'NonMaxSuppression'.*|nms_1") as info:
        nf.onnx.load(proto, nf.Scope())
    assert "nms_1" in str(info.value) and "NonMaxSuppression" in str(info.value)
    other = model(
        [helper.make_node("FusedGemm", ["x"], ["y"], domain="com.microsoft")],
        [tensor("x", [1])],
        [tensor("y", [1])],
    )
    other.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    with pytest.raises(UnknownOpError, match="com.microsoft.FusedGemm"):
        nf.onnx.load(other, nf.Scope())


def test_opsets_outside_the_supported_range():
    relu = [helper.make_node("Relu", ["x"], ["y"])]
    io = [tensor("x", [2])], [tensor("y", [2])]
    with pytest.raises(AttrError, match="opset 6, older"):
        nf.onnx.load(model(relu, *io, opset=6), nf.Scope())
    with pytest.raises(AttrError, match="opset 99, newer"):
        nf.onnx.load(model(relu, *io, opset=99), nf.Scope())
    no_default = model(relu, *io)
    del no_default.opset_import[:]
    no_default.opset_import.append(helper.make_opsetid("ai.onnx.ml", 3))
    with pytest.raises(ProgramDecodeError, match="no opset of the default domain"):
        nf.onnx.load(no_default, nf.Scope())


def test_dynamic_shapes_that_cannot_be_resolved():
    no_shape = helper.make_tensor_value_info("x", F, None)
    proto = model([helper.make_node("Relu", ["x"], ["y"])], [no_shape], [tensor("y", None)])
    with pytest.raises(ShapeError, match="input_shapes"):
        nf.onnx.load(proto, nf.Scope())
    program, _, _ = nf.onnx.load(proto, nf.Scope(), input_shapes={"x": [2, None]})
    assert program.global_block().var("x").shape == (2, -1)
    # a Reshape to a shape tensor whose length is known only at run time (Range of a feed)
    nodes = [
        helper.make_node("Range", ["zero", "n", "one"], ["dims"]),
        helper.make_node("Reshape", ["x", "dims"], ["y"], name="reshape_by_range"),
    ]
    proto = model(
        nodes,
        [tensor("x", [2, 2]), tensor("n", [], I64)],
        [tensor("y", None)],
        [init("zero", np.int64(1)), init("one", np.int64(1))],
    )
    with pytest.raises(ShapeError, match="reshape_by_range.*cannot be resolved"):
        nf.onnx.load(proto, nf.Scope())
    conv = helper.make_node("Conv", ["x", "w"], ["y"], auto_pad="SAME_UPPER")
    proto = model(
        [conv],
        [tensor("x", [1, 1, "H", "W"])],
        [tensor("y", None)],
        [init("w", np.ones((1, 1, 3, 3), np.float32))],
    )
    with pytest.raises(AttrError, match="unknown spatial size"):
        nf.onnx.load(proto, nf.Scope())


def test_types_nestflow_has_no_dtype_for():
    proto = model(
        [helper.make_node("Identity", ["s"], ["t"])],
        [tensor("s", [2], TensorProto.STRING)],
        [tensor("t", [2], TensorProto.STRING)],
    )
    with pytest.raises(DTypeError, match="STRING"):
        nf.onnx.load(proto, nf.Scope())
    seq = helper.make_tensor_sequence_value_info("s", F, None)
    proto = model([helper.make_node("Identity", ["s"], ["t"])], [seq], [seq])
    with pytest.raises(DTypeError, match="sequence_type"):
        nf.onnx.load(proto, nf.Scope())


def test_a_graph_reading_an_undefined_value():
    proto = model(
        [helper.make_node("Add", ["x", "nowhere"], ["y"], name="add_1")],
        [tensor("x", [2])],
        [tensor("y", [2])],
    )
    with pytest.raises(ProgramDecodeError, match="add_1.*'nowhere'"):
        nf.onnx.load(proto, nf.Scope())


def test_a_failed_import_leaves_the_scope_alone():
    proto = mlp_model()
    proto.graph.node.append(helper.make_node("Unique", ["p"], ["u"]))
    scope = nf.Scope()
    with pytest.raises(UnknownOpError):
        nf.onnx.load(proto, scope)
    assert scope.local_var_names() == []


def test_build_time_shape_errors_name_the_node():
    proto = model(
        [helper.make_node("MatMul", ["a", "b"], ["c"], name="bad_product")],
        [tensor("a", [2, 3]), tensor("b", [4, 5])],
        [tensor("c", None)],
    )
    with pytest.raises(ShapeError, match="bad_product.*inner dims differ"):
        nf.onnx.load(proto, nf.Scope())


@pytest.mark.parametrize("spatial", [[5, 7], ["H", "W"]])
@pytest.mark.parametrize("strides", [[1, 1], [2, 3]])
def test_a_1x1_convolution_imports_as_one_conv2d_with_its_bias(spatial, strides):
    w = R.standard_normal((4, 3, 1, 1)).astype("float32")
    b = R.standard_normal(4).astype("float32")
    conv = helper.make_node("Conv", ["x", "w", "b"], ["y"], strides=strides)
    proto = model(
        [conv], [tensor("x", ["N", 3, *spatial])], [tensor("y", None)], [init("w", w), init("b", b)]
    )
    program = check_against_reference(
        proto, {"x": R.standard_normal((2, 3, 5, 7)).astype("float32")}
    )
    assert [op.type for op in program.global_block().ops] == ["conv2d"]


def conv_bn_model(weights_as_initializers: bool):
    w = R.standard_normal((4, 3, 3, 3)).astype("float32")
    b = R.standard_normal(4).astype("float32")
    stats = [R.standard_normal(4).astype("float32") for _ in range(3)]
    stats.append(R.uniform(0.5, 2.0, 4).astype("float32"))  # the variance
    names = ["w", "b", "scale", "beta", "mean", "var"]
    values = [w, b, *stats]
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "scale", "beta", "mean", "var"], ["y"]),
    ]
    if weights_as_initializers:
        inits = [init(n, v) for n, v in zip(names, values)]
    else:
        inits = []
        nodes[:0] = [
            helper.make_node("Constant", [], [n], value=init(n, v)) for n, v in zip(names, values)
        ]
    return model(nodes, [tensor("x", ["N", 3, 5, 5])], [tensor("y", None)], inits)


def test_batch_norm_after_a_constant_convolution_folds_into_it():
    x = R.standard_normal((2, 3, 5, 5)).astype("float32")
    program = check_against_reference(conv_bn_model(False), {"x": x}, rtol=1e-4, atol=1e-5)
    assert [op.type for op in program.global_block().ops] == ["conv2d"]
    # parameters stay parameters (trainable): nothing folds
    program = check_against_reference(conv_bn_model(True), {"x": x}, rtol=1e-4, atol=1e-5)
    assert [op.type for op in program.global_block().ops] == ["conv2d", "batch_norm"]


def residual_block(add="Sum", shortcut="x", relu=True, extra_outputs=(), x_shape=("N", 4, 6, 6)):
    """x -> Conv(3x3, pad 1) -> BatchNormalization -> Add/Sum(shortcut) -> Relu, constants
    throughout; `shortcut` names the other addend (x, or "c0": a conv of x computed first)."""
    values = {
        "w0": R.standard_normal((4, 4, 1, 1)),
        "w": R.standard_normal((4, 4, 3, 3)),
        "b": R.standard_normal(4),
        "scale": R.standard_normal(4),
        "beta": R.standard_normal(4),
        "mean": R.standard_normal(4),
        "var": R.uniform(0.5, 2.0, 4),
    }
    nodes = [
        helper.make_node("Constant", [], [n], value=init(n, v.astype("float32")))
        for n, v in values.items()
    ]
    nodes += [
        helper.make_node("Conv", ["x", "w0"], ["c0"]),
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "scale", "beta", "mean", "var"], ["n"]),
        helper.make_node(add, ["n", shortcut], ["s"]),
    ]
    last = "s"
    if relu:
        nodes.append(helper.make_node("Relu", ["s"], ["y"]))
        last = "y"
    outputs = [tensor(last, None)] + [tensor(name, None) for name in extra_outputs]
    return model(nodes, [tensor("x", list(x_shape))], outputs)


def op_types(program):
    return [op.type for op in program.global_block().ops]


@pytest.mark.parametrize("add", ["Add", "Sum"])
@pytest.mark.parametrize("shortcut", ["x", "c0"])
def test_a_residual_block_imports_as_one_fused_conv(add, shortcut):
    x = R.standard_normal((2, 4, 6, 6)).astype("float32")
    program = check_against_reference(residual_block(add, shortcut), {"x": x}, rtol=1e-4, atol=1e-4)
    assert op_types(program) == ["conv2d", "conv2d"]
    fused = program.global_block().ops[1]
    assert fused.attrs["fuse_activation"] == "relu" and fused.attrs["fuse_residual_connection"]
    assert fused.input("ResidualData") and fused.input("Bias")


def test_a_relu_alone_after_a_conv_fuses_into_it():
    x = R.standard_normal((2, 4, 6, 6)).astype("float32")
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["y"]),
    ]
    w = R.standard_normal((3, 4, 3, 3)).astype("float32")
    proto = model(nodes, [tensor("x", ["N", 4, 6, 6])], [tensor("y", None)], [init("w", w)])
    program = check_against_reference(proto, {"x": x}, rtol=1e-4, atol=1e-4)
    assert op_types(program) == ["conv2d"]
    assert program.global_block().ops[0].attrs["fuse_activation"] == "relu"


@pytest.mark.parametrize(
    "kind,ops",
    [
        # the sum is also a graph output: the conv adds the shortcut, the relu runs apart
        ("sum_read_twice", ["conv2d", "conv2d", "relu"]),
        ("no_relu", ["conv2d", "conv2d"]),
        ("broadcast_up", ["conv2d", "conv2d", "sum", "relu"]),  # the conv's output grows
    ],
)
def test_what_a_conv_does_not_fuse(kind, ops):
    x_shape = ["N", 4, 6, 6]
    extra = ("s",) if kind == "sum_read_twice" else ()
    proto = residual_block(relu=kind != "no_relu", extra_outputs=extra)
    x = R.standard_normal((2, 4, 6, 6)).astype("float32")
    if kind == "broadcast_up":  # conv of one image + a shortcut of two: Sum broadcasts up
        x_shape = [1, 4, 6, 6]
        proto = residual_block(shortcut="z", x_shape=x_shape)
        proto.graph.input.append(tensor("z", [2, 4, 6, 6]))
        x = x[:1]
    feed = {"x": x}
    if kind == "broadcast_up":
        feed["z"] = R.standard_normal((2, 4, 6, 6)).astype("float32")
    program = check_against_reference(proto, feed, rtol=1e-4, atol=1e-4)
    assert op_types(program) == ops


def test_without_the_onnx_package_nestflow_imports_and_load_says_what_to_install():
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['onnx'] = None\n"
        "import nestflow as nf\n"
        "assert nf.ops.has_op('onnx_reshape')\n"
        "try:\n"
        "    nf.onnx.load(b'', nf.Scope())\n"
        "except ModuleNotFoundError as exc:\n"
        "    print(exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "pip install 'nestflow[onnx]'" in done.stdout


def test_model_local_functions_are_inlined():
    function = helper.make_function(
        "custom.domain",
        "Square",
        ["a"],
        ["b"],
        [helper.make_node("Mul", ["a", "a"], ["b"])],
        [helper.make_opsetid("", 17)],
    )
    graph = helper.make_graph(
        [helper.make_node("Square", ["x"], ["y"], domain="custom.domain")],
        "g",
        [tensor("x", [3])],
        [tensor("y", [3])],
    )
    proto = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("custom.domain", 1)],
        functions=[function],
    )
    check_against_reference(proto, {"x": np.asarray([1.0, -2.0, 3.0], np.float32)})
