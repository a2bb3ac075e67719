"""Scope._hold: a step scope keeps a finished block's values without a Variable per name, and
still behaves, to everything that asks by name, as if it held those Variables (seeds 000/001:
variables live in and die with their scope)."""

from __future__ import annotations

import sys
import threading

import numpy as np
import pytest

import nestflow as nf
from nestflow.errors import ScopeDestroyedError


def _held_kid(parent: nf.Scope) -> tuple[nf.Scope, list]:
    """A kid holding a = ndarray, n = 7, and no variable for `gone` (its value is None)."""
    kid = parent.new_scope()
    env = [np.arange(3.0), None, 7, "unused"]
    kid._hold({"a": 0, "gone": 1, "n": 2}, env)
    return kid, env


def test_held_values_are_variables_to_lookups_by_name():
    root = nf.Scope()
    kid, env = _held_kid(root)
    grandkid = kid.new_scope()
    var = kid.find_local_var("a")
    assert isinstance(var, nf.Variable) and var.name == "a"
    assert var.get(nf.Tensor).data() is env[0]  # wrapped, not copied
    assert kid.find_var("n").get(int) == 7
    assert grandkid.find_var("a") is var  # reached through the parent chain
    assert kid.var("a") is var  # create-or-get finds it
    assert "gone" not in kid and kid.find_local_var("gone") is None
    assert "unused" not in kid  # only the named slots are held
    assert kid.local_var_names() == ["a", "n"]
    assert kid.find_scope("n") is kid


def test_reading_held_values_makes_no_variables():
    root = nf.Scope()
    root.var("w").set_value(1.5)
    kid, env = _held_kid(root)
    assert kid._local_value("a") is env[0]
    assert kid._local_value("gone", "absent") == "absent"
    assert kid._local_value("w", "absent") == "absent"  # local only
    assert kid._value("n") == 7 and kid._value("w") == 1.5 and kid._value("nope") is None
    assert kid._held is not None and kid._vars == {}  # still held, nothing made
    assert kid.local_var_names() == ["a", "n"]
    assert kid._held is None  # asked by name: now Variables
    assert kid._value("a") is env[0] and kid._local_value("n") == 7


def test_an_empty_variable_hides_the_parents_one_for_value_reads_too():
    root = nf.Scope()
    root.var("x").set_value(1)
    kid = root.new_scope()
    kid.var("x")  # holds nothing
    assert kid.find_var("x").is_initialized() is False
    assert kid._value("x") is None
    assert kid._local_value("x", "absent") is None


def test_holding_into_a_scope_with_variables_sets_them_in_place():
    scope = nf.Scope()
    old = scope.var("a")
    old.set_value(1)
    scope._hold({"a": 0, "b": 1}, [np.zeros(2), 5])
    assert scope.var("a") is old  # the same Variable, as set_value would leave it
    np.testing.assert_array_equal(old.get(nf.Tensor).data(), np.zeros(2))
    assert scope.find_local_var("b").get(int) == 5


def test_variables_of_a_held_scope_die_with_it():
    root = nf.Scope()
    kid, _ = _held_kid(root)
    var = kid.find_var("a")
    root.drop_kids()
    with pytest.raises(ScopeDestroyedError):
        var.get(nf.Tensor)
    with pytest.raises(ScopeDestroyedError):
        kid.find_var("a")
    with pytest.raises(ScopeDestroyedError):
        kid._value("a")


def test_a_held_scope_destroyed_before_any_lookup_is_dead_too():
    root = nf.Scope()
    kid, _ = _held_kid(root)
    root.delete_scope(kid)
    assert not kid.alive and kid._held is None
    with pytest.raises(ScopeDestroyedError):
        kid.local_var_names()


def test_erase_and_rename_work_on_held_values():
    root = nf.Scope()
    kid, _ = _held_kid(root)
    kid.rename("n", "m")
    assert kid.find_local_var("m").get(int) == 7 and kid.find_local_var("n") is None
    var = kid.find_local_var("a")
    kid.erase_vars("a")
    assert kid.find_local_var("a") is None
    with pytest.raises(ScopeDestroyedError):
        var.get(nf.Tensor)


def test_concurrent_lookups_of_held_values_make_one_variable_per_name():
    saved = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for _ in range(20):
            root = nf.Scope()
            kid, _ = _held_kid(root)
            seen: list[nf.Variable] = []
            barrier = threading.Barrier(6)

            def look(kid=kid, seen=seen, barrier=barrier):
                barrier.wait()
                seen.append(kid.find_var("a"))

            threads = [threading.Thread(target=look) for _ in range(6)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert len(seen) == 6 and all(v is seen[0] for v in seen)
    finally:
        sys.setswitchinterval(saved)


def test_tensors_without_a_place_share_the_host_place():
    a, b = nf.Tensor(), nf.Tensor()
    assert isinstance(a.place, nf.CPUPlace) and a.place == b.place
    held = nf.Tensor._holding(np.ones(2))
    assert held.is_allocated() and held.place == nf.CPUPlace()
