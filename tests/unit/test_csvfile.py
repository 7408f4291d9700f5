"""CSV files written from the parties' data: hostile IDs (formulas, quotes,
commas, carriage returns, line feeds, NUL, unicode) are written so that no cell
starts a formula and read back equal, by securevfl's own reader
(``api.predict(...).frame``) and, row for row, by pandas."""

from __future__ import annotations

import csv
from pathlib import Path

import pandas as pd
import pytest

from securevfl.api import Prediction
from securevfl.app.predict import predictions_frame, write_predictions
from securevfl.report.compare import write_comparison
from tests.support.hostile import FORMULA, HOSTILE_IDS, NUMBER


def _cells(path: Path) -> list[list[str]]:
    """Every row of the file as a spreadsheet sees its cells (RFC 4180 quoting)."""
    with open(path, encoding="utf-8", newline="") as fh:
        return list(csv.reader(fh))


def _no_formula(rows: list[list[str]]) -> None:
    for row in rows:
        for cell in row:
            assert not (FORMULA.match(cell) and not NUMBER.fullmatch(cell)), repr(cell)


def _prediction(folder: Path) -> Prediction:
    return Prediction(
        protocol="p",
        digest="0" * 16,
        backend="plain",
        task="binary",
        rows={"aligned": len(HOSTILE_IDS)},
        predictions="predictions.csv",
        ledger={},
        phase_s={},
        wall_time_s=0.0,
        folder=folder,
    )


@pytest.mark.parametrize("id_column", ["id", "=id", "customer, id"])
def test_hostile_ids_round_trip_through_predictions_csv(tmp_path, id_column):
    n = len(HOSTILE_IDS)
    scores = [k / (n + 1) + 1e-17 * k for k in range(n)]
    classes = ["=evil", "1", "-1", "'q"] * (n // 4) + ["=evil"] * (n % 4)
    write_predictions(
        tmp_path / "predictions.csv",
        predictions_frame(id_column, HOSTILE_IDS, {"score": scores, "class": classes}),
    )
    rows = _cells(tmp_path / "predictions.csv")
    assert len(rows) == n + 1  # a carriage return inside an ID is quoted, not a row break
    _no_formula(rows)
    back = _prediction(tmp_path).frame
    assert list(back.columns) == [id_column, "score", "class"]
    assert back[id_column].tolist() == HOSTILE_IDS
    assert back["score"].tolist() == scores  # floats at full precision
    assert back["class"].tolist() == classes
    # pandas reads the same rows: one per ID, the scores in place
    other = pd.read_csv(tmp_path / "predictions.csv", dtype=str, keep_default_na=False)
    assert len(other) == n
    assert [float(s) for s in other["score"]] == scores


def test_numbers_are_written_as_numbers(tmp_path):
    write_predictions(
        tmp_path / "predictions.csv",
        predictions_frame("id", ["a", "b"], {"value": [-1.5, 2.25]}),
    )
    assert (tmp_path / "predictions.csv").read_bytes() == b"id,value\r\na,-1.5\r\nb,2.25\r\n"


def test_comparison_csvs_guard_their_cells(tmp_path):
    rec = {
        "protocol": "p",
        "backend": "plain",
        "dataset": "digits",
        "seed": 0,
        "test_accuracy": 0.5,
        "defenses": {"p": ["=1+1"]},
        "description": '=HYPERLINK("x")',
    }
    files = write_comparison(tmp_path, [rec])
    for key in ("csv", "runs_csv"):
        _no_formula(_cells(files[key]))
