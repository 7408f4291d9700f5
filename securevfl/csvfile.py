"""CSV files securevfl writes from data it did not author (``predictions.csv``,
a comparison's ``compare.csv`` and ``runs.csv``), written so that a spreadsheet
runs nothing in them and every cell reads back as it was.

**Formulas.** A spreadsheet evaluates a cell whose text starts with ``=``, ``+``,
``-`` or ``@`` (and, in some, a tab, a carriage return, a line feed or their
full-width forms, U+FF1D, U+FF0B, U+FF0D and U+FF20): an ID such as ``=HYPERLINK(...)`` or
``+1+cmd|' /C calc'!A0`` in a file a person opens would run (CSV injection,
OWASP). Such a text cell is written with one apostrophe in front (``'=1+1``),
which spreadsheets show as the text ``=1+1`` and never evaluate. A cell that is
a plain decimal number (``-2``, ``+1.5e3``) is a number to a spreadsheet, not a
formula, and is written as it is. So that the scheme reverses exactly, a text
cell that itself starts with an apostrophe gets one more (``'x`` is written
``''x``); a reader removes one leading apostrophe from every text cell
(:func:`unguard`), as :func:`read_rows` and ``api.predict(...).frame`` do. Header
cells are treated the same way.

**Quoting.** Cells are quoted as RFC 4180 says (a cell holding a comma, a quote,
a carriage return or a line feed is quoted, quotes doubled) and rows end with
CRLF, so a carriage return inside an ID is quoted too (Python's ``csv`` quotes a
carriage return only when the row terminator holds one). NUL and any other
character are written as they are, UTF-8.
"""

from __future__ import annotations

import csv
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

#: what makes a spreadsheet read a cell as a formula (or as the start of one)
FORMULA_START = ("=", "+", "-", "@", "\t", "\r", "\n", "\uff1d", "\uff0b", "\uff0d", "\uff20")
GUARD = "'"
_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
_INTEGER = re.compile(r"[+-]?\d+")
_SPECIAL = frozenset({"nan", "inf", "-inf"})  # how csv writes the non-finite floats


def needs_guard(cell: str) -> bool:
    """Whether a text cell is written with :data:`GUARD` in front: it could start a
    formula, or it starts with the guard itself (so that :func:`unguard` reverses
    :func:`guard` for every text)."""
    if cell.startswith(GUARD):
        return True
    return cell.startswith(FORMULA_START) and _NUMBER.fullmatch(cell) is None


def guard(cell: str) -> str:
    """The text as written to the file: :data:`GUARD` in front when :func:`needs_guard`."""
    return GUARD + cell if needs_guard(cell) else cell


def unguard(cell: str) -> str:
    """The text a cell of the file holds: one leading :data:`GUARD` removed."""
    return cell[1:] if cell.startswith(GUARD) else cell


def _cell(value: Any) -> Any:
    """A value as the writer takes it: numbers, booleans and empty cells (None) as
    they are (``csv`` writes floats with ``repr``, so a float reads back equal);
    anything else as its text, guarded."""
    if value is None or isinstance(value, int | float):
        return value
    return guard(str(value))


def write_rows(path: Path, header: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    """Write a CSV file atomically (a temporary file beside it, then renamed): the
    header, then the rows, every text cell guarded (:func:`guard`)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8", newline="") as fh:
            w = csv.writer(fh, lineterminator="\r\n")
            w.writerow([guard(str(h)) for h in header])
            for row in rows:
                w.writerow([_cell(v) for v in row])
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_dicts(path: Path, table: Sequence[dict[str, Any]]) -> None:
    """:func:`write_rows` for rows given as mappings: the columns are every key, in
    the order first seen; a row without a key leaves that cell empty."""
    fields = list(dict.fromkeys(k for row in table for k in row))
    write_rows(path, fields, ([row.get(k) for k in fields] for row in table))


def read_rows(path: Path) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of a file :func:`write_rows` wrote, every cell as the text it
    holds (guards removed, numbers as their text)."""
    with open(path, encoding="utf-8", newline="") as fh:
        reader = csv.reader(fh)
        header = [unguard(c) for c in next(reader, [])]
        rows = [[unguard(c) for c in row] for row in reader]
    return header, rows


def typed(cells: Sequence[str]) -> list[Any]:
    """A column read back: integers when every cell is one, floats when every cell
    is a number (``nan``, ``inf`` included: how ``csv`` writes them), else the texts.
    A float written by :func:`write_rows` reads back equal (``repr`` and ``float``
    round-trip)."""
    if cells and all(_INTEGER.fullmatch(c) for c in cells):
        return [int(c) for c in cells]
    if cells and all(_NUMBER.fullmatch(c) or c in _SPECIAL for c in cells):
        return [float(c) for c in cells]
    return list(cells)
