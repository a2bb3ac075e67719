"""Collective ops in one process (a world of one rank: each is the identity) through the op
harness, c_allreduce_sum's gradient numerically, the start/wait pair in a program, and their
build-time errors. Their work across ranks is tested on MPI jobs in tests/distributed."""

from __future__ import annotations

import numpy as np
import pytest

import nestflow as nf
from nestflow.core.place import StandInPlace
from nestflow.errors import AttrError, DTypeError, ExecutionError, ShapeError
from nestflow.ops import collective
from tests.ops.harness import OpCase, case_id

# the place the averaging helpers run on when called by hand (the kernels get theirs)
CPU = nf.device_context(nf.CPUPlace())

rng = np.random.default_rng(15)
SHAPES = [(3, 4), (1,), (2, 1, 5), (0, 3)]


def _same(**inputs):
    return {"Out": inputs["X"]}


CASES = [
    *[
        OpCase("c_allreduce_sum", {"X": rng.normal(size=s)}, lambda X, **_: {"Out": X},
               grad=("X",) if 0 not in s else (), id=f"sum{list(s)}")
        for s in SHAPES
    ],
    OpCase("c_allreduce_sum", {"X": np.arange(6, dtype=np.int64).reshape(2, 3)},
           lambda X, **_: {"Out": X}, id="sum-int64"),
    OpCase("c_allreduce_sum", {"X": rng.normal(size=(2, 2)).astype(np.float16)},
           lambda X, **_: {"Out": X}, id="sum-float16"),
    *[
        OpCase(f"c_allreduce_{kind}", {"X": rng.normal(size=(4, 3))}, lambda X, **_: {"Out": X},
               attrs={"use_calc_stream": True}, id=kind)
        for kind in ("max", "min", "prod")
    ],
    OpCase("c_broadcast", {"X": rng.normal(size=(2, 3))}, lambda X, **_: {"Out": X},
           attrs={"root": 0}, id="broadcast"),
    OpCase("c_allgather", {"X": rng.normal(size=(3, 2))}, lambda X, **_: {"Out": X},
           attrs={"nranks": 1}, id="allgather"),
    OpCase("c_sync_calc_stream", {"X": rng.normal(size=(5,))}, lambda X: {"Out": X}),
    OpCase("c_sync_comm_stream", {"X": [rng.normal(size=(2,)), rng.normal(size=(1, 3))]},
           lambda X, **_: {"Out": X}),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_collective_ops_are_the_identity_on_one_rank(case):
    case.check()


def test_the_gradient_of_a_sum_over_ranks_is_the_sum_of_the_gradients():
    """c_allreduce_sum's grad maker emits a c_allreduce_sum of Out@GRAD (every rank's Out
    depends on every rank's X)."""
    x = nf.data("x", [2, 3], "float64")
    x.stop_gradient = False
    block = x.block
    out = block.create_var("out", [2, 3], "float64")
    block.append_op("c_allreduce_sum", {"X": [x]}, {"Out": [out]})
    (grad,) = nf.gradients(nf.layers.reduce_sum(out), [x])
    types = [op.type for op in block.ops]
    assert types.count("c_allreduce_sum") == 2
    (value,) = nf.Executor().run(feed={"x": np.ones((2, 3))}, fetch_list=[grad])
    np.testing.assert_array_equal(value, np.ones((2, 3)))


def _start_wait(grads, weight=None):
    block = grads[0].block
    handle = block.create_var("bucket", type="raw")
    inputs = {"X": grads, "Param": grads}
    if weight is not None:
        inputs["Weight"] = [weight]
    block.append_op("c_allreduce_start", inputs, {"Out": [handle]})
    outs = [block.create_var(f"avg{i}") for i in range(len(grads))]
    block.append_op("c_allreduce_wait", {"Request": [handle], "X": grads}, {"Out": outs})
    return outs


PLACES = [nf.CPUPlace(), StandInPlace(0)]


@pytest.mark.parametrize("place", PLACES, ids=str)
@pytest.mark.parametrize("weighted", [False, True])
def test_start_and_wait_give_back_the_gradients_on_one_rank(weighted, place):
    a = nf.data("a", [-1, 3], "float32")
    b = nf.data("b", [2], "float32")
    w = nf.data("w", [1], "int32") if weighted else None
    outs = _start_wait([a, b], w)
    assert [tuple(o.shape) for o in outs] == [(-1, 3), (2,)]
    assert all(o.dtype == "float32" for o in outs)
    feed = {"a": rng.normal(size=(4, 3)).astype("float32"), "b": np.ones(2, "float32")}
    if weighted:
        feed["w"] = np.array([4], "int32")
    got = nf.Executor(place).run(feed=feed, fetch_list=outs)
    np.testing.assert_array_equal(got[0], feed["a"])
    np.testing.assert_array_equal(got[1], feed["b"])


def test_a_gradient_not_computed_contributes_zeros_of_its_parameters_shape():
    param = np.ones((2, 3))
    pending = collective._start_average([None, np.ones(4)], [param, np.ones(4)], None, CPU)
    out = pending.wait([None, np.ones(4)])
    np.testing.assert_array_equal(out[0], np.zeros((2, 3)))
    np.testing.assert_array_equal(out[1], np.ones(4))
    with pytest.raises(ExecutionError, match="not computed and no Param"):
        collective._start_average([None], [], None, CPU)
    device = nf.device_context(StandInPlace(0))  # on a device: zeros of the device
    pending = collective._start_average([None], [device.to_device(param)], None, device)
    (zeros,) = pending.wait([None])
    assert device.owns(zeros)
    np.testing.assert_array_equal(device.to_host(zeros), np.zeros((2, 3)))


@pytest.mark.parametrize("place", PLACES, ids=str)
def test_the_check_of_layouts_gives_the_digest_on_one_rank(place):
    import hashlib

    block = nf.default_main_program().global_block()
    digest = block.create_var("digest")
    block.append_op("c_check_layout", {}, {"Out": [digest]}, {"layout": "param w float32[2]"})
    assert tuple(digest.shape) == (32,) and digest.dtype == "uint8"
    (got,) = nf.Executor(place).run(fetch_list=[digest])
    assert got.tobytes() == hashlib.sha256(b"param w float32[2]").digest()


def test_a_mismatch_message_names_the_differing_lines_of_each_rank():
    text = collective._mismatch_message(["a 1\nb 2", "a 1\nb 3", "b 2\na 1"], [1, 2], rank=2)
    assert "rank(s) [1, 2] synchronise other variables than rank 0 (this is rank 2)" in text
    assert "rank 0 has: b 2" in text and "rank 1 has: b 3" in text
    assert "rank 2: the same variables in another order" in text


def _var(name, shape, dtype="float32"):
    return nf.default_main_program().global_block().create_var(name, shape, dtype)


@pytest.mark.parametrize(
    "op_type, inputs, attrs, error, match",
    [
        ("c_allreduce_sum", {"X": ["f"]}, {"ring_id": 1}, AttrError, "one communication ring"),
        ("c_allreduce_sum", {"X": ["flag"]}, {}, DTypeError, "X is bool"),
        ("c_broadcast", {"X": ["f"]}, {"root": -1}, AttrError, "root must be a rank"),
        ("c_allgather", {"X": ["scalar"]}, {"nranks": 1}, ShapeError, "X is 0-d"),
        ("c_allgather", {"X": ["f"]}, {"nranks": 0}, AttrError, "nranks must be >= 1"),
        ("c_allgather", {"X": ["f"]}, {}, AttrError, "'nranks' is required"),
        ("c_allreduce_start", {"X": ["f", "d"]}, {}, DTypeError, "mixes dtypes"),
        ("c_allreduce_start", {"X": ["i"]}, {}, DTypeError, "must be floating point"),
        ("c_allreduce_start", {"X": ["f"], "Param": ["f", "f"]}, {}, AttrError, "Param has 2"),
        ("c_allreduce_start", {"X": ["f"], "Param": ["p"]}, {}, ShapeError, r"\[2, 3\] but"),
        ("c_allreduce_start", {"X": ["f"], "Weight": ["f"]}, {}, ShapeError, "one number"),
        ("c_allreduce_start", {"X": ["f"], "Weight": ["flag1"]}, {}, DTypeError, "Weight is"),
        ("c_allreduce_wait", {"Request": ["f"], "X": ["f"]}, {}, DTypeError, "RAW handle"),
    ],
)
def test_bad_collective_ops_fail_at_build_time(op_type, inputs, attrs, error, match):
    _var("f", [2, 3])
    _var("d", [2], "float64")
    _var("i", [2], "int64")
    _var("p", [3, 3])
    _var("flag", [2], "bool")
    _var("flag1", [1], "bool")
    _var("scalar", [])
    block = nf.default_main_program().global_block()
    outputs = {"Out": ["out"]}
    if op_type == "c_allreduce_wait":
        outputs = {"Out": ["f"]}
    with pytest.raises(error, match=match):
        block.append_op(op_type, inputs, outputs, attrs)


def test_a_wait_on_something_else_than_a_start_handle_fails_at_run_time():
    with pytest.raises(ExecutionError, match="not the handle of a c_allreduce_start"):
        collective.c_allreduce_wait.op_def.forward(np.ones(2), [np.ones(2)], 0)


class _TwoRanks:
    """A stand-in world of two ranks for the averaging arithmetic: the other rank's buffer is
    given, and the "all-reduce" adds it to ours."""

    size, rank, initialized = 2, 0, True
    shared = None  # the message path (MPI_Iallreduce), not shared memory

    bucket_buffer = collective.Communicator.bucket_buffer

    def __init__(self, other: np.ndarray):
        self.other = other
        self.sent: list[np.ndarray] = []
        self.buffers, self.pooled_bytes = {}, 0

    def checked(self):
        return self

    def start_allreduce(self, buffer):
        self.sent.append(buffer.copy())
        buffer += self.other
        return "request"

    def wait(self, request):
        assert request == "request"

    def allreduce(self, buffer, kind):
        assert kind == "sum"
        self.sent.append(buffer.copy())
        buffer += self.other


def _average(monkeypatch, X, other, weight=None):
    world = _TwoRanks(np.asarray(other))
    monkeypatch.setattr(collective, "WORLD", world)
    params = [np.zeros_like(x) if x is not None else np.zeros(3) for x in X]
    pending = collective._start_average(X, params, weight, CPU)
    return pending.wait(X), world.sent[0]


def test_the_plain_mean_over_two_ranks(monkeypatch):
    a, b = rng.normal(size=(2, 3)), rng.normal(size=4)
    c, d = rng.normal(size=6), rng.normal(size=4)
    (ga, gb), sent = _average(monkeypatch, [a, b], np.concatenate([c, d]))
    # one buffer, one call; each rank sends its gradients over the number of ranks
    np.testing.assert_array_equal(sent, np.concatenate([a.ravel(), b]) / 2)
    np.testing.assert_allclose(ga, a / 2 + c.reshape(2, 3), rtol=1e-15)
    np.testing.assert_allclose(gb, b / 2 + d, rtol=1e-15)


def test_weighted_by_batch_size_each_rank_counts_as_its_samples(monkeypatch):
    """Rank 0 had 3 samples, rank 1 one: (3 g_0 + 1 g_1) / 4, the mean over the 4 samples."""
    a, c = rng.normal(size=5), rng.normal(size=5)
    (g,), sent = _average(monkeypatch, [a], np.concatenate([c, [1.0]]), np.array([3], np.int32))
    np.testing.assert_array_equal(sent, np.concatenate([3 * a, [3.0]]))
    np.testing.assert_allclose(g, (3 * a + c) / 4, rtol=1e-15)


def test_a_rank_with_an_empty_batch_contributes_nothing(monkeypatch):
    """An empty batch's mean loss has NaN gradients; weighted by 0 samples they are left out;
    when no rank had a sample the average is zero (no step)."""
    nan, c = np.full(3, np.nan), rng.normal(size=3)
    (g,), sent = _average(monkeypatch, [nan], np.concatenate([2 * c, [2.0]]), np.array([0]))
    np.testing.assert_array_equal(sent, np.zeros(4))
    np.testing.assert_allclose(g, c, rtol=1e-15)
    (g,), _ = _average(monkeypatch, [nan], np.zeros(4), np.array([0]))
    np.testing.assert_array_equal(g, np.zeros(3))


def test_float16_gradients_travel_as_float32(monkeypatch):
    a = rng.normal(size=4).astype(np.float16)
    (g,), sent = _average(monkeypatch, [a], np.full(4, 0.5, np.float32))
    assert sent.dtype == np.float32 and g.dtype == np.float16
    np.testing.assert_allclose(g, ((a.astype(np.float32) + 1) / 2).astype(np.float16))


def test_a_missing_gradient_sends_zeros_so_the_ranks_agree(monkeypatch):
    c = rng.normal(size=3)
    (g,), sent = _average(monkeypatch, [None], c / 2)
    np.testing.assert_array_equal(sent, np.zeros(3))
    np.testing.assert_allclose(g, c / 2, rtol=1e-15)


def test_on_a_device_the_ops_stage_through_the_host(monkeypatch):
    """MPI reads host memory: a device's gradients go to the host bucket and the averages come
    back as device arrays, equal to CPUPlace's."""
    device = nf.device_context(StandInPlace(0))
    on = device.to_device
    a, c, weight = rng.normal(size=5), rng.normal(size=5), np.array([3], np.int32)
    other = np.concatenate([c, [1.0]])
    (want,), sent = _average(monkeypatch, [a], other, weight)
    world = _TwoRanks(other)
    monkeypatch.setattr(collective, "WORLD", world)
    (got,) = collective._start_average([on(a)], [on(a)], on(weight), device).wait([on(a)])
    assert device.owns(got)
    np.testing.assert_array_equal(world.sent[0], sent)
    np.testing.assert_array_equal(device.to_host(got), want)
    world.other = c
    summed = collective._all_reduced(on(a), "sum", device)
    assert device.owns(summed)
    np.testing.assert_array_equal(device.to_host(summed), a + c)


def _address(array: np.ndarray) -> int:
    return array.__array_interface__["data"][0]


def test_a_bucket_buffer_is_reused_only_once_nothing_refers_to_it(monkeypatch):
    monkeypatch.setattr(collective, "BUCKET_POOL_BYTES", 4 * 8 * 4)  # four buffers of 8 floats
    world, float32 = collective.Communicator(), np.dtype(np.float32)
    first = world.bucket_buffer(8, float32)
    address, view = _address(first), first[2:5]
    del first
    second = world.bucket_buffer(8, float32)  # a view of the first is alive: a new buffer
    assert _address(second) != address and not np.shares_memory(second, view)
    del view
    assert _address(world.bucket_buffer(8, float32)) == address  # free again: reused
    assert _address(world.bucket_buffer(8, np.dtype(np.float64))) != address  # 64 bytes kept
    held = [world.bucket_buffer(8, float32) for _ in range(6)]
    assert len({_address(b) for b in held}) == len(held)
    # 2 float32 buffers and the float64 one fill the 128 bytes: the rest were not kept
    assert len(world.buffers[(8, float32)]) == 2 and world.pooled_bytes == 128


def test_a_buffer_being_summed_is_not_handed_out_even_if_its_handle_was_dropped():
    """MPI's request holds no Python reference to its buffer: the communicator keeps it with
    the request until the sum is done."""

    class Pending:
        done = False

        def Test(self):
            return self.done

    world, float32 = collective.Communicator(), np.dtype(np.float32)
    first = world.bucket_buffer(8, float32)
    address, request = _address(first), Pending()
    world.inflight.append((request, first))
    del first  # say, the start op's handle lost to an exception before its wait
    assert _address(world.bucket_buffer(8, float32)) != address
    request.done = True
    world.forget_finished()  # what the next start does first
    assert _address(world.bucket_buffer(8, float32)) == address


def test_averaged_gradients_still_held_are_not_overwritten_by_the_next_step(monkeypatch):
    world = _TwoRanks(np.zeros(3))
    monkeypatch.setattr(collective, "WORLD", world)
    a, b = rng.normal(size=3), rng.normal(size=3)
    (held,) = collective._start_average([a], [a], None, CPU).wait([a])
    kept = held.copy()
    (g,) = collective._start_average([b], [b], None, CPU).wait([b])
    np.testing.assert_array_equal(held, kept)
    np.testing.assert_array_equal(g, b / 2)
    address = _address(g)
    del g
    (g,) = collective._start_average([a], [a], None, CPU).wait([a])  # the freed buffer serves again
    assert _address(g) == address
    np.testing.assert_array_equal(g, a / 2)


def test_the_allreduce_choice_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv(collective.ALLREDUCE_ENV, raising=False)
    assert collective.allreduce_choice() == "shared"
    monkeypatch.setenv(collective.ALLREDUCE_ENV, " MPI ")
    assert collective.allreduce_choice() == "mpi"
    monkeypatch.setenv(collective.ALLREDUCE_ENV, "nccl")
    with pytest.raises(AttrError, match="NESTFLOW_ALLREDUCE='nccl': use 'shared' or 'mpi'"):
        collective.allreduce_choice()


class _NodeOfRanks:
    """`size` ranks' shared-memory windows for one bucket, in one process (no MPI): each
    rank's window object sees every rank's send part and one sum array, as the mapped windows
    do. Every number starts as NaN, so a number read before it is written shows."""

    def __init__(self, size: int, numel: int, dtype=np.float64):
        dtype = np.dtype(dtype)
        self.sends = [np.full(numel + 1, np.nan, dtype) for _ in range(size)]
        share = -(-numel // size)
        self.total = np.full(size * share, np.nan, dtype)
        self.windows = []
        for rank in range(size):
            window = object.__new__(collective.BucketWindow)
            window.numel, window.dtype, window.rank, window.slice = numel, dtype, rank, share
            window.low, window.high = collective.share_range(numel, rank, size)
            window.sends, window.send = self.sends, self.sends[rank][:numel]
            window.sums, window.scratch = [self.total], None
            self.windows.append(window)
            self.sends[rank][numel] = 0  # holds no sum array

    def average(self, monkeypatch, X_per_rank, params, weights=None):
        """Start every rank's bucket (packing), then sum every rank's share: the averaged
        numbers, and each rank's send part as packed."""
        pendings = []
        for rank, X in enumerate(X_per_rank):
            window = self.windows[rank]

            class World:
                size, initialized = len(self.windows), True
                shared = type("Node", (), {"acquire": lambda _, numel, dtype: window})()

                def checked(self):
                    return self

                def start_shared(self, window, own):
                    return collective.SharedSum(window, None, own)

            monkeypatch.setattr(collective, "WORLD", World())
            weight = None if weights is None else np.array([weights[rank]])
            pendings.append(collective._start_average(X, params, weight, CPU))
        packed = [send.copy() for send in self.sends]
        for pending in pendings:
            summed, lent = pending.request.window.sum_share(pending.request.own, pending.weighted)
            assert lent and summed.base is not None
        return self.total[: self.windows[0].numel].copy(), packed


@pytest.mark.parametrize("size", [2, 3, 4])
@pytest.mark.parametrize("weighted", [False, True])
def test_the_shared_window_sum_over_ranks(monkeypatch, size, weighted):
    """Each rank packs all but its own share and sums that share from its gradients where
    they are: the sum array holds the (weighted) mean whatever the bucket's size against the
    number of ranks (a bucket of one number over 4 ranks leaves 3 shares empty), with a
    gradient not computed (zeros) and one that is not contiguous."""
    shapes = [(3, 2), (1,), (5,)]
    params = [np.zeros(s) for s in shapes]
    X = [
        [rng.normal(size=(2, 3)).T, None if rank == 1 else rng.normal(size=1),
         rng.normal(size=5)]
        for rank in range(size)
    ]  # fmt: skip
    weights = [rank + 1 for rank in range(size)] if weighted else None
    numel = 12 + weighted
    node = _NodeOfRanks(size, numel)
    summed, packed = node.average(monkeypatch, X, params, weights)
    grads = [
        np.concatenate(
            [np.zeros(s).ravel() if x is None else x.ravel() for x, s in zip(xs, shapes)]
        )
        for xs in X
    ]
    scales = weights or [1 / size] * size
    expected = sum(scale * g for scale, g in zip(scales, grads))
    if weighted:
        expected = np.append(expected / sum(weights), sum(weights))
    np.testing.assert_allclose(summed, expected, rtol=1e-14, atol=1e-15)
    for rank, window in enumerate(node.windows):
        own = slice(window.low, window.high)
        assert np.isnan(packed[rank][own][: 12 - window.low]).all(), "own share packed"
        outside = np.r_[0 : window.low, window.high : 12]
        np.testing.assert_array_equal(packed[rank][outside], (scales[rank] * grads[rank])[outside])
    if size == 2 and not weighted:  # the order of a rank-order reduction, to the bit
        np.testing.assert_array_equal(summed, grads[0] / 2 + grads[1] / 2)


def test_a_bucket_of_one_number_over_more_ranks_than_numbers(monkeypatch):
    node = _NodeOfRanks(3, 1)
    X = [[np.array([float(rank)])] for rank in range(3)]
    summed, _ = node.average(monkeypatch, X, [np.zeros(1)])
    np.testing.assert_allclose(summed, [1.0], rtol=1e-15)
    node = _NodeOfRanks(3, 2)  # one number and the weight: rank 2's share is empty
    summed, _ = node.average(monkeypatch, X, [np.zeros(1)], weights=[0, 2, 2])
    np.testing.assert_allclose(summed, [1.5, 4.0], rtol=1e-15)


def test_the_shared_window_sum_of_float16_gradients_with_a_rank_without_samples(monkeypatch):
    """float16 gradients are scaled and summed in float32 (the wire's dtype), in the packed
    parts and in a rank's own share alike; a rank whose batch was empty (weight 0, NaN
    gradients) adds exact zeros, its own share included (rank 1's here)."""
    x0, x2 = (rng.normal(size=7).astype(np.float16) for _ in range(2))
    X = [[x0], [np.full(7, np.nan, np.float16)], [x2]]
    node = _NodeOfRanks(3, 8, np.float32)
    summed, _ = node.average(monkeypatch, X, [np.zeros(7, np.float16)], weights=[2, 0, 3])
    assert node.windows[1].low < 7 and node.windows[1].high <= 7  # rank 1 sums gradients
    f32 = np.float32
    expected = np.append((2 * x0.astype(f32) + 3 * x2.astype(f32)) / f32(5), 5)
    np.testing.assert_allclose(summed, expected, rtol=1e-6)
