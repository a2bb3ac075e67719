"""Issue 30's tensor-math layers (log_softmax, logsumexp, l2_normalize, cos_sim, masked_fill,
greater_equal/less_equal/not_equal, zeros/ones/_like) and Variable operators (** > >= < <=
abs -x): values against NumPy / PyTorch, gradients against central differences."""

from __future__ import annotations

import numpy as np
import pytest

import nestflow as nf
from nestflow.errors import DTypeError, ShapeError

L = nf.layers
R = np.random.default_rng(32)


def run(build, feeds, grads=()):
    """Fetch build(*vars) (and d sum(out)/d var for the vars named in grads)."""
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        vars_ = {}
        for name, value in feeds.items():
            vars_[name] = nf.data(name, list(value.shape), str(value.dtype))
            vars_[name].stop_gradient = name not in grads
        out = build(**vars_)
        fetch = [out]
        if grads:
            fetch += nf.gradients(L.reduce_sum(out), [vars_[g] for g in grads])
    values = nf.Executor().run(main, feed=feeds, fetch_list=fetch)
    return values[0] if not grads else values


def numeric_grad(f, x, eps=1e-6):
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        up, down = x.copy(), x.copy()
        up[i] += eps
        down[i] -= eps
        g[i] = (f(up).sum() - f(down).sum()) / (2 * eps)
    return g


def test_log_softmax_logsumexp_l2_normalize_and_cos_sim_equal_torch():
    torch = pytest.importorskip("torch")
    x, y = R.standard_normal((4, 5)), R.standard_normal((4, 5))
    tx, ty = torch.from_numpy(x), torch.from_numpy(y)
    np.testing.assert_allclose(
        run(lambda x: L.log_softmax(x, axis=0), {"x": x}), torch.log_softmax(tx, 0), atol=1e-12
    )
    np.testing.assert_allclose(
        run(lambda x: L.reduce_logsumexp(x, dim=1), {"x": x}), torch.logsumexp(tx, 1), atol=1e-12
    )
    assert run(lambda x: L.logsumexp(x), {"x": x}).shape == ()
    np.testing.assert_allclose(
        run(lambda x: L.l2_normalize(x, axis=-1), {"x": x}),
        torch.nn.functional.normalize(tx, dim=-1),
        atol=1e-12,
    )
    got = run(lambda x, y: L.cos_sim(x, y), {"x": x, "y": y})
    np.testing.assert_allclose(got[:, 0], torch.cosine_similarity(tx, ty, dim=1), atol=1e-12)
    one = run(lambda x, y: L.cos_sim(x, y), {"x": x, "y": y[:1]})
    np.testing.assert_allclose(one[:, 0], torch.cosine_similarity(tx, ty[:1], dim=1), atol=1e-12)


def test_masked_fill_values_and_gradient():
    x = R.standard_normal((2, 3, 4))
    mask = R.random((3, 1)) < 0.5
    mask[0] = True
    mask[1] = False
    out, dx = run(lambda x, m: L.masked_fill(x, m, -7.5), {"x": x, "m": mask}, grads=("x",))
    np.testing.assert_array_equal(out, np.where(mask, -7.5, x))
    np.testing.assert_array_equal(dx, np.where(mask, 0.0, 1.0) * np.ones_like(x))
    inf = run(lambda x, m: L.masked_fill(x, m, float("-inf")), {"x": x, "m": mask})
    assert np.isneginf(inf[:, 0]).all()


def test_masked_fill_refuses_a_mask_that_is_not_bool_or_does_not_broadcast():
    with nf.program_guard(nf.Program(), nf.Program()):
        x = nf.data("x", [2, 3])
        with pytest.raises(DTypeError, match="masked_fill.*bool"):
            L.masked_fill(x, nf.data("m", [3], "float32"), 0.0)
        with pytest.raises(ShapeError, match=r"masked_fill.*\[4\] does not broadcast"):
            L.masked_fill(x, nf.data("b", [4], "bool"), 0.0)


def test_comparison_layers_and_operators():
    x = np.array([0.0, 1.0, 2.0])
    y = np.array([1.0, 1.0, 1.0])
    feeds = {"x": x, "y": y}
    for layer, want in (
        (L.greater_equal, x >= y),
        (L.less_equal, x <= y),
        (L.not_equal, x != y),
    ):
        np.testing.assert_array_equal(run(lambda x, y: layer(x, y), feeds), want)
        np.testing.assert_array_equal(run(lambda x, y: layer(x, 1.0), feeds), want)
    for op, want in (
        (lambda x, y: x > y, x > y),
        (lambda x, y: x >= y, x >= y),
        (lambda x, y: x < y, x < y),
        (lambda x, y: x <= y, x <= y),
        (lambda x, y: x > 1.0, x > 1.0),
        (lambda x, y: 1.0 < x, 1.0 < x),  # reflected: x.__gt__(1.0)
    ):
        got = run(op, feeds)
        assert got.dtype == np.bool_
        np.testing.assert_array_equal(got, want)
    with nf.program_guard(nf.Program(), nf.Program()):
        a = nf.data("a", [2])
        assert a == a and a != nf.data("b", [2])  # identity, not an op: dict keys stay usable
        assert len({a: 1}) == 1


def test_pow_abs_and_neg_operators_with_gradients():
    x = R.uniform(0.5, 2.0, (2, 3))
    y = R.uniform(-1.0, 1.0, (2, 3))
    for build, f in (
        (lambda x, y: x**3, lambda x: x**3),
        (lambda x, y: x**y, lambda x: x**y),
        (lambda x, y: 2.0**x, lambda x: 2.0**x),
        (lambda x, y: abs(x - 1.0), lambda x: np.abs(x - 1.0)),
        (lambda x, y: -x, lambda x: -x),
    ):
        out, dx = run(build, {"x": x, "y": y}, grads=("x",))
        np.testing.assert_allclose(out, f(x), rtol=1e-12)
        np.testing.assert_allclose(dx, numeric_grad(f, x), rtol=1e-6, atol=1e-8)


def test_zeros_ones_and_likes():
    x = np.ones((3, 2), "float32")
    assert run(lambda x: L.zeros([2, 3], "float32"), {"x": x}).tolist() == [[0.0] * 3] * 2
    ones = run(lambda x: L.ones([2], "int64"), {"x": x})
    assert ones.dtype == np.int64 and ones.tolist() == [1, 1]
    z = run(lambda x: L.zeros_like(x), {"x": x})
    o = run(lambda x: L.ones_like(x), {"x": x})
    assert z.shape == o.shape == (3, 2) and z.dtype == o.dtype == np.float32
    assert (z == 0).all() and (o == 1).all()


def test_l2_normalize_and_cos_sim_gradients_match_central_differences():
    x, y = R.standard_normal((3, 4)), R.standard_normal((3, 4))
    out, dx = run(lambda x: L.l2_normalize(x, axis=1) * 1.0, {"x": x}, grads=("x",))
    f = lambda x: x / np.sqrt((x * x).sum(1, keepdims=True) + 1e-12)  # noqa: E731
    np.testing.assert_allclose(dx, numeric_grad(f, x), rtol=1e-6, atol=1e-8)
    out, dx, dy = run(lambda x, y: L.cos_sim(x, y), {"x": x, "y": y}, grads=("x", "y"))

    def cos(a, b):
        return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)

    np.testing.assert_allclose(dx, numeric_grad(lambda a: cos(a, y), x), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(dy, numeric_grad(lambda b: cos(x, b), y), rtol=1e-6, atol=1e-8)
