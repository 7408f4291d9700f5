"""Criteo Display Advertising (Kaggle 2014) TSV, split for VFL (spec 002 §4.4).

The format has one record per line and 40 tab-separated fields: the click label
(0/1), 13 integer features I1..I13 (count-like; empty when missing; I2 can be
negative) and 26 hashed categorical features C1..C26 (8 hex digits; empty when
missing). Rows are in time order over 7 days; the spec's stream protocol cuts them
into 7 equal chunks by row order (``day``).

:func:`read_criteo` parses and transforms; :func:`split_criteo` writes the spec's
party split as two CSV files that ``dataset: {name: csv}`` protocols read:

* passive (the media platform): I1..I13, each ``sign(x) log(1 + |x|)`` with a
  missing value as 0 and a ``_missing`` indicator, plus the one-hot top-k values of
  C1..C13 (the spec's extended reconstruction target);
* active (the advertiser): the one-hot top-k values of C14..C26 (its wide part),
  the label, and ``day`` (not a feature unless listed).

Each party encodes only its own fields, from its own file, so the split needs no
data from the other side. The top-k vocabulary is computed on the file being
split (a deployment would fix it on a training window).
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

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


def dense_transform(x: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """``sign(x) log(1 + |x|)`` (heavy-tailed counts; I2 can be negative) with
    missing values set to 0, and the missing indicator."""
    v = x.to_numpy(dtype=np.float64)
    missing = np.isnan(v)
    out = np.sign(v) * np.log1p(np.abs(v))
    out[missing] = 0.0
    return out, missing.astype(np.float64)


def one_hot_top(values: pd.Series, field: str, k: int) -> pd.DataFrame:
    """One column per the ``k`` most frequent non-missing values (ties by value),
    plus ``<field>_other`` for the rest and for missing."""
    counts = Counter(v for v in values if v != "")
    top = [v for v, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:k]]
    cols = {f"{field}_{v}": (values == v).to_numpy(dtype=np.float64) for v in top}
    cols[f"{field}_other"] = (~values.isin(top)).to_numpy(dtype=np.float64)
    return pd.DataFrame(cols, index=values.index)


def passive_table(frame: pd.DataFrame, top_k: int) -> pd.DataFrame:
    parts: dict[str, np.ndarray] = {}
    for f in DENSE:
        parts[f], parts[f"{f}_missing"] = dense_transform(frame[f])
    out = pd.DataFrame({"id": frame["id"], **parts})
    hots = [one_hot_top(frame[f], f, top_k) for f in PASSIVE_CATEGORICAL]
    return pd.concat([out, *hots], axis=1)


def active_table(frame: pd.DataFrame, top_k: int) -> pd.DataFrame:
    hots = [one_hot_top(frame[f], f, top_k) for f in ACTIVE_CATEGORICAL]
    return pd.concat([frame[["id", "day", "label"]], *hots], axis=1)


def split_criteo(
    path: Path | str, out_dir: Path | str, *, top_k: int = 8, max_rows: int | None = None, days: int = 7
) -> dict[str, Path]:
    """Write ``passive.csv`` and ``active.csv`` (spec 002 §4.4's split) under
    ``out_dir``; returns their paths. The active file's features are the
    ``C14_..`` to ``C26_..`` one-hot columns (list them as its ``feature_columns``;
    ``day`` is for per-day reporting)."""
    if top_k < 1:
        raise DataError(f"criteo: top_k must be at least 1, got {top_k}")
    frame = read_criteo(path, max_rows=max_rows, days=days)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"passive": out / "passive.csv", "active": out / "active.csv"}
    passive_table(frame, top_k).to_csv(paths["passive"], index=False)
    active_table(frame, top_k).to_csv(paths["active"], index=False)
    return paths


def active_feature_columns(active_csv: Path | str) -> list[str]:
    """The active file's feature columns (its C14..C26 one-hots)."""
    header = Path(active_csv).read_text(encoding="utf-8").splitlines()[0].split(",")
    return [c for c in header if c not in ("id", "day", "label")]
