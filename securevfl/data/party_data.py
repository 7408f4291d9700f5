"""Loading one party's own file, validating it, and local preprocessing.

A party reads only the columns that are its own: passive parties never read a
label column (their sources have none), and the active party reads only its ID,
label and (optional) own feature columns.
"""

from __future__ import annotations

import csv
import io
import os
import warnings
from collections import Counter
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np
import pandas as pd
import torch

from securevfl.config import CsvSource, PreprocessSpec, TaskKind
from securevfl.data.columns import check_standardize
from securevfl.data.preprocess import categorical_columns, check_declared, imputed_columns
from securevfl.errors import DataError, DataWarning
from securevfl.regular_files import NotRegularFile, open_regular

FLOAT32_MAX = float(np.finfo(np.float32).max)
MIN_ROWS_PER_CLASS = 10  # a label column with more classes than n/10 is warned about


@dataclass
class PartyData:
    """A party's rows after loading: IDs, its feature matrix, labels if active.

    With a ``preprocess`` entry the raw feature columns are kept in ``frame`` and
    ``x`` is filled in only once the preprocessing is fitted on the training rows
    (:func:`securevfl.parties.common.prepare`)."""

    party: str
    ids: list[str]
    columns: list[str]
    x: np.ndarray  # (n, d) float32; d may be 0 for a label-only active party
    y: np.ndarray | None = None  # int64 class indices, or float32 targets (regression)
    classes: list[str] | None = None  # None for a regression task
    task: TaskKind | None = None  # the active party's task, declared or inferred
    frame: pd.DataFrame | None = None  # raw feature columns awaiting preprocessing

    def take(self, order: np.ndarray) -> PartyData:
        """Rows in the given order (after alignment)."""
        return PartyData(
            self.party,
            [self.ids[i] for i in order],
            self.columns,
            self.x[order],
            None if self.y is None else self.y[order],
            self.classes,
            self.task,
            None if self.frame is None else self.frame.iloc[order].reset_index(drop=True),
        )


def _check_header(fh: BinaryIO, path: str, party: str) -> None:
    """Refuse a header that names a column twice: pandas would rename the second
    one (``alcohol.1``) and the party would train on a column it never named.
    Reads the header of the open file ``fh`` and puts it back at its start. A UTF-8
    byte order mark is no part of the first name (pandas drops it too)."""
    text = io.TextIOWrapper(fh, encoding="utf-8-sig", errors="replace", newline="")
    try:
        header = next(csv.reader(text), [])
    except (OSError, csv.Error):
        return  # pandas reports what is wrong with the file
    finally:
        text.detach()
        fh.seek(0)
    repeated = sorted(name for name, n in Counter(header).items() if n > 1)
    if repeated:
        raise DataError(
            f"party '{party}': the header of its data file names the column(s) {repeated[:5]} more than "
            "once: rename or remove the repeated ones",
            detail=f"header of {path}",
        )


def _open_data(path: str, party: str) -> BinaryIO:
    """A party's data file, open for reading: a regular file only
    (:func:`~securevfl.regular_files.open_regular`; ``/dev/zero`` would read without
    end, a named pipe block the rank)."""
    try:
        return os.fdopen(open_regular(path), "rb")
    except FileNotFoundError:
        raise DataError(
            f"party '{party}': its data file was not found", detail=f"no file at {path}"
        ) from None
    except NotRegularFile as exc:
        raise DataError(
            f"party '{party}': its data file is {exc.kind}, not a file", detail=f"{path} is {exc.kind}"
        ) from None
    except OSError as exc:
        raise DataError(
            f"party '{party}': its data file cannot be read", detail=f"{path}: {exc.strerror or exc}"
        ) from None


def _read_csv(path: str, party: str, **kwargs: Any) -> pd.DataFrame:
    """Read a party's CSV strictly: a regular file only (:func:`_open_data`); a row
    with more fields than the header is an error (pandas would otherwise drop the
    extra fields, or silently turn the ID column into the index when every row has
    one field too many), and so is a header naming a column twice
    (:func:`_check_header`)."""
    with _open_data(path, party) as fh:
        _check_header(fh, path, party)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error", pd.errors.ParserWarning)
                return pd.read_csv(fh, index_col=False, **kwargs)
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


