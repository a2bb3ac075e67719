"""batch_norm and layer_norm against NumPy references (float64 central-difference gradients of
X, Scale and Bias), running statistics over several training runs, and against PyTorch."""

from __future__ import annotations

import numpy as np
import pytest

import nestflow as nf
from nestflow.errors import AttrError, DTypeError, ShapeError
from tests.ops.harness import OpCase, case_id

rng = np.random.default_rng(11)


def normal(*shape, dtype="float64"):
    return rng.standard_normal(shape).astype(dtype)


def positive(*shape, dtype="float64"):
    return rng.uniform(0.5, 2.0, shape).astype(dtype)


# ---- batch_norm ----


def bn_ref(
    X,
    Scale,
    Bias,
    Mean,
    Variance,
    MomentumTensor=None,
    is_test=False,
    momentum=0.9,
    epsilon=1e-5,
    data_layout="NCHW",
    use_global_stats=False,
    trainable_statistics=False,
):
    """Channels moved to axis 1 and everything else flattened: x is [N, C, rest]."""
    x = X if data_layout == "NCHW" else np.moveaxis(X, -1, 1)
    n, c = x.shape[:2]
    rest = int(np.prod(x.shape[2:]))
    flat = x.reshape(n, c, rest).transpose(1, 0, 2).reshape(c, n * rest)  # [C, N * rest]
    if (is_test and not trainable_statistics) or use_global_stats:
        mean, var = Mean, Variance
        inv_std = 1 / np.sqrt(Variance + epsilon)
        mean_out, var_out, saved_mean, saved_var = Mean, Variance, Mean, inv_std
    elif flat.shape[1] <= 1:
        zeros = np.zeros_like(Mean)
        return {
            "Y": X.copy(),
            "MeanOut": Mean,
            "VarianceOut": Variance,
            "SavedMean": zeros,
            "SavedVariance": zeros,
        }
    else:
        if MomentumTensor is not None:
            momentum = float(MomentumTensor.ravel()[0])
        mean, var = flat.mean(axis=1), flat.var(axis=1)
        mean_out = momentum * Mean + (1 - momentum) * mean
        var_out = momentum * Variance + (1 - momentum) * var
        saved_mean, saved_var = mean, 1 / np.sqrt(var + epsilon)
    shape = (1, c) + (1,) * (x.ndim - 2)
    y = (x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + epsilon)
    y = y * Scale.reshape(shape) + Bias.reshape(shape)
    y = y if data_layout == "NCHW" else np.moveaxis(y, 1, -1)
    dtype = X.dtype
    return {
        "Y": y.astype(dtype),
        "MeanOut": np.asarray(mean_out, dtype),
        "VarianceOut": np.asarray(var_out, dtype),
        "SavedMean": np.asarray(saved_mean, dtype),
        "SavedVariance": np.asarray(saved_var, dtype),
    }


def bn_inputs(shape, layout="NCHW", dtype="float64"):
    c = shape[1] if layout == "NCHW" else shape[-1]
    return {
        "X": normal(*shape, dtype=dtype) * 2 + 0.5,
        "Scale": normal(c, dtype=dtype),
        "Bias": normal(c, dtype=dtype),
        "Mean": normal(c, dtype=dtype),
        "Variance": positive(c, dtype=dtype),
    }


def bn_case(shape, id, layout="NCHW", grad=("X", "Scale", "Bias"), **attrs):
    return OpCase(
        "batch_norm",
        bn_inputs(shape, layout),
        bn_ref,
        {"data_layout": layout, **attrs},
        grad=grad,
        grad_outputs=("Y",),  # the statistics carry no gradient back (Fluid's batch_norm_grad)
        id=f"batch_norm-{id}",
    )


