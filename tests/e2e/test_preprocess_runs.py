"""Four parties' CSV exports with a categorical column and ~3% missing values
(examples/csv_walkthrough) train with each party's declared preprocessing; the
fitted statistics come from the training rows only; an unseen category without an
"other" bucket and a declared column missing from a file exit 2 naming the party
and the column. Real processes, the real launcher and CLI."""

from __future__ import annotations

import copy
import importlib.util
import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import yaml

from securevfl.data.party_data import split_indices
from securevfl.seeding import generator
from tests.support.protocols import ROOT, write_yaml
from tests.support.runs import cli, run_doc

pytestmark = pytest.mark.timeout(600)

EXAMPLE = ROOT / "examples" / "csv_walkthrough"


def _exports_module() -> Any:
    spec = importlib.util.spec_from_file_location("make_exports", EXAMPLE / "make_exports.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def exports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return _exports_module().write_exports(tmp_path_factory.mktemp("exports"))


def protocol(exports: dict[str, Path], backend: str = "plain", epochs: int = 6) -> dict[str, Any]:
    doc = yaml.safe_load((EXAMPLE / "protocol.yaml").read_text())
    for entry in [doc["parties"]["active"], *doc["parties"]["passive"]]:
        entry["source"]["path"] = str(exports[entry["name"]])
    doc["exchange"] = {"backend": backend}
    doc["training"]["epochs"] = epochs
    return doc


def split_ids(exports: dict[str, Path], doc: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The aligned training and test IDs every rank derives (PSI order: sorted IDs)."""
    common = set.intersection(*(set(pd.read_csv(p, dtype={"id": str})["id"]) for p in exports.values()))
    aligned = sorted(common)
    tr, te = split_indices(len(aligned), doc["dataset"]["test_fraction"], generator(0, "split"))
    return [aligned[i] for i in tr], [aligned[i] for i in te]


def test_exports_look_like_real_ones(exports: dict[str, Path]):
    lab = pd.read_csv(exports["lab"], dtype={"id": str})
    assert not pd.api.types.is_numeric_dtype(lab["region"])
    numeric = lab.drop(columns=["id", "region"])
    share = float(numeric.isna().to_numpy().mean())
    assert 0.01 < share < 0.06, share
    ids = [set(pd.read_csv(p, dtype={"id": str})["id"]) for p in exports.values()]
    assert len(set.union(*ids)) > len(set.intersection(*ids))  # partial overlap


def test_without_preprocess_the_files_are_refused(exports: dict[str, Path], tmp_path: Path):
    doc = protocol(exports)
    for p in doc["parties"]["passive"]:
        p.pop("preprocess")
    r = cli("run", str(write_yaml(tmp_path / "p.yaml", doc)), "--out", str(tmp_path / "out"), "--quiet")
    assert r.returncode == 2, r.stderr[-2000:]
    assert "party 'lab'" in r.stderr and "non-numeric feature columns ['region']" in r.stderr


def with_test_row_outlier(
    exports: dict[str, Path], doc: dict[str, Any], folder: Path
) -> tuple[Any, list[str]]:
    """Put an extreme 'alcohol' value in one test row of the lab's file (and only
    there); returns the lab's table and the training IDs."""
    train_ids, test_ids = split_ids(exports, doc)
    lab = pd.read_csv(exports["lab"], dtype={"id": str})
    victim = next(i for i in test_ids if not np.isnan(lab.loc[lab["id"] == i, "alcohol"].iloc[0]))
    lab.loc[lab["id"] == victim, "alcohol"] = 1e4
    path = folder / "lab.csv"
    lab.to_csv(path, index=False)
    doc["parties"]["passive"][0]["source"]["path"] = str(path)
    return lab.set_index("id"), train_ids


@pytest.mark.parametrize(
    "backend",
    ["plain", pytest.param("mpc", marks=pytest.mark.slow), pytest.param("ckks", marks=pytest.mark.slow)],
)
def test_four_csv_parties_train_with_declared_preprocessing(exports, tmp_path: Path, backend: str):
    """Trains on each backend; and the acceptance check that the fitted transforms
    use only training rows: with an outlier put only in a test row, the median and
    mean the lab's rank fitted are exactly those of its training rows."""
    doc = protocol(exports, backend)
    lab, train_ids = with_test_row_outlier(exports, doc, tmp_path)
    result = run_doc(doc, tmp_path / "out")
    assert result["task"] == "multiclass"
    assert result["rows"]["aligned"] < 178  # partial overlap: PSI kept the common records
    # 40 test rows, a fresh secret start each run: 0.775-0.925 over ten runs on 2026-11-28 (0.85
    # failed 3 of them); the floor by tests/shipped/floor_rule.py (lowest less the whole spread)
    assert result["test_accuracy"] >= 0.625, result["test_accuracy"]
    ranks = tmp_path / "out" / "ranks"
    fitted = json.loads((ranks / "rank1.preprocess.json").read_text())
    assert "region_north" in fitted["outputs"] and "missingindicator_alcohol" in fitted["outputs"]
    assert fitted["categorical"]["region"]["other"]  # the rare 'west' went to the other bucket
    alcohol = lab.loc[train_ids, "alcohol"]
    median = float(alcohol.median())
    assert fitted["numeric"]["alcohol"]["impute_value"] == pytest.approx(median)
    assert fitted["numeric"]["alcohol"]["mean"] == pytest.approx(float(alcohol.fillna(median).mean()))
    every = lab["alcohol"].fillna(median)
    assert abs(float(every.mean()) - fitted["numeric"]["alcohol"]["mean"]) > 10  # the outlier would show
    shop = json.loads((ranks / "rank3.preprocess.json").read_text())
    assert shop["numeric"]["proline"]["log1p"] is True

    # the walk-through's prediction step: every party's new export (new IDs, reordered
    # and extra columns, missing values, an unseen region), scored with this model
    new = _exports_module().write_new_records(tmp_path / "new")
    data = [f"--data={p}={f}" for p, f in new.items()]
    r = cli("predict", str(tmp_path / "out"), "--out", str(tmp_path / "pred"), *data)
    assert r.returncode == 0, r.stderr[-3000:]
    pred = pd.read_csv(tmp_path / "pred" / "predictions.csv", dtype={"id": str})
    assert list(pred.columns) == ["id", "p_c0", "p_c1", "p_c2", "class"]
    held = set.intersection(*(set(pd.read_csv(f, dtype={"id": str})["id"]) for f in new.values()))
    assert pred["id"].tolist() == sorted(held)
    assert np.allclose(pred[["p_c0", "p_c1", "p_c2"]].sum(axis=1), 1.0, atol=1e-5)
    truth = pd.read_csv(tmp_path / "new" / "answers.csv", dtype={"id": str}).set_index("id")["cultivar"]
    accuracy = float((pred["class"].to_numpy() == truth.loc[pred["id"]].to_numpy()).mean())
    assert accuracy >= 0.8, accuracy  # near-copies of wines the model has seen


def test_unseen_category_without_other_bucket_exits_2(exports, tmp_path: Path):
    doc = protocol(exports, epochs=1)
    doc["parties"]["passive"][0]["preprocess"]["categorical"] = {"columns": ["region"], "other": False}
    _, test_ids = split_ids(exports, doc)
    lab = pd.read_csv(exports["lab"], dtype={"id": str})
    lab.loc[lab["id"] == test_ids[0], "region"] = "atlantis"  # only in a test row
    path = tmp_path / "lab.csv"
    lab.to_csv(path, index=False)
    doc["parties"]["passive"][0]["source"]["path"] = str(path)
    r = cli("run", str(write_yaml(tmp_path / "p.yaml", doc)), "--out", str(tmp_path / "out"), "--quiet")
    assert r.returncode == 2, r.stderr[-2000:]
    said = " ".join(r.stderr.split())  # the terminal's error is wrapped to its width
    assert "party 'lab': column 'region' holds a category its training rows do not have" in said


def test_declared_column_missing_from_the_file_exits_2(exports, tmp_path: Path):
    doc = copy.deepcopy(protocol(exports, epochs=1))
    doc["parties"]["passive"][2]["preprocess"]["log1p"] = ["proline", "colour"]
    r = cli("run", str(write_yaml(tmp_path / "p.yaml", doc)), "--out", str(tmp_path / "out"), "--quiet")
    assert r.returncode == 2, r.stderr[-2000:]
    assert "party 'shop': preprocess.log1p names columns ['colour']" in r.stderr
