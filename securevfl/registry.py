"""One small, open registry used for backends, defenses, attacks, datasets, models.

Registration is by name; a duplicate name is refused unless ``force=True``, and an
unknown name raises with the list of known names, so a typo in a protocol file
never falls back silently.

An entry is either the object itself (:meth:`Registry.add`) or where it lives, a
``"package.module:attribute"`` path (:meth:`Registry.add_path`) that is imported
on its first lookup. The built-in backends, defenses and attacks are registered
by path in their package's ``__init__``, so a process pays for the imports of
the components its protocol names and no others: a ``plain`` rank never loads
the HE libraries, CrypTen's helpers, the DP accountants of defenses it does not
run or the scikit-learn models of attacks it does not run. Listing the names
(``securevfl list``, the "known: ..." of an error) imports nothing.

A registry may check what it is given (``check``): the exchange backends' registry
refuses anything but a backend's declaration, whether it is added as an object or
found at its path on the first lookup.

A registry may be used from several threads at once (two ``api.run`` calls in
one script): every change and every first lookup of a path entry holds the
registry's lock, so two threads looking up the same name both get the object.
"""

from __future__ import annotations

import importlib
import re
import threading
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar, cast

from securevfl.errors import ConfigError

T = TypeVar("T")

#: ``package.module:attribute``: where a registered object lives.
PATH = re.compile(r"^(?P<module>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*):(?P<attr>[A-Za-z_]\w*)$")


class Registry(Generic[T]):
    """A name -> object mapping with strict registration and helpful lookups;
    entries registered by path are imported on first lookup."""

    def __init__(self, kind: str, *, check: Callable[[str, T], None] | None = None):
        self.kind = kind
        # raises (ValueError) for an object this registry does not take under a name
        self._check = check
        self._items: dict[str, T] = {}
        self._paths: dict[str, str] = {}  # registered by path, not imported yet
        self._replaced: dict[str, str] = {}  # a built-in name -> where its forced replacement lives
        # reentrant: importing a registered module may register more names here
        self._lock = threading.RLock()

    def register(self, name: str, *, force: bool = False) -> Callable[[T], T]:
        """Decorator: ``@REGISTRY.register("name")``."""

        def deco(obj: T) -> T:
            self.add(name, obj, force=force)
            return obj

        return deco

    def add(self, name: str, obj: T, *, force: bool = False) -> None:
        with self._lock:
            self._refuse_duplicate(name, force)
            if self._check is not None:
                self._check(name, obj)
            self._note_replacement(name, _origin(obj))
            self._paths.pop(name, None)
            self._items[name] = obj

    def add_path(self, name: str, path: str, *, force: bool = False) -> None:
        """Register ``name`` as the object at ``path`` (``"package.module:attribute"``),
        imported on the first :meth:`get` of ``name``."""
        if not PATH.match(path):
            raise ValueError(f"{self.kind} '{name}': {path!r} is not a 'package.module:attribute' path")
        with self._lock:
            self._refuse_duplicate(name, force)
            self._note_replacement(name, path)
            self._items.pop(name, None)
            self._paths[name] = path

    def _refuse_duplicate(self, name: str, force: bool) -> None:
        if name in self and not force:
            raise ValueError(f"{self.kind} '{name}' is already registered")

    def _note_replacement(self, name: str, origin: str) -> None:
        """Remember that ``force=True`` put user code (``origin``) in place of
        securevfl's own entry ``name``, so that a run using the name says so."""
        if name in self._replaced:
            if _is_securevfl(origin):  # securevfl's own again: nothing replaced now
                del self._replaced[name]
            else:
                self._replaced[name] = origin
            return
        current = self._paths.get(name) or (_origin(self._items[name]) if name in self._items else None)
        if current is not None and _is_securevfl(current) and not _is_securevfl(origin):
            self._replaced[name] = origin

    def replaced(self, name: str) -> str | None:
        """Where the user code lives that ``force=True`` registered in place of
        securevfl's own ``name`` (``module:qualname``); None when ``name`` is securevfl's
        own, or was never one."""
        with self._lock:
            return self._replaced.get(name)

    def remove(self, name: str) -> None:
        with self._lock:
            self._items.pop(name, None)
            self._paths.pop(name, None)
            self._replaced.pop(name, None)

    def get(self, name: str, *, path: str | None = None) -> T:
        if name in self._items:
            return self._items[name]
        with self._lock:  # the first lookup of a path entry imports it, once
            if name in self._items:  # another thread imported it meanwhile
                return self._items[name]
            if name in self._paths:
                obj = self._load(name, self._paths[name], path)
                self._items[name] = obj  # before the path goes: the name is never missing
                del self._paths[name]
                return obj
        known = ", ".join(self.names()) or "none"
        raise ConfigError(f"unknown {self.kind} '{name}' (known: {known})", path=path)

    def _load(self, name: str, target: str, path: str | None) -> T:
        """Import the object registered at ``target`` (:func:`load_path`); an
        object whose own ``name`` is not the one it is registered under, or one
        the registry's ``check`` refuses, is a bug in the registration."""
        obj = load_path(self.kind, name, target, path)
        own = getattr(obj, "name", name)
        if isinstance(own, str) and own != name:
            raise LookupError(f"{self.kind} '{name}' is registered at {target}, which is named '{own}'")
        if self._check is not None:
            self._check(name, cast(T, obj))
        return cast(T, obj)

    def __contains__(self, name: object) -> bool:
        return name in self._items or name in self._paths

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def names(self) -> list[str]:
        with self._lock:
            return sorted({*self._items, *self._paths})


def load_path(kind: str, name: str, target: str, path: str | None = None, *, what: str = "") -> object:
    """Import the object at ``target`` (``"package.module:attribute"``), which
    ``kind`` ``name`` names (as its ``what``, or as itself). A third-party module that
    is not installed (an optional extra) is the user's ConfigError (at ``path`` of the
    protocol); a securevfl module or attribute that is missing is a bug in the
    registration."""
    module, _, attr = target.partition(":")
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        missing = exc.name or "?"
        if missing == "securevfl" or missing.startswith("securevfl."):
            raise
        raise ConfigError(
            f"{kind} '{name}' needs the Python package '{missing.partition('.')[0]}', which is "
            "not installed (the optional extras: pip install 'securevfl[crypto,dp]')",
            path=path,
        ) from exc
    obj = getattr(mod, attr, None)
    if obj is None:
        at = f"names its {what} at" if what else "is registered at"
        raise LookupError(f"{kind} '{name}' {at} {target}, which does not exist")
    return obj


def _origin(obj: object) -> str:
    """``module:qualname`` of a registered object (its type's for an instance)."""
    target = obj if hasattr(obj, "__qualname__") else type(obj)
    return f"{getattr(target, '__module__', '?')}:{getattr(target, '__qualname__', '?')}"


def _is_securevfl(origin: str) -> bool:
    module = origin.partition(":")[0]
    return module == "securevfl" or module.startswith("securevfl.")
