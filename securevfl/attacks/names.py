"""The attack registry, apart from the attack interface (:mod:`.base`, with
torch): the package's face registers every built-in attack here by path, so
looking a name up, listing the names or loading a protocol without attacks
imports no attack code."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from securevfl.registry import Registry

if TYPE_CHECKING:
    from securevfl.attacks.base import Attack

ATTACKS: Registry[type[Attack[Any]]] = Registry("attack")
