"""Strict JSON for the files a run writes (``result.json``, ``compare.json``,
``prediction.json``, a model's prediction ledger, each rank's summary and own
report): one rule for numbers that JSON has no spelling for, in one place.

Python's :mod:`json` writes ``Infinity`` and ``NaN``, which no JSON parser but
Python's and JavaScript's ``eval`` accepts (RFC 8259 §6). Here a float that is
not finite is written as a value JSON has:

- ``+inf`` / ``-inf`` as the strings ``"Infinity"`` / ``"-Infinity"`` (an
  unbounded privacy loss is ``epsilon = inf``: a value, not a missing one);
- ``NaN`` as ``null`` (no value: a metric that could not be computed).

:func:`loads` reads both spellings of infinity back as floats (the strings, and
the bare ``Infinity`` an older securevfl wrote), so a record read and written again
is the same file; a string value spelled exactly ``"Infinity"`` reads back as the
number.
"""

from __future__ import annotations

import json
import math
from typing import Any

#: how +inf and -inf are written
POS_INF, NEG_INF = "Infinity", "-Infinity"


def finite(value: Any) -> Any:
    """``value`` with every non-finite float replaced by its JSON spelling above
    (dicts, lists and tuples walked; anything else as it is)."""
    if isinstance(value, float):
        if math.isnan(value):
            return None
        if math.isinf(value):
            return POS_INF if value > 0 else NEG_INF
        return value
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def dumps(value: Any, **kwargs: Any) -> str:
    """``json.dumps`` of :func:`finite` ``(value)`` that refuses anything still not
    JSON (``allow_nan=False``)."""
    return json.dumps(finite(value), allow_nan=False, **kwargs)


def _numbers(value: Any) -> Any:
    if isinstance(value, str):
        return math.inf if value == POS_INF else -math.inf if value == NEG_INF else value
    if isinstance(value, dict):
        return {k: _numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_numbers(v) for v in value]
    return value


def loads(text: str | bytes) -> Any:
    """A file :func:`dumps` wrote, with its infinities as floats again."""
    return _numbers(json.loads(text))
