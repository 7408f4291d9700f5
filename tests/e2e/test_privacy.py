"""Privacy records and budgets in real runs (docs/design.md §7)."""

from __future__ import annotations

import json

import pytest

from tests.support.protocols import small_digits
from tests.support.runs import CliRun, own_reports, run_doc


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
    changed = own_reports(tmp_path)["active"]["label_dp"]["labels_changed"]
    assert 0.72 < changed < 0.81
    assert res["test_accuracy"] is not None


def test_run_without_dp_has_no_privacy_record(small_cli_run: CliRun) -> None:
    """The shared short undefended run (tests/conftest.py)."""
    assert json.loads((small_cli_run.out / "result.json").read_text())["privacy"] == {}


def test_budget_stops_training_at_the_last_step_within_it(tmp_path) -> None:
    """Vanilla embedding DP releases each training row once per epoch, so a
    budget between the cost of one and of two releases must stop the run after
    exactly one epoch (12 steps of 128 over 1437 rows), on every rank."""
    from securevfl.app.loader import load_checked_dict
    from securevfl.defenses.spending import spent
    from securevfl.privacy.step_budget import plan_for

    doc = small_digits(epochs=2)
    dp = {"name": "embedding_dp", "params": {"variant": "vanilla", "epsilon": 2.0, "delta": 1e-2}}
    for p in doc["parties"]["passive"]:
        p["defenses"] = [dp]
    checked = load_checked_dict(doc)
    tr = checked.protocol.training
    one = spent(checked, plan_for(12, 1437, tr))["left"]["total"]["epsilon"]
    two = spent(checked, plan_for(13, 1437, tr))["left"]["total"]["epsilon"]
    assert one < two
    doc["privacy"] = {"budget": {"epsilon": (one + two) / 2}}
    run_doc(doc, tmp_path)
    res = json.loads((tmp_path / "result.json").read_text())
    assert res["train_steps"] == 12
    priv = res["privacy"]
    assert priv["stopped_by_budget"] is True and priv["planned_steps"] == 24 and priv["steps_run"] == 12
    for party in ("left", "right"):
        assert priv["parties"][party]["total"]["epsilon"] == pytest.approx(one, rel=1e-6)
        assert priv["parties"][party]["total"]["epsilon"] <= (one + two) / 2
    # every rank ran the same truncated schedule
    for r in (1, 2):
        summary = json.loads((tmp_path / "ranks" / f"rank{r}.summary.json").read_text())
        assert summary["train_steps"] == 12


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["mpc", "ckks"])
def test_label_dp_runs_under_crypto_backends(tmp_path, backend: str) -> None:
    """Crypto plus perturbation: randomized response happens at A before any
    exchange, so it composes with every backend unchanged."""
    doc = small_digits(epochs=1, max_steps=4)
    doc["exchange"] = {"backend": backend, "params": {}}
    doc["parties"]["active"]["defenses"] = [{"name": "label_dp", "params": {"epsilon": 0.5}}]
    run_doc(doc, tmp_path)
    res = json.loads((tmp_path / "result.json").read_text())
    assert res["backend"] == backend and res["train_steps"] == 4
    rec = res["privacy"]["parties"]["active"]["mechanisms"]["label_dp.randomized_response"]
    assert rec["epsilon"] == pytest.approx(0.5, abs=1e-3)
    # at eps = 0.5, K = 10: 1 - e^0.5 / (9 + e^0.5) = 84.5% of labels change
    assert 0.80 < own_reports(tmp_path)["active"]["label_dp"]["labels_changed"] < 0.89