BATCH_NORM_CASES = [
    bn_case((4, 3), "2d"),
    bn_case((2, 5), "2d-batch2-odd_channels"),
    bn_case((2, 3, 4, 5), "nchw"),
    bn_case((2, 4, 5, 3), "nhwc", layout="NHWC"),
    bn_case((3, 5), "2d-nhwc", layout="NHWC"),
    bn_case((1, 3, 2, 3), "batch1"),
    bn_case((3, 7, 3, 1), "odd_channels-width1"),
    bn_case((2, 3, 5), "3d"),
    bn_case((2, 3, 2, 2, 2), "5d"),
    bn_case((1, 3), "one_value_per_channel_copies_x"),
    bn_case((0, 3, 2, 2), "empty_batch"),
    bn_case((2, 3, 3, 3), "momentum_0.5-eps_1e-3", momentum=0.5, epsilon=1e-3),
    bn_case((2, 3, 3, 2), "is_test", is_test=True),
    bn_case((2, 4, 3), "is_test-nhwc", layout="NHWC", is_test=True),
    bn_case((2, 3, 2, 3), "use_global_stats", use_global_stats=True),
    bn_case((2, 3, 2, 3), "is_test-trainable_statistics", is_test=True, trainable_statistics=True),
    OpCase(
        "batch_norm",
        {**bn_inputs((2, 3, 2, 2)), "MomentumTensor": np.array([0.25])},
        bn_ref,
        grad=("X", "Scale", "Bias"),
        grad_outputs=("Y",),
        id="batch_norm-momentum_tensor",
    ),
    OpCase(
        "batch_norm",
        bn_inputs((4, 3, 3, 3), dtype="float32"),
        bn_ref,
        atol=1e-5,
        id="batch_norm-float32",
    ),
]


# ---- layer_norm ----


def ln_ref(X, Scale=None, Bias=None, epsilon=1e-5, begin_norm_axis=1):
    rows = int(np.prod(X.shape[:begin_norm_axis]))
    x = X.reshape(rows, -1) if rows else X.reshape(0, int(np.prod(X.shape[begin_norm_axis:])))
    mean, var = x.mean(axis=1), x.var(axis=1)
    y = (x - mean[:, None]) / np.sqrt(var[:, None] + epsilon)
    if Scale is not None:
        y = y * Scale
    if Bias is not None:
        y = y + Bias
    return {"Y": y.reshape(X.shape), "Mean": mean, "Variance": var}


def ln_case(shape, axis, id, scale=True, bias=True, dtype="float64", epsilon=None, **kw):
    width = int(np.prod(shape[axis:]))
    inputs = {"X": normal(*shape, dtype=dtype) * 3 - 1}
    grad = ["X"]
    if scale:
        inputs["Scale"] = normal(width, dtype=dtype)
        grad.append("Scale")
    if bias:
        inputs["Bias"] = normal(width, dtype=dtype)
        grad.append("Bias")
    return OpCase(
        "layer_norm",
        inputs,
        ln_ref,
        {"begin_norm_axis": axis, **({} if epsilon is None else {"epsilon": epsilon})},
        grad=tuple(grad) if dtype == "float64" else (),
        grad_outputs=("Y",),
        id=f"layer_norm-{id}",
        **kw,
    )


LAYER_NORM_CASES = [
    ln_case((3, 5), 1, "2d"),
    ln_case((2, 3, 4), 1, "3d-axis1"),
    ln_case((2, 3, 4), 2, "3d-axis2"),
    ln_case((2, 3, 2, 3), 2, "4d-axis2"),
    ln_case((1, 7), 1, "batch1-odd"),
    ln_case((4, 1), 1, "width1"),
    ln_case((0, 3, 2), 1, "empty_batch"),
    ln_case((3, 4), 1, "no_scale", scale=False),
    ln_case((3, 4), 1, "no_bias", bias=False),
    ln_case((3, 4), 1, "neither", scale=False, bias=False),
    ln_case((3, 4), 1, "eps_1e-3", epsilon=1e-3),
    ln_case((4, 6), 1, "float32", dtype="float32", atol=1e-5),
]


@pytest.mark.parametrize("case", BATCH_NORM_CASES + LAYER_NORM_CASES, ids=case_id)
def test_op(case):
    case.check()


# ---- running statistics over several runs ----


def _running_stats_program(shape, momentum, is_test=False):
    """batch_norm whose MeanOut/VarianceOut are its persistable Mean/Variance, as the layer
    builds it; Scale and Bias fed."""
    program = nf.Program()
    block = program.global_block()
    c = shape[1]
    block.create_var("x", [-1, *shape[1:]], "float64")
    for name in ("scale", "bias"):
        block.create_var(name, [c], "float64")
    for name in ("mean", "var"):
        block.create_var(name, [c], "float64", persistable=True, stop_gradient=True)
    block.append_op(
        "batch_norm",
        {"X": "x", "Scale": "scale", "Bias": "bias", "Mean": "mean", "Variance": "var"},
        {"Y": "y", "MeanOut": "mean", "VarianceOut": "var"},
        {"momentum": momentum, "is_test": is_test},
    )
    return program


