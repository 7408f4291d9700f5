"""Default suite: ``python -m tests.shipped.add_runs`` reads a tier's summary as
tests/shipped/conftest.py prints it, adds each value to its entry's runs in
protocols/floors.toml, and sets the floors again by the rule, leaving the rest of
the file as it was."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from tests.shipped import add_runs
from tests.shipped.add_runs import FloorsFileError, Result, parse_summary
from tests.shipped.conftest import HEADER, Outcome, row
from tests.shipped.floor_rule import floor_from

FLOORS = """\
# a comment that stays

["a.yaml"]  # its own comment
metric = "test_accuracy"
at_least = 0.85
runs = [0.900, 0.910, 0.905, 0.920, 0.915]

["b.yaml"]
metric = "test_rmse"
at_most = 0.65
runs = [0.500, 0.550, 0.520, 0.510, 0.530]

["demo/comparison.yaml"]
metric = "test_accuracy"
at_least = {"x[eps=1]" = 0.7, "x[eps=2]" = 0.75}

["demo/comparison.yaml".runs]
# x[eps=1]: a comment between the lists
"x[eps=1]" = [0.800, 0.820, 0.810, 0.850, 0.830]
"x[eps=2]" = [
  0.850, 0.860, 0.870, 0.880, 0.890,
]
"""


def summary(*outcomes: Outcome) -> str:
    """A log with a tier's summary in it, printed by the tier's own code."""
    return "\n".join(
        [
            "...",
            "============= shipped protocols (load average now 4.03 4.53 4.52) ==============",
            HEADER,
            *map(row, outcomes),
            "files' own wall times together: 2352.5 s",
            "35 passed, 9 deselected in 1183.02s (0:19:43)",
        ]
    )


def outcome(file: str, value: float | None, metric: str = "test_accuracy") -> Outcome:
    return Outcome(
        file=file, metric=metric, floor=">= 0.85", value=value, seconds=20.0, how="compare: 7 reused"
    )


def test_the_summary_reads_back_as_the_tier_printed_it():
    log = summary(
        outcome("a.yaml", 0.87994),
        outcome("b.yaml", 0.49, "test_rmse"),
        outcome("demo/comparison.yaml x[eps=1]", 0.7),
        outcome("c.yaml", None),
    )
    assert parse_summary(log) == [
        Result("a.yaml", "", "test_accuracy", 0.880),
        Result("b.yaml", "", "test_rmse", 0.49),
        Result("demo/comparison.yaml", "x[eps=1]", "test_accuracy", 0.7),
        Result("c.yaml", "", "test_accuracy", None),
    ]
    assert parse_summary("no table here\n") == []
    broken = log.replace(row(outcome("b.yaml", 0.49, "test_rmse")), "b.yaml garbled")
    with pytest.raises(
        FloorsFileError, match=re.escape("line 5 of the summary is not a row of it: 'b.yaml garbled'")
    ):
        parse_summary(broken)


def test_values_join_their_runs_and_the_floors_follow_the_rule():
    results = parse_summary(
        summary(
            outcome("a.yaml", 0.912),  # inside the runs' range: the floor stays
            outcome("b.yaml", 0.600, "test_rmse"),  # above the highest: the bound rises
            outcome("demo/comparison.yaml x[eps=1]", 0.700),  # below the lowest: the floor falls
            outcome("demo/comparison.yaml x[eps=2]", None),
        )
    )
    text, said = add_runs.add_runs(FLOORS, results)
    doc = tomllib.loads(text)
    assert doc["a.yaml"]["runs"][-1] == 0.912 and doc["a.yaml"]["at_least"] == 0.85
    assert doc["b.yaml"]["at_most"] == floor_from([0.5, 0.55, 0.52, 0.51, 0.53, 0.6], "at_most") == 0.7
    ones = [0.8, 0.82, 0.81, 0.85, 0.83, 0.7]
    assert doc["demo/comparison.yaml"]["runs"]["x[eps=1]"] == ones
    assert doc["demo/comparison.yaml"]["at_least"] == {"x[eps=1]": floor_from(ones), "x[eps=2]": 0.75}
    assert said == [
        "b.yaml: 0.65 -> 0.7 (0.600 added to 5 runs)",
        "demo/comparison.yaml x[eps=1]: 0.7 -> 0.55 (0.700 added to 5 runs)",
        "demo/comparison.yaml x[eps=2]: did not run in this tier; nothing added",
    ]
    for kept in ("# a comment that stays", '["a.yaml"]  # its own comment', "# x[eps=1]: a comment between"):
        assert kept in text
    assert text.count("\n") == FLOORS.count("\n")  # the lists still fit their lines


def test_a_long_list_wraps_and_reads_back():
    results = [Result("a.yaml", "", "test_accuracy", 0.9)] * 12
    text, _ = add_runs.add_runs(FLOORS, results)
    assert tomllib.loads(text)["a.yaml"]["runs"] == [0.9, 0.91, 0.905, 0.92, 0.915] + [0.9] * 12
    assert max(len(line) for line in text.splitlines()) <= add_runs.WIDTH
    assert "runs = [\n  0.900, 0.910," in text


@pytest.mark.parametrize(
    ("result", "message"),
    [
        (Result("z.yaml", "", "test_accuracy", 0.9), "floors.toml has no entry 'z.yaml'"),
        (
            Result("a.yaml", "", "test_auc", 0.9),
            "a.yaml: the summary gives test_auc, floors.toml test_accuracy",
        ),
        (
            Result("demo/comparison.yaml", "x[eps=9]", "test_accuracy", 0.9),
            "no floor for 'demo/comparison.yaml x",
        ),
        (Result("a.yaml", "p", "test_accuracy", 0.9), "no floor for 'a.yaml p'"),
    ],
)
def test_a_result_with_no_entry_is_refused_by_name(result: Result, message: str):
    with pytest.raises(FloorsFileError, match=re.escape(message)):
        add_runs.add_runs(FLOORS, [result])


def test_the_command_writes_the_file_or_with_dry_run_only_says(tmp_path: Path, monkeypatch, capsys):
    floors, log = tmp_path / "floors.toml", tmp_path / "ci.log"
    floors.write_text(FLOORS)
    log.write_text(summary(outcome("demo/comparison.yaml x[eps=1]", 0.7)))
    monkeypatch.setattr(add_runs, "FLOORS_FILE", floors)
    assert add_runs.main(["--dry-run", str(log)]) == 0
    assert floors.read_text() == FLOORS
    assert "1 results added to floors.toml; 1 floors moved (dry run)" in capsys.readouterr().out
    assert add_runs.main([str(log)]) == 0
    assert tomllib.loads(floors.read_text())["demo/comparison.yaml"]["at_least"]["x[eps=1]"] == 0.55
    (tmp_path / "empty.log").write_text("nothing\n")
    assert add_runs.main([str(tmp_path / "empty.log")]) == 2
    assert "no tier summary" in capsys.readouterr().err
