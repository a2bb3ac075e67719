"""Layers sequence_conv/sequence_softmax/sequence_expand and nets sequence_conv_pool and
img_conv_group: values against NumPy over each row's valid steps, Fluid's op structure, and
training through them."""

from __future__ import annotations

import numpy as np
import pytest

import nestflow as nf
from nestflow.errors import AttrError
from tests.ops.test_sequence_nn import conv_ref

R = np.random.default_rng(3)


def _run(main, startup, feed, fetch):
    exe, scope = nf.Executor(), nf.Scope()
    exe.run(startup, scope=scope)
    return exe.run(main, feed=feed, fetch_list=fetch, scope=scope), scope


def test_sequence_conv_pool_equals_numpy_conv_bias_act_and_max_pool():
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        x = nf.data("x", [-1, 6, 3], "float64")
        n = nf.data("n", [-1], "int64")
        attr = nf.ParamAttr(name="conv.w")
        bias = nf.ParamAttr(name="conv.b", initializer=nf.initializer.Constant(0.25))
        out = nf.nets.sequence_conv_pool(x, 4, 3, param_attr=attr, act="tanh", bias_attr=bias,
                                         lengths=n)  # fmt: skip
    xs, lens = R.standard_normal((3, 6, 3)), np.array([6, 2, 4])
    (got, w), scope = _run(main, startup, {"x": xs, "n": lens}, [out, "conv.w"])
    conv = np.tanh(conv_ref(xs, w, lens, contextLength=3, contextStart=-1)["Out"] + 0.25)
    want = np.stack([conv[i, : lens[i]].max(axis=0) for i in range(3)])
    np.testing.assert_allclose(got, want, atol=1e-12)
    assert [op.type for op in main.global_block().ops] == [
        "sequence_conv", "elementwise_add", "tanh", "sequence_pool"
    ]  # fmt: skip


def test_sequence_conv_trains_and_padding_gets_no_gradient():
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        x = nf.data("x", [-1, 5, 2], "float64", stop_gradient=False)
        n = nf.data("n", [-1], "int64")
        y = nf.layers.sequence_conv(x, 3, filter_size=2, padding_start=0, lengths=n)
        loss = nf.layers.mean(nf.layers.sequence_pool(y, "sum", n))
        nf.optimizer.SGD(0.1).minimize(loss)
    feed = {"x": R.standard_normal((2, 5, 2)), "n": np.array([5, 3])}
    (before, dx), scope = _run(main, startup, feed, [loss, "x@GRAD"])
    assert np.all(dx[1, 3:] == 0) and np.any(dx[1, :3] != 0)
    (after,) = nf.Executor().run(main, feed=feed, fetch_list=[loss], scope=scope)
    assert after < before


def test_sequence_softmax_and_expand_layers():
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        s = nf.data("s", [-1, 4], "float64")
        h = nf.data("h", [-1, 3], "float64")
        n = nf.data("n", [-1], "int64")
        soft = nf.layers.sequence_softmax(s, lengths=n)
        expanded = nf.layers.sequence_expand(h, nf.layers.unsqueeze(s, [2]), lengths=n)
    ss, hs, lens = R.standard_normal((2, 4)), R.standard_normal((2, 3)), np.array([4, 1])
    (got_soft, got_exp), _ = _run(main, startup, {"s": ss, "h": hs, "n": lens}, [soft, expanded])
    e = np.exp(ss[0] - ss[0].max())
    np.testing.assert_allclose(got_soft[0], e / e.sum())
    assert got_soft[1].tolist() == [1.0, 0.0, 0.0, 0.0]
    assert got_exp.shape == (2, 4, 3)
    np.testing.assert_array_equal(got_exp[0], np.tile(hs[0], (4, 1)))
    np.testing.assert_array_equal(got_exp[1, 1:], 0)


def test_img_conv_group_is_fluids_vgg_block():
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        img = nf.data("img", [-1, 3, 8, 8])
        out = nf.nets.img_conv_group(img, [4, 6, 6], pool_size=2, pool_stride=2,
                                     conv_act="relu", conv_with_batchnorm=[True, False, True],
                                     conv_batchnorm_drop_rate=[0.4, 0.0, 0.0])  # fmt: skip
    types = [op.type for op in main.global_block().ops]
    assert types == [
        "conv2d", "elementwise_add", "batch_norm", "relu", "dropout",
        "conv2d", "elementwise_add", "relu",
        "conv2d", "elementwise_add", "batch_norm", "relu", "pool2d",
    ], types  # fmt: skip
    assert out.shape == (-1, 6, 4, 4)
    (value,), _ = _run(main, startup, {"img": np.ones((2, 3, 8, 8), "float32")}, [out])
    assert value.shape == (2, 6, 4, 4)
    with pytest.raises(AttrError, match="conv_padding has 2 entries but conv_num_filter has 3"):
        nf.nets.img_conv_group(img, [4, 6, 6], 2, conv_padding=[1, 1])
