"""A plugin attack's own code failing in the attack harness: what it raises, or a
guess or score of the wrong kind, is the user's UserCodeError naming the attack,
the hook and the adversary (exit code 2, no traceback), raised before the harness
writes anything, so result.json never holds an ``ap`` the table cannot read."""

from __future__ import annotations

import math
import uuid
from pathlib import Path
from typing import Any

import pytest

from securevfl import plugins
from securevfl.app.harness import _run_all
from securevfl.app.loader import load_checked_dict
from securevfl.app.rank_layout import layout_of
from securevfl.attacks import ATTACKS
from securevfl.attacks.base import View, World
from securevfl.errors import UserCodeError
from tests.support.protocols import small_digits


def _world_with(behaviour: dict[str, Any]) -> tuple[Any, World, str]:
    tag = uuid.uuid4().hex[:8]

    class Flaky(plugins.Attack[plugins.AttackOptions]):
        name = f"flaky_{tag}"

        def knowledge(self, world: World) -> dict[str, Any]:
            if behaviour.get("knowledge") == "raise":
                raise KeyError("secret row 17")
            return {}

        def run(self, view: View) -> Any:
            if behaviour.get("run") == "raise":
                raise RuntimeError("boom")
            return behaviour.get("guess", {"used": {}})

        def score(self, guess: dict[str, Any], world: Any) -> Any:
            return behaviour.get("score", {"ap": 0.5})

    plugins.register_attack(Flaky)
    doc = small_digits()
    doc["attacks"] = [{"name": Flaky.name}]
    checked = load_checked_dict(doc)
    layout = layout_of(checked)
    views = {r.party: View(r.rank, r.party, {}, {}) for r in layout.roles if r.kind != "helper"}
    return World(checked.protocol, checked.components, layout, views, Path(".")), Flaky.name


@pytest.mark.parametrize(
    ("behaviour", "said"),
    [
        ({"knowledge": "raise"}, "its knowledge hook raised KeyError"),
        ({"run": "raise"}, "its run hook raised RuntimeError"),
        ({"guess": [1, 2]}, "its run hook returned a list, not a dict"),
        ({"score": {"ap": "high"}}, "its score hook returned 'ap' as a str, not a number"),
        ({"score": {"ap": 0.5, "chance": True}}, "returned 'chance' as a bool, not a number"),
        ({"score": {"ap": math.inf}}, "returned 'ap' = inf, not a finite number"),
        ({"score": 0.7}, "its score hook returned a float, not a dict of metrics"),
    ],
    ids=["knowledge-raises", "run-raises", "guess-list", "ap-string", "chance-bool", "ap-inf", "score-float"],
)
def test_a_plugin_attack_that_fails_is_named_with_its_hook(behaviour: dict[str, Any], said: str) -> None:
    world, name = _world_with(behaviour)
    try:
        with pytest.raises(UserCodeError) as info:
            _run_all(world)
    finally:
        ATTACKS.remove(name)
    msg = str(info.value)
    assert f"attack '{name}'" in msg and said in msg and info.value.path == "attacks[0]", msg
    if "raised" in said:
        assert "adversary 'active'" in msg or "knowledge" in said
        assert info.value.detail is not None and "secret row 17" not in msg  # its text: the owner's alone


def test_a_plugin_attack_that_scores_numbers_is_recorded() -> None:
    world, name = _world_with({"score": {"ap": 0.75, "chance": math.nan, "note": "fine"}})
    try:
        results = _run_all(world)
    finally:
        ATTACKS.remove(name)
    entry = results[name]
    assert entry["ap"] == 0.75 and entry["chance"] is None and entry["note"] == "fine"
    assert entry["adversary"] == "active" and entry["attack"] == name
