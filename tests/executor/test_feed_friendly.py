"""Friendlier feeds (issue 33, item 3): a Python list is converted with its variable's dtype
(a value the conversion would change is still a FeedError), and an unknown feed name suggests
the program's closest names."""

from __future__ import annotations

import numpy as np
import pytest

import nestflow as nf
from nestflow.errors import FeedError

L = nf.layers


def _identity(dtype: str, shape=(-1,)):
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup), nf.unique_name.guard():
        out = L.assign(L.data("v", list(shape), dtype))
    return main, out


@pytest.mark.parametrize(
    "dtype, value, want",
    [
        ("float32", [1, 2, 3], np.array([1, 2, 3], "float32")),
        ("float64", [[1, 0], [0, 1]], np.eye(2)),
        ("int64", [1.0, -2.0], np.array([1, -2], "int64")),
        ("int32", [True, False], np.array([1, 0], "int32")),
        ("uint8", (0, 255), np.array([0, 255], "uint8")),
        ("bool", [1, 0], np.array([True, False])),
    ],
)
def test_a_python_list_takes_its_variables_dtype(dtype, value, want):
    main, out = _identity(dtype, [-1] * np.ndim(value))
    (got,) = nf.Executor().run(main, feed={"v": value}, fetch_list=[out])
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(
    "dtype, value, index",
    [
        ("int64", [1.0, 1.5], [1]),
        ("float32", [0, 2**24 + 1], [1]),
        ("int64", [float("nan")], [0]),
        ("bool", [0, 2], [1]),
        ("uint8", [3, -1], [1]),
    ],
)
def test_a_list_value_the_conversion_would_change_is_a_feed_error(dtype, value, index):
    main, out = _identity(dtype)
    with pytest.raises(FeedError, match=rf"feed 'v'.*index \{index}"):
        nf.Executor().run(main, feed={"v": value}, fetch_list=[out])


def test_an_array_feed_keeps_its_dtype_rules():
    """Only lists are converted: an int array for a float variable is refused as before."""
    main, out = _identity("float32")
    with pytest.raises(FeedError, match="has dtype int64"):
        nf.Executor().run(main, feed={"v": np.array([1, 2])}, fetch_list=[out])


@pytest.mark.parametrize(
    "name, suggested",
    [("V", "'v'"), ("image", "'images'"), ("lable", "'label'")],
)
def test_an_unknown_feed_name_suggests_the_closest(name, suggested):
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup), nf.unique_name.guard():
        v = L.data("v", [-1, 1])
        images = L.data("images", [-1, 1])
        label = L.data("label", [-1, 1])
        out = v + images + label
    feed = {n: np.ones((1, 1), "float32") for n in ("v", "images", "label")}
    feed[name] = feed.pop({"V": "v", "image": "images", "lable": "label"}[name])
    with pytest.raises(FeedError) as info:
        nf.Executor().run(main, feed=feed, fetch_list=[out])
    message = str(info.value)
    assert f"feed '{name}' is not a variable of the program (did you mean {suggested}" in message


def test_a_name_far_from_every_variable_gets_no_guess():
    main, out = _identity("float32")
    with pytest.raises(FeedError) as info:
        nf.Executor().run(main, feed={"v": [1.0], "zzz": [1.0]}, fetch_list=[out])
    assert "did you mean" not in str(info.value)
