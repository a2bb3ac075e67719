"""Random state belongs to the run, not the module (issue 12 item 4): programs run on several
threads at once draw exactly the numbers each draws when run alone."""

from __future__ import annotations

import sys
import threading

import numpy as np

import nestflow as nf
from nestflow.ops import random_state

L = nf.layers
RUNS = 60


def _dropout_program(random_seed: int) -> tuple[nf.Program, str]:
    """x -> dropout(0.5) -> fetch the mask; `random_seed` 0 means: draw from nf.seed's."""
    main, startup = nf.Program(), nf.Program()
    main.random_seed = random_seed
    with nf.program_guard(main, startup), nf.unique_name.guard():
        x = L.data("x", [-1, 64])
        L.dropout(x, 0.5)
    drop = next(op for op in main.global_block().ops if op.type == "dropout")
    return main, drop.output("Mask")[0]


FEED = {"x": np.ones((8, 64), "float32")}


def _masks(program: nf.Program, mask: str, global_seed: int | None, start=None) -> list:
    """RUNS masks of `program`, run one after another; with `global_seed`, nf.seed first."""
    if global_seed is not None:
        nf.seed(global_seed)
    if start is not None:
        start.wait(timeout=60)
    exe, scope = nf.Executor(), nf.Scope()
    return [exe.run(program, feed=FEED, fetch_list=[mask], scope=scope)[0] for _ in range(RUNS)]


def _alone(random_seed: int, global_seed: int | None) -> list:
    program, mask = _dropout_program(random_seed)
    return _masks(program, mask, global_seed)


def _concurrently(jobs: list[tuple[int, int | None]]) -> list[list]:
    """Each (random_seed, global_seed) job in its own thread, all started together. The
    interpreter switches threads every 50 us instead of every 5 ms, so the runs interleave
    op by op."""
    start = threading.Barrier(len(jobs))
    results: list = [None] * len(jobs)
    errors: list = []

    # Built here: building programs is not what runs concurrently in this test.
    programs = [_dropout_program(random_seed) for random_seed, _ in jobs]

    def work(i: int, global_seed: int | None) -> None:
        try:
            results[i] = _masks(*programs[i], global_seed, start)
        except BaseException as exc:  # reported below, in the test's thread
            start.abort()
            errors.append(exc)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(5e-5)
    try:
        threads = [threading.Thread(target=work, args=(i, job[1])) for i, job in enumerate(jobs)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)
    assert not errors, errors
    return results


def _assert_same(got: list, want: list) -> None:
    assert len(got) == len(want) == RUNS
    differing = [i for i, (a, b) in enumerate(zip(got, want)) if not np.array_equal(a, b)]
    assert differing == [], f"{len(differing)} of {RUNS} masks differ"


def test_seeded_program_and_nf_seed_program_on_two_threads_reproduce_their_masks():
    """The issue's case: one program with its own random_seed, one drawing from nf.seed's
    generator, run concurrently (3 repetitions): every mask of each equals its run alone."""
    want_seeded = _alone(17, None)
    want_global = _alone(0, 5)
    assert not np.array_equal(want_seeded[0], want_seeded[1])  # new masks each run
    for _ in range(3):
        seeded, drawn = _concurrently([(17, None), (0, 5)])
        _assert_same(seeded, want_seeded)
        _assert_same(drawn, want_global)


def test_two_seeded_programs_on_two_threads_reproduce_their_masks():
    want = {seed: _alone(seed, None) for seed in (3, 4)}
    first, second = _concurrently([(3, None), (4, None)])
    _assert_same(first, want[3])
    _assert_same(second, want[4])


def test_a_seeded_run_leaves_the_nf_seed_stream_where_it_was():
    """A seeded program's draws come from its own generator: the global stream (nf.seed) goes
    on as if the seeded program had not run, also when the seeded run fails half way."""
    plain, plain_mask = _dropout_program(0)
    seeded, seeded_mask = _dropout_program(9)
    nf.seed(1)
    exe, scope = nf.Executor(), nf.Scope()
    want = [exe.run(plain, feed=FEED, fetch_list=[plain_mask], scope=scope)[0] for _ in range(2)]
    nf.seed(1)
    first = exe.run(plain, feed=FEED, fetch_list=[plain_mask], scope=scope)[0]
    exe.run(seeded, feed=FEED, fetch_list=[seeded_mask], scope=scope)
    try:
        exe.run(seeded, feed={"x": np.ones((2, 3), "float32")}, scope=scope)
    except nf.errors.FeedError:
        pass
    second = exe.run(plain, feed=FEED, fetch_list=[plain_mask], scope=scope)[0]
    np.testing.assert_array_equal(first, want[0])
    np.testing.assert_array_equal(second, want[1])
    assert random_state.current_generator() is None  # nothing left set after the runs


def test_a_program_runs_with_its_own_generator_inside_another_programs_run():
    """Runs nest (an op may run another program): the inner run's generator is set for the
    inner run only, and the outer run's is back afterwards."""
    outer_gen = np.random.default_rng(1)
    with random_state.run_generator(outer_gen):
        assert random_state.generator() is outer_gen
        inner, mask = _dropout_program(21)
        nf.Executor().run(inner, feed=FEED, fetch_list=[mask], scope=nf.Scope())
        assert random_state.generator() is outer_gen
    assert random_state.current_generator() is None
