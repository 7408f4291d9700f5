"""A user's module that registers its own defense when imported (as a plugin
does), for the tests of registering a class by reference in a rank."""

from __future__ import annotations

from securevfl.defenses.base import DEFENSES, Defense, DefenseOptions


@DEFENSES.register("test_self_registered")
class SelfRegistered(Defense[DefenseOptions]):
    """Passes embeddings through."""

    name = "test_self_registered"
    sides = frozenset({"passive"})
