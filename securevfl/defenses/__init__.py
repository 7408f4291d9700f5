"""Defenses: one small class per mechanism, registered by name in DEFENSES,
applied as an ordered stack per party at the hook points of DESIGN §5. A
defense is generic in its options model and gets the options validated at load
(:mod:`securevfl.components`); a defense that depends on what another party runs
asks :meth:`~securevfl.components.Components.options` for that party's typed
options. Larger defenses are packages of small modules (``crdp/``, ``hashvfl/``).

Importing this package registers every built-in defense."""

from securevfl.defenses import crdp, dravl, hashvfl, label_dp, vfl_afe  # noqa: F401  (registration)
from securevfl.defenses.base import DEFENSES, Defense, DefenseContext, DefenseStack

__all__ = ["DEFENSES", "Defense", "DefenseContext", "DefenseStack"]
