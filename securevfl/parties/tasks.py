"""Task kinds, registered by name (by path, in
:data:`securevfl.parties.task_kinds.TASKS`): what the top model outputs, the
training loss and the test metrics. The active party picks its task from the label column
(declared ``task:`` or inferred, :func:`securevfl.data.party_data.labels_for_task`)
and never branches on its name.

* ``binary`` / ``multiclass``: K logits, cross-entropy; test accuracy, the test
  rows' majority rate (the accuracy of always predicting the most common class, A's
  to publish like its accuracy), and the ROC AUC of the positive class (the second
  sorted label value) when there are two classes.
* ``regression``: one output, MSE (or Huber) on the target standardized with the
  training rows' mean and standard deviation (so that learning rates tuned for
  classification fit any target scale); RMSE, MAE and R^2 in the target's own
  units on the test rows.

The metrics themselves are pure functions in :mod:`securevfl.metrics`
(:func:`regression_metrics`, :func:`classification_metrics`), tested without parties.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F

from securevfl.metrics import classification_metrics, regression_metrics

__all__ = ["Task", "classification_metrics", "regression_metrics"]


class Task:
    """One task kind. ``y_train`` (the active party's raw training targets) fixes
    whatever the task fits on them (the regression target's scale).

    A plugin's task (:func:`securevfl.plugins.register_task`) subclasses this with
    a unique ``name``, ``has_classes`` (True: the label column is read as classes,
    ``classes`` their sorted distinct values and ``y`` their int64 indices; False:
    as float values, ``classes`` None), ``metric_keys`` (the keys
    :meth:`metrics` returns, the first one the headline) and the methods below
    marked raise-NotImplementedError. It runs in the active party's rank alone,
    on A's own labels: :meth:`loss` from the top model's outputs (``outputs``
    columns) and the targets, :meth:`outputs_to_scores` and :meth:`metrics` on
    the test rows (the metrics go to ``result.json``, which every party reads),
    :meth:`prediction_columns` for ``securevfl predict``. What it fits on the
    training targets in ``__init__`` it saves as attributes and sets back in
    :meth:`_restore` (the saved model keeps them; they are A's)."""

    name: ClassVar[str]
    has_classes: ClassVar[bool]
    metric_keys: ClassVar[tuple[str, ...]]

    @property
    def positive_class(self) -> str | None:
        """The class ``test_auc`` and a prediction's ``score`` are about (binary tasks only)."""
        return None

    def __init__(self, y_train: np.ndarray, classes: list[str] | None, loss: str):
        self.classes = classes
        self.loss_name = loss

    @classmethod
    def restore(cls, classes: list[str] | None, loss: str, fitted: dict[str, Any]) -> Task:
        """The task of a saved model (``securevfl predict``): what it fitted on the
        training targets comes from ``fitted`` (its saved attributes), not from
        labels, which prediction does not have."""
        task = cls.__new__(cls)
        Task.__init__(task, np.zeros(0), classes, loss)
        task._restore(fitted)
        return task

    def _restore(self, fitted: dict[str, Any]) -> None:
        """Set what :meth:`__init__` fits on the training targets (nothing here)."""

    @property
    def outputs(self) -> int:
        """Width of the top model's output."""
        raise NotImplementedError

    def targets(self, y: np.ndarray) -> torch.Tensor:
        """Raw labels as the loss's targets."""
        raise NotImplementedError

    def loss(self, out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def outputs_to_scores(self, out: torch.Tensor) -> torch.Tensor:
        """Top-model outputs as what the task reports per row: class
        probabilities, or the predicted value in the target's units."""
        raise NotImplementedError

    def metrics(self, scores: np.ndarray, y: np.ndarray) -> dict[str, Any]:
        raise NotImplementedError

    def prediction_columns(self, scores: np.ndarray) -> dict[str, list[Any]]:
        """The columns of ``predictions.csv`` after the ID (``securevfl predict``),
        from :meth:`outputs_to_scores` of the rows, in order."""
        raise NotImplementedError

    def headline(self, row: dict[str, Any]) -> str:
        """The test metric a progress line shows."""
        key = self.metric_keys[0]
        value = row.get(key)
        return "" if value is None else f"{key.removeprefix('test_')} {value:.4f}"


class Classification(Task):
    has_classes = True
    metric_keys = ("test_accuracy", "test_auc", "test_majority_rate")

    @property
    def outputs(self) -> int:
        assert self.classes is not None
        return len(self.classes)

    def targets(self, y: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(np.asarray(y, dtype=np.int64))

    def loss(self, out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(out, target)

    def outputs_to_scores(self, out: torch.Tensor) -> torch.Tensor:
        return torch.softmax(out.float(), dim=1)

    def metrics(self, scores: np.ndarray, y: np.ndarray) -> dict[str, Any]:
        return classification_metrics(scores, np.asarray(y))

    def prediction_columns(self, scores: np.ndarray) -> dict[str, list[Any]]:
        """One probability column per class (``p_<class>``, the label column's own
        values) and the most probable ``class``."""
        assert self.classes is not None
        scores = np.asarray(scores, dtype=np.float64)
        cols: dict[str, list[Any]] = {f"p_{c}": scores[:, k].tolist() for k, c in enumerate(self.classes)}
        cols["class"] = [self.classes[k] for k in scores.argmax(axis=1)]
        return cols


class Binary(Classification):
    name = "binary"

    @property
    def positive_class(self) -> str | None:
        """The label value ``test_auc`` and a prediction's ``score`` are about: the second of the
        two sorted label values (``1`` of 0/1, ``yes`` of no/yes)."""
        return None if self.classes is None else str(self.classes[1])

    def prediction_columns(self, scores: np.ndarray) -> dict[str, list[Any]]:
        """``score``: the probability of the second class (the positive one, as
        ``test_auc`` scores it), then the most probable ``class``."""
        assert self.classes is not None
        scores = np.asarray(scores, dtype=np.float64)
        return {
            "score": scores[:, 1].tolist(),
            "class": [self.classes[k] for k in scores.argmax(axis=1)],
        }


class Multiclass(Classification):
    name = "multiclass"


class Regression(Task):
    name = "regression"
    has_classes = False
    metric_keys = ("test_r2", "test_rmse", "test_mae")

    def __init__(self, y_train: np.ndarray, classes: list[str] | None, loss: str):
        super().__init__(y_train, classes, loss)
        y = np.asarray(y_train, dtype=np.float64)
        self.mean = float(y.mean())
        sd = float(y.std())
        self.scale = sd if sd > 1e-12 else 1.0

    def _restore(self, fitted: dict[str, Any]) -> None:
        self.mean = float(fitted["mean"])
        self.scale = float(fitted["scale"])

    @property
    def outputs(self) -> int:
        return 1

    def targets(self, y: np.ndarray) -> torch.Tensor:
        y = np.asarray(y, dtype=np.float64)
        return torch.as_tensor(((y - self.mean) / self.scale).astype(np.float32))

    def loss(self, out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        pred = out.squeeze(1)
        if self.loss_name == "huber":
            return F.huber_loss(pred, target, delta=1.0)
        return F.mse_loss(pred, target)

    def outputs_to_scores(self, out: torch.Tensor) -> torch.Tensor:
        return out.float().squeeze(1).double() * self.scale + self.mean

    def metrics(self, scores: np.ndarray, y: np.ndarray) -> dict[str, Any]:
        return regression_metrics(scores, y)

    def prediction_columns(self, scores: np.ndarray) -> dict[str, list[Any]]:
        """``value``: the prediction in the target's own units."""
        return {"value": np.asarray(scores, dtype=np.float64).reshape(-1).tolist()}
