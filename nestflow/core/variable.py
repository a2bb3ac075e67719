"""Variable: a named holder of one value of any type, created only by a Scope (seeds 000, 001, 004)."""

from __future__ import annotations

from typing import Any, TypeVar

from nestflow.errors import ScopeDestroyedError, TypeMismatchError, UninitializedError

T = TypeVar("T")

# Only Scope holds this token, so only Scope can construct a Variable (seed 000's friend class).
_SCOPE_TOKEN = object()


class Variable:
    """Holds nothing until `get_mutable(T)` puts a fresh `T()` in it (lazy, seed 004).

    `get(T)` checks the held type. Once the owning scope is destroyed every method raises
    ScopeDestroyedError, so a kept reference never reads stale data (seed 001's weak pointers).

    >>> scope = nf.Scope()
    >>> v = scope.var("w")
    >>> v.is_initialized()
    False
    >>> v.get_mutable(nf.Tensor).set(np.zeros(3, "float32"))
    >>> v.is_type(nf.Tensor), v.get(nf.Tensor).shape
    (True, (3,))
    """

    __slots__ = ("_name", "_value", "_alive", "__weakref__")

    def __init__(self, *args, **kwargs):
        if not args or args[0] is not _SCOPE_TOKEN:
            raise TypeError("a Variable can only be created by a Scope: use scope.var(name)")
        self._name: str = args[1]
        self._value: Any = None
        self._alive = True

    def _check_alive(self) -> None:
        if not self._alive:
            raise ScopeDestroyedError(
                f"variable '{self._name}' was used after its scope was destroyed"
            )

    @property
    def name(self) -> str:
        self._check_alive()
        return self._name

    def is_initialized(self) -> bool:
        self._check_alive()
        return self._value is not None

    def is_type(self, kind: type) -> bool:
        self._check_alive()
        return isinstance(self._value, kind)

    def held_type(self) -> type | None:
        self._check_alive()
        return None if self._value is None else type(self._value)

    def get(self, kind: type[T]) -> T:
        """The held value, which must be a `kind`."""
        self._check_alive()
        value = self._value
        if value is None:
            raise UninitializedError(
                f"variable '{self._name}' holds nothing yet (asked for {kind.__name__})"
            )
        if not isinstance(value, kind):
            raise TypeMismatchError(
                f"variable '{self._name}' holds {type(value).__name__}, not {kind.__name__}"
            )
        return value

    def get_mutable(self, kind: type[T]) -> T:
        """The held `kind`, creating an empty one if the variable holds nothing."""
        self._check_alive()
        if self._value is None:
            self._value = kind()
        elif not isinstance(self._value, kind):
            raise TypeMismatchError(
                f"variable '{self._name}' holds {type(self._value).__name__}, "
                f"cannot be used as {kind.__name__}"
            )
        return self._value

    def set_value(self, value: Any) -> None:
        """Hold `value` (of any type), replacing what was held."""
        self._check_alive()
        self._value = value

    def clear(self) -> None:
        self._check_alive()
        self._value = None

    def _destroy(self) -> None:
        self._value = None
        self._alive = False

    def __repr__(self) -> str:
        if not self._alive:
            return f"Variable('{self._name}', destroyed)"
        held = "nothing" if self._value is None else repr(self._value)
        return f"Variable('{self._name}', holds {held})"