def test_running_statistics_move_over_training_runs_and_normalise_in_test():
    shape, momentum = (6, 3, 2, 2), 0.8
    program = _running_stats_program(shape, momentum)
    scope = nf.Scope()
    start_mean, start_var = normal(3), positive(3)
    scope.var("mean").get_mutable(nf.Tensor).set(start_mean.copy())
    scope.var("var").get_mutable(nf.Tensor).set(start_var.copy())
    scale, bias = normal(3), normal(3)
    exe = nf.Executor()
    want_mean, want_var = start_mean, start_var
    for step in range(4):
        x = normal(*shape) * (step + 1) + step
        feed = {"x": x, "scale": scale, "bias": bias}
        (y,) = exe.run(program, feed=feed, fetch_list=["y"], scope=scope)
        batch_mean, batch_var = x.mean(axis=(0, 2, 3)), x.var(axis=(0, 2, 3))
        want_mean = momentum * want_mean + (1 - momentum) * batch_mean
        want_var = momentum * want_var + (1 - momentum) * batch_var  # biased, as Fluid
        np.testing.assert_allclose(scope.find_var("mean").get(nf.Tensor).numpy(), want_mean)
        np.testing.assert_allclose(scope.find_var("var").get(nf.Tensor).numpy(), want_var)
        expected = bn_ref(x, scale, bias, want_mean, want_var, momentum=momentum)["Y"]
        np.testing.assert_allclose(y, expected, atol=1e-12)
    test_program = program.clone(for_test=True)
    x = normal(2, 3, 2, 2)
    (y,) = exe.run(
        test_program, feed={"x": x, "scale": scale, "bias": bias}, fetch_list=["y"], scope=scope
    )
    b = (1, 3, 1, 1)
    expected = (x - want_mean.reshape(b)) / np.sqrt(want_var.reshape(b) + 1e-5)
    np.testing.assert_allclose(y, expected * scale.reshape(b) + bias.reshape(b), atol=1e-12)
    # Inference leaves the running statistics alone.
    np.testing.assert_allclose(scope.find_var("mean").get(nf.Tensor).numpy(), want_mean)
    np.testing.assert_allclose(scope.find_var("var").get(nf.Tensor).numpy(), want_var)


# ---- build-time errors ----


def _build(x_shape, x_dtype="float64", c=None, param_dtype="float64", **attrs):
    program = nf.Program()
    block = program.global_block()
    block.create_var("x", x_shape, x_dtype)
    c = c if c is not None else x_shape[1]
    for name in ("scale", "bias", "mean", "var"):
        block.create_var(name, [c], param_dtype)
    return block.append_op(
        "batch_norm",
        {"X": "x", "Scale": "scale", "Bias": "bias", "Mean": "mean", "Variance": "var"},
        {"Y": "y", "MeanOut": "mean", "VarianceOut": "var"},
        attrs,
    )


@pytest.mark.parametrize(
    "kwargs, error, words",
    [
        ({"x_shape": [2, 3], "x_dtype": "int64"}, DTypeError, "floating-point"),
        ({"x_shape": [2, 3], "param_dtype": "float32"}, DTypeError, "Scale is float32"),
        ({"x_shape": [6], "c": 6}, ShapeError, "rank 2 to 5"),
        ({"x_shape": [2, 3, 1, 1, 1, 1]}, ShapeError, "rank 2 to 5"),
        ({"x_shape": [2, 3, 4], "c": 4}, ShapeError, "Scale must be [3]"),
        ({"x_shape": [2, 3], "data_layout": "NCDHW"}, AttrError, "data_layout"),
        ({"x_shape": [2, 3], "epsilon": 0.01}, AttrError, "epsilon"),
        ({"x_shape": [2, 3], "fuse_with_relu": True}, AttrError, "fuse_with_relu"),
    ],
)
def test_batch_norm_rejects_bad_input_at_build_time(kwargs, error, words):
    with pytest.raises(error, match="batch_norm") as info:
        _build(**kwargs)
    assert words in str(info.value)
    assert "test_norm.py" in str(info.value)  # the user's line


