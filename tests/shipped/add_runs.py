"""Add a tier's results to the runs of protocols/floors.toml and set each floor
again by the rule (tests/shipped/floor_rule.py).

    python -m tests.shipped.add_runs LOG [LOG ...]        # rewrites floors.toml
    python -m tests.shipped.add_runs --dry-run LOG        # only says what would move

LOG is any text holding the tier's terminal summary (``make test-shipped``, or the
output of ``.ci/run``): the table under the "shipped protocols" line that
tests/shipped/conftest.py prints, one line per file or comparison grid point. Each
value goes to the end of its entry's ``runs``, rounded to three decimals as the runs
are written, and the entry's bound becomes what the rule gives over the longer list;
comments and every other line of the file stay as they are. A floor only ever stays
or moves away from the runs (a new value inside the runs' range changes nothing, one
outside widens the spread), so adding a tier cannot make the next one fail.

Add every tier of unchanged code, the low values with the high ones: a floor set
from a chosen subset of runs fails more often than the rule says. A file whose run
failed prints ``-`` and adds nothing; the command names it.
"""

from __future__ import annotations

import argparse
import re
import sys
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from tests.shipped.conftest import HEADER
from tests.shipped.floor_rule import floor_from
from tests.support.protocols import PROTOCOLS

FLOORS_FILE = PROTOCOLS / "floors.toml"
#: the summary's header line and its last line (tests/shipped/conftest.py)
SUMMARY_START = re.compile(r"^=+ shipped protocols \(")
SUMMARY_END = "files' own wall times together"
#: one line of the summary: label, metric, value ("-" if the run failed), floor, seconds, how
ROW = re.compile(
    r"^(?P<label>\S.*?)\s+(?P<metric>test_\w+)\s+(?P<value>-|-?\d+(?:\.\d+)?)\s+"
    r"(?P<direction>>=|<=)\s*(?P<bound>-?\d+(?:\.\d+)?)\s+(?P<seconds>\d+(?:\.\d+)?)\s+\S"
)
#: the runs' list on one line up to this width; longer lists wrap as b3's does
WIDTH = 100


class FloorsFileError(ValueError):
    """A summary or floors.toml this command cannot use; the message names the line or entry."""


@dataclass(frozen=True)
class Result:
    """One line of a tier's summary: ``name`` is the floors.toml entry, ``point`` the
    comparison grid point ("" for a file's own floor), ``value`` None if it did not run."""

    name: str
    point: str
    metric: str
    value: float | None

    @property
    def label(self) -> str:
        return f"{self.name} {self.point}".strip()


def parse_summary(text: str) -> list[Result]:
    """Every row of every tier summary in ``text``, in order."""
    results: list[Result] = []
    inside = False
    for number, line in enumerate(text.splitlines(), 1):
        if SUMMARY_START.match(line):
            inside = True
            continue
        if not inside or line.rstrip() == HEADER.rstrip() or not line.strip():
            continue
        if line.startswith(SUMMARY_END):
            inside = False
            continue
        row = ROW.match(line)
        if row is None:
            raise FloorsFileError(f"line {number} of the summary is not a row of it: {line!r}")
        name, _, point = row["label"].partition(" ")
        value = None if row["value"] == "-" else round(float(row["value"]), 3)
        results.append(Result(name, point.strip(), row["metric"], value))
    return results


def _list(prefix: str, values: Iterable[float]) -> str:
    """``prefix = [a, b, ...]`` on one line, or wrapped two spaces in where longer than :data:`WIDTH`."""
    items = [f"{v:.3f}" for v in values]
    one = f"{prefix} = [{', '.join(items)}]"
    if len(one) <= WIDTH:
        return one
    lines, line = [], ""
    for item in items:
        piece = f"{item},"
        if line and len(line) + 1 + len(piece) > WIDTH - 2:
            lines.append(line)
            line = ""
        line = f"{line} {piece}" if line else piece
    lines.append(line)
    return "\n".join([f"{prefix} = [", *(f"  {x}" for x in lines), "]"])


def _table_span(lines: list[str], header: str) -> tuple[int, int]:
    """[start, end) of the table whose header line is ``header`` (a comment may follow it)."""
    starts = [i for i, line in enumerate(lines) if line.split("#")[0].strip() == header]
    if len(starts) != 1:
        raise FloorsFileError(f"floors.toml has {len(starts)} tables {header}, not one")
    start = starts[0]
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("[")), len(lines))
    return start, end


