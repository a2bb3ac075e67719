"""The issue-30 layers over the new ops: conv1d equals PyTorch's F.conv1d, dynamic_lstm equals
nn.LSTM (the input projection and gate order mapped to Fluid's), the volume and resizing
layers train end to end, and bad arguments are nf.errors at the user's line."""

from __future__ import annotations

import numpy as np
import pytest

import nestflow as nf

torch = pytest.importorskip("torch")
rng = np.random.default_rng(5)


def _run(main, startup, feed, fetch, params=None):
    exe, scope = nf.Executor(), nf.Scope()
    exe.run(startup, scope=scope)
    for name, value in (params or {}).items():
        scope.find_var(name).get(nf.Tensor).set(np.ascontiguousarray(value))
    return exe.run(main, feed=feed, fetch_list=fetch, scope=scope), scope


def test_conv1d_equals_torch():
    x = rng.standard_normal((2, 4, 9))
    w = rng.standard_normal((6, 2, 1, 3))
    b = rng.standard_normal(6)
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        xv = nf.data("x", [-1, 4, 9], "float64")
        out = nf.layers.conv1d(xv, 6, 3, stride=2, padding=1, dilation=2, groups=2, name="c1")
    (got,), _ = _run(main, startup, {"x": x}, [out], {"c1.w": w, "c1.b": b})
    want = torch.nn.functional.conv1d(
        torch.tensor(x),
        torch.tensor(w[:, :, 0]),
        torch.tensor(b),
        stride=2,
        padding=1,
        dilation=2,
        groups=2,
    ).numpy()
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)


def _fluid_order(m, d):
    """torch's (i, f, g, o) gate blocks along axis 0 -> Fluid's (c, i, f, o)."""
    i, f, g, o = (m[k * d : (k + 1) * d] for k in range(4))
    return np.concatenate([g, i, f, o])


def test_dynamic_lstm_equals_torch_lstm_with_lengths():
    d, feat, steps = 5, 3, 6
    lengths = np.array([6, 3, 1], np.int64)
    x = rng.standard_normal((3, steps, feat))
    lstm = torch.nn.LSTM(feat, d, batch_first=True).double()
    w_ih, w_hh = lstm.weight_ih_l0.detach().numpy(), lstm.weight_hh_l0.detach().numpy()
    b_ih, b_hh = lstm.bias_ih_l0.detach().numpy(), lstm.bias_hh_l0.detach().numpy()
    proj_w = _fluid_order(w_ih, d).T
    proj_b = _fluid_order(b_ih, d)
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        xv = nf.data("x", [-1, steps, feat], "float64")
        n = nf.data("n", [-1], "int64")
        proj = nf.layers.fc(xv, 4 * d, num_flatten_dims=2, name="proj")
        hidden, cell = nf.layers.dynamic_lstm(
            proj, 4 * d, use_peepholes=False, lengths=n, name="rnn"
        )
    params = {"rnn.w": _fluid_order(w_hh, d).T, "rnn.b": _fluid_order(b_hh, d)[None, :]}
    fc_params = [p.name for p in main.global_block().all_parameters() if p.name.startswith("proj")]
    for name in fc_params:
        params[name] = proj_w if len(main.global_block().var(name).shape) == 2 else proj_b
    (h, c), _ = _run(main, startup, {"x": x, "n": lengths}, [hidden, cell], params)
    for row, length in enumerate(lengths):
        out, (_, c_last) = lstm(torch.tensor(x[row : row + 1, :length]))
        np.testing.assert_allclose(h[row, :length], out[0].detach().numpy(), rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(
            c[row, length - 1], c_last[0, 0].detach().numpy(), rtol=1e-10, atol=1e-12
        )
        assert not h[row, length:].any()


def test_volume_and_resize_layers_train():
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        vol = nf.data("vol", [-1, 2, 4, 6, 6])
        img = nf.data("img", [-1, 3, 5, 5])
        seq = nf.data("seq", [-1, 5, 4])
        n = nf.data("n", [-1], "int64")
        v = nf.layers.conv3d(vol, 4, 3, padding=1, act="relu")
        v = nf.layers.group_norm(v, groups=2)
        v = nf.layers.pool3d(v, 2, pool_stride=2, pool_type="avg")
        i = nf.layers.instance_norm(nf.layers.conv2d(img, 8, 3, padding=1))
        i = nf.layers.pixel_shuffle(i, 2)
        i = nf.layers.resize_bilinear(i, out_shape=[4, 4], align_corners=False, align_mode=0)
        i = nf.layers.resize_nearest(i, scale=0.5)
        s = nf.layers.dynamic_gru(nf.layers.fc(seq, 3 * 4, num_flatten_dims=2), 4, lengths=n)
        s = nf.layers.dynamic_lstm(
            nf.layers.fc(s, 16, num_flatten_dims=2), 16, lengths=n, is_reverse=True
        )[0]
        loss = (
            nf.layers.mean(v)
            + nf.layers.mean(nf.layers.square(i))
            + nf.layers.mean(nf.layers.square(s))
        )
        nf.optimizer.SGD(0.1).minimize(loss)
    feed = {
        "vol": rng.standard_normal((2, 2, 4, 6, 6)).astype("float32"),
        "img": rng.standard_normal((2, 3, 5, 5)).astype("float32"),
        "seq": rng.standard_normal((2, 5, 4)).astype("float32"),
        "n": np.array([5, 2], np.int64),
    }
    exe, scope = nf.Executor(), nf.Scope()
    exe.run(startup, scope=scope)
    losses = [float(exe.run(main, feed=feed, fetch_list=[loss], scope=scope)[0]) for _ in range(5)]
    assert np.isfinite(losses).all() and losses[-1] < losses[0]


@pytest.mark.parametrize(
    "build,error",
    [
        (lambda: nf.layers.conv3d(nf.data("x", [-1, 3, 8, 8]), 4, 3), nf.errors.ShapeError),
        (
            lambda: nf.layers.pool3d(nf.data("x", [-1, 3, 4, 4, 4]), 2, pool_type="sum"),
            nf.errors.AttrError,
        ),
        (lambda: nf.layers.group_norm(nf.data("x", [-1, 6, 4, 4]), groups=4), nf.errors.ShapeError),
        (lambda: nf.layers.resize_bilinear(nf.data("x", [-1, 3, 4, 4])), nf.errors.AttrError),
        (lambda: nf.layers.pixel_shuffle(nf.data("x", [-1, 6, 4, 4]), 2), nf.errors.ShapeError),
        (lambda: nf.layers.dynamic_lstm(nf.data("x", [-1, 5, 10]), 10), nf.errors.AttrError),
        (lambda: nf.layers.dynamic_lstm(nf.data("x", [-1, 5, 12]), 8), nf.errors.ShapeError),
        (lambda: nf.layers.dynamic_gru(nf.data("x", [-1, 5, 12]), 5), nf.errors.ShapeError),
        (lambda: nf.layers.conv1d(nf.data("x", [-1, 3, 8, 8]), 4, 3), nf.errors.ShapeError),
    ],
)
def test_bad_arguments_are_nf_errors(build, error):
    with nf.program_guard(nf.Program(), nf.Program()):
        with pytest.raises(error) as info:
            build()
    assert "test_vision_sequence_today.py" in str(info.value)
