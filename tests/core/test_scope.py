"""Scope: every statement seeds 000, 001 and 002 make about scopes, plus the design contract's core runtime."""

from __future__ import annotations

import gc
import sys
import threading
import weakref

import numpy as np
import pytest

import nestflow as nf
from nestflow.core.scope import live_scope_count
from nestflow.errors import NestflowError, ScopeDestroyedError


@pytest.fixture
def scope() -> nf.Scope:
    return nf.Scope()


# ---- a scope is a map from names to variables ----


def test_var_creates_then_gets_the_same_variable(scope):
    """seed 000: Var is "used to create a Variable by its name and add the mapping relation";
    it returns the existing variable if the scope already contains that name (create-or-get)."""
    v = scope.var("w")
    assert isinstance(v, nf.Variable)
    assert v.name == "w"
    assert scope.var("w") is v
    assert scope.local_var_names() == ["w"]


def test_find_var_gets_a_variable_by_name(scope):
    """seed 000: Get (FindVar) "is used to find a Variable by name"."""
    v = scope.var("w")
    assert scope.find_var("w") is v
    assert scope.find_local_var("w") is v
    assert "w" in scope


def test_find_var_returns_none_when_absent(scope):
    """seed 000/001: FindVar "will return nullptr when name is not found. It can be used as
    Contains method"."""
    assert scope.find_var("nope") is None
    assert scope.find_local_var("nope") is None
    assert "nope" not in scope
    # Looking up must not create anything.
    assert scope.local_var_names() == []


def test_var_with_no_name_creates_fresh_unique_variables(scope):
    """seed 002 (SymbolTable.Var(name="")): a name is generated when none is given."""
    a, b = scope.var(), scope.var()
    assert a is not b and a.name != b.name
    assert set(scope.local_var_names()) == {a.name, b.name}


def test_only_a_scope_can_create_a_variable():
    """seed 000: "Variable can only be created by Scope ... we should mark Variable's
    constructor as a private member function" (seed 001: same)."""
    with pytest.raises(TypeError, match="only be created by a Scope"):
        nf.Variable()
    with pytest.raises(TypeError, match="only be created by a Scope"):
        nf.Variable("w")


def test_scope_holds_no_operators_and_no_run_logic(scope):
    """seed 000/001: "Scope only contains methods that are used to Create and Get Variables.
    Scope do not contain Operators and have no information to run them"."""
    public = {n for n in dir(scope) if not n.startswith("_")}
    assert not {n for n in public if "op" in n.split("_") or n in ("run", "ops", "net")}
    assert {"var", "find_var", "find_local_var", "erase_vars", "new_scope"} <= public


def test_every_variable_belongs_to_one_scope(scope):
    """seed 000/001: "Every variable only belongs to one certain Scope. Variable can not belong
    to many scopes. If you want to use variables from parent scope, you can use parent scope"."""
    kid = scope.new_scope()
    outer = scope.var("w")
    inner = kid.var("w")  # var() is local: it makes the kid its own 'w', never shares outer's
    assert inner is not outer
    assert kid.find_local_var("w") is inner
    assert scope.find_local_var("w") is outer
    assert kid.find_scope("w") is kid
    kid.erase_vars(["w"])
    assert kid.find_var("w") is outer  # the parent's variable is reached through the parent
    assert kid.find_scope("w") is scope
    assert kid.local_var_names() == []


# ---- parent scope and local scope ----


def test_new_scope_is_a_kid_whose_parent_is_this_scope(scope):
    """seed 000: a local scope has a parent_; "the scope is a global scope when parent_ is
    nullptr"."""
    kid = scope.new_scope()
    grandkid = kid.new_scope()
    assert scope.parent is None
    assert kid.parent is scope
    assert grandkid.parent is kid
    assert scope.kids == [kid]
    assert kid.kids == [grandkid]


