"""Vision layers: conv2d, conv2d_transpose, pool2d, lrn, flatten (Fluid 1.8 arguments) — the
ops and parameters they append, their values against the NumPy references of tests/ops/test_nn,
a small conv net that trains, and the errors raised before anything is appended (including an
integer input to a layer that makes float parameters, such as fc)."""

from __future__ import annotations

import numpy as np
import pytest

import nestflow as nf
from nestflow.errors import AttrError, DTypeError, ShapeError
from tests.ops.test_nn import ref_conv2d, ref_conv2d_transpose, ref_lrn, ref_pool2d

rng = np.random.default_rng(7)


def build(fn):
    """Run fn() inside fresh main/startup programs; returns (main, startup, fn's result)."""
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        result = fn()
    return main, startup, result


def run(main, startup, feed, fetch):
    exe, scope = nf.Executor(), nf.Scope()
    exe.run(startup, scope=scope)
    values = exe.run(main, feed=feed, fetch_list=fetch, scope=scope)
    return values, scope


def param(scope, name):
    return np.array(scope.find_var(name).get(nf.Tensor).numpy())


def op_types(program):
    return [op.type for op in program.global_block().ops]


def test_conv2d_appends_conv_bias_and_activation_with_fluid_parameters():
    def net():
        x = nf.data("x", [-1, 3, 9, 8])
        return nf.layers.conv2d(x, 4, 3, stride=2, padding=1, act="relu", name="c")

    main, startup, y = build(net)
    assert y.shape == (-1, 4, 5, 4)
    assert op_types(main) == ["conv2d", "elementwise_add", "relu"]
    add = main.global_block().ops[1]
    assert add.attrs["axis"] == 1
    w, b = main.global_block().var("c.w"), main.global_block().var("c.b")
    assert (w.shape, b.shape) == ((4, 3, 3, 3), (4,))
    init = {op.output("Out")[0]: op for op in startup.global_block().ops}
    assert init["c.w"].type == "gaussian_random"
    assert init["c.w"].attrs["std"] == pytest.approx((2.0 / (3 * 3 * 3)) ** 0.5)
    assert init["c.b"].type == "fill_constant" and init["c.b"].attrs["value"] == 0.0

    x = rng.standard_normal((2, 3, 9, 8)).astype("float32")
    (got,), scope = run(main, startup, {"x": x}, [y])
    conv = ref_conv2d(x, param(scope, "c.w"), strides=[2, 2], paddings=[1, 1])["Output"]
    want = np.maximum(conv + param(scope, "c.b")[:, None, None], 0)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_conv2d_groups_depthwise_choice_and_no_bias():
    def net():
        x = nf.data("x", [-1, 4, 6, 6])
        a = nf.layers.conv2d(x, 8, [3, 1], groups=2, bias_attr=False, name="g")
        b = nf.layers.conv2d(x, 8, 3, groups=4, use_cudnn=False, name="d")
        c = nf.layers.conv2d(x, 8, 3, groups=4, name="cudnn")
        return a, b, c

    main, _, (a, b, c) = build(net)
    assert a.shape == (-1, 8, 4, 6)
    assert main.global_block().var("g.w").shape == (8, 2, 3, 1)
    assert main.global_block().find_var("g.b") is None
    # Fluid appends depthwise_conv2d for groups == channels only without cuDNN.
    assert op_types(main) == ["conv2d", "depthwise_conv2d", "elementwise_add", "conv2d"] + [
        "elementwise_add"
    ]
    assert b.shape == c.shape == (-1, 8, 4, 4)


