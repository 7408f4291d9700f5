"""Attacks on an adversary's view (what its rank received plus its own data,
a typed :class:`~securevfl.records.OwnView` read by field), registered by name
in ATTACKS. Importing this package registers every built-in attack;
:mod:`securevfl.app.harness` runs them after training."""

from securevfl.attacks import (  # noqa: F401  (registration)
    code_detection,
    code_reconstruction,
    feature_reconstruction,
    gradient_clusters,
    label_inference,
    membership,
    online_reconstruction,
    targeted_pgd,
)
from securevfl.attacks.base import ATTACKS, Attack, View, World

__all__ = ["ATTACKS", "Attack", "View", "World"]
