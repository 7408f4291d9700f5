"""The H11 relative-change report (docs/methods/dravl.md §6 H11, §9.5 item 23)."""

from __future__ import annotations

import math

import pytest

from securevfl.report.relative import h11_rows, h11_table, relative_change


def test_relative_change_in_percent_of_the_baseline():
    assert relative_change(1.095, 1.0) == pytest.approx(9.5)
    assert relative_change(0.2636, 0.45) == pytest.approx(-41.422, abs=1e-3)
    assert relative_change(-0.5, -1.0) == pytest.approx(50.0)  # |baseline| keeps the sign of the move
    assert math.isnan(relative_change(1.0, 0.0))


def test_h11_rows_reproduce_the_papers_headline_form():
    # vanilla and a DRAVL run whose changes are the paper's H11 figures
    runs = {
        "vanilla": {"mse": 0.40, "dcor": 0.45, "auc": 0.80},
        "dravl": {"mse": 0.438, "dcor": 0.26352, "auc": 0.782},
        "partial": {"auc": 0.79},
    }
    rows = {r["config"]: r for r in h11_rows(runs)}
    assert set(rows) == {"dravl", "partial"}
    d = rows["dravl"]
    assert d["mse_pct"] == pytest.approx(9.5)
    assert d["dcor_pct"] == pytest.approx(-41.44)
    assert d["auc_pct"] == pytest.approx(-2.25)
    assert d["auc_abs"] == pytest.approx(-0.018)
    assert math.isnan(rows["partial"]["mse_pct"]) and rows["partial"]["auc_abs"] == pytest.approx(-0.01)
    with pytest.raises(KeyError, match="no 'vanilla' entry"):
        h11_rows({"dravl": runs["dravl"]})


def test_h11_table_prints_changes_absolute_auc_and_the_active_only_floor():
    runs = {
        "vanilla": {"mse": 0.40, "dcor": 0.45, "auc": 0.80},
        "dravl": {"mse": 0.438, "dcor": 0.26352, "auc": 0.782},
    }
    out = h11_table(runs, active_only_auc=0.68)
    assert "active-only AUC 0.680" in out and "vanilla: MSE 0.400, dCor 0.450, AUC 0.800" in out
    assert "| config | ΔMSE % | ΔdCor % | ΔAUC % | ΔAUC (abs) |" in out
    assert "| dravl | +9.50 % | -41.44 % | -2.25 % | -0.0180 |" in out