@pytest.mark.parametrize(
    "padding,paddings,algorithm,out_hw",
    [
        (1, [1, 1], "EXPLICIT", (7, 8)),
        ([2, 0], [2, 0], "EXPLICIT", (9, 6)),
        ([1, 1, 2, 2], [1, 2], "EXPLICIT", (7, 10)),
        ([0, 1, 2, 0], [0, 1, 2, 0], "EXPLICIT", (6, 8)),
        ([[0, 0], [0, 0], [1, 0], [0, 2]], [1, 0, 0, 2], "EXPLICIT", (6, 8)),
        ("same", [0, 0], "SAME", (7, 8)),
        ("VALID", [0, 0], "VALID", (5, 6)),
    ],
)
def test_conv2d_padding_spellings(padding, paddings, algorithm, out_hw):
    def net():
        return nf.layers.conv2d(nf.data("x", [-1, 2, 7, 8]), 3, 3, padding=padding)

    main, startup, y = build(net)
    conv = main.global_block().ops[0]
    assert conv.attrs["paddings"] == paddings
    assert conv.attrs["padding_algorithm"] == algorithm
    assert y.shape == (-1, 3) + out_hw
    x = rng.standard_normal((1, 2, 7, 8)).astype("float32")
    (got,), scope = run(main, startup, {"x": x}, [y])
    w = param(scope, main.global_block().ops[0].input("Filter")[0])
    b = param(scope, main.global_block().ops[1].input("Y")[0])
    want = ref_conv2d(x, w, paddings=paddings, padding_algorithm=algorithm)["Output"]
    np.testing.assert_allclose(got, want + b[:, None, None], rtol=1e-5, atol=1e-5)


def test_conv2d_nhwc():
    def net():
        x = nf.data("x", [-1, 6, 5, 3])
        return nf.layers.conv2d(x, 4, 3, padding=1, data_format="NHWC", name="h")

    main, startup, y = build(net)
    assert y.shape == (-1, 6, 5, 4)
    assert main.global_block().ops[1].attrs["axis"] == 3
    x = rng.standard_normal((2, 6, 5, 3)).astype("float32")
    (got,), scope = run(main, startup, {"x": x}, [y])
    want = ref_conv2d(x, param(scope, "h.w"), paddings=[1, 1], data_format="NHWC")["Output"]
    np.testing.assert_allclose(got, want + param(scope, "h.b"), rtol=1e-5, atol=1e-5)


