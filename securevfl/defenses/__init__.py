"""Defenses: one small class per mechanism, registered by name in DEFENSES,
applied as an ordered stack per party at the hook points of DESIGN §5.

Importing this package registers every built-in defense."""

from securevfl.defenses import crdp, dravl, hashvfl, label_dp, vfl_afe  # noqa: F401  (registration)
from securevfl.defenses.base import DEFENSES, Defense, DefenseContext, DefenseStack

__all__ = ["DEFENSES", "Defense", "DefenseContext", "DefenseStack"]
