"""Second-order checks (OpCase grad2): each op whose gradient op has a gradient of its own,
differentiated twice by nf.gradients in float64 against central differences."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.special import erf

from tests.ops.harness import OpCase, case_id

rng = np.random.default_rng(3)


def r(*shape, low=-1.0, high=1.0):
    return rng.uniform(low, high, shape)


def away(*shape):
    """Values away from relu/leaky_relu's kink (central differences cross no kink)."""
    values = r(*shape)
    return np.where(np.abs(values) < 0.2, values + np.sign(values + 1e-12) * 0.3, values)


def _softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _conv(x, w, strides=(1, 1), paddings=(0, 0)):
    n, c, h, wd = x.shape
    m, _, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (paddings[0],) * 2, (paddings[1],) * 2))
    oh = (h + 2 * paddings[0] - kh) // strides[0] + 1
    ow = (wd + 2 * paddings[1] - kw) // strides[1] + 1
    out = np.zeros((n, m, oh, ow))
    for i in range(oh):
        for j in range(ow):
            patch = xp[
                :, :, i * strides[0] : i * strides[0] + kh, j * strides[1] : j * strides[1] + kw
            ]
            out[:, :, i, j] = np.einsum("nchw,mchw->nm", patch, w)
    return out


def _avg_pool(x, k):
    n, c, h, w = x.shape
    return x[:, :, : h // k * k, : w // k * k].reshape(n, c, h // k, k, w // k, k).mean((3, 5))


def _max_pool(x, k, s, p=(0, 0, 0, 0), ceil_mode=False):
    """Max pooling of NCHW x by windows k every s, paddings [top, bottom, left, right]."""
    n, c, h, w = x.shape
    out_hw = []
    for d, size in enumerate((h, w)):
        span = size + p[2 * d] + p[2 * d + 1] - k[d] + (s[d] - 1 if ceil_mode else 0)
        out_hw.append(span // s[d] + 1)
    padded = np.full((n, c, h + p[0] + p[1] + s[0], w + p[2] + p[3] + s[1]), -np.inf)
    padded[:, :, p[0] : p[0] + h, p[2] : p[2] + w] = x
    out = np.empty((n, c, *out_hw))
    for i in range(out_hw[0]):
        for j in range(out_hw[1]):
            window = padded[:, :, i * s[0] : i * s[0] + k[0], j * s[1] : j * s[1] + k[1]]
            out[:, :, i, j] = window.max(axis=(2, 3))
    return out


def _max_pool_case(x, id, channel_last=False, **attrs):
    k, s = attrs["ksize"], attrs.get("strides", [1, 1])
    k = list(x.shape[2:]) if attrs.get("global_pooling") else k
    pads = attrs.get("paddings", [0, 0])
    pads = pads if len(pads) == 4 else [pads[0], pads[0], pads[1], pads[1]]

    def reference(X, **a):
        nchw = X.transpose(0, 3, 1, 2) if channel_last else X
        out = _max_pool(nchw, k, s, pads, a.get("ceil_mode", False))
        return {"Out": out.transpose(0, 2, 3, 1) if channel_last else out}

    layout = {"data_format": "NHWC"} if channel_last else {}
    return OpCase(
        "pool2d",
        {"X": x},
        reference,
        {"pooling_type": "max", **attrs, **layout},
        grad=("X",),
        grad2=True,
        id=f"pool2d-max-{id}",
    )


def _adaptive_max_pool(X, ksize, **a):
    n, c, h, w = X.shape
    out = np.empty((n, c, *ksize))
    for i in range(ksize[0]):
        for j in range(ksize[1]):
            h0, h1 = i * h // ksize[0], -(-(i + 1) * h // ksize[0])
            w0, w1 = j * w // ksize[1], -(-(j + 1) * w // ksize[1])
            out[:, :, i, j] = X[:, :, h0:h1, w0:w1].max(axis=(2, 3))
    return {"Out": out}


def _bn(X, Scale, Bias, Mean, Variance, epsilon=1e-5, data_layout="NCHW", is_test=False, **a):
    """batch_norm's Y (training: the batch's statistics; is_test: the running ones), and in
    training the saved statistics."""
    x = X if data_layout == "NCHW" else np.moveaxis(X, -1, 1)
    axes = (0,) + tuple(range(2, x.ndim))
    shape = (1, -1) + (1,) * (x.ndim - 2)
    mean, var = (Mean, Variance) if is_test else (x.mean(axis=axes), x.var(axis=axes))
    y = (x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + epsilon)
    y = y * Scale.reshape(shape) + Bias.reshape(shape)
    y = y if data_layout == "NCHW" else np.moveaxis(y, 1, -1)
    if is_test or x.size == x.shape[1]:
        return {"Y": x if x.size == x.shape[1] and not is_test else y}
    return {"Y": y, "SavedMean": mean, "SavedVariance": 1 / np.sqrt(var + epsilon)}


def _bn_case(shape, id, layout="NCHW", y_only=False, **attrs):
    c = shape[1] if layout == "NCHW" else shape[-1]

    def reference(**a):
        got = _bn(**a)
        return {"Y": got["Y"]} if y_only else got

    return OpCase(
        "batch_norm",
        {
            "X": r(*shape) * 2 + 0.5,
            "Scale": r(c),
            "Bias": r(c),
            "Mean": r(c),
            "Variance": r(c, low=0.5, high=1.5),
        },
        reference,
        {"data_layout": layout, **attrs},
        grad=("X", "Scale", "Bias"),
        grad_outputs=("Y",),
        grad2=True,
        id=f"batch_norm-{id}",
    )


def _ln(X, Scale=None, Bias=None, epsilon=1e-5, begin_norm_axis=1, **a):
    x = X.reshape(int(np.prod(X.shape[:begin_norm_axis])), -1)
    y = (x - x.mean(1, keepdims=True)) / np.sqrt(x.var(1, keepdims=True) + epsilon)
    y = y * (1.0 if Scale is None else Scale) + (0.0 if Bias is None else Bias)
    return {"Y": y.reshape(X.shape)}


def _ln_case(shape, axis, id, scale=True, bias=True):
    width = int(np.prod(shape[axis:]))
    inputs = {"X": r(*shape) * 3 - 1}
    inputs.update({"Scale": r(width)} if scale else {})
    inputs.update({"Bias": r(width)} if bias else {})
    return OpCase(
        "layer_norm",
        inputs,
        _ln,
        {"begin_norm_axis": axis},
        grad=tuple(inputs),
        grad_outputs=("Y",),
        grad2=True,
        id=f"layer_norm-{id}",
    )


def _gelu(X, approximate=False):
    if approximate:
        return 0.5 * X * (1 + np.tanh(np.sqrt(2 / np.pi) * (X + 0.044715 * X**3)))
    return 0.5 * X * (1 + erf(X / np.sqrt(2)))


def _unary(op, fn, x, **attrs):
    return OpCase(
        op,
        {"X": x},
        lambda X, **a: {"Out": fn(X, **a)},
        attrs,
        grad=("X",),
        grad2=True,
        id=f"{op}-{list(x.shape)}",
    )


def _binary(op, fn, x, y, **attrs):
    return OpCase(
        op,
        {"X": x, "Y": y},
        lambda X, Y, **a: {"Out": fn(X, Y)},
        attrs,
        grad=("X", "Y"),
        grad2=True,
        id=f"{op}-{list(x.shape)}-{list(y.shape)}",
    )


CASES = [
    # products
    _binary("mul", lambda X, Y: X @ Y, r(3, 4), r(4, 2)),
    _binary("mul", lambda X, Y: X @ Y, r(0, 4), r(4, 2)),
    _binary("mul", lambda X, Y: X @ Y, r(1, 1), r(1, 3)),
    OpCase(
        "mul",
        {"X": r(2, 3, 2), "Y": r(6, 2)},
        lambda X, Y, **a: {"Out": X.reshape(2, 6) @ Y},
        {"x_num_col_dims": 1},
        grad=("X", "Y"),
        grad2=True,
        id="mul-flatten",
    ),
    _binary("matmul", lambda X, Y: X @ Y, r(3, 4), r(4, 5)),
    _binary("matmul", lambda X, Y: X @ Y, r(2, 3, 4), r(4, 3)),
    OpCase(
        "matmul",
        {"X": r(4, 3), "Y": r(5, 4)},
        lambda X, Y, **a: {"Out": 0.5 * X.T @ Y.T},
        {"transpose_X": True, "transpose_Y": True, "alpha": 0.5},
        grad=("X", "Y"),
        grad2=True,
        id="matmul-transposed",
    ),
    # elementwise
    _binary("elementwise_add", lambda X, Y: X + Y, r(3, 4), r(4)),
    _binary("elementwise_sub", lambda X, Y: X - Y, r(2, 3), r(2, 3)),
    _binary("elementwise_mul", lambda X, Y: X * Y, r(3, 5), r(5)),
    _binary("elementwise_mul", lambda X, Y: X * Y, r(0, 5), r(5)),
    _binary("elementwise_div", lambda X, Y: X / Y, r(3, 4), r(4, low=1.0, high=2.0)),
    _binary("elementwise_div", lambda X, Y: X / Y, r(1, 3), r(1, 3, low=1.0, high=2.0)),
    OpCase(
        "scale",
        {"X": r(3, 2)},
        lambda X, **a: {"Out": 2.5 * X + 1.0},
        {"scale": 2.5, "bias": 1.0},
        grad=("X",),
        grad2=True,
        id="scale",
    ),
    _unary("square", np.square, r(3, 3)),
    OpCase(
        "sum",
        {"X": [r(2, 3), r(2, 3), r(2, 3)]},
        lambda X: {"Out": X[0] + X[1] + X[2]},
        grad=("X",),
        grad2=True,
        id="sum",
    ),
    # activations
    _unary("relu", lambda X: np.maximum(X, 0), away(4, 5)),
    _unary("relu", lambda X: np.maximum(X, 0), away(0, 3)),
    _unary("tanh", np.tanh, r(3, 7)),
    _unary("sigmoid", lambda X: 1 / (1 + np.exp(-X)), r(5, 1)),
    _unary("leaky_relu", lambda X, alpha: np.where(X > 0, X, alpha * X), away(3, 5), alpha=0.1),
    _unary("softplus", lambda X: np.logaddexp(X, 0), r(2, 5, low=-3, high=3)),
    _unary("gelu", lambda X, **a: _gelu(X), r(3, 5, low=-2, high=2)),
    _unary("gelu", lambda X, **a: _gelu(X, True), r(3, 5, low=-2, high=2), approximate=True),
    _unary("exp", np.exp, r(2, 3)),
    _unary("log", np.log, r(2, 3, low=0.5, high=2.0)),
    _unary("sqrt", np.sqrt, r(2, 3, low=0.5, high=2.0)),
    _unary("softmax", lambda X, axis: _softmax(X, axis), r(3, 5), axis=-1),
    _unary("softmax", lambda X, axis: _softmax(X, axis), r(4, 3, 2), axis=1),
    # reductions
    OpCase(
        "mean",
        {"X": r(3, 4)},
        lambda X: {"Out": np.asarray(X.mean())},
        grad=("X",),
        grad2=True,
        id="mean",
    ),
    OpCase(
        "reduce_sum",
        {"X": r(3, 4, 5)},
        lambda X, **a: {"Out": X.sum(axis=1)},
        {"dim": [1]},
        grad=("X",),
        grad2=True,
        id="reduce_sum",
    ),
    OpCase(
        "reduce_mean",
        {"X": r(3, 4)},
        lambda X, **a: {"Out": X.mean(axis=0, keepdims=True)},
        {"dim": [0], "keep_dim": True},
        grad=("X",),
        grad2=True,
        id="reduce_mean",
    ),
    # shapes
    OpCase(
        "reshape",
        {"X": r(2, 6)},
        lambda X, **a: {"Out": X.reshape(3, 4)},
        {"shape": [3, 4]},
        grad=("X",),
        grad2=True,
        id="reshape",
    ),
    OpCase(
        "transpose",
        {"X": r(2, 3, 4)},
        lambda X, **a: {"Out": X.transpose(2, 0, 1)},
        {"axis": [2, 0, 1]},
        grad=("X",),
        grad2=True,
        id="transpose",
    ),
    OpCase(
        "concat",
        {"X": [r(2, 3), r(1, 3)]},
        lambda X, **a: {"Out": np.concatenate(X, 0)},
        {"axis": 0},
        grad=("X",),
        grad2=True,
        id="concat",
    ),
    OpCase(
        "slice",
        {"Input": r(4, 5)},
        lambda Input, **a: {"Out": Input[1:3, 0:4]},
        {"axes": [0, 1], "starts": [1, 0], "ends": [3, 4]},
        grad=("Input",),
        grad2=True,
        id="slice",
    ),
    # convolution and pooling
    OpCase(
        "conv2d",
        {"Input": r(2, 2, 5, 5), "Filter": r(3, 2, 3, 3)},
        lambda Input, Filter, **a: {"Output": _conv(Input, Filter, (2, 2), (1, 1))},
        {"strides": [2, 2], "paddings": [1, 1]},
        grad=("Input", "Filter"),
        grad2=True,
        id="conv2d",
    ),
    OpCase(
        "conv2d",
        {"Input": r(1, 1, 3, 3), "Filter": r(1, 1, 1, 1)},
        lambda Input, Filter, **a: {"Output": _conv(Input, Filter)},
        grad=("Input", "Filter"),
        grad2=True,
        id="conv2d-1x1",
    ),
    OpCase(
        "pool2d",
        {"X": r(2, 3, 4, 5)},
        lambda X, **a: {"Out": _avg_pool(X, 2)},
        {"pooling_type": "avg", "ksize": [2, 2], "strides": [2, 2]},
        grad=("X",),
        grad2=True,
        id="pool2d-avg",
    ),
    _max_pool_case(r(2, 3, 4, 6), "tiled", ksize=[2, 2], strides=[2, 2]),
    _max_pool_case(
        r(1, 2, 5, 5), "overlapping-padded", ksize=[3, 3], strides=[1, 1], paddings=[1, 1]
    ),
    _max_pool_case(r(2, 1, 5, 7), "odd-ceil", ksize=[2, 3], strides=[2, 2], ceil_mode=True),
    _max_pool_case(r(1, 1, 1, 1), "size1", ksize=[1, 1]),
    _max_pool_case(r(2, 3, 3, 2), "nhwc", channel_last=True, ksize=[2, 2], strides=[1, 1]),
    _max_pool_case(r(2, 2, 3, 5), "global", ksize=[1, 1], global_pooling=True),
    OpCase(
        "pool2d",
        {"X": r(1, 2, 5, 7)},
        _adaptive_max_pool,
        {"pooling_type": "max", "ksize": [2, 3], "adaptive": True},
        grad=("X",),
        grad2=True,
        id="pool2d-max-adaptive",
    ),
    # normalisation
    _bn_case((4, 3), "2d"),
    _bn_case((2, 3, 3, 5), "nchw"),
    _bn_case((3, 2, 3, 1), "nhwc-odd", layout="NHWC"),
    _bn_case((1, 5, 1, 3), "batch1-odd"),
    _bn_case((2, 1, 1, 1), "one_channel-size1"),
    _bn_case((3, 2, 2), "recomputed_statistics", y_only=True),
    _bn_case((1, 3), "one_value_per_channel_copies_x"),
    _bn_case((2, 3, 2, 3), "is_test", is_test=True),
    _bn_case((2, 3, 2, 2), "momentum-eps_1e-3", momentum=0.5, epsilon=1e-3),
    _ln_case((3, 5), 1, "2d"),
    _ln_case((2, 3, 4), 2, "3d-axis2"),
    _ln_case((1, 7), 1, "batch1-odd"),
    _ln_case((3, 1), 1, "width1"),
    _ln_case((2, 3, 3), 1, "no_scale", scale=False),
    _ln_case((3, 4), 1, "no_bias", bias=False),
    _ln_case((2, 5), 1, "no_affine", scale=False, bias=False),
]


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_second_order(case):
    case.check()


def _xent(X, Label, **a):
    return {"Y": -np.log(np.take_along_axis(X, Label, axis=-1))}


def _swce(Logits, Label, **a):
    soft = _softmax(Logits)
    return {"Softmax": soft, "Loss": -np.log(np.take_along_axis(soft, Label, axis=-1))}


LOSS_CASES = [
    OpCase(
        "cross_entropy",
        {"X": r(4, 3, low=0.2, high=1.0), "Label": np.array([[0], [2], [1], [2]])},
        _xent,
        grad=("X",),
        grad2=True,
        id="cross_entropy",
    ),
    OpCase(
        "cross_entropy",
        {"X": r(2, 3, low=0.2, high=1.0), "Label": r(2, 3, low=0.0, high=1.0)},
        lambda X, Label, **a: {"Y": -(Label * np.log(X)).sum(-1, keepdims=True)},
        {"soft_label": True},
        grad=("X",),
        grad2=True,
        id="cross_entropy-soft",
    ),
    OpCase(
        "softmax_with_cross_entropy",
        {"Logits": r(4, 5), "Label": np.array([[0], [4], [1], [1]])},
        _swce,
        grad=("Logits",),
        grad2=True,
        id="softmax_with_cross_entropy",
    ),
    OpCase(
        "softmax_with_cross_entropy",
        {"Logits": r(1, 3), "Label": np.array([[2]])},
        _swce,
        grad=("Logits",),
        grad_outputs=("Loss",),
        grad2=True,
        id="softmax_with_cross_entropy-loss-only",
    ),
]


@pytest.mark.parametrize("case", LOSS_CASES, ids=case_id)
def test_second_order_of_losses(case):
    case.check()


def test_every_registered_second_order_has_a_grad2_case():
    from nestflow.ops.registry import registered_ops

    with_second_order = {
        op_def.forward_type.removesuffix("_grad")
        for name, op_def in registered_ops().items()
        if name.endswith("_grad_grad")
    }
    checked = {case.op_type for case in CASES + LOSS_CASES if case.grad2}
    assert with_second_order - checked == set()