def test_find_var_searches_parents_recursively(scope):
    """seed 000/001: "it will try to search this variable in current scope. If there is no such
    variable in the local scope, scope will keep searching from its parent, until the variable
    is found or there is no parent"."""
    w = scope.var("w")
    kid = scope.new_scope()
    b = kid.var("b")
    grandkid = kid.new_scope()
    assert grandkid.find_var("w") is w
    assert grandkid.find_var("b") is b
    assert grandkid.find_var("missing") is None
    assert scope.find_var("b") is None  # never searches downwards


def test_find_local_var_does_not_search_parents(scope):
    """DESIGN Core runtime: find_local_var looks in this scope only."""
    scope.var("w")
    kid = scope.new_scope()
    assert kid.find_local_var("w") is None
    assert kid.find_var("w") is scope.find_var("w")


def test_local_variable_shadows_the_parents(scope):
    """seed 000: "in another scope, this name may refer to other entity"."""
    scope.var("x").set_value(1)
    kid = scope.new_scope()
    kid.var("x").set_value(2)
    assert kid.find_var("x").get(int) == 2
    assert scope.find_var("x").get(int) == 1


def test_constructing_with_a_parent_makes_a_kid_of_it(scope):
    """seed 000: local scopes are only made through their parent (Create(parent)); so a scope
    built with a parent is owned, and destroyed, by that parent like new_scope()'s kids."""
    kid = nf.Scope(scope)
    assert kid.parent is scope
    assert scope.kids == [kid]
    scope.drop_kids()
    assert not kid.alive


def test_a_kid_keeps_its_parent_alive():
    """seed 000: "when a local scope is using, its parents cannot be destroyed"."""
    parent = nf.Scope()
    w = parent.var("w")
    w.set_value(7)
    kid = parent.new_scope()
    ref = weakref.ref(parent)
    del parent, w
    gc.collect()
    assert ref() is not None
    assert kid.parent is ref()
    assert kid.find_var("w").get(int) == 7


# ---- destruction ----


def test_drop_kids_destroys_kids_and_their_variables(scope):
    """seed 000: "When that local scope is destroyed, all local variables should also be
    destroyed"; seed 002: "After the processing of a minibatch, PaddlePaddle destroys the scope
    hierarchy"."""
    keep = scope.var("param")
    keep.set_value(1)
    kid = scope.new_scope()
    grandkid = kid.new_scope()
    tmp = kid.var("tmp")
    tmp.set_value([1, 2, 3])
    deep = grandkid.var("deep")
    scope.drop_kids()
    assert scope.kids == []
    assert not kid.alive and not grandkid.alive
    assert keep.get(int) == 1  # the parent's own variables survive
    for stale in (tmp, deep):
        with pytest.raises(ScopeDestroyedError, match="after its scope was destroyed"):
            stale.get(list)
        with pytest.raises(ScopeDestroyedError):
            stale.set_value(0)
        with pytest.raises(ScopeDestroyedError):
            stale.get_mutable(nf.Tensor)
        with pytest.raises(ScopeDestroyedError):
            _ = stale.name


def test_stale_scope_reference_raises_instead_of_reading_stale_data(scope):
    """seed 001: "When scope is destroyed, all VariablePtrs belong to this Scope will be changed
    to nullptr" — a kept Scope or Variable reference raises ScopeDestroyedError on use."""
    kid = scope.new_scope()
    kid.var("x").set_value(1)
    scope.drop_kids()
    for use in (
        lambda: kid.var("x"),
        lambda: kid.find_var("x"),
        lambda: kid.find_local_var("x"),
        lambda: kid.new_scope(),
        lambda: kid.local_var_names(),
        lambda: kid.kids,
        lambda: kid.parent,
        lambda: kid.erase_vars(["x"]),
        lambda: kid.rename("x", "y"),
        lambda: kid.drop_kids(),
    ):
        with pytest.raises(ScopeDestroyedError, match="destroyed"):
            use()
    assert "destroyed" in repr(kid)


def test_destroyed_scope_error_is_a_nestflow_error(scope):
    """DESIGN Errors: every raised error derives from nf.errors.NestflowError."""
    kid = scope.new_scope()
    scope.drop_kids()
    with pytest.raises(NestflowError):
        kid.var("x")


