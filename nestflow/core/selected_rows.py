"""SelectedRows: some rows of a [height, ...] tensor, the value a sparse gradient holds (seed 004:
a Variable holds any type, so a variable may hold one instead of a Tensor)."""

from __future__ import annotations

import operator
from typing import Any

import numpy as np

from nestflow.core.device_context import array_module, device_context
from nestflow.core.place import place_of
from nestflow.errors import ShapeError


class SelectedRows:
    """Rows `rows` (int64 [k]) of a tensor of `height` rows, their values `values` ([k, ...]),
    every other row zero: Fluid's SelectedRows. A row may appear more than once (its values
    add up), as in the gradient `embedding(..., is_sparse=True)` gives its table, whose memory is
    k x dim, never the table's. `to_dense()` is the [height, ...] tensor it stands for,
    `merged()` the same rows once each, sorted. The arrays live on one place (NumPy, CuPy or the
    stand-in device); ShapeError for rows that are not one int per value row or lie outside
    [0, height).

    >>> g = nf.SelectedRows([3, 0, 3], np.ones((3, 2)), height=5)
    >>> g.shape, g.rows.tolist(), g.nbytes  # 3 rows of 2 values, not 5
    ((5, 2), [3, 0, 3], 72)
    >>> g.to_dense().tolist()
    [[1.0, 1.0], [0.0, 0.0], [0.0, 0.0], [2.0, 2.0], [0.0, 0.0]]
    >>> m = g.merged()
    >>> m.rows.tolist(), m.values.tolist()
    ([0, 3], [[1.0, 1.0], [2.0, 2.0]])
    """

    __slots__ = ("rows", "values", "height")

    def __init__(self, rows: Any = (), values: Any = None, height: int = 0, *, check=True):
        xp = array_module(rows, values)
        self.rows = xp.asarray(rows, dtype="int64").reshape(-1)
        self.values = xp.zeros((0, 0)) if values is None else xp.asarray(values)
        try:
            self.height = operator.index(height)
        except TypeError:
            raise ShapeError(f"SelectedRows: height must be an int, got {height!r}") from None
        if not check:
            return
        if self.values.ndim < 1 or self.values.shape[0] != self.rows.shape[0]:
            raise ShapeError(
                f"SelectedRows: values {list(self.values.shape)} must have one row per row "
                f"index ({self.rows.shape[0]} rows)"
            )
        if self.rows.size and bool((self.rows.min() < 0) | (self.rows.max() >= self.height)):
            raise ShapeError(
                f"SelectedRows: rows must lie in [0, {self.height}), got "
                f"{self.rows[(self.rows < 0) | (self.rows >= self.height)][:5].tolist()}"
            )

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape of the dense tensor it stands for: (height, *values.shape[1:])."""
        return (self.height, *self.values.shape[1:])

    @property
    def dtype(self):
        return self.values.dtype

    @property
    def nbytes(self) -> int:
        """The memory it holds: its rows and values (never height x dim)."""
        return int(self.rows.nbytes) + int(self.values.nbytes)

    @property
    def place(self):
        return place_of(self.values)

    def merged(self) -> SelectedRows:
        """The same tensor with each row once, in increasing order, repeated rows' values
        added (Fluid's MergeAdd), in the order a dense scatter-add adds them."""
        xp = array_module(self.values)
        if xp is np and self.rows.shape[0]:
            order = np.argsort(self.rows, kind="stable")
            rows = self.rows[order]
            first = np.concatenate(([True], rows[1:] != rows[:-1]))
            values = _sums_in_order(self.values, order, first)
            return SelectedRows(rows[first], values, self.height, check=False)
        rows, inverse = xp.unique(self.rows, return_inverse=True)
        if rows.shape[0] == self.rows.shape[0]:  # no repeats: reorder only
            out = xp.empty((rows.shape[0], *self.values.shape[1:]), self.values.dtype)
            out[inverse.reshape(-1)] = self.values
        else:
            out = xp.zeros((rows.shape[0], *self.values.shape[1:]), self.values.dtype)
            device_context(place_of(self.values)).scatter_add(out, inverse.reshape(-1), self.values)
        return SelectedRows(rows, out, self.height, check=False)

    def to_dense(self):
        """The [height, ...] array it stands for (rows that appear more than once add up)."""
        xp = array_module(self.values)
        out = xp.zeros(self.shape, self.values.dtype)
        device_context(place_of(self.values)).scatter_add(out, self.rows, self.values)
        return out

    def numpy(self):
        """to_dense() as a host NumPy array."""
        return place_of(self.values).to_host(self.to_dense())

    def __repr__(self) -> str:
        return (
            f"SelectedRows(rows={self.rows.shape[0]}, height={self.height}, "
            f"values={list(self.values.shape)} {self.values.dtype})"
        )


# Repeats of a row up to this many are added a repeat at a time over all rows at once; a row
# repeated more often is summed on its own.
_MERGE_LEVELS = 8


def _sums_in_order(values: np.ndarray, order: np.ndarray, first: np.ndarray) -> np.ndarray:
    """The sums of values' rows taken in `order`, a new segment wherever `first` is True,
    each segment added row by row in order: the bits of np.add.at, which a dense scatter-add
    runs (np.add.reduceat's differ on segments of three rows or more). np.add.at itself is
    slow (W16's 3,072 x 64 gradient: 1.3 ms); here the segments' first rows are gathered,
    then the second rows of all segments added at once, the third, and so on; a segment
    longer than _MERGE_LEVELS + 1 rows is added by np.add.reduce (row by row in order too).
    W16's tables: 0.53 -> 0.08 ms and 0.09 -> 0.02 ms against reduceat (the 2-vCPU EPYC)."""
    starts = np.flatnonzero(first)
    out = np.take(values, order[starts], axis=0)
    if starts.shape[0] == order.shape[0]:
        return out
    lengths = np.diff(np.append(starts, order.shape[0]))
    segment = np.cumsum(first) - 1
    rank = np.arange(order.shape[0]) - starts[segment]
    short = lengths[segment] <= _MERGE_LEVELS + 1
    for level in range(1, min(int(rank.max()), _MERGE_LEVELS) + 1):
        at = np.flatnonzero((rank == level) & short)
        if at.shape[0]:
            out[segment[at]] += np.take(values, order[at], axis=0)
    for long in np.flatnonzero(lengths > _MERGE_LEVELS + 1):
        block = order[starts[long] : starts[long] + lengths[long]]
        out[long] = np.add.reduce(np.take(values, block, axis=0), axis=0)
    return out
