"""Scope: a name -> Variable map with a parent chain and owned kid scopes (seeds 000, 001, 002)."""

from __future__ import annotations

import itertools
import threading
import weakref
from typing import Any

from nestflow.core.place import is_array
from nestflow.core.tensor import Tensor
from nestflow.core.variable import _SCOPE_TOKEN, Variable
from nestflow.errors import NestflowError, ScopeDestroyedError, TypeMismatchError

_live_scopes: weakref.WeakSet[Scope] = weakref.WeakSet()
_unique_ids = itertools.count()
_NOTHING_HELD: tuple[dict[str, int], list] = ({}, [])


def live_scope_count() -> int:
    """How many scopes exist and are not destroyed (for leak checks)."""
    return len(_live_scopes)


class Scope:
    """Owns its variables and its kid scopes; lookups fall back to the parent chain.

    `var` creates-or-gets locally, `find_var` searches this scope then its parents. Destroying a
    scope (drop_kids / delete_scope on its parent) destroys its variables and kids, and any kept
    reference to them then raises ScopeDestroyedError. All methods are thread-safe.

    A step scope keeps a finished block's values (`_hold`) as a list of values plus a name ->
    index map, and makes them Variables only when something asks for a variable by name: the
    executor and the gradient ops read such values without a Variable per name (`_value`,
    `_local_value`), and to everything else the scope looks as if it held the Variables all
    along.

    >>> root = nf.Scope()
    >>> root.var("w").get_mutable(nf.Tensor).set(np.ones(2, "float32"))
    >>> step = root.new_scope()  # a kid scope: lookups fall back to the parent
    >>> step.find_var("w") is root.find_var("w"), step.find_local_var("w")
    (True, None)
    >>> h = step.var("h")  # local to the kid
    >>> root.find_var("h") is None, root.kids == [step]
    (True, True)
    >>> root.drop_kids()  # destroys the kid and its variables
    >>> try:
    ...     h.name
    ... except nf.errors.ScopeDestroyedError:
    ...     print("destroyed")
    destroyed
    """

    def __init__(self, parent: Scope | None = None):
        self._parent = parent
        self._vars: dict[str, Variable] = {}
        self._kids: list[Scope] = []
        # Values kept by `_hold` and not made Variables yet: (name -> index, values), or None.
        self._held: tuple[dict[str, int], list] | None = None
        self._alive = True
        # One lock per scope tree: creating a kid and reading the parent chain must not race.
        self._lock: threading.RLock = parent._lock if parent is not None else threading.RLock()
        if parent is not None:
            # A local scope is always owned by its parent (seed 000's Create(parent)), so
            # dropping the parent's kids destroys it however it was made.
            parent._check_alive()
            with self._lock:
                parent._kids.append(self)
        _live_scopes.add(self)

    def _check_alive(self) -> None:
        if not self._alive:
            raise ScopeDestroyedError("this scope was destroyed (its parent dropped it)")

    @property
    def parent(self) -> Scope | None:
        self._check_alive()
        return self._parent

    @property
    def kids(self) -> list[Scope]:
        self._check_alive()
        with self._lock:
            return list(self._kids)

    @property
    def alive(self) -> bool:
        return self._alive

    def new_scope(self) -> Scope:
        """A local scope whose parent is this one; it lives until this scope drops it."""
        return Scope(self)

    def _new_held_scopes(self, slots: dict[str, int], envs: list[list]) -> list[Scope]:
        """One kid scope per env, holding `env[slot]` under each name of `slots` (as `_hold`
        does on a fresh kid): a loop's step scopes made at once after its steps ran, as cheaply
        as a kid can be made (the per-kid work of __init__ done once)."""
        self._check_alive()
        lock = self._lock
        kids = []
        for env in envs:
            kid = Scope.__new__(Scope)
            kid._parent, kid._vars, kid._kids = self, {}, []
            kid._held, kid._alive, kid._lock = (slots, env), True, lock
            kids.append(kid)
        with lock:
            self._kids.extend(kids)
        _live_scopes.update(kids)
        return kids

    def var(self, name: str | None = None) -> Variable:
        """The variable `name` of this scope, created if absent here (parents are not searched).

        With no name, a fresh uniquely named variable is created.
        """
        self._check_alive()
        if name is not None and (not isinstance(name, str) or not name):
            raise TypeMismatchError(f"a variable name is a str, and not empty; got {name!r}")
        with self._lock:
            if self._held is not None:
                self._materialize()
            if name is None:
                name = f"_generated_var_{next(_unique_ids)}"
                while name in self._vars:
                    name = f"_generated_var_{next(_unique_ids)}"
            variable = self._vars.get(name)
            if variable is None:
                variable = self._vars[name] = Variable(_SCOPE_TOKEN, name)
            return variable

    def find_var(self, name: str) -> Variable | None:
        """The variable `name` of this scope or the nearest ancestor having it; None if none."""
        self._check_alive()
        scope = self
        while scope is not None:
            if scope._held is not None:
                scope._materialize()
            variable = scope._vars.get(name)
            if variable is not None:
                return variable
            scope = scope._parent
        return None

    def find_local_var(self, name: str) -> Variable | None:
        self._check_alive()
        if self._held is not None:
            self._materialize()
        return self._vars.get(name)

    def find_scope(self, name: str) -> Scope | None:
        """The scope (this or an ancestor) that owns variable `name`."""
        self._check_alive()
        scope = self
        while scope is not None:
            if scope._held is not None:
                scope._materialize()
            if name in scope._vars:
                return scope
            scope = scope._parent
        return None

    def local_var_names(self) -> list[str]:
        self._check_alive()
        with self._lock:
            if self._held is not None:
                self._materialize()
            return list(self._vars)

    def __contains__(self, name: str) -> bool:
        return self.find_var(name) is not None

    def erase_vars(self, names) -> None:
        """Destroy the named local variables (seed 001's DeleteVariable); absent names are
        ignored. `names`: one name or an iterable of names (TypeMismatchError otherwise)."""
        self._check_alive()
        if isinstance(names, str):  # one name, not its characters
            names = [names]
        try:
            names = list(names)
        except TypeError:
            raise TypeMismatchError(
                f"erase_vars takes a name or a list of names, got {type(names).__name__}"
            ) from None
        odd = [n for n in names if not isinstance(n, str)]
        if odd:
            raise TypeMismatchError(f"erase_vars: variable names are strs, got {odd!r}")
        with self._lock:
            if self._held is not None:
                self._materialize()
            for name in names:
                variable = self._vars.pop(name, None)
                if variable is not None:
                    variable._destroy()

    def rename(self, old: str, new: str) -> None:
        """Rename a local variable; the Variable object (and what it holds) is kept."""
        self._check_alive()
        if not isinstance(new, str) or not new:
            raise TypeMismatchError(
                f"cannot rename '{old}': a new name is a non-empty str, got {new!r}"
            )
        with self._lock:
            if self._held is not None:
                self._materialize()
            if old not in self._vars:
                raise NestflowError(f"cannot rename '{old}': no such variable in this scope")
            if new in self._vars and new != old:
                raise NestflowError(f"cannot rename '{old}' to '{new}': '{new}' already exists")
            variable = self._vars.pop(old)
            variable._name = new
            self._vars[new] = variable

    def _hold(self, slots: dict[str, int], values: list) -> None:
        """Keep `values[slot]` as this scope's variable of each name in `slots` (a None value:
        no variable), as `var(name).set_value(...)` would, ndarrays in Tensors; `values` must not
        change afterwards (a finished frame's env). In a scope with no variables yet the
        Variables are made only when something asks for them by name."""
        self._check_alive()
        with self._lock:
            if not self._vars and self._held is None:
                self._held = (slots, values)
                return
            if self._held is not None:
                self._materialize()
            self._make_vars(slots, values)

    def _materialize(self) -> None:
        """Make the held values Variables (the lock makes this happen once)."""
        with self._lock:
            held = self._held
            if held is not None:
                self._make_vars(*held)
                # Cleared last: a reader that sees None finds every Variable in place.
                self._held = None

    def _make_vars(self, slots: dict[str, int], values: list) -> None:
        variables = self._vars
        for name, slot in slots.items():
            value = values[slot]
            if value is None:
                continue
            variable = variables.get(name)
            if variable is None:
                variable = variables[name] = Variable(_SCOPE_TOKEN, name)
            variable._value = Tensor._holding(value) if is_array(value) else value

    def _held_only(self) -> tuple[dict[str, int], list] | None:
        """(name -> index, values) of a scope whose variables are all still held values (empty
        for a scope with no variables); None once it has Variables."""
        held = self._held  # read first: _materialize fills _vars before it clears _held
        if self._vars:
            return None
        return _NOTHING_HELD if held is None else held

    def _local_value(self, name: str, absent: Any = None) -> Any:
        """The value this scope itself holds for `name` (a Tensor's array), without making a
        Variable; `absent` when it has no such variable (a variable holding nothing: None)."""
        self._check_alive()
        variable = self._vars.get(name)
        if variable is not None:
            held = variable._value
            return held._array if isinstance(held, Tensor) else held
        held = self._held
        if held is not None:
            slot = held[0].get(name)
            if slot is not None:
                value = held[1][slot]
                if value is not None:
                    return value
        return absent

    def _value(self, name: str) -> Any:
        """The value of `find_var(name)` (a Tensor's array; None if absent or empty), without
        making Variables of held values."""
        self._check_alive()
        scope = self
        while scope is not None:
            variable = scope._vars.get(name)
            if variable is not None:
                held = variable._value
                return held._array if isinstance(held, Tensor) else held
            held = scope._held
            if held is not None:
                slot = held[0].get(name)
                if slot is not None and held[1][slot] is not None:
                    return held[1][slot]
            scope = scope._parent
        return None

    def delete_scope(self, kid: Scope) -> None:
        """Destroy one kid scope, its variables and its own kids."""
        self._check_alive()
        with self._lock:
            try:
                self._kids.remove(kid)
            except ValueError:
                raise NestflowError("delete_scope: that scope is not a kid of this one") from None
        kid._destroy()

    def drop_kids(self) -> None:
        """Destroy every kid scope and their variables (seed 002: at the end of a minibatch)."""
        self._check_alive()
        with self._lock:
            kids, self._kids = self._kids, []
        _destroy_scopes(kids)

    def _destroy(self) -> None:
        _destroy_scopes([self])

    def __repr__(self) -> str:
        if not self._alive:
            return "Scope(destroyed)"
        if self._held is not None:
            self._materialize()
        return f"Scope(vars={len(self._vars)}, kids={len(self._kids)})"


def _destroy_scopes(scopes: list[Scope]) -> None:
    """Destroy `scopes` (of one scope tree), their kids and their variables."""
    if not scopes:
        return
    dead = []
    # A worklist, not recursion: scopes nest as deep as the program's blocks do. One lock
    # serves a whole scope tree, so it is taken once.
    pending = list(scopes)
    with scopes[0]._lock:
        while pending:
            scope = pending.pop()
            kids, scope._kids = scope._kids, []
            variables, scope._vars = scope._vars, {}
            scope._held = None
            scope._alive = False
            dead.append(scope)
            if kids:
                pending.extend(kids)
            for variable in variables.values():
                variable._destroy()
    _live_scopes.difference_update(dead)
