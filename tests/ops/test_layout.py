"""nestflow/ops/layout.py: the blocked copy into the batch-innermost layout equals the plain
transposed copy, for batches that fill the blocks, leave a remainder, or fit one block, for
images above and below the size where blocks start, and into windows of a padded array."""

import numpy as np
import pytest

from nestflow.ops import layout


@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 17, 64])
@pytest.mark.parametrize("chw", [(16, 8, 8), (6, 12, 12), (1, 1, 1), (3, 5, 7)])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_batch_last_into_equals_transposed_copy(n, chw, dtype):
    x = np.random.default_rng(n).standard_normal((n,) + chw).astype(dtype)
    out = np.full(chw + (n,), np.nan, dtype)
    got = layout.batch_last_into(out, x)
    assert got is out
    np.testing.assert_array_equal(out, x.transpose(1, 2, 3, 0))


@pytest.mark.parametrize("page_aliased_min", [1, 1 << 60])
def test_batch_last_into_a_padded_window(monkeypatch, page_aliased_min):
    """Both paths (blocks and one copy) write only the window, leaving the padding as it was."""
    monkeypatch.setattr(layout, "PAGE_ALIASED_MIN", page_aliased_min)
    x = np.random.default_rng(0).standard_normal((19, 4, 6, 5)).astype("float32")
    padded = np.zeros((4, 9, 8, 19), "float32")
    layout.batch_last_into(padded[:, 2:8, 1:6], x)
    want = np.zeros_like(padded)
    want[:, 2:8, 1:6] = x.transpose(1, 2, 3, 0)
    np.testing.assert_array_equal(padded, want)
