"""Feeding a training loop: datasets, batch samplers and a DataLoader with a prefetch thread.

>>> import numpy as np, nestflow as nf
>>> data = nf.io.TensorDataset([np.arange(10.0).reshape(5, 2), np.arange(5)])
>>> loader = nf.io.DataLoader(data, batch_size=2, shuffle=True, seed=7)
>>> [y.tolist() for x, y in loader]  # one epoch: every sample once, in a seeded order
[[2, 0], [4, 1], [3]]

A shuffled order depends only on (seed, epoch), never on the process, so every process and every
rank draws the same permutation; each pass over a loader (each `iter`) is the next epoch.

Departures from Paddle 2.0's paddle.io: the shuffle is NumPy's Generator seeded with (seed,
epoch), not RandomState(epoch), and a sampler moves to the next epoch on every pass (Paddle's
only when shuffling); DistributedBatchSampler pads after shuffling (Paddle shuffles the padded
list) and pads any dataset size, even one smaller than half the replicas; DataLoader has no
worker processes, only its one prefetch thread.
"""

from __future__ import annotations

import math
import queue
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from nestflow.errors import AttrError, DTypeError, ExecutionError, NestflowError, ShapeError

__all__ = [
    "BatchSampler",
    "DataLoader",
    "Dataset",
    "DistributedBatchSampler",
    "TensorDataset",
    "default_collate",
    "pad_sequences",
]


class Dataset:
    """A map-style dataset: `dataset[i]` is sample i (an array, a number, or a tuple/list/dict
    of them) for 0 <= i < len(dataset). Subclass it and define both methods; any object with
    `__getitem__` and `__len__` works as well.

    >>> class Squares(nf.io.Dataset):
    ...     def __len__(self):
    ...         return 4
    ...     def __getitem__(self, i):
    ...         return np.float32(i), np.float32(i * i)
    >>> [batch for batch in nf.io.DataLoader(Squares(), batch_size=2)][1]
    (array([2., 3.], dtype=float32), array([4., 9.], dtype=float32))
    """

    def __getitem__(self, index: int) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must define __getitem__")

    def __len__(self) -> int:
        raise NotImplementedError(f"{type(self).__name__} must define __len__")


class TensorDataset(Dataset):
    """Samples sliced from arrays along their first axis: item i is `(a[i] for a in arrays)`.

    Every array needs the same first dimension (else ShapeError) and at least one axis.

    >>> TensorDataset([np.zeros((3, 2)), np.arange(3)])[1]
    (array([0., 0.]), np.int64(1))
    """

    def __init__(self, arrays: Sequence[Any]):
        if isinstance(arrays, np.ndarray) or not isinstance(arrays, Sequence) or not arrays:
            raise AttrError("TensorDataset takes a non-empty list of arrays")
        self.arrays = [np.asarray(a) for a in arrays]
        shapes = [list(a.shape) for a in self.arrays]
        if any(not s for s in shapes) or len({s[0] for s in shapes}) != 1:
            raise ShapeError(
                f"TensorDataset: every array needs the same first dimension, got shapes {shapes}"
            )

    def __getitem__(self, index: int) -> tuple[Any, ...]:
        return tuple(a[index] for a in self.arrays)

    def __len__(self) -> int:
        return len(self.arrays[0])


def default_collate(batch: Sequence[Any]) -> Any:
    """Samples -> one batch: arrays and numbers are stacked into one array [B, ...] (NumPy's
    dtype rules), tuples/lists field by field (a tuple stays a tuple), dicts key by key, strings
    kept as a list. Fields whose shapes differ across samples are a ShapeError (pad them in a
    collate_fn, e.g. with pad_sequences).

    >>> batch = nf.io.default_collate([(np.zeros(2), 0), (np.ones(2), 1)])
    >>> batch[0].shape, batch[1].tolist()
    ((2, 2), [0, 1])
    """
    return _collate(batch, "sample")


