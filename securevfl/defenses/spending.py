"""A protocol's privacy spending, from its parties' defense stacks.

Every party's stack is built from the protocol alone, so any rank can compute any
party's figure; the pure budget math (:mod:`securevfl.privacy.step_budget`) takes these
mechanisms from here and turns a budget into the number of steps every rank runs.
"""

from __future__ import annotations

import functools
from typing import Any

from securevfl.components import CheckedProtocol
from securevfl.defenses.base import build_stack
from securevfl.privacy import step_budget
from securevfl.privacy.accountant import Mechanism, Plan, account


def all_mechanisms(checked: CheckedProtocol, plan: Plan) -> dict[str, list[Mechanism]]:
    """Every party's declared mechanisms for ``plan``."""
    proto, comps = checked.protocol, checked.components
    out = {}
    parties = [("active", proto.parties.active)] + [("passive", p) for p in proto.parties.passive]
    for side, spec in parties:
        out[spec.name] = build_stack(proto, comps, spec.name, side, spec.defenses).mechanisms(plan)
    return out


def prediction_mechanisms(checked: CheckedProtocol) -> dict[str, list[Mechanism]]:
    """Every party's declared releases of one prediction of a saved model
    (:meth:`~securevfl.defenses.base.DefenseStack.prediction_mechanisms`)."""
    proto, comps = checked.protocol, checked.components
    out = {}
    parties = [("active", proto.parties.active)] + [("passive", p) for p in proto.parties.passive]
    for side, spec in parties:
        out[spec.name] = build_stack(proto, comps, spec.name, side, spec.defenses).prediction_mechanisms()
    return out


def spent(checked: CheckedProtocol, plan: Plan) -> dict[str, Any]:
    """Every party's ``(eps, delta)`` over ``plan``, per mechanism and composed."""
    return account(all_mechanisms(checked, plan), checked.protocol.privacy.delta)


def allowed_steps(checked: CheckedProtocol, n_train: int) -> int:
    """How many training steps every rank runs under ``privacy.budget`` (see
    :func:`securevfl.privacy.step_budget.allowed_steps`)."""
    proto = checked.protocol
    return step_budget.allowed_steps(
        functools.partial(all_mechanisms, checked), n_train, proto.training, proto.privacy
    )
