"""Scope: a name -> Variable map with a parent chain and owned kid scopes (seeds 000, 001, 002)."""

from __future__ import annotations

import itertools
import threading
import weakref

from nestflow.core.variable import _SCOPE_TOKEN, Variable
from nestflow.errors import NestflowError, ScopeDestroyedError

_live_scopes: weakref.WeakSet[Scope] = weakref.WeakSet()
_unique_ids = itertools.count()


def live_scope_count() -> int:
    """How many scopes exist and are not destroyed (for leak checks)."""
    return len(_live_scopes)


class Scope:
    """Owns its variables and its kid scopes; lookups fall back to the parent chain.

    `var` creates-or-gets locally, `find_var` searches this scope then its parents. Destroying a
    scope (drop_kids / delete_scope on its parent) destroys its variables and kids, and any kept
    reference to them then raises ScopeDestroyedError. All methods are thread-safe.
    """

    def __init__(self, parent: Scope | None = None):
        self._parent = parent
        self._vars: dict[str, Variable] = {}
        self._kids: list[Scope] = []
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

    def var(self, name: str | None = None) -> Variable:
        """The variable `name` of this scope, created if absent here (parents are not searched).

        With no name, a fresh uniquely named variable is created.
        """
        self._check_alive()
        with self._lock:
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
            variable = scope._vars.get(name)
            if variable is not None:
                return variable
            scope = scope._parent
        return None

    def find_local_var(self, name: str) -> Variable | None:
        self._check_alive()
        return self._vars.get(name)

    def find_scope(self, name: str) -> Scope | None:
        """The scope (this or an ancestor) that owns variable `name`."""
        self._check_alive()
        scope = self
        while scope is not None:
            if name in scope._vars:
                return scope
            scope = scope._parent
        return None

    def local_var_names(self) -> list[str]:
        self._check_alive()
        with self._lock:
            return list(self._vars)

    def __contains__(self, name: str) -> bool:
        return self.find_var(name) is not None

    def erase_vars(self, names) -> None:
        """Destroy the named local variables (seed 001's DeleteVariable); absent names are ignored."""
        self._check_alive()
        if isinstance(names, str):  # one name, not its characters
            names = [names]
        with self._lock:
            for name in names:
                variable = self._vars.pop(name, None)
                if variable is not None:
                    variable._destroy()

    def rename(self, old: str, new: str) -> None:
        """Rename a local variable; the Variable object (and what it holds) is kept."""
        self._check_alive()
        with self._lock:
            if old not in self._vars:
                raise NestflowError(f"cannot rename '{old}': no such variable in this scope")
            if new in self._vars and new != old:
                raise NestflowError(f"cannot rename '{old}' to '{new}': '{new}' already exists")
            variable = self._vars.pop(old)
            variable._name = new
            self._vars[new] = variable

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
        for kid in kids:
            kid._destroy()

    def _destroy(self) -> None:
        with self._lock:
            kids, self._kids = self._kids, []
            variables, self._vars = self._vars, {}
            self._alive = False
        for kid in kids:
            kid._destroy()
        for variable in variables.values():
            variable._destroy()
        _live_scopes.discard(self)

    def __repr__(self) -> str:
        if not self._alive:
            return "Scope(destroyed)"
        return f"Scope(vars={len(self._vars)}, kids={len(self._kids)})"
