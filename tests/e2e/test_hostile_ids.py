"""Hostile IDs end to end, real processes: parties whose files hold IDs that are
spreadsheet formulas, quotes, commas, carriage returns, line feeds, NUL and
unicode train and predict; ``predictions.csv`` has one row per aligned ID, no
cell that starts a formula, and ``api.predict(...).frame`` gives every ID back
as it was in the parties' files."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from securevfl import api
from tests.support.hostile import FORMULA, HOSTILE_IDS, NUMBER

pytestmark = pytest.mark.timeout(600)


def _write(path: Path, frame: pd.DataFrame) -> None:
    """A party's export, quoted as RFC 4180 says (a CR inside an ID is quoted)."""
    with open(path, "w", encoding="utf-8", newline="") as fh:
        w = csv.writer(fh, lineterminator="\r\n")
        w.writerow(frame.columns)
        w.writerows(frame.itertuples(index=False))


def test_hostile_ids_train_predict_and_come_back(tmp_path):
    ids = [i for i in HOSTILE_IDS if i.strip()] + [f"plain-{k}" for k in range(80)]
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=len(ids)), rng.normal(size=len(ids))
    label = (a + b > 0).astype(int)
    _write(tmp_path / "bank.csv", pd.DataFrame({"id": ids, "a": a, "churn": label}).iloc[::-1])
    _write(tmp_path / "shop.csv", pd.DataFrame({"id": ids[3:], "b": b[3:]}))  # three IDs bank alone holds
    model = {"kind": "mlp", "hidden": [4], "out": 4}
    doc = {
        "name": "hostile",
        "task": "binary",
        "dataset": {"name": "csv", "test_fraction": 0.25},
        "parties": {
            "active": {
                "name": "bank",
                "source": {
                    "path": str(tmp_path / "bank.csv"),
                    "label_column": "churn",
                    "feature_columns": ["a"],
                },
                "model": model,
            },
            "passive": [{"name": "shop", "source": {"path": str(tmp_path / "shop.csv")}, "model": model}],
        },
        "interactive": {"out": 4},
        "training": {"epochs": 1, "batch_size": 32},
    }
    run = api.run(doc, out=tmp_path / "run", progress=False)
    assert run.rows["aligned"] == len(ids) - 3
    pred = api.predict(run, out=tmp_path / "pred")
    assert pred.rows["aligned"] == len(ids) - 3
    frame = pred.frame
    assert list(frame.columns) == ["id", "score", "class"]
    assert sorted(frame["id"]) == sorted(ids[3:])
    assert frame["score"].between(0, 1).all() and set(frame["class"]) <= {0, 1}
    # the result and the prediction name the class test_auc and `score` are about
    assert json.loads((tmp_path / "run" / "result.json").read_text())["positive_class"] == "1"
    assert json.loads((tmp_path / "pred" / "prediction.json").read_text())["positive_class"] == "1"
    with open(pred.path, encoding="utf-8", newline="") as fh:
        rows = list(csv.reader(fh))
    assert len(rows) == len(ids) - 3 + 1
    for row in rows:
        for cell in row:
            assert not (FORMULA.match(cell) and not NUMBER.fullmatch(cell)), repr(cell)
