"""Hostile text for tests of files securevfl writes from the parties' data: IDs
that are spreadsheet formulas, quotes, commas, line breaks, NUL and unicode, and
what a spreadsheet would run as a formula."""

from __future__ import annotations

import re

HOSTILE_IDS = [
    "=1+1",
    "+1+cmd|' /C calc'!A0",
    "-2+3",
    "@SUM(1+1)",
    '=HYPERLINK("http://example.com/x","click")',
    "=cmd|' /C notepad'!'A1'",
    "\t=1+1",
    "\r=1+1",
    "\uff1d1+1",  # a full-width equals sign
    "'=1+1",  # already guarded by hand: must come back with its apostrophe
    "''x",
    "'",
    "a,b",
    'say "hi"',
    '"',
    "cr\rinside",
    "lf\ninside",
    "crlf\r\ninside",
    "trailing cr\r",
    "nul\x00inside",
    "ünïcødé 日本 🙂",
    "-5",  # a number: a spreadsheet reads it as one, nothing to guard
    "+1.5e3",
    "plain-id",
    " leading space",
    "",
]

#: what a spreadsheet runs as a formula (the text of a cell, as a spreadsheet reads the file)
FORMULA = re.compile(r"^[=+\-@\t\r\n\uff1d\uff0b\uff0d\uff20]")
NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