def _check_ids(frame: pd.DataFrame, source: CsvSource, party: str) -> pd.Series:
    """The ID column of a party's non-empty file, every ID present and unique."""
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
    return ids


def load_party_data(
    source: CsvSource,
    party: str,
    *,
    is_active: bool,
    preprocess: PreprocessSpec | None = None,
    task: TaskKind | None = None,
    task_has_classes: bool | None = None,
) -> PartyData:
    """Read and validate a party's own CSV.

    Without ``preprocess`` every feature column must be numeric and complete. With
    it, the declared categorical columns may hold anything (and be missing) and the
    imputed numeric columns may have missing values; the rest stays strict.

    ``task`` (active party) is the declared task; ``None`` infers it from the label
    column (:func:`labels_for_task`). ``task_has_classes`` says whether a declared
    task's labels are classes (a task a plugin registers; the built-in ones are
    known by name).

    Public error messages name the party, the column and a count; the first
    offending lines and IDs go to :attr:`DataError.detail`, which stays with the
    owner (see :class:`~securevfl.errors.DataError`)."""
    # IDs and declared categorical columns are labels, read as text: a postcode or
    # a hashed category such as 00a1b2c3 keeps its leading zeros
    as_text = dict.fromkeys([source.id_column, *categorical_columns(preprocess)], str)
    frame = _read_csv(source.path, party, dtype=as_text, keep_default_na=True)
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
    ids = _check_ids(frame, source, party)
    if preprocess is not None:
        check_declared(preprocess, party, feats)
        check_standardize(preprocess, party, feats)
    cats = categorical_columns(preprocess)
    numeric = [c for c in feats if c not in cats]
    x = frame[numeric]
    non_numeric = [c for c in numeric if not pd.api.types.is_numeric_dtype(x[c])]
    if non_numeric:
        hint = "" if preprocess is None else " (declare them in preprocess.categorical)"
        raise DataError(f"party '{party}': non-numeric feature columns {non_numeric[:5]}{hint}")
    xv = x.to_numpy(dtype=np.float64)
    may_miss = np.isin(numeric, imputed_columns(preprocess, numeric))
    bad = (np.isnan(xv) & ~may_miss[None, :]) | np.isinf(xv) | (np.abs(np.nan_to_num(xv)) > FLOAT32_MAX)
    if bad.any():
        cols = [numeric[c] for c in np.flatnonzero(bad.any(axis=0))]
        raise DataError(
            f"party '{party}': {int(bad.sum())} missing, infinite or float32-overflowing values in "
            f"columns {cols[:5]} (impute them with a preprocess entry, or drop such rows, before training)",
            detail=f"first at {_first_rows(bad.any(axis=1), ids)} of {source.path}",
        )
    y = classes = None
    kind: TaskKind | None = None
    if label:
        y, classes, kind = labels_for_task(
            frame[label], party, label, ids, source.path, task, task_has_classes
        )
    if preprocess is None:
        return PartyData(party, ids.tolist(), feats, xv.astype(np.float32), y, classes, kind)
    raw = frame[feats].reset_index(drop=True)
    return PartyData(party, ids.tolist(), feats, np.zeros((len(raw), 0), np.float32), y, classes, kind, raw)


