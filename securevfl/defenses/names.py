"""The defense registry, apart from the defense interface (:mod:`.base`, with
torch): the package's face registers every built-in defense here by path, so
looking a name up, listing the names or loading a protocol without defenses
imports no defense code."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from securevfl.registry import Registry

if TYPE_CHECKING:
    from securevfl.defenses.base import Defense

DEFENSES: Registry[type[Defense[Any]]] = Registry("defense")
