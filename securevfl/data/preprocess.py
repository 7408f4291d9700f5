"""A party's own preprocessing (docs/design.md §12): scikit-learn transformers fitted on
the party's aligned *training* rows only and applied unchanged to its test rows.

What a protocol declares (:class:`~securevfl.config.PreprocessSpec`) becomes one
``ColumnTransformer``:

* categorical columns: missing values become the category ``missing``
  (``SimpleImputer(strategy="constant")``), then ``OneHotEncoder`` with
  ``min_frequency`` and, when ``other`` is on, ``handle_unknown=
  "infrequent_if_exist"`` (rare and unseen categories share one column;
  ``max_categories`` keeps only the most frequent ones, Criteo-style top-k);
  ``other: false`` makes an unseen category an error;
* numeric columns: ``log1p`` or ``signed_log1p`` (``FunctionTransformer``) where
  listed, then
  ``SimpleImputer`` (mean / median / constant, with ``add_indicator``) where
  declared, then ``StandardScaler`` on the columns ``standardize`` selects
  (``true``: all, ``false``: none, or a list of numeric columns).

The output columns come in the order of the groups below (numeric groups by
log transform, imputation and scaling, then the categorical columns);
:mod:`securevfl.data.layout` describes them one by one for a model factory.

Fitting only on training rows is what keeps the test rows honest: a test row's
outlier or rare category changes nothing that was fitted (tested). Everything
here is local to one party; nothing crosses a party boundary. Errors name the
party and the column, never a value (values go to ``DataError.detail``, which
stays with the owner).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from sklearn.compose import ColumnTransformer
from sklearn.impute import SimpleImputer
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import FunctionTransformer, OneHotEncoder, StandardScaler

from securevfl.config import PreprocessSpec
from securevfl.errors import DataError

MISSING_CATEGORY = "missing"


def check_declared(spec: PreprocessSpec, party: str, columns: list[str]) -> None:
    """Every column the ``preprocess`` entry names must be one of the party's
    feature columns."""
    named: list[tuple[str, list[str]]] = [("log1p", spec.log1p), ("signed_log1p", spec.signed_log1p)]
    if spec.categorical is not None:
        named.append(("categorical.columns", spec.categorical.columns))
    if spec.impute is not None and spec.impute.columns is not None:
        named.append(("impute.columns", spec.impute.columns))
    have = set(columns)
    for field, cols in named:
        missing = [c for c in cols if c not in have]
        if missing:
            raise DataError(
                f"party '{party}': preprocess.{field} names columns {missing[:5]} that are not among "
                "its feature columns"
            )


def categorical_columns(spec: PreprocessSpec | None) -> list[str]:
    return list(spec.categorical.columns) if spec is not None and spec.categorical is not None else []


def imputed_columns(spec: PreprocessSpec | None, numeric: list[str]) -> list[str]:
    """The numeric columns that may hold missing values under ``spec``."""
    if spec is None or spec.impute is None:
        return []
    return list(numeric if spec.impute.columns is None else spec.impute.columns)


def log1p(x: Any) -> Any:
    """log(1 + x); values at or below -1 give -inf/NaN, which :meth:`Preprocessor.transform`
    then refuses naming the column (no warning on the way)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.log1p(x)


def signed_log1p(x: Any) -> Any:
    """sign(x) log(1 + |x|): log1p for heavy-tailed counts that may be negative
    (Criteo's I2); defined everywhere, odd, and 0 at 0. NaN stays NaN for the imputer."""
    return np.sign(x) * np.log1p(np.abs(x))


LOG_TRANSFORMS = {"log1p": log1p, "signed_log1p": signed_log1p}


def _log_kind(spec: PreprocessSpec, column: str) -> str | None:
    if column in spec.log1p:
        return "log1p"
    if column in spec.signed_log1p:
        return "signed_log1p"
    return None


def _numeric_pipeline(spec: PreprocessSpec, *, log: str | None, impute: bool, scale: bool) -> Pipeline:
    steps: list[tuple[str, Any]] = []
    if log is not None:
        steps.append((log, FunctionTransformer(LOG_TRANSFORMS[log], feature_names_out="one-to-one")))
    if impute:
        imp = spec.impute
        assert imp is not None
        steps.append(
            (
                "impute",
                SimpleImputer(
                    strategy=imp.strategy,
                    fill_value=imp.fill_value if imp.strategy == "constant" else None,
                    add_indicator=imp.indicator,
                    keep_empty_features=True,
                ),
            )
        )
    steps.append(("scale", StandardScaler() if scale else "passthrough"))
    return Pipeline(steps)


