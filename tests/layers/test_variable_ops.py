"""`+ - * / @` and unary minus on build-time variables (issue 2 item 6), with numbers on either
side, against NumPy; gradients flow through them."""

from __future__ import annotations

import numpy as np
import pytest

import nestflow as nf

L = nf.layers


def _run(fetch, feed):
    scope = nf.Scope()
    exe = nf.Executor()
    exe.run(nf.default_startup_program(), scope=scope)
    return exe.run(feed=feed, fetch_list=fetch, scope=scope)


EXPRESSIONS = {
    "x+y": (lambda x, y: x + y),
    "x-y": (lambda x, y: x - y),
    "x*y": (lambda x, y: x * y),
    "x/y": (lambda x, y: x / y),
    "x+2": (lambda x, y: x + 2),
    "2+x": (lambda x, y: 2 + x),
    "x-2.5": (lambda x, y: x - 2.5),
    "3-x": (lambda x, y: 3 - x),
    "x*-1.5": (lambda x, y: x * -1.5),
    "4*x": (lambda x, y: 4 * x),
    "x/4": (lambda x, y: x / 4),
    "2/x": (lambda x, y: 2 / x),
    "-x": (lambda x, y: -x),
}


@pytest.mark.parametrize("expr", list(EXPRESSIONS))
def test_operator_matches_numpy(expr, rng):
    f = EXPRESSIONS[expr]
    x = L.data("x", [-1, 3], "float64")
    y = L.data("y", [-1, 3], "float64")
    out = f(x, y)
    assert out.dtype == "float64" and tuple(out.shape) == (-1, 3)
    xs, ys = rng.uniform(0.5, 2, size=(4, 3)), rng.uniform(0.5, 2, size=(4, 3))
    (got,) = _run([out], {"x": xs, "y": ys})
    np.testing.assert_allclose(got, f(xs, ys), rtol=1e-12)


def test_matmul_operator(rng):
    x = L.data("x", [-1, 3], "float64")
    w = L.data("w", [3, 2], "float64")
    xs, ws = rng.normal(size=(4, 3)), rng.normal(size=(3, 2))
    (got,) = _run([x @ w], {"x": xs, "w": ws})
    np.testing.assert_allclose(got, xs @ ws, rtol=1e-12)


def test_division_by_a_zero_number_is_inf_like_numpy_not_a_python_error():
    """x / 0 builds (a ZeroDivisionError at build time would be a bare Python error) and
    gives NumPy's inf/nan at run time, which check_nan_inf reports."""
    x = L.data("x", [-1], "float64")
    out = x / 0
    xs = np.array([1.0, -2.0, 0.0])
    with np.errstate(all="ignore"):
        (got,) = _run([out], {"x": xs})
        np.testing.assert_array_equal(got, xs / 0.0)
        with pytest.raises(nf.errors.NanInfError):
            nf.Executor().run(feed={"x": xs}, fetch_list=[out], check_nan_inf=True)


def test_integer_variables_keep_their_dtype_and_divide_truncating():
    """An int64 variable stays int64 under every operator, as the ops infer; division
    truncates toward zero whichever side the number is on."""
    i = L.data("i", [-1], "int64")
    outs = [i + 1, 10 - i, i * 3, i / 2, 7 / i, i / i]
    assert [o.dtype for o in outs] == ["int64"] * 6
    iv = np.array([1, -3, 4, 5])
    got = _run(outs, {"i": iv})
    for value in got:
        assert value.dtype == np.int64
    want = [iv + 1, 10 - iv, iv * 3, np.trunc(iv / 2), np.trunc(7 / iv), np.ones(4)]
    for value, ref in zip(got, want):
        np.testing.assert_array_equal(value, ref.astype(np.int64))


def test_gradients_flow_through_the_operators(rng):
    """loss = mean(2 / w + 3 - w * x): d/dw = mean over rows of (-2 / w^2 - x)."""
    x = L.data("x", [-1, 3], "float64")
    w = L.create_parameter([3], "float64", name="w", initializer=nf.initializer.Uniform(1.0, 2.0))
    loss = L.mean(2 / w + 3 - w * x)
    nf.append_backward(loss)
    scope = nf.Scope()
    exe = nf.Executor()
    exe.run(nf.default_startup_program(), scope=scope)
    xs = rng.normal(size=(5, 3))
    (grad,) = exe.run(feed={"x": xs}, fetch_list=["w@GRAD"], scope=scope)
    wv = scope.find_var("w").get(nf.Tensor).numpy()
    np.testing.assert_allclose(grad, (-2 / wv**2 - xs.mean(axis=0)) / 3, rtol=1e-10)
