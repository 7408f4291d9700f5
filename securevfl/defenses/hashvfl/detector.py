"""HashVFL's abnormal-input detector at the active party (docs/methods/hashvfl.md §2.9).

Each batch of codes h_i is compared pairwise (the largest Hamming distance
between two parties' codes of one sample) and against the class code of the
predicted class; a distance above the threshold flags the sample. The statistics
are kept over a window of the latest training steps, in total, and for the latest
evaluation pass. :func:`detector_row` and :func:`detector_rates` are the math;
:class:`Detector` keeps the running record.
"""

from __future__ import annotations

from collections import deque

import torch

from securevfl.privacy import hashing

#: counters kept over the whole run
TOTALS = ("samples", "pair_flagged", "to_pred_flagged")


def detector_row(
    hs: list[torch.Tensor], codes: torch.Tensor, logits: torch.Tensor, y: torch.Tensor, threshold: float
) -> dict[str, float]:
    """Detector statistics of one batch: flags (pairwise, against o_{y_hat}),
    pairwise Hamming sums for correct and wrong predictions, exact matches with
    the true class's code. ``codes``: the class codes, one row per class."""
    pred = logits.argmax(1)
    det = hashing.detect(hs, codes[pred], threshold)
    correct = (pred == y).cpu()
    exact = torch.stack([(hashing.hamming(h, codes[y]) == 0).float().cpu() for h in hs]).mean()
    return {
        "samples": float(len(y)),
        "pair_flagged": float(det["pair_flag"].float().sum()),
        "to_pred_flagged": float(det["to_pred_flag"].float().sum()),
        "pair_ham_correct_sum": float(det["pair_max"][correct].sum()),
        "correct": float(correct.sum()),
        "pair_ham_wrong_sum": float(det["pair_max"][~correct].sum()),
        "wrong": float((~correct).sum()),
        "match_class_code": float(exact) * len(y),
    }


def detector_rates(rows: list[dict[str, float]]) -> dict[str, float | None]:
    """Flag rates, mean pairwise Hamming for correct and wrong predictions (the
    Table VI statistic) and the exact-match rate over batches' detector rows."""
    w = {k: sum(r[k] for r in rows) for k in rows[0]} if rows else {}
    n = w.get("samples", 0.0)

    def ratio(a: float, b: float) -> float | None:
        return a / b if b else None

    return {
        "samples": int(n),
        "pair_flag_rate": ratio(w.get("pair_flagged", 0.0), n),
        "to_pred_flag_rate": ratio(w.get("to_pred_flagged", 0.0), n),
        "pair_hamming_correct": ratio(w.get("pair_ham_correct_sum", 0.0), w.get("correct", 0.0)),
        "pair_hamming_wrong": ratio(w.get("pair_ham_wrong_sum", 0.0), w.get("wrong", 0.0)),
        "match_class_code_rate": ratio(w.get("match_class_code", 0.0), n),
    }


class Detector:
    """The detector's running record: a window of the latest ``window`` training
    batches, totals over the run, and the latest evaluation pass."""

    def __init__(self, threshold: float, window: int):
        self.threshold = threshold
        self._window: deque[dict[str, float]] = deque(maxlen=window)
        self._totals = dict.fromkeys(TOTALS, 0)
        self._eval: list[dict[str, float]] = []  # the latest evaluation pass, per batch
        self._eval_passes = 0

    @torch.no_grad()
    def observe_train(
        self, hs: list[torch.Tensor], codes: torch.Tensor, logits: torch.Tensor, y: torch.Tensor
    ) -> None:
        row = detector_row([h.detach() for h in hs], codes, logits.detach(), y, self.threshold)
        self._window.append(row)
        for k in self._totals:
            self._totals[k] += int(row[k])

    def begin_eval(self) -> None:
        self._eval = []
        self._eval_passes += 1

    @torch.no_grad()
    def observe_eval(
        self, hs: list[torch.Tensor], codes: torch.Tensor, logits: torch.Tensor, y: torch.Tensor
    ) -> None:
        self._eval.append(detector_row([h.detach() for h in hs], codes, logits.detach(), y, self.threshold))

    def report(self) -> dict[str, object]:
        out: dict[str, object] = {
            "detector_last_steps": {"steps": len(self._window), **detector_rates(list(self._window))},
            "detector_totals": dict(self._totals),
        }
        if self._eval:
            out["detector_eval"] = {"passes": self._eval_passes, **detector_rates(self._eval)}
        return out
