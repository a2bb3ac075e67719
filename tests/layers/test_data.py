"""nf.data: feed variables of the global block."""

from __future__ import annotations

import numpy as np
import pytest

import nestflow as nf


def test_declaring_the_same_data_twice_gives_the_same_variable():
    x = nf.data("x", [-1, 3])
    assert nf.data("x", [None, 3], "float32") is x


@pytest.mark.parametrize(
    "shape, dtype", [([-1, 4], "float32"), ([-1, 3], "float64"), ([3], "float32")]
)
def test_redeclaring_data_with_another_shape_or_dtype_is_an_error(shape, dtype):
    nf.data("x", [-1, 3])
    with pytest.raises(nf.errors.ShapeError, match="already has a variable 'x'"):
        nf.data("x", shape, dtype)


def test_data_cannot_take_a_parameters_name():
    nf.layers.create_parameter([3], "float32", name="w")
    with pytest.raises(nf.errors.ShapeError, match="persistable"):
        nf.data("w", [3])


def test_data_made_in_a_sub_block_is_fed_like_any_other():
    x = nf.data("x", [-1, 2])
    blk = nf.BlockOp()
    with blk.block():
        bias = nf.data("bias", [-1, 2])
        blk.output(x + bias)
    (out,) = blk()
    assert nf.default_main_program().global_block().var("bias") is bias
    feed = {"x": np.ones((2, 2), "float32"), "bias": np.full((2, 2), 2.0, "float32")}
    (got,) = nf.Executor().run(feed=feed, fetch_list=[out], scope=nf.Scope())
    np.testing.assert_array_equal(got, np.full((2, 2), 3.0))


def test_append_batch_size_prepends_a_batch_dimension_as_fluid_does():
    with nf.program_guard(nf.Program(), nf.Program()):
        x = nf.data("image", [1, 28, 28], append_batch_size=True)
        y = nf.data("label", [1], "int64", append_batch_size=False)
    assert x.shape == (-1, 1, 28, 28)
    assert y.shape == (1,)


def test_lod_level_other_than_zero_is_refused_with_the_alternative():
    with nf.program_guard(nf.Program(), nf.Program()):
        with pytest.raises(nf.errors.AttrError, match="lengths"):
            nf.data("words", [-1, 1], "int64", lod_level=1)