def test_conv2d_transpose_with_filter_size_or_output_size():
    def net():
        x = nf.data("x", [-1, 4, 5, 5])
        a = nf.layers.conv2d_transpose(x, 6, filter_size=3, stride=2, padding=1, name="t")
        b = nf.layers.conv2d_transpose(x, 2, output_size=[12, 11], stride=2, name="o")
        c = nf.layers.conv2d_transpose(x, 4, filter_size=3, groups=4, use_cudnn=False)
        return a, b, c

    main, startup, (a, b, c) = build(net)
    assert a.shape == (-1, 6, 9, 9)
    assert main.global_block().var("t.w").shape == (4, 6, 3, 3)
    # Fluid derives the filter from output_size: (12 - 4 * 2 - 1) // 1 + 1 = 4, then 3.
    assert main.global_block().var("o.w").shape == (4, 2, 4, 3)
    assert b.shape == (-1, 2, 12, 11)
    assert "depthwise_conv2d_transpose" in op_types(main)
    assert c.shape == (-1, 4, 7, 7)
    x = rng.standard_normal((2, 4, 5, 5)).astype("float32")
    (got_a, got_b), scope = run(main, startup, {"x": x}, [a, b])
    want_a = ref_conv2d_transpose(x, param(scope, "t.w"), strides=[2, 2], paddings=[1, 1])
    np.testing.assert_allclose(
        got_a, want_a["Output"] + param(scope, "t.b")[:, None, None], rtol=1e-5, atol=1e-5
    )
    want_b = ref_conv2d_transpose(x, param(scope, "o.w"), strides=[2, 2], output_size=[12, 11])
    np.testing.assert_allclose(
        got_b, want_b["Output"] + param(scope, "o.b")[:, None, None], rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize(
    "kwargs,attrs,out_hw",
    [
        ({"pool_size": 2, "pool_stride": 2}, {"pooling_type": "max", "ksize": [2, 2]}, (3, 3)),
        (
            {"pool_size": 3, "pool_type": "avg", "pool_stride": 2, "pool_padding": 1},
            {"pooling_type": "avg", "ksize": [3, 3], "paddings": [1, 1]},
            (4, 4),
        ),
        (
            {"pool_size": 2, "pool_stride": 2, "ceil_mode": True, "pool_type": "avg"},
            {"pooling_type": "avg", "ksize": [2, 2], "ceil_mode": True},
            (4, 4),
        ),
        (
            {"pool_size": 3, "pool_type": "avg", "pool_padding": 1, "exclusive": False},
            {"pooling_type": "avg", "ksize": [3, 3], "paddings": [1, 1], "exclusive": False},
            (7, 7),
        ),
        (
            {"global_pooling": True},
            {"pooling_type": "max", "ksize": [1, 1], "global_pooling": True},
            (1, 1),
        ),
    ],
)
def test_pool2d(kwargs, attrs, out_hw):
    def net():
        return nf.layers.pool2d(nf.data("x", [-1, 3, 7, 7]), **kwargs)

    main, startup, y = build(net)
    assert y.shape == (-1, 3) + out_hw
    x = rng.standard_normal((2, 3, 7, 7)).astype("float32")
    (got,), _ = run(main, startup, {"x": x}, [y])
    strides = [kwargs.get("pool_stride", 1)] * 2
    want = ref_pool2d(x, strides=strides, **attrs)["Out"]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_lrn_and_flatten():
    def net():
        x = nf.data("x", [-1, 6, 3, 4])
        y = nf.layers.lrn(x, n=3, k=1.0, alpha=0.1, beta=0.5)
        return y, nf.layers.flatten(y), nf.layers.flatten(x, axis=0), nf.layers.flatten(x, 3)

    main, startup, (y, flat, all_in_one, last) = build(net)
    assert y.shape == (-1, 6, 3, 4)
    assert (flat.shape, all_in_one.shape, last.shape) == ((-1, 72), (1, -1), (-1, 4))
    assert op_types(main) == ["lrn", "flatten2", "flatten2", "flatten2"]
    x = rng.standard_normal((2, 6, 3, 4)).astype("float32")
    (got, got_flat), _ = run(main, startup, {"x": x}, [y, flat])
    want = ref_lrn(x, n=3, k=1.0, alpha=0.1, beta=0.5)["Out"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got_flat, want.reshape(2, 72), rtol=1e-5, atol=1e-6)


def test_a_small_conv_net_trains():
    """conv-pool-conv-pool-fc on a separable synthetic task: SGD lowers the loss."""
    data_rng = np.random.default_rng(0)
    xs = data_rng.standard_normal((32, 1, 8, 8)).astype("float32")
    ys = (xs[:, 0, :4].sum(axis=(1, 2)) > xs[:, 0, 4:].sum(axis=(1, 2))).astype("int64")[:, None]

    def net():
        x = nf.data("x", [-1, 1, 8, 8])
        y = nf.data("y", [-1, 1], "int64")
        h = nf.layers.conv2d(x, 4, 3, padding=1, act="relu")
        h = nf.layers.pool2d(h, 2, pool_stride=2)
        h = nf.layers.conv2d(h, 8, 3, padding=1, act="relu")
        h = nf.layers.pool2d(h, 2, "avg", pool_stride=2)
        logits = nf.layers.fc(nf.layers.flatten(h), 2)
        loss = nf.layers.mean(nf.layers.softmax_with_cross_entropy(logits, y))
        nf.optimizer.SGD(learning_rate=0.1).minimize(loss)
        return loss

    main, startup, loss = build(net)
    exe, scope = nf.Executor(), nf.Scope()
    exe.run(startup, scope=scope)
    losses = [
        float(exe.run(main, feed={"x": xs, "y": ys}, fetch_list=[loss], scope=scope)[0])
        for _ in range(40)
    ]
    assert losses[-1] < 0.5 * losses[0]


# ---- errors before anything is appended ----


def test_fc_on_integer_data_is_a_dtype_error():
    def net():
        ids = nf.data("ids", [-1, 4], "int64")
        nf.layers.fc(ids, 3)

    with pytest.raises(DTypeError) as info:
        build(net)
    text = str(info.value)
    assert "fc" in text and "int64" in text and "ids" in text and "test_vision.py" in text


def test_embedding_still_takes_integer_ids():
    def net():
        return nf.layers.embedding(nf.data("ids", [-1, 4], "int64"), [10, 3])

    assert build(net)[2].shape == (-1, 4, 3)


@pytest.mark.parametrize(
    "make",
    [
        lambda x: nf.layers.conv2d(x, 2, 3),
        lambda x: nf.layers.conv2d_transpose(x, 2, filter_size=3),
        lambda x: nf.layers.pool2d(x, 2),
        lambda x: nf.layers.lrn(x),
    ],
    ids=["conv2d", "conv2d_transpose", "pool2d", "lrn"],
)
def test_integer_images_are_dtype_errors(make):
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup), pytest.raises(DTypeError, match="int32"):
        make(nf.data("x", [-1, 3, 8, 8], "int32"))
    assert not main.global_block().all_parameters()


