"""nf.layers.sequence_pool / sequence_mask / sequence_reverse as users call them: values against
NumPy, float64 central-difference gradients through a small program, and the errors a user
sees for bad lengths (build time where shapes are known, run time otherwise)."""

from __future__ import annotations

import numpy as np
import pytest

import nestflow as nf
from nestflow.errors import AttrError, DTypeError, ExecutionError, ShapeError
from tests.gradcheck import assert_gradients_match
from tests.ops.test_sequence import pool_ref, reverse_ref

L = nf.layers
N, T, F = 4, 6, 3


def _program(build):
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        x = L.data("x", [-1, T, F], "float64", stop_gradient=False)
        n = L.data("n", [-1], "int64")
        fetch = build(x, n)
    return main, startup, fetch


@pytest.mark.parametrize("pool_type", ["sum", "average", "sqrt", "max", "first", "last", "MAX"])
def test_sequence_pool_values_and_gradients(pool_type):
    rng = np.random.default_rng(1)
    feed = {"x": rng.standard_normal((N, T, F)), "n": np.array([6, 1, 0, 3])}

    def build(x, n):
        pooled = L.sequence_pool(x, pool_type, n, pad_value=0.5)
        w = L.create_parameter([F, 2], "float64", name="w")
        return pooled, L.reduce_sum(L.tanh(L.matmul(pooled, w)))

    main, startup, (pooled, loss) = _program(build)
    nf.append_backward(loss)
    exe, scope = nf.Executor(), nf.Scope()
    exe.run(startup, scope=scope)
    (got,) = exe.run(main, feed=feed, fetch_list=[pooled], scope=scope)
    want = pool_ref(feed["x"], feed["n"], pool_type.upper(), pad_value=0.5)["Out"]
    np.testing.assert_allclose(got, want, rtol=1e-12)
    assert pooled.shape == (-1, F)
    assert_gradients_match(exe, main, scope, feed, loss, ["x", "w"])


def test_sequence_reverse_values_gradients_and_whole_rows():
    rng = np.random.default_rng(2)
    feed = {"x": rng.standard_normal((N, T, F)), "n": np.array([6, 2, 0, 5])}
    up = rng.standard_normal((N, T, F))

    def build(x, n):
        rev = L.sequence_reverse(x, n)
        whole = L.sequence_reverse(x)
        return rev, whole, L.reduce_sum(rev * L.assign(up)) + L.reduce_sum(L.square(whole))

    main, startup, (rev, whole, loss) = _program(build)
    nf.append_backward(loss)
    exe, scope = nf.Executor(), nf.Scope()
    got, got_whole = exe.run(main, feed=feed, fetch_list=[rev, whole], scope=scope)
    np.testing.assert_array_equal(got, reverse_ref(feed["x"], feed["n"])["Y"])
    np.testing.assert_array_equal(got_whole, feed["x"][:, ::-1])
    assert_gradients_match(exe, main, scope, feed, loss, ["x"])


def test_sequence_mask_shapes_dtypes_and_a_masked_sum_equals_sum_pooling():
    rng = np.random.default_rng(3)
    feed = {"x": rng.standard_normal((N, T, F)), "n": np.array([6, 1, 0, 3])}

    def build(x, n):
        width = L.fill_constant([1], "int64", 4)
        masks = [L.sequence_mask(n), L.sequence_mask(n, maxlen=T, dtype="float64"),
                 L.sequence_mask(n, maxlen=width, dtype="bool")]  # fmt: skip
        masked = L.reduce_sum(x * L.unsqueeze(masks[1], [2]), dim=1)
        return masks, masked, L.sequence_pool(x, "sum", n)

    main, _, (masks, masked, pooled) = _program(build)
    assert [m.shape for m in masks] == [(-1, -1), (-1, T), (-1, -1)]
    assert [m.dtype for m in masks] == ["int64", "float64", "bool"]
    got = nf.Executor().run(main, feed=feed, fetch_list=[*masks, masked, pooled])
    steps = np.arange(T)[None, :] < feed["n"][:, None]
    np.testing.assert_array_equal(got[0], steps.astype(np.int64))  # maxlen = max(n) = 6
    np.testing.assert_array_equal(got[1], steps.astype(np.float64))
    np.testing.assert_array_equal(got[2], steps[:, :4])
    np.testing.assert_allclose(got[3], got[4], rtol=1e-12)


def test_build_time_errors_name_the_layer_the_variable_and_the_line():
    main = nf.Program()
    with nf.program_guard(main, nf.Program()):
        x = L.data("x", [4, T, F], "float64")
        with pytest.raises(AttrError, match="pool_type must be one of") as info:
            L.sequence_pool(x, "median")
        assert "test_sequence_layers.py" in str(info.value)
        with pytest.raises(AttrError, match="lengths must be an int32/int64 \\[batch\\] variable"):
            L.sequence_pool(x, "max", np.array([1, 2, 3, 4]))
        with pytest.raises(DTypeError, match=r"lengths 'fl' is float32\[4\]"):
            L.sequence_reverse(x, L.data("fl", [4], "float32"))
        with pytest.raises(ShapeError, match=r"lengths 'n3' \[3\] has 3 lengths but 'x'"):
            L.sequence_pool(x, "sum", L.data("n3", [3], "int64"))
        with pytest.raises(ShapeError, match="a padded sequence batch is"):
            L.sequence_reverse(L.data("flat", [4], "float64"))
        with pytest.raises(DTypeError, match="must be int32 or int64, got float32"):
            L.sequence_mask(L.data("lf", [4], "float32"))
        with pytest.raises(AttrError, match="maxlen must be >= 0"):
            L.sequence_mask(L.data("li", [4], "int64"), maxlen=-2)
        with pytest.raises(AttrError, match="x must be a lengths variable"):
            L.sequence_mask([1, 2])


def test_run_time_errors_for_lengths_known_only_then():
    def build(x, n):
        return L.sequence_pool(x, "last", n)

    main, _, pooled = _program(build)
    exe = nf.Executor()
    x = np.zeros((N, T, F))
    with pytest.raises(ExecutionError, match=r"Length\[2\] = 7 is outside \[0, 6\]") as info:
        exe.run(main, feed={"x": x, "n": np.array([1, 2, 7, 3])}, fetch_list=[pooled])
    assert "sequence_pool" in str(info.value) and "test_sequence_layers.py" in str(info.value)
    with pytest.raises(ExecutionError, match=r"Length has shape \[3\] but X \[4, 6, 3\] has 4"):
        exe.run(main, feed={"x": x, "n": np.array([1, 2, 3])}, fetch_list=[pooled])
