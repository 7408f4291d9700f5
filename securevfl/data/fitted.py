"""A party's fitted preprocessing, applied from its saved parameters
(``securevfl predict``; docs/design.md §12).

Training fits scikit-learn's transformers on the party's training rows
(:mod:`securevfl.data.preprocess`); the fitted parameters are saved with the
party's model as plain JSON (:meth:`Preprocessor.fitted`, key ``transformers``),
because a saved model is loaded without unpickling anything. This module puts
those parameters back to work on new records, step for step as the fitted
``ColumnTransformer`` applies them:

* numeric groups: the log transform (``log1p``, ``signed_log1p``), then ``SimpleImputer`` (NaN -> its
  statistic, then the missing-indicator columns of the features that had
  missing values when fitted), then ``StandardScaler`` (``x -= mean``,
  ``x /= scale``) over all of the group's outputs, in float64;
* the categorical group: missing -> ``"missing"``, then one-hot over the fitted
  categories, the infrequent ones (and, with ``handle_unknown:
  infrequent_if_exist``, unseen ones) in one trailing "other" column when the
  feature has one, unseen ones as all zeros when it has none, and an unseen
  category an error when ``other`` is off.

The same IEEE operations on the same float64 parameters give the same bits as
the transformers themselves; a unit test holds this against scikit-learn on
missing values, unseen and rare categories. Errors name the party and the
column, as :meth:`Preprocessor.transform` does.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, ValidationError

from securevfl.errors import DataError

MISSING_CATEGORY = "missing"


class _Doc(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Imputed(_Doc):
    statistics: list[float]  # one per input column of the group
    indicator: list[int]  # the group's columns that get a missing-indicator column


class Scaled(_Doc):
    mean: list[float]  # one per output column of the imputer (indicators included)
    scale: list[float]


class NumericGroup(_Doc):
    kind: Literal["numeric"] = "numeric"
    columns: list[str]
    log: Literal["log1p", "signed_log1p"] | None = None
    impute: Imputed | None = None
    scale: Scaled | None = None


class CategoricalGroup(_Doc):
    kind: Literal["categorical"] = "categorical"
    columns: list[str]
    categories: list[list[str]]  # per column, as the encoder holds them (sorted)
    infrequent: list[list[str] | None]  # per column, the categories in its "other" column
    handle_unknown: Literal["infrequent_if_exist", "error"]


class FittedTransform(_Doc):
    """What a fitted ``ColumnTransformer`` does, in its own order of groups."""

    inputs: list[str]
    outputs: list[str]
    groups: list[NumericGroup | CategoricalGroup]


def from_saved(fitted: dict[str, object], party: str) -> FittedTransform:
    """The ``inputs``, ``outputs`` and ``groups`` of a saved
    :meth:`Preprocessor.fitted` document, validated; anything malformed is a
    :class:`DataError` naming the party and the field."""
    try:
        return FittedTransform.model_validate({k: fitted.get(k) for k in ("inputs", "outputs", "groups")})
    except ValidationError as exc:
        e = exc.errors()[0]
        where = ".".join(str(p) for p in e["loc"])
        raise DataError(
            f"party '{party}': its saved preprocessing is malformed at '{where}': {e['msg']}"
        ) from None


def log1p(x: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.log1p(x)


def signed_log1p(x: np.ndarray) -> np.ndarray:
    return np.sign(x) * np.log1p(np.abs(x))


LOGS = {"log1p": log1p, "signed_log1p": signed_log1p}


def _numeric(group: NumericGroup, frame: pd.DataFrame) -> np.ndarray:
    x = frame[group.columns].to_numpy(dtype=np.float64, copy=True)
    if group.log is not None:
        x = LOGS[group.log](x)
    if group.impute is not None:
        missing = np.isnan(x)
        filled = np.where(missing, np.asarray(group.impute.statistics, dtype=np.float64)[None, :], x)
        x = np.hstack([filled, missing[:, group.impute.indicator].astype(np.float64)])
    if group.scale is not None:
        x = x - np.asarray(group.scale.mean, dtype=np.float64)[None, :]
        x = x / np.asarray(group.scale.scale, dtype=np.float64)[None, :]
    return x


def _categorical(group: CategoricalGroup, frame: pd.DataFrame, party: str) -> np.ndarray:
    blocks = []
    for c, cats, rare in zip(group.columns, group.categories, group.infrequent, strict=True):
        values = frame[c].astype(object).map(lambda v: MISSING_CATEGORY if pd.isna(v) else str(v)).to_numpy()
        rare_set = set(rare or [])
        frequent = [v for v in cats if v not in rare_set]
        where = {v: k for k, v in enumerate(frequent)}
        other = len(frequent) if rare_set else None
        known = set(cats)
        unseen = ~np.isin(values, list(known))
        if unseen.any() and group.handle_unknown == "error":
            raise DataError(
                f"party '{party}': column '{c}' holds a category its training rows do not have, "
                "and preprocess.categorical.other is false (set it to true to map unseen categories to "
                "the 'other' bucket)"
            )
        block = np.zeros((len(values), len(frequent) + (1 if rare_set else 0)), dtype=np.float64)
        for i, v in enumerate(values):
            k = where.get(v)
            if k is None and other is not None and (v in rare_set or v not in known):
                k = other
            if k is not None:
                block[i, k] = 1.0
        blocks.append(block)
    return np.hstack(blocks) if blocks else np.zeros((len(frame), 0))


def apply_fitted(fitted: FittedTransform, party: str, frame: pd.DataFrame) -> np.ndarray:
    """A party's raw feature ``frame`` through its saved, fitted preprocessing: the
    float32 matrix its bottom model was trained on, columns ``fitted.outputs``."""
    missing = [c for c in fitted.inputs if c not in frame.columns]
    if missing:
        raise DataError(
            f"party '{party}': its data lacks the training column(s) {missing[:5]} "
            "its preprocessing was fitted on"
        )
    logged = [c for g in fitted.groups if isinstance(g, NumericGroup) and g.log == "log1p" for c in g.columns]
    low = (frame[logged] <= -1).sum() if logged else pd.Series(dtype=int)
    bad = [c for c in logged if low[c]]
    if bad:
        raise DataError(
            f"party '{party}': {int(low[bad].sum())} values at or below -1 in columns {bad[:5]}, "
            "which preprocess.log1p cannot transform"
        )
    parts = [
        _numeric(g, frame) if isinstance(g, NumericGroup) else _categorical(g, frame, party)
        for g in fitted.groups
    ]
    out = np.hstack(parts) if parts else np.zeros((len(frame), 0))
    if out.shape[1] != len(fitted.outputs):
        raise DataError(
            f"party '{party}': its saved preprocessing produces {out.shape[1]} columns, "
            f"but names {len(fitted.outputs)}"
        )
    finite = np.isfinite(out)
    if not finite.all():
        cols = [fitted.outputs[j] for j in np.flatnonzero((~finite).any(axis=0))]
        raise DataError(
            f"party '{party}': preprocessing produced {int((~finite).sum())} missing or infinite values "
            f"in columns {cols[:5]} (log1p needs values above -1; missing values need preprocess.impute)"
        )
    return out.astype(np.float32)
