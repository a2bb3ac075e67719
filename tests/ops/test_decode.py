"""gather_tree (beam search backtracking) against a NumPy reference written per beam."""

from __future__ import annotations

import numpy as np
import pytest

import nestflow as nf
from nestflow.core.place import StandInPlace
from nestflow.errors import DTypeError, ExecutionError, ShapeError
from tests.ops.harness import OpCase, case_id

R = np.random.default_rng(5)


def tree(steps, batch, beam, dtype="int64"):
    return {
        "Ids": R.integers(0, 20, (steps, batch, beam)).astype(dtype),
        "Parents": R.integers(0, beam, (steps, batch, beam)).astype(dtype),
    }


def gather_tree_ref(Ids, Parents):
    """Follow each final beam back one step at a time."""
    steps, batch, beam = Ids.shape
    out = np.zeros_like(Ids)
    for b in range(batch):
        for k in range(beam):
            parent = k
            for t in range(steps - 1, -1, -1):
                out[t, b, k] = Ids[t, b, parent]
                parent = Parents[t, b, parent]
    return {"Out": out}


CASES = [
    OpCase("gather_tree", tree(5, 3, 4), gather_tree_ref, id="gather_tree"),
    OpCase("gather_tree", tree(7, 2, 3, "int32"), gather_tree_ref, id="gather_tree-int32"),
    OpCase("gather_tree", tree(1, 2, 3), gather_tree_ref, id="gather_tree-one_step"),
    OpCase("gather_tree", tree(4, 1, 1), gather_tree_ref, id="gather_tree-one_beam"),
    OpCase("gather_tree", tree(4, 0, 3), gather_tree_ref, id="gather_tree-empty_batch"),
    OpCase("gather_tree", tree(0, 2, 3), gather_tree_ref, id="gather_tree-no_steps"),
]


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_gather_tree(case):
    case.check()


def test_gather_tree_follows_a_known_tree():
    """Fluid's docstring example."""
    ids = np.array([[[2, 2], [6, 1]], [[3, 9], [6, 1]], [[0, 1], [9, 0]]], np.int64)
    parents = np.array([[[0, 0], [1, 1]], [[1, 0], [1, 0]], [[0, 0], [0, 1]]], np.int64)
    want = np.array([[[2, 2], [1, 6]], [[3, 3], [6, 1]], [[0, 1], [9, 0]]], np.int64)
    np.testing.assert_array_equal(gather_tree_ref(ids, parents)["Out"], want)
    L = nf.layers
    out = nf.default_main_program().global_block().create_var("out")
    nf.default_main_program().global_block().append_op(
        "gather_tree",
        {"Ids": [L.data("ids", [-1, -1, 2], "int64")], "Parents": [L.data("p", [-1, -1, 2], "int64")]},
        {"Out": [out]},
    )  # fmt: skip
    (got,) = nf.Executor().run(feed={"ids": ids, "p": parents}, fetch_list=[out])
    np.testing.assert_array_equal(got, want)


def test_bad_inputs_are_errors():
    L = nf.layers
    block = nf.default_main_program().global_block()
    out = block.create_var("out")
    ids = L.data("ids", [4, 2, 3], "int64")

    def append(parents, ids=ids):
        block.append_op("gather_tree", {"Ids": [ids], "Parents": [parents]}, {"Out": [out]})

    with pytest.raises(ShapeError, match=r"must have one shape"):
        append(L.data("p1", [4, 2, 2], "int64"))
    with pytest.raises(DTypeError, match="Parents must be int32 or int64, got float32"):
        append(L.data("p2", [4, 2, 3], "float32"))
    with pytest.raises(DTypeError, match="Ids is int64 but Parents is int32"):
        append(L.data("p3", [4, 2, 3], "int32"))
    with pytest.raises(ShapeError, match=r"\[max_time, batch, beam_size\], got \[4, 6\]"):
        append(L.data("p4", [4, 6], "int64"), ids=L.data("ids2", [4, 6], "int64"))
    append(L.data("p5", [4, 2, 3], "int64"))
    feed = {"ids": np.zeros((4, 2, 3), np.int64), "p5": np.full((4, 2, 3), 3, np.int64)}
    for place in (nf.CPUPlace(), StandInPlace(0)):  # a device wraps bad indices: checked
        with pytest.raises(ExecutionError, match=r"Parents: index 3 at position \[0, 0, 0\]"):
            nf.Executor(place).run(feed=feed, fetch_list=[out])