@pytest.mark.parametrize(
    "shape, axis, scale, dtype, error, words",
    [
        ([2, 3], 1, 3, "int32", DTypeError, "floating-point"),
        ([2, 3], 2, 3, "float64", ShapeError, "begin_norm_axis=2"),
        ([2, 3], 0, 6, "float64", ShapeError, "begin_norm_axis=0"),
        ([2, 3, 4], 1, 4, "float64", ShapeError, "Scale must be [12]"),
    ],
)
def test_layer_norm_rejects_bad_input_at_build_time(shape, axis, scale, dtype, error, words):
    block = nf.Program().global_block()
    block.create_var("x", shape, dtype)
    block.create_var("s", [scale], dtype)
    with pytest.raises(error, match="layer_norm") as info:
        block.append_op(
            "layer_norm", {"X": "x", "Scale": "s"}, {"Y": "y"}, {"begin_norm_axis": axis}
        )
    assert words in str(info.value)


# ---- PyTorch ----


def _grads_program(op_type, inputs, attrs, outputs):
    """One op over fed float64 inputs plus its gradients for X, Scale, Bias given dY."""
    program = nf.Program()
    block = program.global_block()
    with nf.program_guard(program, nf.Program()):
        for name, value in inputs.items():
            block.create_var(name, value.shape, value.dtype)
        block.create_var("dy", inputs["X"].shape, "float64")
        block.append_op(op_type, {k: k for k in inputs}, outputs, attrs)
        wrt = [block.var(n) for n in ("X", "Scale", "Bias") if n in inputs]
        grads = nf.gradients([block.var("Y")], wrt, target_gradients=[block.var("dy")])
    return program, grads


def _torch_grads(torch, make_y, arrays, dy):
    tensors = {k: torch.tensor(v, requires_grad=True) for k, v in arrays.items()}
    y = make_y(**tensors)
    y.backward(torch.tensor(dy))
    return y.detach().numpy(), {k: t.grad.numpy() for k, t in tensors.items()}


@pytest.mark.parametrize(
    "shape, layout, training, momentum",
    [
        ((8, 5), "NCHW", True, 0.9),
        ((4, 3, 5, 6), "NCHW", True, 0.9),  # fewer than 64 pixels: the images summed first
        ((3, 4, 9, 8), "NCHW", True, 0.9),  # 64 or more: vecdot over each channel's pixels
        ((1, 4, 3, 3), "NCHW", True, 0.7),
        ((3, 2, 4, 3, 2), "NCHW", True, 0.9),
        ((4, 5, 6, 3), "NHWC", True, 0.9),
        ((4, 3, 5, 6), "NCHW", False, 0.9),
        ((5, 7), "NCHW", False, 0.9),
        ((2, 4, 4, 5), "NHWC", False, 0.9),
    ],
)
def test_batch_norm_equals_torch(shape, layout, training, momentum):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    arrays = bn_inputs(shape, layout)
    dy = normal(*shape)
    c = arrays["Scale"].shape[0]
    program, grads = _grads_program(
        "batch_norm",
        arrays,
        {"data_layout": layout, "is_test": not training, "momentum": momentum},
        {"Y": "Y", "MeanOut": "mean_out", "VarianceOut": "var_out", "SavedMean": "sm"},
    )
    fetch = ["Y", "mean_out", "var_out"] + [g.name for g in grads]
    y, mean_out, var_out, dx, dscale, dbias = nf.Executor().run(
        program, feed={**arrays, "dy": dy}, fetch_list=fetch, scope=nf.Scope()
    )
    running_mean = torch.tensor(arrays["Mean"])
    running_var = torch.tensor(arrays["Variance"])

    def torch_bn(X, Scale, Bias):
        x = X if layout == "NCHW" else torch.movedim(X, -1, 1)
        out = F.batch_norm(
            x,
            running_mean,
            running_var,
            Scale,
            Bias,
            training=training,
            momentum=1 - momentum,
            eps=1e-5,
        )  # torch's momentum weighs the new batch: 1 - Fluid's
        return out if layout == "NCHW" else torch.movedim(out, 1, -1)

    want_y, want = _torch_grads(torch, torch_bn, {k: arrays[k] for k in ("X", "Scale", "Bias")}, dy)
    np.testing.assert_allclose(y, want_y, rtol=1e-8, atol=1e-8)
    np.testing.assert_allclose(dx, want["X"], rtol=1e-8, atol=1e-8)
    np.testing.assert_allclose(dscale, want["Scale"], rtol=1e-8, atol=1e-8)
    np.testing.assert_allclose(dbias, want["Bias"], rtol=1e-8, atol=1e-8)
    np.testing.assert_allclose(mean_out, running_mean.numpy(), rtol=1e-8, atol=1e-8)
    if not training:
        np.testing.assert_array_equal(var_out, arrays["Variance"])
        return
    # The one difference: torch moves running_var with the unbiased batch variance, Fluid (and
    # nestflow) with the biased one; undoing torch's count / (count - 1) gives ours.
    count = dy.size // c
    batch_var_torch = (running_var.numpy() - momentum * arrays["Variance"]) / (1 - momentum)
    np.testing.assert_allclose(
        var_out,
        momentum * arrays["Variance"] + (1 - momentum) * batch_var_torch * (count - 1) / count,
        rtol=1e-8,
        atol=1e-8,
    )


