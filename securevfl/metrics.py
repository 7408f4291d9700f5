"""Test metrics as pure functions of predictions and labels, shared by the active
party's evaluation (:mod:`securevfl.parties.tasks`) and the attacks that check a
rebuilt model against the run (:mod:`securevfl.attacks.server`): one definition,
so that "equals the run's accuracy" compares like with like (float64 means)."""

from __future__ import annotations

import numpy as np
from sklearn.metrics import roc_auc_score


def majority_rate(y: np.ndarray) -> float:
    """The share of the most common label in ``y``: the accuracy of always predicting the
    majority class, the trivial baseline any classifier's accuracy is read against (nan
    for no rows)."""
    y = np.asarray(y).reshape(-1)
    if not y.size:
        return float("nan")
    _, counts = np.unique(y, return_counts=True)
    return float(counts.max() / y.size)


def classification_metrics(probs: np.ndarray, y: np.ndarray) -> dict[str, float | None]:
    """Accuracy of the arg-max class, the test rows' majority rate (:func:`majority_rate`,
    the baseline accuracy is read against) and, for two classes present in ``y``, the
    ROC AUC of class 1's probability (None when the test rows hold one class only: no
    AUC is defined)."""
    acc = float((probs.argmax(1) == y).mean())
    auc = None
    if probs.shape[1] == 2 and len(np.unique(y)) == 2:
        auc = float(roc_auc_score(y, probs[:, 1]))
    return {"test_accuracy": acc, "test_auc": auc, "test_majority_rate": majority_rate(y)}


def regression_metrics(pred: np.ndarray, y: np.ndarray) -> dict[str, float]:
    """RMSE, MAE and the coefficient of determination R^2 = 1 - SS_res / SS_tot
    (SS_tot around the test rows' own mean, as scikit-learn's ``r2_score``)."""
    pred = np.asarray(pred, dtype=np.float64).reshape(-1)
    y = np.asarray(y, dtype=np.float64).reshape(-1)
    err = pred - y
    ss_tot = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - float((err**2).sum()) / ss_tot if ss_tot > 0 else float("nan")
    return {
        "test_rmse": float(np.sqrt((err**2).mean())),
        "test_mae": float(np.abs(err).mean()),
        "test_r2": r2,
    }