def test_delete_scope_destroys_one_kid(scope):
    """seed 000: destroying one local scope destroys its variables; siblings are untouched."""
    a, b = scope.new_scope(), scope.new_scope()
    va, vb = a.var("x"), b.var("x")
    scope.delete_scope(a)
    assert scope.kids == [b]
    with pytest.raises(ScopeDestroyedError):
        va.get(int)
    vb.set_value(3)
    assert vb.get(int) == 3
    with pytest.raises(NestflowError, match="not a kid"):
        scope.delete_scope(nf.Scope())


def test_root_scope_destroys_its_variables_when_collected():
    """seed 000: "Scope should destruct all Variables inside it when itself is destructed"."""
    gc.collect()  # scopes left unreferenced by earlier tests must not disturb the count
    before = live_scope_count()
    root = nf.Scope()
    var_ref = weakref.ref(root.var("w"))
    kid_ref = weakref.ref(root.new_scope())
    assert live_scope_count() == before + 2
    del root
    gc.collect()
    assert var_ref() is None
    assert kid_ref() is None
    assert live_scope_count() == before


def test_live_scope_count_drops_after_drop_kids(scope):
    """seed 002: the scope hierarchy made for a minibatch is destroyed when it completes, so
    nothing leaks."""
    gc.collect()
    before = live_scope_count()
    for _ in range(5):
        kid = scope.new_scope()
        kid.new_scope()
    assert live_scope_count() == before + 10
    scope.drop_kids()
    assert live_scope_count() == before


# ---- delete / rename / listing ----


def test_erase_vars_deletes_local_variables(scope):
    """seed 001: Scope has Create/Get/Delete (DeleteVariable); a deleted variable is gone and
    a kept reference to it is invalid."""
    a, _ = scope.var("a"), scope.var("b")
    scope.erase_vars(["a", "not_there"])  # absent names are ignored
    assert scope.find_var("a") is None
    assert scope.local_var_names() == ["b"]
    with pytest.raises(ScopeDestroyedError):
        a.get(int)
    assert scope.var("a") is not a  # a new variable of that name can be made


def test_erase_vars_takes_a_single_name_too(scope):
    """seed 001: DeleteVariable(name) — a bare string is one name, not a list of characters."""
    scope.var("w")
    scope.var("wx")
    scope.erase_vars("wx")
    assert scope.local_var_names() == ["w"]


def test_erase_vars_does_not_touch_parents(scope):
    """seed 001: DeleteVariable acts on the scope's own variables."""
    w = scope.var("w")
    kid = scope.new_scope()
    kid.erase_vars(["w"])
    assert scope.find_var("w") is w


def test_rename_keeps_the_variable_and_its_value(scope):
    """DESIGN Core runtime: scope.rename("a", "b") moves the same Variable to a new name."""
    a = scope.var("a")
    a.set_value(5)
    scope.var("c")
    scope.rename("a", "b")
    assert scope.find_var("a") is None
    assert scope.find_var("b") is a
    assert a.name == "b" and a.get(int) == 5
    assert sorted(scope.local_var_names()) == ["b", "c"]
    with pytest.raises(NestflowError, match="already exists"):
        scope.rename("b", "c")
    with pytest.raises(NestflowError, match="no such variable"):
        scope.rename("zzz", "y")


def test_local_var_names_lists_only_this_scope(scope):
    """DESIGN Core runtime: local_var_names() lists this scope's own variables."""
    for name in ("x", "y", "z"):
        scope.var(name)
    kid = scope.new_scope()
    kid.var("k")
    assert sorted(scope.local_var_names()) == ["x", "y", "z"]
    assert kid.local_var_names() == ["k"]