def build_transformer(spec: PreprocessSpec, columns: list[str]) -> ColumnTransformer:
    """The unfitted ``ColumnTransformer`` for a party's feature ``columns``:
    numeric groups by log transform (``log1p``, ``signed_log1p``, none), then
    imputed before complete columns, then standardized before unstandardized
    ones (a split only a ``standardize`` list makes), each in file order; then
    the categorical columns."""
    cats = categorical_columns(spec)
    numeric = [c for c in columns if c not in cats]
    imputed = set(imputed_columns(spec, numeric))
    scaled = set(spec.standardized(numeric))
    parts: list[tuple[str, Any, list[str]]] = []
    for log in ("log1p", "signed_log1p", None):
        for imp in (True, False):
            for sc in (True, False):
                group = [
                    c
                    for c in numeric
                    if _log_kind(spec, c) == log and (c in imputed) == imp and (c in scaled) == sc
                ]
                if group:
                    kind = f"{'imputed' if imp else 'numeric'}{'' if sc else '_raw'}"
                    name = f"{log + '_' if log else ''}{kind}"
                    parts.append((name, _numeric_pipeline(spec, log=log, impute=imp, scale=sc), group))
    if cats:
        assert spec.categorical is not None
        cat = spec.categorical
        encoder = OneHotEncoder(
            handle_unknown="infrequent_if_exist" if cat.other else "error",
            min_frequency=cat.min_frequency if cat.min_frequency > 1 else None,
            # sklearn counts the shared "other" column among max_categories
            max_categories=None if cat.max_categories is None else cat.max_categories + 1,
            sparse_output=False,
            dtype=np.float64,
        )
        fill = SimpleImputer(strategy="constant", fill_value=MISSING_CATEGORY)
        parts.append(("categorical", Pipeline([("fill", fill), ("onehot", encoder)]), cats))
    return ColumnTransformer(parts, remainder="drop", verbose_feature_names_out=False)


def categorical_frame(frame: pd.DataFrame, cats: list[str]) -> pd.DataFrame:
    """Categorical columns as strings (a number such as a postcode is a label, not
    a quantity), missing values as NaN for the imputer that names them."""
    out = frame.copy()
    for c in cats:
        out[c] = out[c].astype(object).map(lambda v: np.nan if pd.isna(v) else str(v))
    return out