def _collate(batch: Sequence[Any], where: str) -> Any:
    first = batch[0]
    if isinstance(first, (str, bytes)):
        return list(batch)
    if isinstance(first, Mapping):
        return {key: _collate([s[key] for s in batch], f"{where}[{key!r}]") for key in first}
    if isinstance(first, (tuple, list)):
        if any(len(s) != len(first) for s in batch):
            raise ShapeError(
                f"default_collate: {where} has {sorted({len(s) for s in batch})} fields "
                "across the batch; every sample needs the same number"
            )
        fields = [_collate([s[i] for s in batch], f"{where}[{i}]") for i in range(len(first))]
        return tuple(fields) if isinstance(first, tuple) else fields
    if isinstance(first, (np.ndarray, np.generic, int, float, bool, complex)) or hasattr(
        first, "__array__"
    ):
        arrays = [np.asarray(s) for s in batch]
        shapes = {a.shape for a in arrays}
        if len(shapes) != 1:
            odd = next(i for i, a in enumerate(arrays) if a.shape != arrays[0].shape)
            raise ShapeError(
                f"default_collate: {where} has shapes {sorted(map(list, shapes))} across the "
                f"batch (the batch's sample {odd}: {list(arrays[odd].shape)}, sample 0: "
                f"{list(arrays[0].shape)}); pad them in a collate_fn (nf.io.pad_sequences)"
            )
        return np.stack(arrays)
    raise DTypeError(
        f"default_collate: cannot batch {where} of type {type(first).__name__}; pass a "
        "collate_fn to DataLoader"
    )


def pad_sequences(
    seqs: Sequence[Any], pad_value: Any = 0, dtype: Any = None
) -> tuple[np.ndarray, np.ndarray]:
    """Sequences of lengths T_i (each [T_i, ...], same trailing shape) -> `(padded, lengths)`:
    `padded` [N, max T_i, ...] with `pad_value` after each sequence's end (dtype: `dtype`, else
    NumPy's common dtype of the sequences), `lengths` int64 [N]. No sequences give [0, 0].
    Different trailing shapes or a 0-d sequence -> ShapeError.

    >>> padded, lengths = pad_sequences([[1, 2, 3], [4]])
    >>> padded.tolist(), lengths.tolist()
    ([[1, 2, 3], [4, 0, 0]], [3, 1])
    """
    arrays = [np.asarray(s) for s in seqs]
    if any(a.ndim == 0 for a in arrays):
        raise ShapeError("pad_sequences: every sequence needs a time axis; got a 0-d value")
    trailing = {a.shape[1:] for a in arrays}
    if len(trailing) > 1:
        raise ShapeError(
            "pad_sequences: sequences need one shape after the time axis, got "
            f"{sorted(map(list, trailing))}"
        )
    lengths = np.array([len(a) for a in arrays], dtype=np.int64)
    if dtype is None:
        dtype = np.result_type(*arrays) if arrays else np.float64
    shape = (len(arrays), int(lengths.max(initial=0))) + (trailing.pop() if trailing else ())
    padded = np.full(shape, pad_value, dtype=dtype)
    for row, array in enumerate(arrays):
        padded[row, : len(array)] = array
    return padded, lengths


