"""The pure parts of federated prediction (docs/design.md §12): a saved, fitted
preprocessing applied without scikit-learn gives scikit-learn's bits; the new
records' loader; ``--data PARTY=PATH``; the predictions file per task kind."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from securevfl.app.loader import load_protocol_dict
from securevfl.app.predict import check_out, parse_data_overrides, predictions_frame
from securevfl.config import CsvSource, PreprocessSpec
from securevfl.data.fitted import apply_fitted, from_saved
from securevfl.data.party_data import load_new_records
from securevfl.data.preprocess import fit_preprocessor
from securevfl.errors import ConfigError, DataError
from securevfl.parties.task_kinds import TASKS
from tests.support.protocols import small_digits


def _frame(n: int = 200, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    f = pd.DataFrame(
        {
            "a": rng.normal(5, 2, n),
            "b": rng.exponential(3, n),
            "c": rng.integers(0, 9, n),
            "r": rng.choice(["n", "s", "e", "w"], n, p=[0.5, 0.3, 0.18, 0.02]).astype(object),
        }
    )
    f.loc[rng.random(n) < 0.05, "a"] = np.nan
    f.loc[rng.random(n) < 0.05, "b"] = np.nan
    f.loc[rng.random(n) < 0.05, "r"] = None
    return f


@pytest.mark.parametrize(
    "declared",
    [
        {
            "categorical": {"columns": ["r"], "min_frequency": 5, "other": True},
            "log1p": ["b"],
            "impute": {"strategy": "median", "indicator": True},
        },
        {"categorical": {"columns": ["r"], "other": True}, "impute": {"strategy": "mean"}},
        {
            "categorical": {"columns": ["r"], "other": False},
            "impute": {"strategy": "constant", "fill_value": -1},
            "standardize": False,
        },
        {
            "impute": {"strategy": "median", "columns": ["a", "b"], "indicator": True},
            "categorical": {"columns": ["r"]},
        },
    ],
)
def test_saved_preprocessing_gives_scikit_learns_bits(declared: dict):
    """Fitted on the first 150 rows; the last 50 (with missing values, a rare and,
    where ``other`` is on, an unseen category) transformed by the fitted
    ColumnTransformer and by the saved parameters are bit-identical."""
    f = _frame()
    spec = PreprocessSpec.model_validate(declared)
    pre = fit_preprocessor(spec, "lab", f.iloc[:150])
    saved = from_saved(pre.fitted(), "lab")
    new = f.iloc[150:].copy()
    new.loc[new.index[0], "a"] = np.nan
    if spec.categorical is not None and spec.categorical.other:
        new.loc[new.index[1], "r"] = "unseen"
    want = pre.transform(new)
    got = apply_fitted(saved, "lab", new)
    assert saved.outputs == pre.columns
    assert got.dtype == want.dtype and np.array_equal(got, want)


def test_saved_preprocessing_refuses_an_unseen_category_without_other():
    f = _frame()
    pre = fit_preprocessor(
        PreprocessSpec.model_validate(
            {"categorical": {"columns": ["r"], "other": False}, "impute": {"strategy": "mean"}}
        ),
        "lab",
        f.iloc[:150],
    )
    new = f.iloc[150:].copy()
    new.loc[new.index[2], "r"] = "south-west"
    with pytest.raises(
        DataError, match="party 'lab': column 'r' holds a category its training rows do not have"
    ):
        apply_fitted(from_saved(pre.fitted(), "lab"), "lab", new)


def test_a_malformed_saved_preprocessing_names_the_party_and_field():
    f = _frame()
    fitted = fit_preprocessor(
        PreprocessSpec.model_validate({"impute": {"strategy": "mean"}}), "lab", f[["a", "c"]]
    ).fitted()
    fitted["groups"][0]["scale"]["mean"] = "zero"
    with pytest.raises(DataError, match=r"party 'lab': its saved preprocessing is malformed at 'groups\.0"):
        from_saved(fitted, "lab")


def _csv(path: Path, frame: pd.DataFrame) -> Path:
    frame.to_csv(path, index=False)
    return path


def test_new_records_use_only_the_training_columns(tmp_path: Path):
    f = pd.DataFrame(
        {
            "id": ["b", "a", "c"],
            "x2": [1.0, 2.0, 3.0],
            "extra": [9, 9, 9],
            "x1": [4, 5, 6],
            "label": [0, 1, 0],
        }
    )
    src = CsvSource(path=str(_csv(tmp_path / "p.csv", f)), id_column="id", label_column="label")
    data = load_new_records(src, "lab", ["x1", "x2"])
    assert data.ids == ["b", "a", "c"] and data.columns == ["x1", "x2"]
    assert data.x.tolist() == [[4, 1], [5, 2], [6, 3]] and data.y is None
    ids_only = load_new_records(src, "bank", [])  # a label-only active party: IDs, no label needed
    assert ids_only.ids == ["b", "a", "c"] and ids_only.x.shape == (3, 0)


def test_new_records_missing_a_training_column_name_the_party_and_column(tmp_path: Path):
    src = CsvSource(path=str(_csv(tmp_path / "p.csv", pd.DataFrame({"id": ["a"], "x1": [1.0]}))))
    with pytest.raises(
        DataError, match=r"party 'lab': its prediction file lacks the training column\(s\) \['x2'\]"
    ):
        load_new_records(src, "lab", ["x1", "x2"])
    with pytest.raises(DataError, match="party 'lab': ID column 'key' is not in its prediction file"):
        load_new_records(src.model_copy(update={"id_column": "key"}), "lab", ["x1"])
    dup = CsvSource(path=str(_csv(tmp_path / "d.csv", pd.DataFrame({"id": ["a", "a"], "x1": [1.0, 2.0]}))))
    with pytest.raises(DataError, match="duplicate IDs"):
        load_new_records(dup, "bank", [])


def test_data_overrides_are_typed_and_checked(tmp_path: Path):
    proto = load_protocol_dict(small_digits())
    f = tmp_path / "left.csv"
    f.write_text("id,x\n")
    assert parse_data_overrides([f"left={f}"], proto) == {"left": f.resolve()}
    for bad, msg in [
        ("left", "must look like PARTY=PATH"),
        (f"nobody={f}", "'nobody' is not a party"),
        (f"left={tmp_path / 'none.csv'}", "party 'left': no file at"),
    ]:
        with pytest.raises(ConfigError, match=msg) as e:
            parse_data_overrides([bad], proto)
        assert e.value.path == "--data"
    with pytest.raises(ConfigError, match="given twice"):
        parse_data_overrides([f"left={f}", f"left={f}"], proto)


def test_the_output_folder_may_not_be_the_run_folder(tmp_path: Path):
    with pytest.raises(ConfigError, match="is the training run's folder"):
        check_out(tmp_path / "run" / ".." / "run", tmp_path / "run")
    check_out(tmp_path / "pred", tmp_path / "run")


@pytest.mark.parametrize(
    ("kind", "classes", "scores", "want"),
    [
        ("binary", ["no", "yes"], [[0.2, 0.8], [0.7, 0.3]], {"score": [0.8, 0.3], "class": ["yes", "no"]}),
        (
            "multiclass",
            ["a", "b", "c"],
            [[0.1, 0.2, 0.7], [0.5, 0.3, 0.2]],
            {"p_a": [0.1, 0.5], "p_b": [0.2, 0.3], "p_c": [0.7, 0.2], "class": ["c", "a"]},
        ),
        ("regression", None, [1.5, -2.25], {"value": [1.5, -2.25]}),
    ],
)
def test_prediction_columns_per_task(kind, classes, scores, want, tmp_path: Path):
    y = np.array([0.0, 1.0, 3.0]) if classes is None else np.array([0, 1])
    task = TASKS.get(kind)(y, classes, "mse")
    cols = task.prediction_columns(np.asarray(scores))
    assert cols == want  # exact: the values are binary fractions
    frame = predictions_frame("customer", ["c1", "c2"], cols)
    assert list(frame.columns) == ["customer", *want]
    path = tmp_path / "p.csv"
    frame.to_csv(path, index=False)
    back = pd.read_csv(path, dtype={"customer": str})
    first = next(iter(want))
    assert back[first].tolist() == want[first]  # full precision round trip


def test_a_saved_task_is_restored_without_labels():
    """The task of a saved model: a regression target's scale comes from what was
    saved (mean, scale), not from labels, which prediction does not have."""
    trained = TASKS.get("regression")(np.array([10.0, 20.0, 30.0, 40.0]), None, "mse")
    saved = {"kind": "regression", "classes": None, "mean": trained.mean, "scale": trained.scale}
    restored = TASKS.get("regression").restore(None, "mse", saved)
    out = torch.tensor([[0.5], [-1.0]])
    assert torch.equal(restored.outputs_to_scores(out), trained.outputs_to_scores(out))
    binary = TASKS.get("binary").restore(["no", "yes"], "mse", {"kind": "binary"})
    assert binary.outputs == 2 and binary.classes == ["no", "yes"]
