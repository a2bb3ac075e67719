"""Feeds are cast to their variable's dtype only when the cast keeps every value (issue 12
item 5): integer overflow and float overflow to inf are a FeedError naming the variable and
the first offending index; rounding, NaN and exact casts stay silent. Also `feed=` as a list
of (name, value) pairs (item 6)."""

from __future__ import annotations

import numpy as np
import pytest

import nestflow as nf
from nestflow.errors import FeedError, NanInfError

L = nf.layers


def _identity(dtype: str, shape=(-1,)) -> tuple[nf.Program, str]:
    """A program whose variable `v` of `dtype` is read by one op (assign) and fetched back."""
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup), nf.unique_name.guard():
        v = L.data("v", list(shape), dtype)
        out = L.assign(v)
    return main, out.name


def _run(dtype: str, value, shape=(-1,), **kwargs):
    main, out = _identity(dtype, shape)
    (got,) = nf.Executor().run(main, feed={"v": value}, fetch_list=[out], **kwargs)
    return got


LOSSY = [
    # (variable dtype, fed array, first offending index, the case)
    ("int64", np.array([1, 2**63 + 1], "uint64"), [1], "uint64 2**63+1 -> int64"),
    ("int32", np.array([5, 7, 2**40 + 5], "int64"), [2], "int64 2**40+5 -> int32"),
    ("float32", np.array([0.5, 1e300], "float64"), [1], "float64 1e300 -> float32 (inf)"),
    ("float32", np.array([[0.0, 1.0], [-1e300, 2.0]]), [1, 0], "-1e300 -> -inf, 2-D index"),
    ("int32", np.array([[1, 2], [3, -(2**31) - 1]], "int64"), [1, 1], "below int32's minimum"),
    ("int8", np.array([100, 200], "uint8"), [1], "uint8 200 -> int8"),
    ("int16", np.array([1, 2, 40000], "int32"), [2], "int32 40000 -> int16"),
    ("float16", np.array([1.0, 7e4], "float32"), [1], "float32 7e4 -> float16 (inf)"),
    ("complex64", np.array([1 + 1j, 1 + 1e300j]), [1], "imaginary part overflows"),
]


@pytest.mark.parametrize("dtype, value, index, case", LOSSY, ids=[case for *_, case in LOSSY])
def test_a_cast_that_changes_a_value_is_a_feed_error(dtype, value, index, case):
    with pytest.raises(FeedError) as info:
        _run(dtype, value, shape=[-1] * value.ndim)
    message = str(info.value)
    assert "feed 'v'" in message
    assert f"index {index}" in message
    assert str(value.dtype) in message and dtype in message


def test_lossy_python_lists_and_scalars_are_refused_too():
    with pytest.raises(FeedError, match=r"feed 'v'.*index \[1\]"):
        _run("int32", [1, 2**40 + 5])
    with pytest.raises(FeedError, match=r"feed 'v'.*index \[\]"):
        _run("float32", 1e300, shape=())


def test_a_lossy_nf_tensor_feed_is_refused():
    tensor = nf.Tensor()
    tensor.set(np.array([3, 2**35], "int64"))
    with pytest.raises(FeedError, match=r"index \[1\]"):
        _run("int32", tensor)


def test_executor_eval_refuses_a_lossy_feed():
    main, out = _identity("int32")
    with pytest.raises(FeedError, match=r"feed 'v'.*index \[0\]"):
        nf.Executor().eval(main, targets=[out], feed={"v": np.array([2**33], "int64")})


EXACT = [
    ("int32", np.array([0, -5, 2**31 - 1, -(2**31)], "int64")),
    ("int64", np.array([0, 2**63 - 1], "uint64")),
    ("int8", np.array([0, 127], "uint8")),
    ("int64", np.array([True, False])),
    ("int16", np.array([-3, 4], "int8")),
    ("float32", np.array([0.1, -2.5, 3.4028234e38, 1e-50])),  # rounding (and underflow) is fine
    ("float32", np.array([np.inf, -np.inf, np.nan])),  # already non-finite: nothing changes
    ("float16", np.array([1.0, 65504.0], "float32")),
    ("complex64", np.array([1 + 2j, -0.5j])),
]


