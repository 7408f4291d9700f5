"""Loading one party's own file, validating it, and local preprocessing.

A party reads only the columns that are its own: passive parties never read a
label column (their sources have none), and the active party reads only its ID,
label and (optional) own feature columns.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from securevfl.config import CsvSource
from securevfl.errors import DataError


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


def _header(path: str, party: str) -> list[str]:
    try:
        return list(pd.read_csv(path, nrows=0).columns)
    except FileNotFoundError:
        raise DataError(f"party '{party}': data file not found: {path}") from None
    except Exception as exc:
        raise DataError(f"party '{party}': cannot read CSV {path}: {exc}") from None


def load_party_data(source: CsvSource, party: str, *, is_active: bool) -> PartyData:
    """Read and validate a party's own CSV. Errors name the party, the column and
    the first offending ID or line."""
    header = _header(source.path, party)
    if source.id_column not in header:
        raise DataError(f"party '{party}': ID column '{source.id_column}' not in {source.path}")
    label = source.label_column if is_active else None
    if is_active and label is None:
        raise DataError(f"party '{party}': the active party needs a label_column")
    if label is not None and label not in header:
        raise DataError(f"party '{party}': label column '{label}' not in {source.path}")
    if source.feature_columns is not None:
        missing = [c for c in source.feature_columns if c not in header]
        if missing:
            raise DataError(f"party '{party}': feature columns {missing[:5]} not in {source.path}")
        feats = list(source.feature_columns)
    elif is_active:
        feats = []  # the active party's own features must be listed explicitly
    else:
        feats = [c for c in header if c != source.id_column]
    if not is_active and not feats:
        raise DataError(f"party '{party}': no feature columns in {source.path}")
    usecols = [source.id_column, *feats] + ([label] if label else [])
    frame = pd.read_csv(source.path, usecols=usecols, dtype={source.id_column: str}, keep_default_na=True)

    ids = frame[source.id_column]
    if ids.isna().any():
        line = int(np.flatnonzero(ids.isna().to_numpy())[0]) + 2
        raise DataError(f"party '{party}': missing ID in column '{source.id_column}' at line {line}")
    dup = ids[ids.duplicated()]
    if len(dup):
        raise DataError(
            f"party '{party}': duplicate IDs in column '{source.id_column}', e.g. {sorted(set(dup))[:3]}"
        )
    x = frame[feats]
    non_numeric = [c for c in feats if not pd.api.types.is_numeric_dtype(x[c])]
    if non_numeric:
        raise DataError(f"party '{party}': non-numeric feature columns {non_numeric[:5]}")
    xv = x.to_numpy(dtype=np.float64)
    if xv.size and not np.isfinite(xv).all():
        r, c = np.argwhere(~np.isfinite(xv))[0]
        raise DataError(
            f"party '{party}': NaN or infinite value in column '{feats[c]}' at ID '{ids.iloc[r]}'"
            " (impute or drop such rows before training)"
        )
    y = classes = None
    if label:
        lab = frame[label]
        if lab.isna().any():
            r = int(np.flatnonzero(lab.isna().to_numpy())[0])
            raise DataError(f"party '{party}': missing label in '{label}' at ID '{ids.iloc[r]}'")
        uniq = sorted(lab.unique().tolist())
        if len(uniq) < 2:
            raise DataError(f"party '{party}': label column '{label}' has fewer than 2 classes")
        index = {v: i for i, v in enumerate(uniq)}
        y = lab.map(index).to_numpy(dtype=np.int64)
        classes = [str(v) for v in uniq]
    return PartyData(party, ids.tolist(), feats, xv.astype(np.float32), y, classes)


def split_indices(n: int, test_fraction: float, gen) -> tuple[np.ndarray, np.ndarray]:
    """The agreed train/test split of the aligned rows (same on every rank)."""
    import torch

    perm = torch.randperm(n, generator=gen).numpy()
    n_test = max(1, round(n * test_fraction))
    if n - n_test < 1:
        raise DataError(f"only {n} aligned rows: too few to split into train and test")
    return np.sort(perm[n_test:]), np.sort(perm[:n_test])


def standardize(x_train: np.ndarray, x_test: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Party-local z-scoring with training-row statistics; constant columns keep
    scale 1."""
    mu = x_train.mean(axis=0, keepdims=True)
    sd = x_train.std(axis=0, keepdims=True)
    sd[sd < 1e-12] = 1.0
    return ((x_train - mu) / sd).astype(np.float32), ((x_test - mu) / sd).astype(np.float32)