def test_step_scopes_can_be_held_by_a_variable(scope):
    """seed 000/002: each RNN time step runs in "an independent local scope"; the step scopes
    are kept (in a variable) for the backward pass and destroyed with the hierarchy."""
    steps = [scope.new_scope() for _ in range(3)]
    for t, step in enumerate(steps):
        step.var("h").set_value(t)
    holder = scope.var("step_scopes")
    holder.set_value(steps)
    assert [s.find_var("h").get(int) for s in holder.get(list)] == [0, 1, 2]
    scope.drop_kids()
    assert all(not s.alive for s in holder.get(list))


# ---- threads ----


@pytest.fixture
def fast_switching():
    """Switch threads often so races would show."""
    saved = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(saved)


def _run_threads(n: int, target) -> None:
    errors: list[BaseException] = []
    barrier = threading.Barrier(n)

    def body(i):
        try:
            barrier.wait()
            target(i)
        except BaseException as exc:  # collected so the main thread fails the test
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_concurrent_var_creation_and_lookup_is_exact(scope, fast_switching):
    """DESIGN Core runtime: "Scope is safe to use from several threads (lookups and creation
    under a lock)" — create-or-get races never make two variables of one name."""
    n_threads, n_vars = 8, 200
    shared: list[list[nf.Variable]] = [[] for _ in range(n_threads)]

    def work(i):
        for j in range(n_vars):
            scope.var(f"own_{i}_{j}").set_value(j)
            shared[i].append(scope.var(f"shared_{j}"))
            assert scope.find_var(f"own_{i}_{j}").get(int) == j
            scope.var()  # generated names must not collide either

    _run_threads(n_threads, work)
    names = scope.local_var_names()
    assert len(names) == len(set(names)) == n_threads * n_vars * 2 + n_vars
    for j in range(n_vars):
        assert all(shared[i][j] is scope.find_var(f"shared_{j}") for i in range(n_threads))


def test_concurrent_kid_creation_is_exact(scope, fast_switching):
    """DESIGN Core runtime: kid scopes made from several threads are all recorded, and all
    destroyed by drop_kids."""
    n_threads, n_kids = 8, 50
    made: list[nf.Scope] = []
    lock = threading.Lock()

    def work(i):
        for _ in range(n_kids):
            kid = scope.new_scope()
            kid.var("x").set_value(i)
            assert kid.find_var("x").get(int) == i
            with lock:
                made.append(kid)

    gc.collect()
    before = live_scope_count()
    _run_threads(n_threads, work)
    assert len(scope.kids) == n_threads * n_kids
    assert set(map(id, scope.kids)) == set(map(id, made))
    assert live_scope_count() == before + n_threads * n_kids
    scope.drop_kids()
    assert live_scope_count() == before
    assert not any(k.alive for k in made)


@pytest.mark.parametrize("name", [3, b"w", ("w",)])
def test_a_variable_name_must_be_a_string(scope, name):
    with pytest.raises(nf.errors.TypeMismatchError, match="variable name is a str"):
        scope.var(name)
    assert scope.local_var_names() == []


def test_held_kid_scopes_made_at_once_read_by_name_and_dropped(scope):
    # A loop's step scopes made after its steps ran: each holds its own step's values, reads
    # through to the parent, and drop_kids destroys them like kids made one by one.
    scope.var("w").get_mutable(nf.Tensor).set(np.ones(2, "float32"))
    before = live_scope_count()
    slots = {"h": 0, "y": 1}
    envs = [[np.full(3, t, "float32"), None] for t in range(4)]
    kids = scope._new_held_scopes(slots, envs)
    assert scope.kids == kids and live_scope_count() == before + 4
    for t, kid in enumerate(kids):
        assert kid.parent is scope
        np.testing.assert_array_equal(kid.find_var("h").get(nf.Tensor).numpy(), [t, t, t])
        assert kid.find_local_var("y") is None  # a None value makes no variable
        assert kid.find_var("w") is scope.find_var("w")
    scope.drop_kids()
    assert live_scope_count() == before
    assert not any(kid.alive for kid in kids)
    with pytest.raises(nf.errors.ScopeDestroyedError):
        kids[0].find_var("h")
