"""nf.io data feeding: Dataset/TensorDataset, DataLoader (batching, seeded shuffle, drop_last,
collate, the prefetch thread and its shutdown), pad_sequences, DistributedBatchSampler."""

from __future__ import annotations

import math
import subprocess
import sys
import threading
import time
import traceback

import numpy as np
import pytest

import nestflow as nf
from nestflow.errors import AttrError, DTypeError, ExecutionError, ShapeError


def _loader_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "nestflow-DataLoader"]


@pytest.fixture(autouse=True)
def no_thread_left_behind():
    assert _loader_threads() == []
    yield
    assert _loader_threads() == []


class Squares(nf.io.Dataset):
    """Sample i: (i as a float32 [2] row, i * i)."""

    def __init__(self, n: int):
        self.n = n

    def __getitem__(self, index):
        return np.array([index, -index], dtype="float32"), index * index

    def __len__(self):
        return self.n


def _epoch_indices(loader) -> list[int]:
    return [int(i) for (_, squares) in loader for i in np.sqrt(squares).round()]


def test_batches_stack_fields_in_order():
    loader = nf.io.DataLoader(Squares(5), batch_size=2)
    batches = list(loader)
    assert len(loader) == len(batches) == 3
    rows, squares = batches[0]
    assert rows.dtype == np.float32 and rows.tolist() == [[0, 0], [1, -1]]
    assert squares.dtype == np.int64 and squares.tolist() == [0, 1]
    assert [b[1].tolist() for b in batches[1:]] == [[4, 9], [16]]


@pytest.mark.parametrize("prefetch", [0, 1, 3])
@pytest.mark.parametrize(("n", "batch_size"), [(1, 1), (10, 3), (12, 4), (7, 10)])
def test_every_sample_once_per_epoch(n, batch_size, prefetch):
    loader = nf.io.DataLoader(Squares(n), batch_size, shuffle=True, seed=3, prefetch=prefetch)
    orders = [_epoch_indices(loader) for _ in range(3)]
    for order in orders:
        assert sorted(order) == list(range(n))
    if n >= 7:
        assert orders[0] != orders[1] != orders[2]  # a new permutation each epoch


@pytest.mark.parametrize(("n", "batch_size"), [(10, 3), (12, 4), (2, 5)])
def test_drop_last_drops_only_the_short_batch(n, batch_size):
    loader = nf.io.DataLoader(Squares(n), batch_size, shuffle=True, seed=1, drop_last=True)
    batches = list(loader)
    assert len(batches) == len(loader) == n // batch_size
    assert all(len(b[1]) == batch_size for b in batches)
    seen = _epoch_indices(loader)
    assert len(set(seen)) == len(seen) == n // batch_size * batch_size


_ORDER_SCRIPT = """
import nestflow as nf
loader = nf.io.DataLoader(nf.io.TensorDataset([list(range(50))]), batch_size=8, shuffle=True,
                          seed=2024)
print([[int(i) for (b,) in loader for i in b] for _ in range(3)])
"""


def test_seeded_shuffle_is_the_same_in_two_processes():
    runs = [
        subprocess.run(
            [sys.executable, "-c", _ORDER_SCRIPT], capture_output=True, text=True, check=True
        ).stdout
        for _ in range(2)
    ]
    assert runs[0] == runs[1]
    loader = nf.io.DataLoader(
        nf.io.TensorDataset([list(range(50))]), batch_size=8, shuffle=True, seed=2024
    )
    here = [[int(i) for (b,) in loader for i in b] for _ in range(3)]
    assert runs[0].strip() == str(here)
    assert here[0] != here[1] and sorted(here[2]) == list(range(50))


def test_set_epoch_replays_an_epoch_and_seed_none_follows_nf_seed():
    loader = nf.io.DataLoader(Squares(20), batch_size=4, shuffle=True, seed=9)
    first, second = _epoch_indices(loader), _epoch_indices(loader)
    loader.set_epoch(1)
    assert _epoch_indices(loader) == second
    loader.set_epoch(0)
    assert _epoch_indices(loader) == first

    def unseeded_orders():
        nf.seed(77)
        a = nf.io.DataLoader(Squares(20), batch_size=4, shuffle=True)
        b = nf.io.DataLoader(Squares(20), batch_size=4, shuffle=True)
        return _epoch_indices(a), _epoch_indices(b)

    orders = unseeded_orders()
    assert orders == unseeded_orders() and orders[0] != orders[1]


