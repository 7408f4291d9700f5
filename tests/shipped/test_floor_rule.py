"""Default suite: every floor of protocols/floors.toml is the one the runs written
beside it give by the rule of tests/shipped/floor_rule.py, so a floor moves only with
its runs; and the rule itself, on known numbers."""

from __future__ import annotations

import pytest

from tests.shipped.floor_rule import FEWEST_RUNS, false_alarm_rate, floor_from
from tests.shipped.test_shipped_protocols import FLOORS_FILE, read_floors


def test_every_floor_is_the_rule_over_its_runs():
    floors = [
        (name if label == "" else f"{name} {label}", floor)
        for name, entry in read_floors().items()
        for label, floor in (entry.items() if isinstance(entry, dict) else [("", entry)])
    ]
    assert len(floors) > 30, f"only {len(floors)} floors found"
    few = [f"{label}: {len(floor.runs)}" for label, floor in floors if len(floor.runs) < FEWEST_RUNS]
    assert not few, f"protocols/{FLOORS_FILE.name}: entries with fewer than {FEWEST_RUNS} runs: {few}"
    given = [(label, floor.bound, floor_from(floor.runs, floor.direction)) for label, floor in floors]
    off = [f"{label}: {bound} where its runs give {want}" for label, bound, want in given if bound != want]
    assert not off, f"protocols/{FLOORS_FILE.name}: floors off the rule (tests/shipped/floor_rule.py): {off}"


def test_the_floor_is_the_lowest_run_less_the_spread_or_five_points():
    assert floor_from([0.780, 0.833, 0.894, 0.84, 0.85]) == 0.666  # spread 0.114
    assert floor_from([0.993, 1.0, 0.993, 0.993, 0.993]) == 0.943  # spread 0.007: 0.05
    assert floor_from([0.5, 0.55, 0.52, 0.51, 0.53], "at_most") == 0.6  # RMSE: 0.55 + 0.05
    assert floor_from([0.2, 0.3, 0.25, 0.22, 0.28], "at_most") == 0.4


def test_the_rule_refuses_too_few_runs_and_an_unknown_direction():
    with pytest.raises(ValueError, match="at least 5 runs"):
        floor_from([0.9, 0.91, 0.92])
    with pytest.raises(ValueError, match="at_least or at_most"):
        floor_from([0.9] * 5, "above")


def test_the_whole_spread_fails_an_unchanged_run_far_less_often_than_half_of_it():
    """The simulation behind the rule (floors.toml's header; docs/benchmarks.md §11):
    ten runs from a normal law, a next run from the same law."""
    half, whole = false_alarm_rate(10, 0.5, trials=50_000), false_alarm_rate(10, 1.0, trials=50_000)
    assert 0.005 < half < 0.015, half
    assert whole < 0.002, whole
