"""Privacy records and budgets in real runs (DESIGN §7)."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_doc, small_digits


def test_label_dp_run_carries_its_privacy_record(tmp_path) -> None:
    doc = small_digits(epochs=1)
    doc["parties"]["active"]["defenses"] = [{"name": "label_dp", "params": {"epsilon": 1.0}}]
    run_doc(doc, tmp_path)
    res = json.loads((tmp_path / "result.json").read_text())
    priv = res["privacy"]
    assert priv["delta"] == 1e-5 and priv["stopped_by_budget"] is False
    rec = priv["parties"]["active"]["mechanisms"]["label_dp.randomized_response"]
    assert rec["epsilon"] == pytest.approx(1.0, abs=1e-3)
    # at eps = 1 with K = 10, 1 - e/(9 + e) = 76.8% of training labels change
    changed = res["defense_report"]["active"]["label_dp"]["labels_changed"]
    assert 0.72 < changed < 0.81
    assert res["test_accuracy"] is not None


def test_run_without_dp_has_no_privacy_record(tmp_path) -> None:
    run_doc(small_digits(epochs=1), tmp_path)
    assert json.loads((tmp_path / "result.json").read_text())["privacy"] == {}