def test_collate_fn_exception_surfaces_in_the_loop_with_its_traceback():
    def collate_second_batch_fails(samples):
        if samples[0][1] >= 4:
            raise ValueError(f"cannot collate {len(samples)} samples")
        return nf.io.default_collate(samples)

    loader = nf.io.DataLoader(Squares(6), batch_size=2, collate_fn=collate_second_batch_fails)
    got = []
    with pytest.raises(ExecutionError, match=r"samples \[2, 3\].*cannot collate 2") as info:
        for batch in loader:
            got.append(batch[1].tolist())
    assert got == [[0, 1]]
    assert isinstance(info.value.__cause__, ValueError)  # the collate_fn's own, chained
    text = "".join(traceback.format_exception(info.value))
    assert "in collate_second_batch_fails" in text
    assert 'raise ValueError(f"cannot collate' in text  # the failing line itself


@pytest.mark.parametrize("prefetch", [0, 2])
def test_dataset_exception_surfaces_with_its_traceback(prefetch):
    class Broken(Squares):
        def __getitem__(self, index):
            if index == 3:
                raise KeyError(f"sample {index} is missing")
            return super().__getitem__(index)

    loader = nf.io.DataLoader(Broken(8), batch_size=2, prefetch=prefetch)
    with pytest.raises(ExecutionError, match=r"Broken\[3\] failed: KeyError.*sample 3") as info:
        list(loader)
    assert isinstance(info.value.__cause__, KeyError)  # the dataset's own, chained
    assert "in __getitem__" in "".join(traceback.format_exception(info.value))


class Slow(Squares):
    def __getitem__(self, index):
        time.sleep(0.002)
        return super().__getitem__(index)


def test_break_leaves_no_thread_running():
    loader = nf.io.DataLoader(Slow(400), batch_size=2, prefetch=2)
    for index, _ in enumerate(loader):
        assert len(_loader_threads()) == 1
        if index == 3:
            time.sleep(0.05)  # the thread has filled the queue and waits to put the next one
            break
    assert _loader_threads() == []


def test_an_error_in_the_loop_body_or_a_dropped_iterator_leaves_no_thread():
    loader = nf.io.DataLoader(Slow(400), batch_size=2)
    with pytest.raises(RuntimeError, match="training step failed"):
        for _ in loader:
            raise RuntimeError("training step failed")
    assert _loader_threads() == []
    iterator = iter(loader)
    next(iterator)
    assert len(_loader_threads()) == 1
    del iterator  # garbage: closed without a break or an error
    assert _loader_threads() == []


def test_stopping_waits_only_for_the_batch_being_loaded():
    loader = nf.io.DataLoader(Slow(400), batch_size=50, prefetch=1)
    iterator = iter(loader)
    next(iterator)
    start = time.perf_counter()
    iterator.close()
    assert time.perf_counter() - start < 1.0  # one batch: 50 x 2 ms, not the 7 left
    assert next(iterator, "done") == "done"


def test_default_collate_structures_and_errors():
    collate = nf.io.default_collate
    batch = collate([{"x": np.ones(2), "n": 1, "s": "a"}, {"x": np.zeros(2), "n": 2, "s": "b"}])
    assert batch["x"].shape == (2, 2) and batch["n"].tolist() == [1, 2] and batch["s"] == ["a", "b"]
    assert isinstance(collate([(1, 2.0), (3, 4.0)]), tuple)
    assert isinstance(collate([[1, 2.0], [3, 4.0]]), list)
    with pytest.raises(ShapeError, match=r"sample\[0\] has shapes \[\[2\], \[3\]\]"):
        collate([(np.ones(2), 1), (np.ones(3), 2)])
    with pytest.raises(ShapeError, match="fields"):
        collate([(1, 2), (1,)])
    with pytest.raises(DTypeError, match="collate_fn"):
        collate([object(), object()])


def test_tensor_dataset():
    data = nf.io.TensorDataset([np.arange(6).reshape(3, 2), np.array([7, 8, 9])])
    assert len(data) == 3
    row, label = data[2]
    assert row.tolist() == [4, 5] and label == 9
    with pytest.raises(ShapeError, match=r"same first dimension, got shapes \[\[3\], \[4\]\]"):
        nf.io.TensorDataset([np.zeros(3), np.zeros(4)])
    with pytest.raises(AttrError):
        nf.io.TensorDataset([])


@pytest.mark.parametrize("batch_size", [0, -2, 1.5, True, None])
def test_bad_batch_size_is_an_attr_error(batch_size):
    with pytest.raises(AttrError, match="batch_size must be a positive int"):
        nf.io.DataLoader(Squares(4), batch_size=batch_size)
    with pytest.raises(AttrError, match="batch_size must be a positive int"):
        nf.io.DistributedBatchSampler(Squares(4), batch_size, num_replicas=1, rank=0)