def _replace_value(lines: list[str], span: tuple[int, int], key: str, new: str) -> None:
    """Replace ``key = ...`` (a one-line value or a list over several lines) inside ``span``."""
    pattern = re.compile(rf"^{re.escape(key)}\s*=")
    found = [i for i in range(*span) if pattern.match(lines[i])]
    if len(found) != 1:
        raise FloorsFileError(f"floors.toml: {key} appears {len(found)} times in its table, not once")
    first = last = found[0]
    if lines[first].rstrip().endswith("["):
        last = next(i for i in range(first, span[1]) if lines[i].strip() == "]")
    lines[first : last + 1] = new.split("\n")


def _direction(entry: dict) -> str:
    """Which bound an entry holds: ``at_least`` (accuracy, R^2) or ``at_most`` (an error)."""
    return "at_least" if "at_least" in entry else "at_most"


def add_runs(text: str, results: Iterable[Result]) -> tuple[str, list[str]]:
    """floors.toml's ``text`` with each result added to its entry's runs and the
    bounds set again by the rule; and a line per floor that moved or result skipped."""
    doc = tomllib.loads(text)
    said: list[str] = []
    touched: dict[tuple[str, str], bool] = {}  # (entry, grid point) -> its bound moved
    for r in results:
        if r.value is None:
            said.append(f"{r.label}: did not run in this tier; nothing added")
            continue
        entry = doc.get(r.name)
        if entry is None:
            raise FloorsFileError(f"floors.toml has no entry '{r.name}' (from the summary line of {r.label})")
        if entry["metric"] != r.metric:
            raise FloorsFileError(f"{r.label}: the summary gives {r.metric}, floors.toml {entry['metric']}")
        if isinstance(entry["runs"], dict) != bool(r.point) or (r.point and r.point not in entry["runs"]):
            raise FloorsFileError(f"floors.toml's '{r.name}' has no floor for '{r.label}'")
        direction = _direction(entry)
        runs = entry["runs"][r.point] if r.point else entry["runs"]
        bounds = entry[direction] if r.point else entry
        key = r.point or direction
        runs.append(r.value)
        before, bounds[key] = bounds[key], floor_from(runs, direction)
        touched[(r.name, r.point)] = touched.get((r.name, r.point), False) or bounds[key] != before
        if bounds[key] != before:
            said.append(
                f"{r.label}: {before:g} -> {bounds[key]:g} ({r.value:.3f} added to {len(runs) - 1} runs)"
            )
    return _write(text, doc, touched), said


def _write(text: str, doc: dict, touched: dict[tuple[str, str], bool]) -> str:
    """``text`` with the runs of each touched (entry, grid point) as ``doc`` holds
    them, and the bound too where it moved."""
    lines = text.split("\n")
    for (name, point), moved in touched.items():
        entry = doc[name]
        direction = _direction(entry)
        span = _table_span(lines, f'["{name}"]')
        if point:
            if moved:
                bounds = ", ".join(f'"{k}" = {v:g}' for k, v in entry[direction].items())
                _replace_value(lines, span, direction, f"{direction} = {{{bounds}}}")
            runs_span = _table_span(lines, f'["{name}".runs]')
            _replace_value(lines, runs_span, f'"{point}"', _list(f'"{point}"', entry["runs"][point]))
        else:
            if moved:
                _replace_value(lines, span, direction, f"{direction} = {entry[direction]:g}")
            _replace_value(lines, span, "runs", _list("runs", entry["runs"]))
    new = "\n".join(lines)
    if tomllib.loads(new) != doc:
        raise FloorsFileError("floors.toml would not read back as written; nothing was changed")
    return new


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.shipped.add_runs", description=__doc__.split("\n")[0]
    )
    parser.add_argument("logs", nargs="+", type=Path, help="text holding a tier's summary table")
    parser.add_argument("--dry-run", action="store_true", help="say what would move; write nothing")
    args = parser.parse_args(argv)
    try:
        results = [r for log in args.logs for r in parse_summary(log.read_text(errors="replace"))]
        if not results:
            raise FloorsFileError(
                f"no tier summary ('shipped protocols' table) in {[str(p) for p in args.logs]}"
            )
        text = FLOORS_FILE.read_text()
        new, said = add_runs(text, results)
    except (OSError, FloorsFileError) as exc:
        print(f"add_runs: {exc}", file=sys.stderr)
        return 2
    for line in said:
        print(line)
    added = sum(r.value is not None for r in results)
    moved = sum("->" in line for line in said)
    print(
        f"{added} results added to {FLOORS_FILE.name}; {moved} floors moved"
        + (" (dry run)" if args.dry_run else "")
    )
    if not args.dry_run and new != text:
        FLOORS_FILE.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
