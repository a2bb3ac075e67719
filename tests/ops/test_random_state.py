"""Deterministic random ops: nf.seed(n) and Program.random_seed."""

from __future__ import annotations

import numpy as np

import nestflow as nf

L = nf.layers


def _mlp_startup(random_seed: int) -> tuple[nf.Program, nf.Program]:
    main, startup = nf.Program(), nf.Program()
    startup.random_seed = random_seed
    main.random_seed = random_seed
    with nf.program_guard(main, startup), nf.unique_name.guard():
        x = L.data("x", [-1, 4])
        L.fc(L.dropout(L.fc(x, 8, act="tanh", name="a"), 0.5), 2, name="b")
    return main, startup


def _init(startup: nf.Program) -> dict[str, np.ndarray]:
    scope = nf.Scope()
    nf.Executor().run(startup, scope=scope)
    return {n: scope.find_var(n).get(nf.Tensor).numpy() for n in ("a.w", "b.w")}


def test_program_random_seed_makes_initial_parameters_reproducible():
    _, first = _mlp_startup(7)
    nf.seed(123)  # the global generator does not matter to a seeded program
    _, second = _mlp_startup(7)
    one, two = _init(first), _init(second)
    for name in one:
        np.testing.assert_array_equal(one[name], two[name])
    _, other = _mlp_startup(8)
    assert not np.array_equal(_init(other)["a.w"], one["a.w"])


def test_program_random_seed_survives_serialisation():
    _, startup = _mlp_startup(11)
    copy = nf.Program.from_bytes(startup.to_bytes())
    assert copy.random_seed == 11
    one, two = _init(startup), _init(copy)
    np.testing.assert_array_equal(one["a.w"], two["a.w"])


def test_seeded_program_draws_new_dropout_masks_in_a_reproducible_sequence():
    def masks():
        main, startup = _mlp_startup(5)
        scope = nf.Scope()
        exe = nf.Executor()
        exe.run(startup, scope=scope)
        drop = next(op for op in main.global_block().ops if op.type == "dropout")
        mask = drop.output("Mask")[0]
        feed = {"x": np.ones((3, 4), "float32")}
        return [exe.run(main, feed=feed, fetch_list=[mask], scope=scope)[0] for _ in range(3)]

    first, second = masks(), masks()
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(first[0], first[1])


def test_unseeded_program_follows_nf_seed():
    _, startup = _mlp_startup(0)
    nf.seed(3)
    one = _init(startup)
    nf.seed(3)
    two = _init(startup)
    np.testing.assert_array_equal(one["a.w"], two["a.w"])
    nf.seed(4)
    assert not np.array_equal(_init(startup)["a.w"], one["a.w"])