BAD_LAYERS = [
    (lambda x: nf.layers.conv2d(x, 4, 3, groups=2), ShapeError, ["3 channels", "groups=2"]),
    (lambda x: nf.layers.conv2d(x, 5, 3, groups=3), ShapeError, ["num_filters=5", "groups=3"]),
    (lambda x: nf.layers.conv2d(x, 4, 0), AttrError, ["filter_size", "0"]),
    (lambda x: nf.layers.conv2d(x, 4, 3, stride=0), AttrError, ["stride"]),
    (lambda x: nf.layers.conv2d(x, 4, 3, padding=-1), AttrError, ["padding"]),
    (lambda x: nf.layers.conv2d(x, 4, 3, padding="FULL"), AttrError, ["'FULL'"]),
    (
        lambda x: nf.layers.conv2d(x, 4, 3, padding=[[0, 1], [0, 0], [1, 1], [1, 1]]),
        AttrError,
        ["batch or channel"],
    ),
    (lambda x: nf.layers.conv2d(x, 4, 3, data_format="CHWN"), AttrError, ["CHWN"]),
    (lambda x: nf.layers.conv2d_transpose(x, 4), AttrError, ["output_size"]),
    (lambda x: nf.layers.conv2d_transpose(x, 4, filter_size=3, groups=2), ShapeError, ["groups=2"]),
    (lambda x: nf.layers.pool2d(x), AttrError, ["pool_size"]),
    (lambda x: nf.layers.pool2d(x, 2, "min"), AttrError, ["'min'"]),
    (lambda x: nf.layers.pool2d(x, 2, pool_padding="VALID", ceil_mode=True), AttrError, ["VALID"]),
    (lambda x: nf.layers.flatten(x, axis=5), AttrError, ["[0, 4]"]),
    (lambda x: nf.layers.conv2d(x, 4, 3, use_cudnn=1), AttrError, ["use_cudnn"]),
    (lambda x: nf.layers.conv2d(x, 4.0, 3), AttrError, ["num_filters", "float"]),
    (lambda x: nf.layers.lrn(x, alpha="small"), AttrError, ["alpha"]),
    (lambda x: nf.layers.pool2d(x, 2, use_cudnn="yes"), AttrError, ["use_cudnn"]),
]


@pytest.mark.parametrize(
    "make,error,words", BAD_LAYERS, ids=[str(i) for i in range(len(BAD_LAYERS))]
)
def test_bad_layer_arguments_raise_before_any_parameter_is_made(make, error, words):
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        x = nf.data("x", [-1, 3, 8, 8])
        with pytest.raises(error) as info:
            make(x)
    text = str(info.value)
    assert "test_vision.py" in text
    for word in words:
        assert word in text
    assert not main.global_block().all_parameters()
    assert not main.global_block().ops


def test_shape_errors_from_the_op_name_the_op_shapes_and_the_line():
    def net():
        x = nf.data("x", [-1, 3, 4, 4])
        nf.layers.pool2d(x, 6)

    with pytest.raises(ShapeError) as info:
        build(net)
    text = str(info.value)
    assert "op 'pool2d'" in text and "larger than the padded input" in text
    assert "test_vision.py" in text

    def conv():
        nf.layers.conv2d(nf.data("x", [-1, 3, 4, 4]), 2, 5)

    with pytest.raises(ShapeError, match=r"extent 5 .* padded input height 4"):
        build(conv)


def test_image_layers_need_a_4d_input_with_known_channels():
    with pytest.raises(ShapeError, match="4-D"):
        build(lambda: nf.layers.conv2d(nf.data("x", [-1, 3, 8]), 2, 3))
    with pytest.raises(ShapeError, match="known channel count"):
        build(lambda: nf.layers.conv2d(nf.data("x", [-1, -1, 8, 8]), 2, 3))
