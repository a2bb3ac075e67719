"""Variable: every statement seeds 000, 001 and 004 make about variables."""

from __future__ import annotations

import numpy as np
import pytest

import nestflow as nf
from nestflow.errors import NestflowError, TypeMismatchError, UninitializedError


@pytest.fixture
def scope() -> nf.Scope:
    return nf.Scope()


def test_variable_holds_nothing_until_get_mutable(scope):
    """seed 004: "a variable holds nothing until Variable::GetMutable<Tensor>() allocates a
    tensor and puts it in the variable"."""
    v = scope.var("x")
    assert not v.is_initialized()
    assert v.held_type() is None
    assert not v.is_type(nf.Tensor)
    t = v.get_mutable(nf.Tensor)
    assert isinstance(t, nf.Tensor)
    assert v.is_initialized() and v.is_type(nf.Tensor) and v.held_type() is nf.Tensor
    assert v.get_mutable(nf.Tensor) is t  # the same tensor, not a fresh one
    assert v.get(nf.Tensor) is t
    # GetMutable puts an (empty) tensor in: the tensor's memory is still not allocated.
    assert not t.is_allocated()


def test_get_before_anything_is_held_raises_uninitialized(scope):
    """seed 004: Get checks the held object; a variable holding nothing has nothing to give."""
    v = scope.var("x")
    with pytest.raises(UninitializedError, match="'x' holds nothing"):
        v.get(nf.Tensor)


def test_get_with_wrong_type_names_variable_requested_and_held_types(scope):
    """seed 004: "Variable::Get checks the expected type and the saved object's type";
    DESIGN: TypeMismatchError names the variable, T and the held type."""
    v = scope.var("ids")
    v.set_value(42)
    with pytest.raises(TypeMismatchError) as info:
        v.get(nf.Tensor)
    msg = str(info.value)
    assert "'ids'" in msg and "Tensor" in msg and "int" in msg
    assert isinstance(info.value, NestflowError) and isinstance(info.value, TypeError)


def test_get_mutable_with_wrong_type_raises_instead_of_replacing(scope):
    """seed 004: GetMutable also checks the saved object's type; the held value is kept."""
    v = scope.var("w")
    t = v.get_mutable(nf.Tensor)
    with pytest.raises(TypeMismatchError, match="'w' holds Tensor.*list"):
        v.get_mutable(list)
    assert v.get(nf.Tensor) is t


def test_variable_holds_integer_ids(scope):
    """seed 004: "a variable should be able to contain any typed value -- a tensor in most
    cases, but could also be some integer IDs"."""
    v = scope.var("step")
    v.set_value(3)
    assert v.get(int) == 3 and v.is_type(int)
    v.set_value([7, 8, 9])
    assert v.get(list) == [7, 8, 9] and not v.is_type(int)


def test_variable_holds_a_scope_of_other_variables(scope):
    """seed 004: a variable may hold "a scope of other variables in the case of RNN"."""
    steps = [scope.new_scope(), scope.new_scope()]
    steps[1].var("h").set_value(1.5)
    v = scope.var("step_scopes")
    v.set_value(steps)
    held = v.get(list)
    assert held[1].find_var("h").get(float) == 1.5
    single = scope.var("one_scope")
    single.set_value(steps[0])
    assert single.get(nf.Scope) is steps[0]


def test_get_mutable_creates_any_default_constructible_type_lazily(scope):
    """seed 004 (type hiding): one Variable class holds any T; GetMutable<T> makes a T()."""
    lst = scope.var("arr").get_mutable(list)
    lst.append(np.zeros(2))
    assert len(scope.find_var("arr").get(list)) == 1
    assert scope.var("n").get_mutable(int) == 0


def test_one_variable_type_holds_different_types_over_time(scope):
    """seed 004: Variable "cannot be a template": the held type is only known at run time."""
    v = scope.var("x")
    v.set_value(1)
    assert v.held_type() is int
    v.clear()
    assert not v.is_initialized()
    v.get_mutable(nf.Tensor).set(np.ones(3))
    assert v.held_type() is nf.Tensor


def test_variables_can_only_be_got_from_a_scope(scope):
    """seed 000: "a variable can only be got from Scope. User cannot create or get a variable
    outside a scope" — the only ways to a Variable are scope.var and scope.find_var."""
    v = scope.var("x")
    assert scope.find_var("x") is v
    with pytest.raises(TypeError):
        nf.Variable("x")
    with pytest.raises(TypeError):
        type(v)()


def test_seed_004_lazy_allocation_example(scope):
    """seed 004's example: Randomize v1 (float16 [100, 200]) and v2 (float16 [200, 300]) through
    GetMutable<Tensor>().mutable_data; Mult into vr with v1's type and SizeOfMult's shape."""
    v1, v2, vr = scope.var("v1"), scope.var("v2"), scope.var("vr")
    assert not any(v.is_initialized() for v in (v1, v2, vr))
    rng = np.random.default_rng(0)
    a = v1.get_mutable(nf.Tensor).mutable_data((100, 200), "float16")
    a[...] = rng.standard_normal(a.shape)
    b = v2.get_mutable(nf.Tensor).mutable_data((200, 300), "float16")
    b[...] = rng.standard_normal(b.shape)
    assert not vr.is_initialized()
    out_shape = (v1.get(nf.Tensor).shape[0], v2.get(nf.Tensor).shape[1])
    r = vr.get_mutable(nf.Tensor).mutable_data(out_shape, v1.get(nf.Tensor).dtype)
    np.matmul(v1.get(nf.Tensor).data(), v2.get(nf.Tensor).data(), out=r)
    assert vr.get(nf.Tensor).dtype == np.float16
    assert vr.get(nf.Tensor).shape == (100, 300)
    ref = a.astype(np.float32) @ b.astype(np.float32)
    np.testing.assert_allclose(vr.get(nf.Tensor).numpy(), ref, rtol=2e-2, atol=0.5)


def test_repr_says_what_the_variable_holds(scope):
    """DESIGN (inspectability): a Variable's repr names it and what it holds."""
    v = scope.var("x")
    assert "nothing" in repr(v)
    v.set_value(5)
    assert "'x'" in repr(v) and "5" in repr(v)