@dataclass
class Preprocessor:
    """A party's fitted preprocessing: ``transform`` maps its raw feature frame to
    the float32 matrix its bottom model sees, with column names ``columns``."""

    party: str
    spec: PreprocessSpec
    inputs: list[str]
    transformer: ColumnTransformer
    columns: list[str]

    def transform(self, frame: pd.DataFrame) -> np.ndarray:
        missing = [c for c in self.inputs if c not in frame.columns]
        if missing:
            raise DataError(
                f"party '{self.party}': its data lacks the training column(s) {missing[:5]} "
                "its preprocessing was fitted on"
            )
        check_log_domain(self.spec, self.party, frame)
        cats = categorical_columns(self.spec)
        try:
            out = self.transformer.transform(categorical_frame(frame[self.inputs], cats))
        except ValueError as exc:
            if "unknown categor" not in str(exc):
                raise
            column = _unseen_column(self.transformer, frame, cats)
            raise DataError(
                f"party '{self.party}': column '{column}' holds a category its training rows do not have, "
                "and preprocess.categorical.other is false (set it to true to map unseen categories to "
                "the 'other' bucket)",
                detail=str(exc),
            ) from None
        out = np.asarray(out, dtype=np.float64)
        bad = ~np.isfinite(out)
        if bad.any():
            cols = [self.columns[j] for j in np.flatnonzero(bad.any(axis=0))]
            raise DataError(
                f"party '{self.party}': preprocessing produced {int(bad.sum())} missing or infinite values "
                f"in columns {cols[:5]} (log1p needs values above -1; missing values need preprocess.impute)"
            )
        return out.astype(np.float32)

    def fitted(self) -> dict[str, Any]:
        """What was fitted, as plain JSON: per numeric column the imputation value
        and the scaler's mean and scale, per categorical column its categories
        (those in the "other" bucket listed apart). Saved next to the party's model."""
        out: dict[str, Any] = {
            "inputs": self.inputs,
            "outputs": self.columns,
            "numeric": {},
            "categorical": {},
            "groups": self._groups(),
        }
        for name, pipe, cols in self.transformer.transformers_:
            if name == "categorical":
                enc = pipe.named_steps["onehot"]
                infrequent = (
                    enc.infrequent_categories_
                    if enc.min_frequency is not None or enc.max_categories is not None
                    else [None] * len(cols)
                )
                for c, cats, rare in zip(cols, enc.categories_, infrequent, strict=True):
                    rare_set = set() if rare is None else {str(v) for v in rare}
                    out["categorical"][c] = {
                        "categories": [str(v) for v in cats if str(v) not in rare_set],
                        "other": sorted(rare_set),
                    }
                continue
            if not isinstance(pipe, Pipeline):
                continue
            imp = pipe.named_steps.get("impute")
            scale = pipe.named_steps.get("scale")
            for j, c in enumerate(cols):
                rec: dict[str, Any] = {
                    "log1p": "log1p" in pipe.named_steps,
                    "signed_log1p": "signed_log1p" in pipe.named_steps,
                }
                if imp is not None:
                    rec["impute_value"] = float(imp.statistics_[j])
                if isinstance(scale, StandardScaler):
                    rec["mean"] = float(scale.mean_[j])
                    rec["scale"] = float(scale.scale_[j])
                out["numeric"][c] = rec
        return out

    def _groups(self) -> list[dict[str, Any]]:
        """Every fitted parameter, group by group in the transformer's output order
        (:class:`securevfl.data.fitted.FittedTransform`): what prediction applies
        to new records without the scikit-learn objects."""
        groups: list[dict[str, Any]] = []
        for name, pipe, cols in self.transformer.transformers_:
            if not isinstance(pipe, Pipeline):
                continue  # the dropped remainder
            if name == "categorical":
                enc = pipe.named_steps["onehot"]
                enabled = enc.min_frequency is not None or enc.max_categories is not None
                rare = enc.infrequent_categories_ if enabled else [None] * len(cols)
                groups.append(
                    {
                        "kind": "categorical",
                        "columns": list(cols),
                        "categories": [[str(v) for v in cats] for cats in enc.categories_],
                        "infrequent": [None if r is None else [str(v) for v in r] for r in rare],
                        "handle_unknown": enc.handle_unknown,
                    }
                )
                continue
            imp = pipe.named_steps.get("impute")
            scale = pipe.named_steps.get("scale")
            group: dict[str, Any] = {
                "kind": "numeric",
                "columns": list(cols),
                "log": next((n for n in ("log1p", "signed_log1p") if n in pipe.named_steps), None),
            }
            if imp is not None:
                feats = imp.indicator_.features_ if imp.indicator_ is not None else []
                group["impute"] = {
                    "statistics": [float(v) for v in imp.statistics_],
                    "indicator": [int(j) for j in feats],
                }
            if isinstance(scale, StandardScaler):
                group["scale"] = {
                    "mean": [float(v) for v in scale.mean_],
                    "scale": [float(v) for v in scale.scale_],
                }
            groups.append(group)
        return groups


def check_log_domain(spec: PreprocessSpec, party: str, frame: pd.DataFrame) -> None:
    """log1p needs values above -1; a value at or below it would become NaN and
    then, in an imputed column, be silently imputed."""
    cols = [c for c in spec.log1p if c in frame.columns]
    low = (frame[cols] <= -1).sum()
    bad = [c for c in cols if low[c]]
    if bad:
        raise DataError(
            f"party '{party}': {int(low[bad].sum())} values at or below -1 in columns {bad[:5]}, "
            "which preprocess.log1p cannot transform"
        )


def _unseen_column(transformer: ColumnTransformer, frame: pd.DataFrame, cats: list[str]) -> str:
    """The first categorical column of ``frame`` holding a category the fitted
    encoder does not know."""
    pipe = transformer.named_transformers_["categorical"]
    enc = pipe.named_steps["onehot"]
    values = categorical_frame(frame[cats], cats)
    for c, known in zip(cats, enc.categories_, strict=True):
        seen = {str(v) for v in known}
        col = values[c].map(lambda v: MISSING_CATEGORY if pd.isna(v) else v)
        if not col.isin(seen).all():
            return c
    return cats[0]


def fit_preprocessor(spec: PreprocessSpec, party: str, frame: pd.DataFrame) -> Preprocessor:
    """Fit ``spec`` on ``frame``, which must be the party's training rows only."""
    inputs = list(frame.columns)
    check_declared(spec, party, inputs)
    check_log_domain(spec, party, frame)
    transformer = build_transformer(spec, inputs)
    transformer.fit(categorical_frame(frame, categorical_columns(spec)))
    columns = [str(c) for c in transformer.get_feature_names_out()]
    return Preprocessor(party, spec, inputs, transformer, columns)