@pytest.mark.parametrize("dtype, value", EXACT, ids=[f"{v.dtype}->{d}" for d, v in EXACT])
def test_casts_that_keep_every_value_are_accepted(dtype, value):
    with np.errstate(all="ignore"):
        got = _run(dtype, value)
        want = value.astype(dtype)
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(got, want)


def test_a_lossy_feed_after_an_accepted_one_of_the_same_dtype_is_still_checked():
    """The executor binds a feed like the last accepted one without checking again: a cast
    feed never takes that path, so new values of the same source dtype are checked each run."""
    main, out = _identity("int32")
    exe, scope = nf.Executor(), nf.Scope()
    small = np.array([1, 2, 3], "int64")
    np.testing.assert_array_equal(exe.run(main, {"v": small}, [out], scope)[0], small)
    with pytest.raises(FeedError, match=r"index \[2\]"):
        exe.run(main, {"v": np.array([1, 2, 2**40], "int64")}, [out], scope)
    np.testing.assert_array_equal(exe.run(main, {"v": small}, [out], scope)[0], small)


def test_a_refused_feed_leaves_the_parameters_unchanged():
    """The issue's consequence: 1e300 fed to float32 became inf and SGD wrote non-finite
    parameters. Now the run stops before any op runs."""
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup), nf.unique_name.guard():
        x = L.data("x", [-1, 2])
        loss = L.mean(L.fc(x, 1, name="fc"))
        nf.optimizer.SGD(0.1).minimize(loss)
    scope, exe = nf.Scope(), nf.Executor()
    exe.run(startup, scope=scope)
    before = scope.find_var("fc.w").get(nf.Tensor).numpy().copy()
    with pytest.raises(FeedError, match="feed 'x'"):
        exe.run(main, feed={"x": np.array([[1.0, 1e300]])}, fetch_list=[loss], scope=scope)
    np.testing.assert_array_equal(scope.find_var("fc.w").get(nf.Tensor).numpy(), before)


def test_nan_is_fed_unless_nan_inf_checking_is_on():
    value = np.array([1.0, np.nan, 2.0])
    got = _run("float32", value)
    assert np.isnan(got[1])
    with pytest.raises(NanInfError, match=r"feed 'v' contains NaN at index \[1\]"):
        _run("float32", value, check_nan_inf=True)
    with pytest.raises(NanInfError, match=r"feed 'v' contains Inf at index \[0\]"):
        _run("float64", np.array([np.inf, 0.0]), check_nan_inf=True)


# feed= as a list of pairs (issue 12 item 6)


def test_feed_may_be_a_list_of_name_value_pairs():
    main, out = _identity("float32")
    xs = np.array([1.0, 2.0], "float32")
    exe = nf.Executor()
    (got,) = exe.run(main, feed=[("v", xs)], fetch_list=[out])
    np.testing.assert_array_equal(got, xs)
    (got,) = exe.run(main, feed=(("v", xs),), fetch_list=[out])
    np.testing.assert_array_equal(got, xs)
    (got,) = exe.eval(main, targets=[out], feed=[("v", xs)])
    np.testing.assert_array_equal(got, xs)


@pytest.mark.parametrize(
    "feed, message",
    [
        ([("v", np.zeros(2, "float32")), ("v", np.ones(2, "float32"))], "'v' is fed twice"),
        ([("v",)], r"item #0 is not a \(name, value\) pair"),
        ([np.zeros(2)], r"item #0 is not a \(name, value\) pair"),
        ("v", "a mapping name -> value or a list of"),
        (np.zeros(2), "a mapping name -> value or a list of"),
        (3, "a mapping name -> value or a list of"),
        ([(3, np.zeros(2))], "feed names are variable names"),
        ({3: np.zeros(2)}, "feed names are variable names"),
    ],
    ids=["twice", "not-a-pair", "array-item", "str", "array", "int", "int-name", "int-key"],
)
def test_a_feed_that_is_not_a_mapping_or_pairs_is_a_feed_error(feed, message):
    main, out = _identity("float32")
    with pytest.raises(FeedError, match=message):
        nf.Executor().run(main, feed=feed, fetch_list=[out])