def _int(value: Any, what: str, minimum: int) -> int:
    """`value` as an int >= `minimum` (0 or 1), else AttrError naming `what`."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        kind = "a positive int" if minimum == 1 else "a non-negative int"
        raise AttrError(f"{what} must be {kind}, got {value!r}")
    return int(value)


def _flag(value: Any, what: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise AttrError(f"{what} must be True or False, got {value!r}")
    return bool(value)


def _dataset_length(dataset: Any, what: str) -> int:
    """len(dataset); AttrError naming `what` and the dataset when it is not a map-style dataset
    or its __len__ is not an int >= 0 (len() would raise a bare ValueError or TypeError)."""
    if not (hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")):
        raise AttrError(
            f"{what} needs a map-style dataset (with __getitem__ and __len__), got "
            f"{type(dataset).__name__}"
        )
    length = dataset.__len__()
    if isinstance(length, bool) or not isinstance(length, (int, np.integer)) or length < 0:
        raise AttrError(
            f"{what}: {type(dataset).__name__}.__len__() must return an int >= 0, got {length!r}"
        )
    return int(length)


class BatchSampler:
    """The index lists of one epoch's batches: 0..len(dataset)-1 in order, or with `shuffle`
    in the order of a permutation drawn from (seed, epoch), cut into batches of `batch_size`
    (the last one shorter unless `drop_last`).

    Each `iter()` is one epoch and moves on to the next; `set_epoch(e)` chooses the epoch the
    next `iter()` uses. batch_size < 1 or not an int -> AttrError.

    >>> list(BatchSampler(range(5), batch_size=2))
    [[0, 1], [2, 3], [4]]
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int = 1,
        shuffle: bool = False,
        drop_last: bool = False,
        seed: int = 0,
    ):
        kind = type(self).__name__
        self.dataset = dataset
        self.batch_size = _int(batch_size, f"{kind}: batch_size", 1)
        self.shuffle = _flag(shuffle, f"{kind}: shuffle")
        self.drop_last = _flag(drop_last, f"{kind}: drop_last")
        self.seed = _int(seed, f"{kind}: seed", 0)
        self.epoch = 0
        _dataset_length(dataset, kind)

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next pass uses (its shuffle is drawn from (seed, epoch))."""
        self.epoch = _int(epoch, "set_epoch: epoch", 0)

    def _order(self, size: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(size)
        return np.random.default_rng([self.seed, self.epoch]).permutation(size)

    def _indices(self) -> np.ndarray:
        """This sampler's indices for the current epoch, in the order they are batched."""
        return self._order(len(self.dataset))

    def __iter__(self) -> Iterator[list[int]]:
        # Computed now, not lazily: the epoch moves on when iteration starts, in the caller's
        # thread, whatever thread consumes the batches.
        indices = self._indices().tolist()
        self.epoch += 1
        size = self.batch_size
        stop = len(indices) - len(indices) % size if self.drop_last else len(indices)
        return iter([indices[i : i + size] for i in range(0, stop, size)])

    def _samples(self) -> int:
        return len(self.dataset)

    def __len__(self) -> int:
        samples = self._samples()
        return samples // self.batch_size if self.drop_last else -(-samples // self.batch_size)


