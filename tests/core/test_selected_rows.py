"""SelectedRows.merged: each row once, repeats added in the order a dense scatter-add adds them."""

from __future__ import annotations

import numpy as np
import pytest

from nestflow.core import selected_rows
from nestflow.core.selected_rows import SelectedRows


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize(
    "ids",
    [
        np.array([5, 1, 3]),  # no repeats
        np.array([2, 2, 2, 0, 2, 1, 0]),  # short repeats: a level at a time
        np.r_[np.arange(20), np.full(40, 7), np.arange(10)],  # one row past the levels
        np.random.default_rng(0).integers(0, 30, 500),  # many of each
        np.array([4]),
    ],
    ids=["unique", "short", "long", "many", "one"],
)
def test_merged_rows_are_sorted_and_summed_with_the_bits_of_a_scatter_add(ids, dtype):
    rng = np.random.default_rng(1)
    values = rng.standard_normal((ids.shape[0], 3, 4)).astype(dtype)
    merged = SelectedRows(ids, values, 64).merged()
    dense = np.zeros((64, 3, 4), dtype)
    np.add.at(dense, ids, values)
    np.testing.assert_array_equal(merged.rows, np.unique(ids))
    assert merged.values.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(merged.values, dense[np.unique(ids)])
    np.testing.assert_array_equal(merged.to_dense(), dense)


def test_rows_repeated_past_the_levels_are_summed_on_their_own(monkeypatch):
    monkeypatch.setattr(selected_rows, "_MERGE_LEVELS", 1)
    ids = np.array([3, 3, 3, 1, 1, 0])
    values = np.random.default_rng(2).standard_normal((6, 5)).astype("float32")
    dense = np.zeros((4, 5), "float32")
    np.add.at(dense, ids, values)
    merged = SelectedRows(ids, values, 4).merged()
    np.testing.assert_array_equal(merged.values, dense[[0, 1, 3]])
