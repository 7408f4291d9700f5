"""Criteo Display Advertising (Kaggle 2014) TSV, split for VFL (docs/methods/dravl.md §4.4).

The format has one record per line and 40 tab-separated fields: the click label
(0/1), 13 integer features I1..I13 (count-like; empty when missing; I2 can be
negative) and 26 hashed categorical features C1..C26 (8 hex digits; empty when
missing). Rows are in time order over 7 days; the spec's stream protocol cuts them
into 7 equal chunks by row order (``day``).

:func:`read_criteo` parses; :func:`split_criteo` writes the spec's party split as
two CSV files of *raw* fields, and :func:`criteo_protocol` the protocol that trains
on them, whose per-party ``preprocess`` entries (docs/design.md §12,
:mod:`securevfl.data.preprocess`) do the transforms the spec asks for:

* passive (the media platform): I1..I13 and C1..C13 (the spec's extended
  reconstruction target). ``signed_log1p`` on I1..I13 (``sign(x) log(1 + |x|)``),
  a missing count imputed as 0 with a ``missingindicator_`` column, and the
  one-hot top-k values of C1..C13 with an "other" column;
* active (the advertiser): the one-hot top-k values of C14..C26 (its wide part),
  the label, and ``day`` (not a feature).

Each party's transforms are fitted on its own aligned training rows only, saved
with its model, and applied unchanged to its test rows and at prediction time; an
empty categorical field is the category ``missing``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from securevfl.errors import DataError

DENSE = [f"I{i}" for i in range(1, 14)]
CATEGORICAL = [f"C{i}" for i in range(1, 27)]
FIELDS = ["label", *DENSE, *CATEGORICAL]
PASSIVE_CATEGORICAL = CATEGORICAL[:13]
ACTIVE_CATEGORICAL = CATEGORICAL[13:]


def _dense(value: str, field: str, line: int) -> float:
    if value == "":
        return math.nan
    try:
        return float(int(value))
    except ValueError:
        raise DataError(f"criteo line {line}: {field} is {value!r}, not an integer") from None


def read_criteo(path: Path | str, *, max_rows: int | None = None, days: int = 7) -> pd.DataFrame:
    """Parse a Criteo TSV into ``id, day, label, I1..I13, C1..C26`` (dense as
    floats with NaN for missing, categorical as strings, '' for missing). Errors
    name the line and the field."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"criteo: no file at {path}")
    rows: list[list[object]] = []
    with path.open(encoding="utf-8") as fh:
        for line_no, raw in enumerate(fh, start=1):
            if max_rows is not None and len(rows) >= max_rows:
                break
            parts = raw.rstrip("\n").rstrip("\r").split("\t")
            if len(parts) != len(FIELDS):
                raise DataError(
                    f"criteo line {line_no}: {len(parts)} tab-separated fields, expected {len(FIELDS)} "
                    "(label, I1..I13, C1..C26)"
                )
            if parts[0] not in ("0", "1"):
                raise DataError(f"criteo line {line_no}: label is {parts[0]!r}, expected 0 or 1")
            dense = [_dense(v, f, line_no) for v, f in zip(parts[1:14], DENSE, strict=True)]
            rows.append([int(parts[0]), *dense, *parts[14:]])
    if not rows:
        raise DataError(f"criteo: {path} holds no records")
    frame = pd.DataFrame(rows, columns=FIELDS)
    n = len(frame)
    frame.insert(0, "day", (np.arange(n) * days) // n)
    frame.insert(0, "id", [f"r{i}" for i in range(n)])
    return frame


def criteo_paths(out_dir: Path | str) -> dict[str, Path]:
    """Where :func:`split_criteo` writes each party's file under ``out_dir``."""
    out = Path(out_dir)
    return {"passive": out / "passive.csv", "active": out / "active.csv"}


def split_criteo(
    path: Path | str, out_dir: Path | str, *, max_rows: int | None = None, days: int = 7
) -> dict[str, Path]:
    """Write ``passive.csv`` (id, I1..I13, C1..C13) and ``active.csv`` (id, day,
    label, C14..C26) under ``out_dir``, raw fields as read (docs/methods/dravl.md §4.4's split);
    returns their paths. Categorical fields are written as text so that a hash
    such as ``00a1b2c3`` keeps its leading zeros."""
    frame = read_criteo(path, max_rows=max_rows, days=days)
    paths = criteo_paths(out_dir)
    paths["passive"].parent.mkdir(parents=True, exist_ok=True)
    passive = frame[["id", *DENSE, *PASSIVE_CATEGORICAL]].astype(dict.fromkeys(DENSE, "Int64"))
    passive.to_csv(paths["passive"], index=False)  # counts as integers, '' when missing
    frame[["id", "day", "label", *ACTIVE_CATEGORICAL]].to_csv(paths["active"], index=False)
    return paths


def criteo_preprocess(top_k: int, *, dense: list[str], categorical: list[str]) -> dict[str, Any]:
    """A party's ``preprocess`` entry for its Criteo fields: signed log of the
    counts with missing counts as 0 plus an indicator, one-hot top-``top_k`` of
    the categorical fields with an "other" column. Counts are not standardized (the
    signed log already brings them to a few units)."""
    if top_k < 1:
        raise DataError(f"criteo: top_k must be at least 1, got {top_k}")
    entry: dict[str, Any] = {
        "categorical": {"columns": categorical, "max_categories": top_k, "other": True},
        "standardize": False,
    }
    if dense:
        entry["signed_log1p"] = dense
        entry["impute"] = {"strategy": "constant", "fill_value": 0.0, "indicator": True, "columns": dense}
    return entry


def criteo_protocol(paths: dict[str, Path], *, top_k: int = 8, source: str = "") -> dict[str, Any]:
    """The protocol document that trains on :func:`split_criteo`'s files: the
    media platform passive, the advertiser active, each with its own
    :func:`criteo_preprocess` entry."""
    return {
        "name": "criteo",
        "description": f"Criteo split of {source or paths['passive'].parent}: media platform (passive) "
        "and advertiser (active)",
        "dataset": {"name": "csv", "test_fraction": 0.2},
        "parties": {
            "active": {
                "name": "advertiser",
                "source": {
                    "path": str(paths["active"]),
                    "label_column": "label",
                    "feature_columns": list(ACTIVE_CATEGORICAL),
                },
                "model": {"kind": "mlp", "hidden": [32], "out": 16},
                "preprocess": criteo_preprocess(top_k, dense=[], categorical=list(ACTIVE_CATEGORICAL)),
            },
            "passive": [
                {
                    "name": "media",
                    "source": {"path": str(paths["passive"])},
                    "model": {"kind": "mlp", "hidden": [64], "out": 16},
                    "preprocess": criteo_preprocess(
                        top_k, dense=list(DENSE), categorical=list(PASSIVE_CATEGORICAL)
                    ),
                }
            ],
        },
        "exchange": {"backend": "plain"},
        "interactive": {"out": 16},
        "training": {"epochs": 5, "batch_size": 64, "lr": 0.003, "optimizer": "adam", "seed": 0},
    }
