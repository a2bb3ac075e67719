"""Fluid 1.x's own slicing cases (test_variable.py's _test_slice): shapes at build time and
values at run time."""

from __future__ import annotations

import numpy as np

import nestflow as nf

L = nf.layers


def test_slicing_shapes_follow_fluid():
    block = nf.default_main_program().current_block()
    w = block.create_var("w", dtype="float64", shape=[784, 100, 100])
    for i in range(3):
        assert w[i].shape == (100, 100)
    assert w[:].shape == (784, 100, 100)
    assert w[:, :].shape == (784, 100, 100)
    assert w[:, :, -1].shape == (784, 100)
    assert w[1, 1, 1].shape == (1,)
    assert w[:, :, :-1].shape == (784, 100, 99)


def test_slicing_values_follow_fluid():
    t = np.arange(1, 28, dtype="float32").reshape(3, 3, 3)
    var = L.assign(t)
    cases = {
        "var[0, 1, 1]": (var[0, 1, 1], t[0, 1, 1:2]),
        "var[1:]": (var[1:], t[1:]),
        "var[::-1]": (var[::-1], t[::-1]),
        "var[1, 1:, 1:]": (var[1, 1:, 1:], t[1, 1:, 1:]),
        "reshape[:, :, -1]": (L.reshape(var, [3, -1, 3])[:, :, -1], t.reshape(3, -1, 3)[:, :, -1]),
        "var[:1, :1, :1]": (var[:1, :1, :1], t[:1, :1, :1]),
        "var[::-1, :1, :-1]": (var[::-1, :1, :-1], t[::-1, :1, :-1]),
        "var[:-1, ::-1, -1:]": (var[:-1, ::-1, -1:], t[:-1, ::-1, -1:]),
        "var[2:10, 2:, -2:-1]": (var[2:10, 2:, -2:-1], t[2:10, 2:, -2:-1]),
        "var[1:-1, 0:2, ::-1]": (var[1:-1, 0:2, ::-1], t[1:-1, 0:2, ::-1]),
        "var[::-1, ::-1, ::-1]": (var[::-1, ::-1, ::-1], t[::-1, ::-1, ::-1]),
    }
    got = nf.Executor().run(fetch_list=[v for v, _ in cases.values()])
    for (name, (_, want)), value in zip(cases.items(), got):
        np.testing.assert_array_equal(value, want, err_msg=name)
