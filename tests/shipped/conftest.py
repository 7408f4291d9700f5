"""The shipped-protocol tier's record: each test reports its file's metric, floor
and wall time, and the terminal summary lists them (the CI log keeps the table;
``python -m tests.shipped.add_runs LOG`` adds its values to protocols/floors.toml)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import pytest


@dataclass(frozen=True)
class Outcome:
    file: str
    metric: str
    floor: str
    value: float | None
    seconds: float
    how: str


OUTCOMES = pytest.StashKey[list[Outcome]]()
#: the summary's column header (tests/shipped/add_runs.py skips this line)
HEADER = f"{'file':38} {'metric':14} {'value':>8} {'floor':>9} {'seconds':>8}  how"


def row(o: Outcome) -> str:
    """One line of the summary (tests/shipped/add_runs.py reads these back)."""
    value = "-" if o.value is None else f"{o.value:.4f}"
    return f"{o.file:38} {o.metric:14} {value:>8} {o.floor:>9} {o.seconds:8.1f}  {o.how}"


@pytest.fixture
def record(request: pytest.FixtureRequest) -> Callable[..., None]:
    """``record(file=, metric=, floor=, value=, seconds=, how=)``: one line of the summary."""
    outcomes = request.config.stash.setdefault(OUTCOMES, [])
    return lambda **kw: outcomes.append(Outcome(**kw))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    outcomes = config.stash.get(OUTCOMES, [])
    if not outcomes:
        return
    tr = terminalreporter
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    tr.write_sep("=", f"shipped protocols (load average now {load})")
    tr.write_line(HEADER)
    for o in outcomes:
        tr.write_line(row(o))
    runs = {(o.how, o.seconds) for o in outcomes}  # a comparison's rows share one run
    tr.write_line(f"files' own wall times together: {sum(s for _, s in runs):.1f} s")