class DistributedBatchSampler(BatchSampler):
    """The batches of one rank out of `num_replicas` (Paddle's DistributedBatchSampler).

    The epoch's order (a (seed, epoch) permutation with `shuffle`, so the same on every rank) is
    padded by repeating its start to a multiple of num_replicas, so every rank gets
    ceil(len(dataset) / num_replicas) samples; rank r takes the r-th run of `batch_size` indices
    of each round of num_replicas * batch_size, and an equal share of the last partial round.
    The shards of all ranks are disjoint apart from the padding and cover the dataset.
    num_replicas and rank default to nf.distributed's world size and rank when that module is
    loaded, else 1 and 0. Bad values -> AttrError.

    >>> [list(DistributedBatchSampler(range(5), 2, num_replicas=2, rank=r)) for r in (0, 1)]
    [[[0, 1], [4]], [[2, 3], [0]]]
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int,
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: bool = False,
        drop_last: bool = False,
        seed: int = 0,
    ):
        super().__init__(dataset, batch_size, shuffle, drop_last, seed)
        default_replicas, default_rank = _distributed_defaults()
        self.num_replicas = _int(
            default_replicas if num_replicas is None else num_replicas,
            "DistributedBatchSampler: num_replicas",
            1,
        )
        rank = _int(default_rank if rank is None else rank, "DistributedBatchSampler: rank", 0)
        if rank >= self.num_replicas:
            raise AttrError(
                f"DistributedBatchSampler: rank {rank} is outside 0..{self.num_replicas - 1}"
            )
        self.rank = rank

    def _samples(self) -> int:
        return math.ceil(len(self.dataset) / self.num_replicas)

    def _indices(self) -> np.ndarray:
        replicas, size = self.num_replicas, self.batch_size
        total = self._samples() * replicas
        order = np.resize(self._order(len(self.dataset)), total)  # pads by repeating the start
        if replicas == 1:
            return order
        # Whole rounds: each rank takes its run of `size`; the last round is shared evenly.
        last = total % (size * replicas)
        whole = order[: total - last].reshape(-1, replicas, size)[:, self.rank].reshape(-1)
        share = last // replicas
        tail = order[total - last :][self.rank * share : (self.rank + 1) * share]
        return np.concatenate([whole, tail])


def _distributed_defaults() -> tuple[int, int]:
    """(world size, rank) from nf.distributed when a program has loaded it, else (1, 0)."""
    distributed = sys.modules.get("nestflow.distributed")
    if distributed is None or not hasattr(distributed, "world_size"):
        return 1, 0
    return distributed.world_size(), distributed.rank()


class DataLoader:
    """Batches of a map-style dataset, prepared by a background thread.

    Each `iter()` (each `for batch in loader`) is one epoch: the batch sampler's index lists
    (default: a BatchSampler of `batch_size`, `shuffle`, `drop_last` and `seed`), each turned
    into `collate_fn([dataset[i] for i in indices])` (default: default_collate, stacking each
    field into an array [B, ...]). With `prefetch` > 0 a thread prepares up to `prefetch` batches
    ahead into a bounded queue; 0 prepares them in the caller's thread. An exception raised by
    the dataset or collate_fn is raised again in the loop as an nf.errors error naming the
    sample's index (`MyDataset[7]: ...`) or the batch's indices, the original as its
    __cause__ (an nf.errors error keeps its class, anything else becomes an ExecutionError).
    A dataset whose __len__ is not an int >= 0 is an AttrError.

    Leaving the loop early (break, an exception, Ctrl-C, the iterator dropped) stops the thread
    and waits up to JOIN_TIMEOUT_S for it, so an interrupt returns promptly whatever the
    dataset does: a thread still inside the dataset then (a __getitem__ blocked on I/O, say)
    is abandoned. It is a daemon thread; it starts no further batch and ends once the batch it
    is loading is done, and that batch is discarded. Until then it may still be calling the
    dataset while the next epoch's thread does too.

    `seed`: the shuffle's seed; None draws one from nestflow's global generator (so nf.seed(n)
    fixes it). `batch_sampler`: any iterable of index lists, used instead of batch_size,
    shuffle, drop_last and seed (which must then keep their defaults). Bad arguments (a
    batch_size of 0, a negative prefetch...) -> AttrError.

    >>> loader = DataLoader(TensorDataset([np.arange(6)]), batch_size=4)
    >>> [b.tolist() for (b,) in loader], len(loader)
    ([[0, 1, 2, 3], [4, 5]], 2)
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int = 1,
        shuffle: bool = False,
        drop_last: bool = False,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        seed: int | None = None,
        prefetch: int = 2,
        batch_sampler: Iterable[Sequence[int]] | None = None,
    ):
        _dataset_length(dataset, "DataLoader")
        self.dataset = dataset
        self.prefetch = _int(prefetch, "DataLoader: prefetch", 0)
        if collate_fn is not None and not callable(collate_fn):
            raise AttrError(f"DataLoader: collate_fn must be callable, got {collate_fn!r}")
        self.collate_fn = collate_fn if collate_fn is not None else default_collate
        if batch_sampler is not None:
            if batch_size != 1 or shuffle or drop_last or seed is not None:
                raise AttrError(
                    "DataLoader: batch_sampler replaces batch_size, shuffle, drop_last and seed; "
                    "leave those at their defaults"
                )
            self.batch_sampler = batch_sampler
        else:
            if seed is None and shuffle is True:
                from nestflow.ops.random_state import generator

                seed = int(generator().integers(2**63 - 1))
            self.batch_sampler = BatchSampler(
                dataset, batch_size, shuffle, drop_last, 0 if seed is None else seed
            )

    def __len__(self) -> int:
        """The number of batches in one epoch."""
        return len(self.batch_sampler)

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next pass uses (its shuffle is drawn from (seed, epoch)); passed on to
        the batch sampler."""
        set_epoch = getattr(self.batch_sampler, "set_epoch", None)
        if set_epoch is None:
            raise AttrError(
                f"DataLoader.set_epoch: the batch sampler ({type(self.batch_sampler).__name__}) "
                "has no set_epoch"
            )
        set_epoch(epoch)

    def __iter__(self) -> Iterator[Any]:
        batches = iter(self.batch_sampler)
        dataset, collate = self.dataset, self.collate_fn
        name = type(dataset).__name__

        def load(indices: Sequence[int]) -> Any:
            samples = []
            for i in indices:
                try:
                    samples.append(dataset[i])
                except Exception as exc:
                    raise _naming(exc, f"{name}[{i}]") from exc
            try:
                return collate(samples)
            except Exception as exc:
                raise _naming(exc, f"collating {name}'s samples {list(indices)}") from exc

        if self.prefetch == 0:
            return (load(indices) for indices in batches)
        return _PrefetchIterator(batches, load, self.prefetch)


def _naming(error: Exception, where: str) -> NestflowError:
    """`error`, raised by a dataset or collate_fn, as an nf.errors error whose message starts
    with `where` (the sample's index, the batch's indices): an nf.errors error keeps its
    class, anything else becomes an ExecutionError (the original is its __cause__)."""
    if isinstance(error, NestflowError):
        return type(error)(f"{where}: {error.message}", location=error.location)
    return ExecutionError(f"{where} failed: {type(error).__name__}: {error}")


class _End:
    """Put by the prefetch thread after the last batch."""


class _Failure:
    """Put by the prefetch thread in place of a batch when loading it raised `error`."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException):
        self.error = error


