"""A party's declared preprocessing: scikit-learn transformers fitted on its
training rows only, applied unchanged to its test rows; strict defaults without a
``preprocess`` entry; errors that name the party and the column."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from securevfl.config import CsvSource, PartySpec, PreprocessSpec
from securevfl.data.party_data import load_party_data
from securevfl.data.preprocess import fit_preprocessor
from securevfl.errors import DataError
from securevfl.parties.common import split_features


def spec(**kw) -> PreprocessSpec:
    return PreprocessSpec.model_validate(kw)


def frame(n: int = 40, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        {
            "age": rng.normal(40, 10, n),
            "income": rng.lognormal(3, 1, n),
            "region": rng.choice(["north", "south", "east"], n, p=[0.5, 0.45, 0.05]),
        }
    )


def test_outlier_in_test_rows_leaves_the_fitted_mean_unchanged():
    """The acceptance check: statistics come from the training rows alone."""
    f = frame()
    train_idx = np.arange(30)  # rows 30..39 are the test rows
    with_outlier = f.copy()
    with_outlier.loc[35, "age"] = 1e6  # a test row only
    s = spec(categorical={"columns": ["region"]})
    clean = fit_preprocessor(s, "lab", f.iloc[train_idx]).fitted()
    dirty = fit_preprocessor(s, "lab", with_outlier.iloc[train_idx]).fitted()
    assert dirty["numeric"]["age"]["mean"] == clean["numeric"]["age"]["mean"]
    assert dirty["numeric"]["age"]["mean"] == pytest.approx(f["age"].iloc[:30].mean())
    # ... while the same column over every row would have moved by ~25000
    assert abs(with_outlier["age"].mean() - clean["numeric"]["age"]["mean"]) > 1e4


def test_split_features_fits_on_training_rows_and_transforms_all(tmp_path: Path):
    f = frame()
    f.loc[[3, 33], "income"] = np.nan
    f.loc[35, "age"] = 1e6
    path = tmp_path / "p.csv"
    f.insert(0, "id", [f"c{i:03d}" for i in range(len(f))])
    f.to_csv(path, index=False)
    pre = spec(categorical={"columns": ["region"]}, impute={"strategy": "median"}, log1p=["income"])
    party = PartySpec(name="lab", preprocess=pre)
    data = load_party_data(CsvSource(path=str(path)), "lab", is_active=False, preprocess=pre)
    train_idx, test_idx = np.arange(30), np.arange(30, 40)
    x_tr, x_te, fitted = split_features(data, train_idx, test_idx, party, scale=True)
    assert fitted is not None
    assert data.columns == fitted.columns
    assert x_tr.dtype == np.float32 and x_tr.shape[1] == x_te.shape[1] == len(fitted.columns)
    assert np.isfinite(x_te).all()
    # standardized on the training rows: mean 0 there, not on the test rows
    age = data.columns.index("age")
    assert abs(float(x_tr[:, age].mean())) < 1e-5
    assert float(x_te[:, age].max()) > 1e3
    # median of log1p(income) over the training rows that have it
    stats = fitted.fitted()["numeric"]["income"]
    assert stats["impute_value"] == pytest.approx(np.median(np.log1p(f["income"].iloc[:30].dropna())))
    assert "missingindicator_income" in data.columns
    assert {"region_north", "region_south", "region_east"} <= set(data.columns)


def test_min_frequency_groups_rare_categories_into_other_and_maps_unseen_there():
    train = pd.DataFrame({"region": ["north"] * 6 + ["south"] * 5 + ["east"]})
    s = spec(categorical={"columns": ["region"], "min_frequency": 3}, standardize=False)
    pre = fit_preprocessor(s, "lab", train)
    assert pre.columns == ["region_north", "region_south", "region_infrequent_sklearn"]
    assert pre.fitted()["categorical"]["region"] == {"categories": ["north", "south"], "other": ["east"]}
    out = pre.transform(pd.DataFrame({"region": ["west", "east", "north"]}))
    assert out.tolist() == [[0, 0, 1], [0, 0, 1], [1, 0, 0]]


def test_missing_category_is_its_own_category():
    train = pd.DataFrame({"region": ["north", None, "south", "north"]})
    pre = fit_preprocessor(spec(categorical={"columns": ["region"]}), "lab", train)
    assert "region_missing" in pre.columns
    assert pre.transform(pd.DataFrame({"region": [None]}))[0, pre.columns.index("region_missing")] == 1


def test_unseen_category_without_other_bucket_names_party_and_column():
    train = pd.DataFrame({"region": ["north", "south"] * 5, "age": np.arange(10.0)})
    pre = fit_preprocessor(spec(categorical={"columns": ["region"], "other": False}), "lab", train)
    with pytest.raises(DataError) as exc:
        pre.transform(pd.DataFrame({"region": ["west"], "age": [1.0]}))
    msg = str(exc.value)
    assert "party 'lab'" in msg and "'region'" in msg and "west" not in msg  # the value stays private
    assert "west" in (exc.value.detail or "")


def test_missing_training_column_names_party_and_column():
    train = pd.DataFrame({"region": ["north", "south"] * 5, "age": np.arange(10.0)})
    pre = fit_preprocessor(spec(categorical={"columns": ["region"]}), "lab", train)
    with pytest.raises(DataError, match=r"party 'lab'.*\['age'\]"):
        pre.transform(pd.DataFrame({"region": ["north"]}))


def test_log1p_of_values_below_minus_one_is_refused():
    pre = fit_preprocessor(spec(log1p=["x"]), "lab", pd.DataFrame({"x": [0.0, 1.0, 2.0]}))
    with pytest.raises(DataError, match=r"party 'lab': 1 values at or below -1 in columns \['x'\]"):
        pre.transform(pd.DataFrame({"x": [-5.0]}))
    imputed = spec(log1p=["x"], impute={})  # not silently imputed either
    with pytest.raises(DataError, match=r"\['x'\]"):
        fit_preprocessor(imputed, "lab", pd.DataFrame({"x": [0.0, -2.0, np.nan]}))


def test_constant_imputation_and_no_indicator():
    train = pd.DataFrame({"x": [1.0, np.nan, 3.0]})
    s = spec(impute={"strategy": "constant", "fill_value": -1.0, "indicator": False}, standardize=False)
    pre = fit_preprocessor(s, "lab", train)
    assert pre.columns == ["x"]
    assert pre.transform(train)[:, 0].tolist() == [1.0, -1.0, 3.0]


def _csv(tmp_path: Path, text: str) -> str:
    p = tmp_path / "p.csv"
    p.write_text(text.strip() + "\n")
    return str(p)


def test_defaults_stay_strict(tmp_path: Path):
    path = _csv(tmp_path, "id,region,x\na,north,1\nb,south,\nc,east,3")
    with pytest.raises(DataError, match=r"party 'lab': non-numeric feature columns \['region'\]"):
        load_party_data(CsvSource(path=path), "lab", is_active=False)
    # declaring the categorical column alone does not allow the missing value
    cat = spec(categorical={"columns": ["region"]})
    with pytest.raises(DataError, match=r"party 'lab': 1 missing.*\['x'\].*preprocess"):
        load_party_data(CsvSource(path=path), "lab", is_active=False, preprocess=cat)
    both = spec(categorical={"columns": ["region"]}, impute={})
    data = load_party_data(CsvSource(path=path), "lab", is_active=False, preprocess=both)
    assert data.frame is not None and data.frame.shape == (3, 2)


def test_imputation_limited_to_listed_columns(tmp_path: Path):
    path = _csv(tmp_path, "id,x,y\na,1,\nb,,2\nc,3,3")
    pre = spec(impute={"columns": ["x"]})
    with pytest.raises(DataError, match=r"\['y'\]"):
        load_party_data(CsvSource(path=path), "lab", is_active=False, preprocess=pre)


def test_declared_column_must_exist(tmp_path: Path):
    path = _csv(tmp_path, "id,x\na,1\nb,2")
    with pytest.raises(DataError, match=r"party 'lab': preprocess.log1p names columns \['income'\]"):
        load_party_data(CsvSource(path=path), "lab", is_active=False, preprocess=spec(log1p=["income"]))


def test_schema_refuses_contradictions():
    with pytest.raises(ValueError, match="other: true"):
        spec(categorical={"columns": ["r"], "min_frequency": 3, "other": False})
    with pytest.raises(ValueError, match="both categorical and numeric"):
        spec(categorical={"columns": ["r"]}, log1p=["r"])


def test_signed_log1p_is_odd_defined_below_minus_one_and_keeps_nan_for_the_imputer():
    f = pd.DataFrame({"x": [0.0, 3.0, -2.0, np.nan, 5.0]})
    pre = fit_preprocessor(
        spec(signed_log1p=["x"], impute={"strategy": "constant", "fill_value": 0.0}, standardize=False),
        "lab",
        f,
    )
    out = pre.transform(f)
    assert pre.columns == ["x", "missingindicator_x"]
    assert np.allclose(out[:, 0], [0.0, np.log(4.0), -np.log(3.0), 0.0, np.log(6.0)])
    assert out[:, 1].tolist() == [0.0, 0.0, 0.0, 1.0, 0.0]
    assert pre.fitted()["numeric"]["x"] == {
        "log1p": False,
        "signed_log1p": True,
        "impute_value": 0.0,
    }


def test_max_categories_keeps_the_top_k_and_sends_the_rest_and_unseen_to_other():
    train = pd.DataFrame({"c": ["a", "b", "a", "c", "a", "b", "d"]})
    pre = fit_preprocessor(spec(categorical={"columns": ["c"], "max_categories": 2}), "lab", train)
    assert pre.columns == ["c_a", "c_b", "c_infrequent_sklearn"]
    out = pre.transform(pd.DataFrame({"c": ["a", "c", "zzz", None]}))
    assert out.tolist() == [[1, 0, 0], [0, 0, 1], [0, 0, 1], [0, 0, 1]]
    fitted = pre.fitted()["categorical"]["c"]
    assert fitted == {"categories": ["a", "b"], "other": ["c", "d"]}


@pytest.mark.parametrize(
    "kw,needle",
    [
        ({"categorical": {"columns": ["c"], "max_categories": 2, "other": False}}, "max_categories groups"),
        ({"log1p": ["x"], "signed_log1p": ["x"]}, "both log1p and signed_log1p"),
        ({"categorical": {"columns": ["x"]}, "signed_log1p": ["x"]}, "both categorical and numeric"),
    ],
)
def test_contradictory_log_and_category_declarations_are_refused(kw, needle):
    with pytest.raises(ValueError, match=needle):
        spec(**kw)
