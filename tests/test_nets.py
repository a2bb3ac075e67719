"""nf.nets.simple_img_conv_pool: conv2d then pool2d (Fluid 1.8's nets), against NumPy loops."""

from __future__ import annotations

import numpy as np
import pytest

import nestflow as nf
from nestflow.errors import DTypeError, ShapeError


def conv_ref(x, w, b, stride, padding, dilation, groups):
    """Direct convolution by loops over output pixels (NCHW, filters [M, C/groups, kh, kw])."""
    n, c, h, wd = x.shape
    m, cg, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    oh = (h + 2 * padding - dilation * (kh - 1) - 1) // stride + 1
    ow = (wd + 2 * padding - dilation * (kw - 1) - 1) // stride + 1
    out = np.zeros((n, m, oh, ow))
    per_group = m // groups
    for f in range(m):
        g = f // per_group
        channels = xp[:, g * cg : (g + 1) * cg]
        for i in range(oh):
            for j in range(ow):
                rows = i * stride + dilation * np.arange(kh)
                cols = j * stride + dilation * np.arange(kw)
                patch = channels[:, :, rows][:, :, :, cols]
                out[:, f, i, j] = np.sum(patch * w[f], axis=(1, 2, 3)) + b[f]
    return out


def pool_ref(x, size, stride, padding, kind):
    n, c, h, w = x.shape
    fill = -np.inf if kind == "max" else 0.0
    xp = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)), constant_values=fill)
    oh = (h + 2 * padding - size) // stride + 1
    ow = (w + 2 * padding - size) // stride + 1
    out = np.zeros((n, c, oh, ow))
    for i in range(oh):
        for j in range(ow):
            r0, c0 = i * stride, j * stride
            window = xp[:, :, r0 : r0 + size, c0 : c0 + size]
            if kind == "max":
                out[:, :, i, j] = window.max(axis=(2, 3))
            else:  # exclusive: average over the cells inside the unpadded image
                rows = np.arange(r0, r0 + size) - padding
                cols = np.arange(c0, c0 + size) - padding
                inside = ((rows >= 0) & (rows < h)).sum() * ((cols >= 0) & (cols < w)).sum()
                out[:, :, i, j] = window.sum(axis=(2, 3)) / inside
    return out


def _run(outputs, feed):
    scope = nf.Scope()
    exe = nf.Executor()
    exe.run(nf.default_startup_program(), scope=scope)
    return exe.run(feed=feed, fetch_list=outputs, scope=scope), scope


@pytest.mark.parametrize(
    "shape, kwargs",
    [
        ((2, 1, 8, 8), dict(num_filters=4, filter_size=3, pool_size=2, pool_stride=2)),
        (
            (2, 2, 7, 7),
            dict(
                num_filters=3, filter_size=5, pool_size=2, pool_stride=2, conv_padding=2, act="relu"
            ),
        ),
        (
            (1, 4, 9, 9),
            dict(
                num_filters=6,
                filter_size=3,
                pool_size=3,
                pool_stride=2,
                pool_padding=1,
                pool_type="avg",
                conv_stride=2,
                conv_padding=1,
                conv_groups=2,
            ),
        ),
        (
            (3, 2, 9, 8),
            dict(num_filters=2, filter_size=2, pool_size=2, pool_stride=1, conv_dilation=2),
        ),
    ],
)
def test_simple_img_conv_pool_is_conv2d_then_pool2d(shape, kwargs):
    rng = np.random.default_rng(0)
    x = nf.data("img", [-1, *shape[1:]], "float64")
    out = nf.nets.simple_img_conv_pool(x, **kwargs)
    glob = nf.default_main_program().global_block()
    assert [op.type for op in glob.ops][0] == "conv2d" and glob.ops[-1].type == "pool2d"
    images = rng.normal(size=shape)
    _, scope = _run([out], {"img": images})
    (w_name,) = [v.name for v in glob.all_parameters() if v.ndim == 4]
    (b_name,) = [v.name for v in glob.all_parameters() if v.ndim == 1]
    w = scope.find_var(w_name).get(nf.Tensor).numpy()
    b = rng.normal(size=kwargs["num_filters"])
    scope.find_var(b_name).get(nf.Tensor).set(b)
    (got,) = nf.Executor().run(feed={"img": images}, fetch_list=[out], scope=scope)
    conv = conv_ref(
        images,
        w,
        b,
        kwargs.get("conv_stride", 1),
        kwargs.get("conv_padding", 0),
        kwargs.get("conv_dilation", 1),
        kwargs.get("conv_groups", 1),
    )
    if kwargs.get("act") == "relu":
        conv = np.maximum(conv, 0)
    want = pool_ref(
        conv,
        kwargs["pool_size"],
        kwargs["pool_stride"],
        kwargs.get("pool_padding", 0),
        kwargs.get("pool_type", "max"),
    )
    assert out.shape == (-1, *want.shape[1:])
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


