"""One training loop: both sides run :meth:`Party.run`; a side adds only its step,
its round, its evaluation and what it reports."""

from __future__ import annotations

import ast
import inspect

from securevfl.parties import active, passive
from securevfl.parties.active import ActiveParty
from securevfl.parties.common import Party
from securevfl.parties.passive import PassiveParty


def test_both_sides_run_the_one_loop():
    assert ActiveParty.run is Party.run and PassiveParty.run is Party.run


def test_no_side_walks_the_schedule_itself():
    for module in (active, passive):
        tree = ast.parse(inspect.getsource(module))
        called = {
            n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
        }
        assert not called & {"schedule", "rounds_of"}, module.__name__


def test_each_side_provides_the_hooks_the_loop_calls():
    for cls in (ActiveParty, PassiveParty):
        for hook in ("train_step", "train_round", "evaluate"):
            assert getattr(cls, hook) is not getattr(Party, hook), (cls.__name__, hook)
