"""HashVFL's detector (docs/methods/hashvfl.md §2.9): one batch's statistics, the rates, and
the running record kept at the active party."""

from __future__ import annotations

import pytest
import torch

from securevfl.defenses.hashvfl.detector import Detector, detector_rates, detector_row

CODES = torch.tensor([[1.0, 1.0, 1.0, 1.0], [-1.0, -1.0, -1.0, -1.0]])  # two classes, d = 4


def _logits(pred: list[int]) -> torch.Tensor:
    return torch.nn.functional.one_hot(torch.tensor(pred), 2).float()


def test_codes_on_their_class_code_are_not_flagged_and_match_it() -> None:
    y = torch.tensor([0, 1])
    hs = [CODES[y], CODES[y]]
    row = detector_row(hs, CODES, _logits([0, 1]), y, threshold=2.0)
    assert row["pair_flagged"] == 0 and row["to_pred_flagged"] == 0
    assert row["match_class_code"] == 2.0 and row["correct"] == 2.0 and row["wrong"] == 0.0


def test_a_party_far_from_the_other_is_flagged_pairwise_and_against_the_prediction() -> None:
    y = torch.tensor([0, 0])
    other = CODES[y].clone()
    other[0] = -other[0]  # sample 0: all 4 bits differ
    row = detector_row([CODES[y], other], CODES, _logits([0, 1]), y, threshold=2.0)
    assert row["pair_flagged"] == 1  # sample 0 only
    assert row["to_pred_flagged"] == 2  # sample 0 vs o_0, sample 1 (predicted 1) vs o_1
    assert row["pair_ham_correct_sum"] == 4.0 and row["pair_ham_wrong_sum"] == 0.0
    assert row["match_class_code"] == pytest.approx(0.75 * 2)  # 3 of the 4 (party, row) codes are o_y


def test_rates_over_no_rows_are_none() -> None:
    rates = detector_rates([])
    assert rates["samples"] == 0 and rates["pair_flag_rate"] is None


def test_the_detector_keeps_a_window_totals_and_the_latest_evaluation_pass() -> None:
    det = Detector(threshold=2.0, window=2)
    y = torch.tensor([0, 1])
    for _ in range(3):
        det.observe_train([CODES[y], -CODES[y]], CODES, _logits([0, 1]), y)
    rep = det.report()
    assert rep["detector_last_steps"]["steps"] == 2
    assert rep["detector_totals"] == {"samples": 6, "pair_flagged": 6, "to_pred_flagged": 6}
    assert "detector_eval" not in rep
    det.begin_eval()
    det.observe_eval([CODES[y], CODES[y]], CODES, _logits([0, 1]), y)
    det.begin_eval()
    det.observe_eval([CODES[y], CODES[y]], CODES, _logits([0, 1]), y)
    rep = det.report()
    assert rep["detector_eval"]["passes"] == 2 and rep["detector_eval"]["samples"] == 2
    assert rep["detector_eval"]["pair_flag_rate"] == 0.0
