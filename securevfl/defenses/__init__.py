"""Defenses: one small class per mechanism, registered by name in DEFENSES,
applied as an ordered stack per party at the hook points of DESIGN §5."""

from securevfl.defenses.base import DEFENSES, Defense, DefenseContext, DefenseStack

__all__ = ["DEFENSES", "Defense", "DefenseContext", "DefenseStack"]
