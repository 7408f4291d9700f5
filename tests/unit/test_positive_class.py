"""A binary task names its positive class: the second of its two sorted label values, the
class ``test_auc`` and a prediction's ``score`` are about (README, "Task kinds")."""

from __future__ import annotations

import numpy as np

from securevfl.parties.task_kinds import TASKS


def test_a_binary_task_names_the_second_sorted_label_value_and_others_none() -> None:
    binary = TASKS.get("binary")(np.zeros(4), ["no", "yes"], "ce")
    assert binary.positive_class == "yes"
    scores = np.array([[0.8, 0.2], [0.1, 0.9]])
    assert binary.prediction_columns(scores) == {"score": [0.2, 0.9], "class": ["no", "yes"]}
    assert TASKS.get("multiclass")(np.zeros(4), ["a", "b", "c"], "ce").positive_class is None
    assert TASKS.get("regression")(np.arange(4.0), None, "mse").positive_class is None