def test_other_bad_loader_arguments():
    with pytest.raises(AttrError, match="prefetch"):
        nf.io.DataLoader(Squares(4), prefetch=-1)
    with pytest.raises(AttrError, match="map-style dataset"):
        nf.io.DataLoader(iter(range(4)))
    with pytest.raises(AttrError, match="shuffle"):
        nf.io.DataLoader(Squares(4), shuffle="yes")
    sampler = nf.io.BatchSampler(Squares(4), batch_size=2)
    with pytest.raises(AttrError, match="batch_sampler replaces"):
        nf.io.DataLoader(Squares(4), batch_size=2, batch_sampler=sampler)
    with pytest.raises(AttrError, match="set_epoch"):
        nf.io.DataLoader(Squares(4), batch_sampler=[[0, 1], [2, 3]]).set_epoch(1)


def test_pad_sequences():
    padded, lengths = nf.io.pad_sequences([[1, 2, 3], [], [4]], pad_value=-1)
    assert padded.tolist() == [[1, 2, 3], [-1, -1, -1], [4, -1, -1]]
    assert lengths.dtype == np.int64 and lengths.tolist() == [3, 0, 1]
    rows = [np.ones((2, 4), "float32"), np.zeros((5, 4), "float32")]
    padded, lengths = nf.io.pad_sequences(rows, dtype="float64")
    assert padded.shape == (2, 5, 4) and padded.dtype == np.float64
    assert padded[0, 2:].sum() == 0 and padded[0, :2].sum() == 8 and lengths.tolist() == [2, 5]
    assert nf.io.pad_sequences(rows)[0].dtype == np.float32
    empty, lengths = nf.io.pad_sequences([])
    assert empty.shape == (0, 0) and lengths.shape == (0,)
    with pytest.raises(ShapeError, match=r"\[\[3\], \[4\]\]"):
        nf.io.pad_sequences([np.ones((2, 3)), np.ones((2, 4))])
    with pytest.raises(ShapeError, match="time axis"):
        nf.io.pad_sequences([np.float32(1.0)])


def test_pad_sequences_as_a_collate_fn():
    sequences = [np.arange(n) for n in (3, 1, 4, 2)]
    loader = nf.io.DataLoader(sequences, batch_size=2, collate_fn=nf.io.pad_sequences)
    (a, la), (b, lb) = loader
    assert a.tolist() == [[0, 1, 2], [0, 0, 0]] and la.tolist() == [3, 1]
    assert b.shape == (2, 4) and lb.tolist() == [4, 2]


def _shards(n, batch_size, replicas, shuffle=False, drop_last=False, epoch=0):
    shards = []
    for rank in range(replicas):
        sampler = nf.io.DistributedBatchSampler(
            list(range(n)), batch_size, replicas, rank, shuffle, drop_last, seed=5
        )
        sampler.set_epoch(epoch)
        batches = list(sampler)
        assert len(batches) == len(sampler)
        assert all(len(b) == batch_size for b in batches[:-1])
        shards.append([i for b in batches for i in b])
    return shards


def test_distributed_shards_follow_paddles_layout():
    assert _shards(10, 2, 3) == [[0, 1, 6, 7], [2, 3, 8, 9], [4, 5, 0, 1]]
    assert _shards(8, 3, 2) == [[0, 1, 2, 6], [3, 4, 5, 7]]
    sampler = nf.io.DistributedBatchSampler(list(range(8)), 3, num_replicas=2, rank=0)
    assert list(sampler) == [[0, 1, 2], [6]]


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize(("n", "batch_size", "replicas"), [(10, 2, 3), (17, 4, 4), (3, 2, 5)])
def test_distributed_shards_are_disjoint_and_cover(n, batch_size, replicas, shuffle):
    for epoch in (0, 1):
        shards = _shards(n, batch_size, replicas, shuffle, epoch=epoch)
        per_rank = math.ceil(n / replicas)
        assert [len(s) for s in shards] == [per_rank] * replicas
        every = [i for s in shards for i in s]
        assert set(every) == set(range(n))
        padding = per_rank * replicas - n
        assert len(every) - len(set(every)) == padding  # only the padding repeats
        # Each rank's padded-in samples are ones another rank already has: without padding
        # duplicates, the shards are disjoint.
        assert sum(len(set(s)) for s in shards) >= n
    if shuffle and n > replicas:
        assert _shards(n, batch_size, replicas, True, epoch=0) != _shards(
            n, batch_size, replicas, True, epoch=1
        )