def test_global_pooling_and_parameter_attributes_pass_through():
    x = nf.data("img", [-1, 3, 6, 6], "float64")
    out = nf.nets.simple_img_conv_pool(
        x,
        num_filters=5,
        filter_size=3,
        pool_size=2,
        pool_stride=2,
        pool_type="avg",
        global_pooling=True,
        param_attr=nf.ParamAttr(name="conv.w", initializer=nf.initializer.Constant(0.5)),
        bias_attr=False,
    )
    assert out.shape == (-1, 5, 1, 1)
    names = sorted(v.name for v in nf.default_main_program().global_block().all_parameters())
    assert names == ["conv.w"]
    images = np.random.default_rng(1).normal(size=(2, 3, 6, 6))
    (got,), _ = _run([out], {"img": images})
    conv = conv_ref(images, np.full((5, 3, 3, 3), 0.5), np.zeros(5), 1, 0, 1, 1)
    np.testing.assert_allclose(got[:, :, 0, 0], conv.mean(axis=(2, 3)), rtol=1e-10)


def test_gradients_reach_the_filter_and_training_lowers_the_loss():
    rng = np.random.default_rng(2)
    x = nf.data("img", [-1, 1, 6, 6], "float64")
    label = nf.data("label", [-1, 1], "int64")
    h = nf.nets.simple_img_conv_pool(x, 4, 3, pool_size=2, pool_stride=2, act="relu")
    logits = nf.layers.fc(h, size=2)
    loss = nf.layers.mean(nf.layers.softmax_with_cross_entropy(logits, label))
    _, params_grads = nf.optimizer.Adam(learning_rate=0.05).minimize(loss)
    assert {p.ndim for p, _ in params_grads} == {1, 2, 4}
    images = rng.normal(size=(16, 1, 6, 6))
    labels = (images[:, 0, :3].sum(axis=(1, 2)) > 0).astype("int64").reshape(-1, 1)
    scope = nf.Scope()
    exe = nf.Executor()
    exe.run(nf.default_startup_program(), scope=scope)
    feed = {"img": images, "label": labels}
    losses = [float(exe.run(feed=feed, fetch_list=[loss], scope=scope)[0]) for _ in range(30)]
    assert losses[-1] < 0.5 * losses[0]


def test_bad_input_raises_what_conv2d_raises():
    with pytest.raises(DTypeError, match="conv2d"):
        nf.nets.simple_img_conv_pool(nf.data("a", [-1, 1, 8, 8], "int64"), 2, 3, 2, 2)
    with pytest.raises(ShapeError):
        nf.nets.simple_img_conv_pool(nf.data("b", [-1, 8, 8], "float32"), 2, 3, 2, 2)


def test_nets_is_imported_lazily():
    import subprocess
    import sys

    code = "import sys, nestflow as nf; print('nestflow.nets' in sys.modules); nf.nets"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout.strip() == "False", done.stderr