# How often a prefetch thread waiting on a full queue checks whether its consumer stopped.
_PUT_POLL_S = 0.05
# How long closing an iterator waits for its prefetch thread, which may be stuck in a
# dataset's __getitem__ (after that the thread is abandoned, see DataLoader).
JOIN_TIMEOUT_S = 1.0


def _prefetch(batches: Iterator, load: Callable, slots: queue.Queue, stop: threading.Event) -> None:
    """The prefetch thread: loads batches into `slots` until the epoch ends, loading fails, or
    `stop` is set. It never holds a reference to its iterator, so dropping the iterator stops
    it."""

    def put(item: Any) -> bool:
        while not stop.is_set():
            try:
                slots.put(item, timeout=_PUT_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    try:
        for indices in batches:
            if stop.is_set() or not put(load(indices)):
                return
        put(_End)
    except BaseException as error:  # noqa: B036 - anything a dataset raises goes to the loop
        put(_Failure(error))


class _PrefetchIterator:
    """One epoch's batches, loaded `depth` ahead by a thread; `close()` (also on break, error
    or garbage collection) stops it and waits for it, JOIN_TIMEOUT_S at most."""

    def __init__(self, batches: Iterator, load: Callable, depth: int):
        self._slots: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=_prefetch,
            args=(batches, load, self._slots, self._stop),
            name="nestflow-DataLoader",
            daemon=True,  # never keeps the interpreter alive, even if a dataset hangs
        )
        self._thread.start()

    def __iter__(self) -> _PrefetchIterator:
        return self

    def __next__(self) -> Any:
        if self._stop.is_set():
            raise StopIteration
        item = self._slots.get()
        if item is _End:
            self.close()
            raise StopIteration
        if isinstance(item, _Failure):
            self.close()
            raise item.error  # its traceback still runs through the dataset or collate_fn
        return item

    def close(self) -> None:
        """Stop the thread and wait for it, JOIN_TIMEOUT_S at most: it finishes at most the
        batch it is loading, and one still loading after that is left to end on its own (its
        batch discarded), so closing never hangs on a dataset."""
        self._stop.set()
        while True:  # free the queue so a thread blocked on put() sees the stop at once
            try:
                self._slots.get_nowait()
            except queue.Empty:
                break
        if self._thread is not threading.current_thread():
            self._thread.join(JOIN_TIMEOUT_S)

    def __del__(self) -> None:
        if hasattr(self, "_thread"):
            self.close()
