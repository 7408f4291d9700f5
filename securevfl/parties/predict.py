"""The parties' side of federated prediction (docs/design.md §12): a
trained split model applied to new, aligned rows.

Each side does exactly what it does in an evaluation pass of training
(:meth:`ActiveParty.evaluate`, :meth:`PassiveParty.evaluate`), in the same
batches (:func:`securevfl.schedule.eval_batches` of ``training.batch_size``)
through the same exchange backend in eval mode, so what each party learns at
prediction is what it learns at evaluation:

* a passive party P_i runs its bottom model and its embedding defenses in eval
  mode (``embed(h, train=False)``) and contributes h'_i to the exchange; it
  receives no gradient and no output;
* the active party A receives what the backend reveals to it at evaluation
  (z = sum_i h'_i W_i under ``plain`` from the h'_i it sees, z alone under ``mpc``,
  the z_i under ``ckks``/``paillier``), adds its own part and the bias, and turns
  the top model's outputs into the task's scores.

Nothing here builds, saves or loads models: the caller hands over the party's
model, loaded into the split-model class training uses
(:mod:`securevfl.parties.split_model`), and its restored exchange role.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from securevfl.exchange.base import ActiveExchange, PassiveExchange, RunPlan
from securevfl.parties.split_model import ActiveModel, PassiveModel
from securevfl.parties.tasks import Task
from securevfl.schedule import eval_batches


def _prediction_plan(n_rows: int, batch_size: int) -> RunPlan:
    """What prediction puts through the exchange: no training step, one pass of
    evaluation batches over the ``n_rows`` aligned rows (both sides know them)."""
    return RunPlan({}, tuple(len(b) for b in eval_batches(n_rows, batch_size)))


@dataclass
class ActivePredictor:
    """A's trained model (:class:`~securevfl.parties.split_model.ActiveModel`, the
    one training runs: task head, top model, bias and, with features, its bottom
    model and own block) and the exchange's active role restored to the trained
    interactive layer (or A's shares of it)."""

    model: ActiveModel
    exchange: ActiveExchange
    batch_size: int
    keep_z: bool = False  # keep every z the exchange reveals (runtime.dump_views: wire audits)

    def __post_init__(self) -> None:
        self.revealed_z: list[torch.Tensor] = []

    @property
    def task(self) -> Task:
        return self.model.task

    @torch.no_grad()
    def predict(self, x: torch.Tensor, n_rows: int) -> np.ndarray:
        """The task's scores for the ``n_rows`` aligned rows (``x``: A's own model
        inputs for them, zero columns for a label-only party), one exchange forward
        per batch, in row order."""
        scores = []
        self.exchange.expect(_prediction_plan(n_rows, self.batch_size))
        for idx in eval_batches(n_rows, self.batch_size):
            z = self.exchange.forward(len(idx), train=False).to(self.model.device)
            if self.keep_z:
                self.revealed_z.append(z.detach().cpu().clone())
            _, logits = self.model.forward(z, x[idx])
            scores.append(self.task.outputs_to_scores(logits).cpu())
        return torch.cat(scores).numpy()


@dataclass
class PassivePredictor:
    """P_i's trained model (:class:`~securevfl.parties.split_model.PassiveModel`, the
    one training runs: its bottom model and defense stack in their trained state)
    and the exchange's passive role with its trained share."""

    model: PassiveModel
    exchange: PassiveExchange
    batch_size: int
    keep_sent: bool = False  # keep every h'_i it sends (runtime.dump_views: wire audits)

    def __post_init__(self) -> None:
        self.sent: list[tuple[int, torch.Tensor]] = []

    @torch.no_grad()
    def contribute(self, x: torch.Tensor) -> None:
        """Send h'_i of every aligned row, batch by batch, in row order."""
        self.exchange.expect(_prediction_plan(x.shape[0], self.batch_size))
        for b, idx in enumerate(eval_batches(x.shape[0], self.batch_size)):
            _, h2 = self.model.forward(x[idx], train=False)
            if self.keep_sent:
                self.sent.append((b, h2.detach().cpu().clone()))
            self.exchange.forward(h2, train=False)
