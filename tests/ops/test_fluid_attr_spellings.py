"""Fluid programs and Fluid's op tests spell some attrs differently: dtype attrs as VarType
codes, list attrs as NumPy arrays, cast's in_dtype. They are accepted as Fluid means them."""

from __future__ import annotations

import numpy as np
import pytest

import nestflow as nf
from nestflow.core.dtype import dtype_name
from nestflow.errors import DTypeError


@pytest.mark.parametrize(
    "code, name", [(0, "bool"), (2, "int32"), (3, "int64"), (5, "float32"), (6, "float64")]
)
def test_fluid_var_type_codes_name_their_dtype(code, name):
    assert dtype_name(code) == name


def test_an_unknown_var_type_code_is_a_dtype_error():
    with pytest.raises(DTypeError, match="99 is not a Fluid VarType"):
        dtype_name(99)


def test_cast_takes_fluid_attrs_in_dtype_and_out_dtype_codes():
    program = nf.Program()
    block = program.global_block()
    block.create_var("x", shape=(2, 3), dtype="float32")
    block.append_op("cast", {"X": ["x"]}, {"Out": ["y"]}, {"in_dtype": 5, "out_dtype": 3})
    assert block.var("y").dtype == "int64"
    x = np.full((2, 3), 2.7, np.float32)
    (y,) = nf.Executor().run(program, {"x": x}, ["y"], nf.Scope())
    np.testing.assert_array_equal(y, np.full((2, 3), 2, np.int64))
    again = nf.Program.from_bytes(program.to_bytes())
    assert again.global_block().ops[0].attrs["out_dtype"] == "int64"


def test_a_list_attr_given_as_a_numpy_array_is_a_list():
    program = nf.Program()
    block = program.global_block()
    block.create_var("x", shape=(2, 3), dtype="float32")
    op = block.append_op("pad", {"X": ["x"]}, {"Out": ["y"]}, {"paddings": np.array([0, 1, 1, 0])})
    assert op.attrs["paddings"] == [0, 1, 1, 0]
    assert block.var("y").shape == (3, 4)
