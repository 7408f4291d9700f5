"""One small, open registry used for backends, defenses, attacks, datasets, models.

Registration is by name; a duplicate name is refused unless ``force=True``, and an
unknown name raises with the list of known names, so a typo in a protocol file
never falls back silently.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from securevfl.errors import ConfigError

T = TypeVar("T")


class Registry(Generic[T]):
    """A name -> object mapping with strict registration and helpful lookups."""

    def __init__(self, kind: str):
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str, *, force: bool = False) -> Callable[[T], T]:
        """Decorator: ``@REGISTRY.register("name")``."""

        def deco(obj: T) -> T:
            self.add(name, obj, force=force)
            return obj

        return deco

    def add(self, name: str, obj: T, *, force: bool = False) -> None:
        if name in self._items and not force:
            raise ValueError(f"{self.kind} '{name}' is already registered")
        self._items[name] = obj

    def remove(self, name: str) -> None:
        self._items.pop(name, None)

    def get(self, name: str, *, path: str | None = None) -> T:
        try:
            return self._items[name]
        except KeyError:
            known = ", ".join(sorted(self._items)) or "none"
            raise ConfigError(f"unknown {self.kind} '{name}' (known: {known})", path=path) from None

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._items))

    def names(self) -> list[str]:
        return sorted(self._items)
