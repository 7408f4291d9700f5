"""Privacy math (pure functions) and the one accountant (docs/design.md §7).

Mechanisms declare what they release as :class:`~securevfl.privacy.accountant.Release`
objects; :mod:`securevfl.privacy.accountant` composes them per party on
``dp_accounting``'s privacy-loss distributions, and :mod:`securevfl.privacy.step_budget`
turns a budget into the number of training steps every rank runs, given every
party's mechanisms (built from the defense stacks by :mod:`securevfl.defenses.spending`).
"""