def labels_for_task(
    lab: pd.Series,
    party: str,
    label: str,
    ids: pd.Series,
    path: str,
    task: TaskKind | None,
    has_classes: bool | None = None,
) -> tuple[np.ndarray, list[str] | None, TaskKind]:
    """The label column as training targets: (y, classes, task).

    Regression: float32 targets, no classes. Classification: int64 class indices
    into the sorted distinct values. Without a declared ``task`` a numeric column
    holding a non-integer value is a regression target and anything else is
    classification, binary with two classes and multiclass above; an integer
    column with nearly one value per row is warned about (declare ``task:
    regression`` if it is a quantity). A declared task other than the built-in
    ones reads its labels as classes or as values by ``has_classes``."""
    missing_label = lab.isna().to_numpy()
    if missing_label.any():
        raise DataError(
            f"party '{party}': missing label in column '{label}' on {int(missing_label.sum())} rows",
            detail=f"first at {_first_rows(missing_label, ids)} of {path}",
        )
    numeric = pd.api.types.is_numeric_dtype(lab) and not pd.api.types.is_bool_dtype(lab)
    if task is None and numeric and not np.all(np.mod(lab.to_numpy(dtype=np.float64), 1) == 0):
        task = "regression"
    values = task == "regression" or (task not in (None, "binary", "multiclass") and has_classes is False)
    if values:
        if not numeric:
            raise DataError(
                f"party '{party}': label column '{label}' is not numeric, so it is no regression target"
            )
        yv = lab.to_numpy(dtype=np.float64)
        if not np.all(np.isfinite(yv)) or np.abs(yv).max() > FLOAT32_MAX:
            raise DataError(
                f"party '{party}': label column '{label}' holds infinite or float32-overflowing values"
            )
        if np.ptp(yv) == 0:
            raise DataError(
                f"party '{party}': label column '{label}' is constant; there is nothing to regress"
            )
        return yv.astype(np.float32), None, task or "regression"
    uniq = sorted(lab.unique().tolist())
    if len(uniq) < 2:
        raise DataError(f"party '{party}': label column '{label}' has fewer than 2 classes")
    if task == "binary" and len(uniq) != 2:
        raise DataError(f"party '{party}': task is binary but label column '{label}' has {len(uniq)} classes")
    if task is None and len(uniq) > max(2, len(lab) // MIN_ROWS_PER_CLASS):
        warnings.warn(
            DataWarning(
                f"party '{party}': label column '{label}' has {len(uniq)} distinct values in "
                f"{len(lab)} rows (more than one class per {MIN_ROWS_PER_CLASS} rows): is it a "
                "continuous target or an ID? securevfl trains a classifier with one class per value "
                "(declare 'task: regression' for a quantity)"
            ),
            stacklevel=3,
        )
    index = {v: i for i, v in enumerate(uniq)}
    kind: TaskKind = task or ("binary" if len(uniq) == 2 else "multiclass")
    return lab.map(index).to_numpy(dtype=np.int64), [str(v) for v in uniq], kind


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


def scaling(x_train: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The z-scoring statistics of the training rows (mean, scale; 1 x columns):
    constant columns keep scale 1. Saved with a party's model."""
    mu = x_train.mean(axis=0, keepdims=True)
    sd = x_train.std(axis=0, keepdims=True)
    sd[sd < 1e-12] = 1.0
    return mu, sd


def standardize(x_train: np.ndarray, x_test: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Party-local z-scoring with training-row statistics; constant columns keep
    scale 1."""
    mu, sd = scaling(x_train)
    return ((x_train - mu) / sd).astype(np.float32), ((x_test - mu) / sd).astype(np.float32)


def load_new_records(
    source: CsvSource, party: str, columns: list[str], *, preprocess: PreprocessSpec | None = None
) -> PartyData:
    """A party's file of new records for prediction (``securevfl predict``): its ID
    column and exactly the raw feature ``columns`` its model was trained on (in
    that order), validated as at training. Other columns, the active party's label
    column included, are neither needed nor read; a training column the file lacks
    is a :class:`DataError` naming the party and the column."""
    header = list(_read_csv(source.path, party, nrows=0).columns)
    if source.id_column not in header:
        raise DataError(
            f"party '{party}': ID column '{source.id_column}' is not in its prediction file",
            detail=f"columns of {source.path}: {header[:20]}",
        )
    missing = [c for c in columns if c not in header]
    if missing:
        raise DataError(
            f"party '{party}': its prediction file lacks the training column(s) {missing[:5]} "
            "its model was trained on",
            detail=f"columns of {source.path}: {header[:20]}",
        )
    if not columns:  # a label-only active party: its IDs alone
        frame = _read_csv(source.path, party, dtype={source.id_column: str}, usecols=[source.id_column])
        ids_only = CsvSource(path=source.path, id_column=source.id_column, feature_columns=[])
        _check_ids(frame, ids_only, party)
        ids = frame[source.id_column].tolist()
        return PartyData(party, ids, [], np.zeros((len(ids), 0), np.float32))
    own = CsvSource(path=source.path, id_column=source.id_column, feature_columns=list(columns))
    return load_party_data(own, party, is_active=False, preprocess=preprocess)
