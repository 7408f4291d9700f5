"""Loading one party's own file, validating it, and local preprocessing.

A party reads only the columns that are its own: passive parties never read a
label column (their sources have none), and the active party reads only its ID,
label and (optional) own feature columns.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch

from securevfl.config import CsvSource
from securevfl.errors import DataError, DataWarning

FLOAT32_MAX = float(np.finfo(np.float32).max)
MIN_ROWS_PER_CLASS = 10  # a label column with more classes than n/10 is warned about


@dataclass
class PartyData:
    """A party's rows after loading: IDs, its feature matrix, labels if active."""

    party: str
    ids: list[str]
    columns: list[str]
    x: np.ndarray  # (n, d) float32; d may be 0 for a label-only active party
    y: np.ndarray | None = None  # int64 class indices (active party only)
    classes: list[str] | None = None

    def take(self, order: np.ndarray) -> PartyData:
        """Rows in the given order (after alignment)."""
        return PartyData(
            self.party,
            [self.ids[i] for i in order],
            self.columns,
            self.x[order],
            None if self.y is None else self.y[order],
            self.classes,
        )


def _read_csv(path: str, party: str, **kwargs: Any) -> pd.DataFrame:
    """Read a party's CSV strictly: a row with more fields than the header is an
    error (pandas would otherwise drop the extra fields, or silently turn the ID
    column into the index when every row has one field too many)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", pd.errors.ParserWarning)
            return pd.read_csv(path, index_col=False, **kwargs)
    except FileNotFoundError:
        raise DataError(
            f"party '{party}': its data file was not found", detail=f"no file at {path}"
        ) from None
    except (pd.errors.ParserError, pd.errors.ParserWarning) as exc:
        raise DataError(
            f"party '{party}': a row of its CSV file has more fields than the header",
            detail=f"{path}: {str(exc).strip()}",
        ) from None
    except (UnicodeDecodeError, pd.errors.EmptyDataError, ValueError, OSError) as exc:
        raise DataError(
            f"party '{party}': its data file is not a readable CSV file",
            detail=f"{path}: {type(exc).__name__}: {str(exc).strip()}",
        ) from None


def _first_rows(mask: np.ndarray, ids: pd.Series, k: int = 3) -> str:
    """The owner-only detail for rows flagged in ``mask``: their CSV line numbers
    (header is line 1) and IDs."""
    rows = np.flatnonzero(mask)[:k]
    return ", ".join(f"line {int(r) + 2} (ID {ids.iloc[int(r)]!r})" for r in rows)


def load_party_data(source: CsvSource, party: str, *, is_active: bool) -> PartyData:
    """Read and validate a party's own CSV.

    Public error messages name the party, the column and a count; the first
    offending lines and IDs go to :attr:`DataError.detail`, which stays with the
    owner (see :class:`~securevfl.errors.DataError`)."""
    frame = _read_csv(source.path, party, dtype={source.id_column: str}, keep_default_na=True)
    header = list(frame.columns)
    if source.id_column not in header:
        raise DataError(
            f"party '{party}': ID column '{source.id_column}' is not in its data file",
            detail=f"columns of {source.path}: {header[:20]}",
        )
    label = source.label_column if is_active else None
    if is_active and label is None:
        raise DataError(f"party '{party}': the active party needs a label_column")
    if label is not None and label not in header:
        raise DataError(f"party '{party}': label column '{label}' is not in its data file")
    if source.feature_columns is not None:
        missing = [c for c in source.feature_columns if c not in header]
        if missing:
            raise DataError(f"party '{party}': feature columns {missing[:5]} are not in its data file")
        feats = list(source.feature_columns)
    elif is_active:
        feats = []  # the active party's own features must be listed explicitly
    else:
        feats = [c for c in header if c != source.id_column]
    if not is_active and not feats:
        raise DataError(f"party '{party}': its data file has no feature columns")
    if frame.empty:
        raise DataError(
            f"party '{party}': its data file has a header but no rows", detail=f"{source.path} is empty"
        )

    ids = frame[source.id_column]
    missing_id = ids.isna().to_numpy()
    if missing_id.any():
        rows = ", ".join(f"line {int(r) + 2}" for r in np.flatnonzero(missing_id)[:3])
        raise DataError(
            f"party '{party}': missing ID in column '{source.id_column}' on {int(missing_id.sum())} rows",
            detail=f"first at {rows} of {source.path}",
        )
    dup = ids.duplicated(keep=False).to_numpy()
    if dup.any():
        n_dup = int(ids[dup].nunique())
        raise DataError(
            f"party '{party}': {n_dup} duplicate IDs in column '{source.id_column}' "
            "(each occurs more than once)",
            detail=f"first at {_first_rows(dup, ids)} of {source.path}",
        )
    x = frame[feats]
    non_numeric = [c for c in feats if not pd.api.types.is_numeric_dtype(x[c])]
    if non_numeric:
        raise DataError(f"party '{party}': non-numeric feature columns {non_numeric[:5]}")
    xv = x.to_numpy(dtype=np.float64)
    bad = ~np.isfinite(xv) | (np.abs(np.nan_to_num(xv)) > FLOAT32_MAX)
    if bad.any():
        cols = [feats[c] for c in np.flatnonzero(bad.any(axis=0))]
        raise DataError(
            f"party '{party}': {int(bad.sum())} missing, infinite or float32-overflowing values in "
            f"columns {cols[:5]} (impute or drop such rows before training)",
            detail=f"first at {_first_rows(bad.any(axis=1), ids)} of {source.path}",
        )
    y = classes = None
    if label:
        lab = frame[label]
        missing_label = lab.isna().to_numpy()
        if missing_label.any():
            raise DataError(
                f"party '{party}': missing label in column '{label}' on {int(missing_label.sum())} rows",
                detail=f"first at {_first_rows(missing_label, ids)} of {source.path}",
            )
        uniq = sorted(lab.unique().tolist())
        if len(uniq) < 2:
            raise DataError(f"party '{party}': label column '{label}' has fewer than 2 classes")
        if len(uniq) > max(2, len(lab) // MIN_ROWS_PER_CLASS):
            warnings.warn(
                DataWarning(
                    f"party '{party}': label column '{label}' has {len(uniq)} distinct values in "
                    f"{len(lab)} rows (more than one class per {MIN_ROWS_PER_CLASS} rows): is it a "
                    "continuous target or an ID? securevfl trains a classifier with one class per value"
                ),
                stacklevel=2,
            )
        index = {v: i for i, v in enumerate(uniq)}
        y = lab.map(index).to_numpy(dtype=np.int64)
        classes = [str(v) for v in uniq]
    return PartyData(party, ids.tolist(), feats, xv.astype(np.float32), y, classes)


def split_indices(n: int, test_fraction: float, gen) -> tuple[np.ndarray, np.ndarray]:
    """The agreed train/test split of the aligned rows (same on every rank)."""
    perm = torch.randperm(n, generator=gen).numpy()
    n_test = max(1, round(n * test_fraction))
    if n - n_test < 1:
        raise DataError(f"only {n} aligned rows: too few to split into train and test")
    return np.sort(perm[n_test:]), np.sort(perm[:n_test])


def check_test_rows(party: str, n_test: int, classes: list[str] | None) -> None:
    """Refuse a split whose test rows cannot hold one row per class: the test
    accuracy would silently ignore whole classes (raise ``dataset.test_fraction``)."""
    if classes is not None and n_test < len(classes):
        raise DataError(
            f"party '{party}': the test split holds {n_test} rows, fewer than the {len(classes)} "
            "classes of the label column; raise dataset.test_fraction or use more rows"
        )


def standardize(x_train: np.ndarray, x_test: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Party-local z-scoring with training-row statistics; constant columns keep
    scale 1."""
    mu = x_train.mean(axis=0, keepdims=True)
    sd = x_train.std(axis=0, keepdims=True)
    sd[sd < 1e-12] = 1.0
    return ((x_train - mu) / sd).astype(np.float32), ((x_test - mu) / sd).astype(np.float32)