def test_distributed_drop_last_and_defaults():
    # 5 per rank ([0, 1, 4, 5, 8] and [2, 3, 6, 7, 0]): each drops its short last batch.
    assert _shards(9, 2, 2, drop_last=True) == [[0, 1, 4, 5], [2, 3, 6, 7]]
    sampler = nf.io.DistributedBatchSampler(list(range(5)), 2)
    assert (sampler.num_replicas, sampler.rank) == (1, 0)
    assert list(sampler) == [[0, 1], [2, 3], [4]]
    with pytest.raises(AttrError, match=r"rank 3 is outside 0..2"):
        nf.io.DistributedBatchSampler(list(range(5)), 2, num_replicas=3, rank=3)
    with pytest.raises(AttrError, match="num_replicas"):
        nf.io.DistributedBatchSampler(list(range(5)), 2, num_replicas=0, rank=0)


def test_dataloader_with_a_distributed_batch_sampler():
    seen = []
    for rank in range(2):
        sampler = nf.io.DistributedBatchSampler(Squares(9), 2, 2, rank, shuffle=True, seed=1)
        loader = nf.io.DataLoader(Squares(9), batch_sampler=sampler)
        assert len(loader) == 3
        seen.append(_epoch_indices(loader))
    assert set(seen[0]) | set(seen[1]) == set(range(9))
    assert len(seen[0]) == len(seen[1]) == 5


class Lengthed(Squares):
    """Squares whose __len__ returns whatever it was given."""

    def __init__(self, length):
        super().__init__(4)
        self.length = length

    def __len__(self):
        return self.length


@pytest.mark.parametrize("length", [-1, 7.5, "3", True])
def test_a_len_that_is_no_count_is_an_attr_error_naming_the_dataset(length):
    """Issue 32 item 12: len() would raise a bare ValueError (-1) or TypeError (7.5)."""
    for make in (nf.io.DataLoader, nf.io.BatchSampler):
        with pytest.raises(AttrError, match=r"Lengthed\.__len__\(\) must return an int >= 0"):
            make(Lengthed(length))


def test_a_collate_shape_error_names_the_odd_sample_and_the_batch_indices():
    """Issue 32 item 12: the ShapeError says which sample of which batch has the odd shape."""

    class Ragged(Squares):
        def __getitem__(self, index):
            return np.zeros(3 if index == 5 else 2, "float32")

    with pytest.raises(ShapeError) as info:
        list(nf.io.DataLoader(Ragged(6), batch_size=3))
    message = str(info.value)
    assert "Ragged's samples [3, 4, 5]" in message
    assert "the batch's sample 2: [3], sample 0: [2]" in message
    with pytest.raises(ShapeError, match=r"the batch's sample 1: \[3\]"):
        nf.io.default_collate([np.zeros(2), np.zeros(3)])


def test_a_dataset_nestflow_error_keeps_its_class_and_names_the_index():
    class Strict(Squares):
        def __getitem__(self, index):
            if index == 2:
                raise ShapeError("sample too short")
            return super().__getitem__(index)

    with pytest.raises(ShapeError, match=r"^Strict\[2\]: sample too short$"):
        list(nf.io.DataLoader(Strict(4), batch_size=2, prefetch=0))


class Blocking(Squares):
    """Samples from index `block_at` on wait for `release` (a __getitem__ stuck on I/O)."""

    def __init__(self, n: int, block_at: int):
        super().__init__(n)
        self.block_at = block_at
        self.release = threading.Event()
        self.entered = threading.Event()

    def __getitem__(self, index):
        if index >= self.block_at:
            self.entered.set()
            self.release.wait()
        return super().__getitem__(index)


def test_closing_does_not_wait_for_ever_on_a_blocked_dataset():
    """Issue 32 item 10: leaving the loop while the prefetch thread is stuck in __getitem__
    returns after JOIN_TIMEOUT_S at most; the abandoned thread ends once the dataset returns."""
    data = Blocking(8, block_at=2)
    batches = iter(nf.io.DataLoader(data, batch_size=2))
    next(batches)
    assert data.entered.wait(5)
    start = time.perf_counter()
    batches.close()
    assert time.perf_counter() - start < nf.io.data.JOIN_TIMEOUT_S + 1
    (thread,) = _loader_threads()
    assert thread.daemon
    data.release.set()
    thread.join(5)
    assert not thread.is_alive()
