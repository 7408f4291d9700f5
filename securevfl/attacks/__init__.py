"""Attacks on an adversary's view (what its rank received plus its own data),
registered by name in ATTACKS."""

from securevfl.attacks.base import ATTACKS, Attack, View

__all__ = ["ATTACKS", "Attack", "View"]