@pytest.mark.parametrize(
    "shape, axis, scale, bias",
    [
        ((4, 6), 1, True, True),
        ((3, 4, 5), 2, True, True),
        ((2, 3, 4, 5), 1, True, True),
        ((2, 3, 4, 5), 3, True, False),
        ((5, 3, 4), 1, False, True),
        ((1, 9), 1, False, False),
    ],
)
def test_layer_norm_equals_torch(shape, axis, scale, bias):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    width = int(np.prod(shape[axis:]))
    arrays = {"X": normal(*shape) * 2 + 1}
    if scale:
        arrays["Scale"] = normal(width)
    if bias:
        arrays["Bias"] = normal(width)
    dy = normal(*shape)
    program, grads = _grads_program(
        "layer_norm", arrays, {"begin_norm_axis": axis}, {"Y": "Y", "Mean": "m", "Variance": "v"}
    )
    got = nf.Executor().run(
        program,
        feed={**arrays, "dy": dy},
        fetch_list=["Y"] + [g.name for g in grads],
        scope=nf.Scope(),
    )

    def torch_ln(X, Scale=None, Bias=None):
        normalized = X.shape[axis:]
        weight = None if Scale is None else Scale.reshape(normalized)
        shift = None if Bias is None else Bias.reshape(normalized)
        return F.layer_norm(X, normalized, weight, shift, eps=1e-5)

    want_y, want = _torch_grads(torch, torch_ln, arrays, dy)
    np.testing.assert_allclose(got[0], want_y, rtol=1e-8, atol=1e-8)
    for value, slot in zip(got[1:], [k for k in ("X", "Scale", "Bias") if k in arrays]):
        np.testing.assert_allclose(value, want[slot], rtol=1e-8, atol=1e-8, err_msg=slot)


@pytest.mark.parametrize("is_test", [False, True])
@pytest.mark.parametrize("shape", [(3, 5, 4, 7), (2, 3, 1, 1), (0, 4, 3, 3), (2, 6, 5)])
def test_batch_norm_spread_operands_give_the_bits_of_plain_broadcasting(
    shape, is_test, monkeypatch
):
    """NCHW per-channel operands spread over one image (math.spread_y) change the loops, not
    the values: forward and gradients equal those computed with [1, C, 1, 1] operands."""
    from nestflow.ops import norm
    from nestflow.ops.registry import get_op_def

    rng = np.random.default_rng(7)
    x = rng.standard_normal(shape).astype("float32")
    dy = rng.standard_normal(shape).astype("float32")
    c = shape[1]
    scale, bias = rng.uniform(0.5, 2, c).astype("float32"), rng.standard_normal(c).astype("float32")
    mean, var = rng.standard_normal(c).astype("float32"), rng.uniform(0.5, 2, c).astype("float32")
    attrs = dict(
        data_layout="NCHW",
        epsilon=1e-5,
        is_test=is_test,
        use_global_stats=False,
        trainable_statistics=False,
        momentum=0.9,
    )
    op = get_op_def("batch_norm")

    def run():
        outs = op.forward(x, scale, bias, mean, var, None, xp=np, **attrs)
        grads = op.backward(
            x, scale, bias, mean, var, None, *outs, dy, None, None, None, None, xp=np, **attrs
        )
        return [a for a in (*outs, *grads) if a is not None]

    spread = run()
    monkeypatch.setattr(
        norm, "spread_y", lambda X, v, c_axis, xp: v.reshape(norm._per_channel(X.ndim, c_axis)[1])
    )
    for got, want in zip(spread, run(), strict=True):
        np.testing.assert_array_equal(got, want)
