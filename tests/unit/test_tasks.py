"""Task kinds: the pure metrics against scikit-learn, the regression target's
scaling, and the load-time refusal of class-needing components under regression."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.metrics import mean_absolute_error, r2_score, roc_auc_score

from securevfl.app.loader import load_protocol_dict
from securevfl.errors import ConfigError, UnsupportedCombination
from securevfl.metrics import majority_rate
from securevfl.parties.task_kinds import TASKS
from securevfl.parties.tasks import classification_metrics, regression_metrics
from tests.support.protocols import load_yaml


def test_regression_metrics_match_scikit_learn():
    rng = np.random.default_rng(0)
    y = rng.normal(150, 70, 200)
    pred = y + rng.normal(0, 30, 200)
    m = regression_metrics(pred, y)
    assert m["test_r2"] == pytest.approx(r2_score(y, pred))
    assert m["test_mae"] == pytest.approx(mean_absolute_error(y, pred))
    assert m["test_rmse"] == pytest.approx(float(np.sqrt(np.mean((y - pred) ** 2))))
    assert regression_metrics(np.full(200, y.mean()), y)["test_r2"] == pytest.approx(0.0)


def test_classification_metrics_match_scikit_learn():
    rng = np.random.default_rng(1)
    p1 = rng.random(100)
    probs = np.stack([1 - p1, p1], axis=1)
    y = (rng.random(100) < p1).astype(np.int64)
    m = classification_metrics(probs, y)
    assert m["test_auc"] == pytest.approx(roc_auc_score(y, p1))
    assert m["test_accuracy"] == pytest.approx(float(((p1 > 0.5) == y).mean()))
    three = classification_metrics(np.eye(3)[[0, 1, 2, 2]], np.array([0, 1, 2, 1]))
    assert three == {"test_accuracy": 0.75, "test_auc": None, "test_majority_rate": 0.5}


def test_majority_rate_is_the_accuracy_of_predicting_the_most_common_label():
    y = np.array([2, 0, 2, 1, 2, 2, 0, 1])
    assert majority_rate(y) == 0.5
    # it is exactly what the constant majority prediction scores
    probs = np.eye(3)[np.full(len(y), 2)]
    assert classification_metrics(probs, y)["test_accuracy"] == majority_rate(y)
    assert majority_rate(np.array(["no", "yes", "no"])) == pytest.approx(2 / 3)
    assert majority_rate(np.ones(5, dtype=np.int64)) == 1.0
    assert np.isnan(majority_rate(np.zeros(0, dtype=np.int64)))
    # binary: AUC is present whenever the test rows hold both classes
    binary = classification_metrics(np.array([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4]]), np.array([0, 1, 1]))
    assert binary["test_auc"] == 1.0 and binary["test_majority_rate"] == pytest.approx(2 / 3)


def test_regression_trains_on_the_standardized_target_and_reports_in_its_units():
    y_train = np.array([100.0, 200.0, 300.0], dtype=np.float32)
    task = TASKS.get("regression")(y_train, None, "mse")
    assert task.outputs == 1
    t = task.targets(y_train)
    assert t.dtype == torch.float32 and float(t.mean()) == pytest.approx(0.0, abs=1e-6)
    assert float(t.std(unbiased=False)) == pytest.approx(1.0)
    back = task.outputs_to_scores(t[:, None])
    assert back.numpy().tolist() == pytest.approx([100.0, 200.0, 300.0])
    out = torch.tensor([[0.0], [3.0]])
    target = torch.tensor([0.0, 0.0])
    assert float(task.loss(out, target)) == pytest.approx(4.5)  # MSE
    huber = TASKS.get("regression")(y_train, None, "huber")
    assert float(huber.loss(out, target)) == pytest.approx((0 + (3 - 0.5)) / 2)  # delta 1


def test_classification_outputs_one_logit_per_class():
    task = TASKS.get("multiclass")(np.array([0, 1, 2]), ["a", "b", "c"], "mse")
    assert task.outputs == 3 and task.has_classes
    assert not TASKS.get("regression").has_classes


def _regression(**extra) -> dict:
    doc = load_yaml("diabetes_regression.yaml")
    doc.update(extra)
    return doc


@pytest.mark.parametrize(
    ("where", "component", "path"),
    [
        ("active", {"name": "label_dp", "params": {"epsilon": 1.0}}, "parties.active.defenses[0]"),
        ("attacks", {"name": "label_norm"}, "attacks[0]"),
        ("attacks", {"name": "membership_inference"}, "attacks[0]"),
    ],
)
def test_regression_refuses_class_components_at_load(where, component, path):
    doc = _regression()
    if where == "active":
        doc["parties"]["active"]["defenses"] = [component]
    else:
        doc["attacks"] = [component]
    with pytest.raises(UnsupportedCombination, match="needs class labels") as exc:
        load_protocol_dict(doc)
    assert exc.value.path == path


def test_regression_keeps_the_components_that_apply():
    doc = _regression()
    doc["parties"]["passive"][0]["defenses"] = [{"name": "gaussian_noise", "params": {"std": 0.1}}]
    doc["attacks"] = [{"name": "feature_reconstruction"}]
    assert load_protocol_dict(doc).task == "regression"


def test_huber_needs_a_regression_task():
    doc = load_yaml("breast_cancer.yaml")
    doc["task"] = "binary"
    doc["training"]["loss"] = "huber"
    with pytest.raises(ConfigError, match="regression loss") as exc:
        load_protocol_dict(doc)
    assert exc.value.path == "training.loss"
