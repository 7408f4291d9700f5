"""Label inference by a passive party (spec 001 §1; anchors note: VFLAIR's
Norm/DirectionbasedScoring after Li et al. 2022, arXiv 2102.08504, and model
completion after Fu et al., USENIX Security 2022; spec 004 §5.4).

Threat model: the attacking passive party P_i is honest-but-curious. Its view is
the gradient dL/dh'_i the exchange revealed to it at every training step (under
``plain`` the ledger's ``embedding_grad``; under ``mpc``/``ckks``/``paillier`` the
value the backend reveals to P_i alone; the party records it as it arrives), its
own features and its trained bottom model. Rows are identified through the shared
batch schedule. Scores are graded against A's true labels, which the attack never
sees except for the few ``n_known`` training labels it is explicitly given.

* ``label_norm`` (binary / one-vs-rest): the score of a training record is the
  L2 norm of its gradient, averaged over the steps it appeared in. Metric: leak
  AUC = max(AUC, 1 - AUC), since the attacker need not know which class has the
  larger norm (0.5 = chance).
* ``label_direction`` (binary / one-vs-rest): given a few known labels, a record
  in the same batch as known records scores sum_k s_k cos(g, g_k) (s_k = +1 for a
  known positive, -1 for a known negative), averaged over its steps. Metric: AUC
  with that orientation, and leak AUC.
* ``model_completion`` (any task): a small classifier on the party's own final
  bottom-model output (what it sends, after its embedding defenses, by default)
  fitted to the ``n_known`` known labels, predicting the test records. Metric:
  accuracy (and AUC for binary tasks). The semi-supervised MixMatch step of Fu et
  al. is left out: the head is fitted on the known labels only.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field

from securevfl.attacks import metrics
from securevfl.attacks.base import ATTACKS, Attack, AttackOptions, View, World
from securevfl.attacks.learners import fit_classifier
from securevfl.attacks.views import steps_per_row


class _PassiveOptions(AttackOptions):
    party: str | None = Field(default=None, description="the attacking passive party (default: the first)")


class _ScoringOptions(_PassiveOptions):
    positive: int = Field(
        default=1, ge=0, description="the class scored as positive (one-vs-rest on multi-class tasks)"
    )


class _PassiveAttack(Attack):
    adversary = "passive"

    def adversary_party(self, world: World) -> str:
        return world.passive(self.params.party).party

    def _known(self, world: World, n: int) -> dict[str, Any]:
        """``n`` training records whose true label the attacker is given."""
        a = world.active.own
        n_train = len(a["train_idx"])
        g = np.random.default_rng(self.params.seed)
        rows = np.sort(g.choice(n_train, size=min(n, n_train), replace=False)) if n else np.zeros(0, int)
        return {"known_rows": rows, "known_labels": a["y_train"][torch.as_tensor(rows)].numpy()}

    @staticmethod
    def _grads(view: View) -> list[list[torch.Tensor]]:
        own = view.own
        return steps_per_row(own["forwards"], own["grads"], len(own["train_idx"]))


def _binary_truth(world: World, positive: int, rows: np.ndarray) -> np.ndarray:
    y = world.active.own["y_train"].numpy()[rows]
    return (y == positive).astype(int)


class LabelNormOptions(_ScoringOptions):
    pass


class LabelNorm(_PassiveAttack):
    name = "label_norm"
    options = LabelNormOptions

    def run(self, view: View) -> dict[str, Any]:
        per_row = self._grads(view)
        rows = np.array([i for i, gs in enumerate(per_row) if gs])
        scores = np.array([float(torch.stack(per_row[i]).norm(dim=1).mean()) for i in rows])
        return {
            "rows": rows,
            "scores": scores,
            "used": {"input": "revealed dL/dh' per training step (own record)", "known_labels": 0},
        }

    def score(self, guess: dict[str, Any], world: World) -> dict[str, Any]:
        y = _binary_truth(world, self.params.positive, guess["rows"])
        auc = metrics.leak_auc(guess["scores"], y)
        return {"auc": auc, "auc_raw": metrics.roc_auc(guess["scores"], y), "ap": auc, "n_rows": len(y)}


class LabelDirectionOptions(_ScoringOptions):
    n_known: int = Field(default=10, ge=1, description="training records whose label the attacker knows")


class LabelDirection(_PassiveAttack):
    name = "label_direction"
    options = LabelDirectionOptions

    def knowledge(self, world: World) -> dict[str, Any]:
        known = self._known(world, self.params.n_known)
        known["known_positive"] = (known.pop("known_labels") == self.params.positive).astype(int)
        return known

    def run(self, view: View) -> dict[str, Any]:
        own = view.own
        sign = {
            int(r): (1.0 if p else -1.0)
            for r, p in zip(view.prior["known_rows"], view.prior["known_positive"], strict=True)
        }
        n_train = len(own["train_idx"])
        total = np.zeros(n_train)
        count = np.zeros(n_train)
        for f, g in zip(own["forwards"], own["grads"], strict=True):
            rows = np.asarray(f["rows"])
            ref = [(k, sign[int(r)]) for k, r in enumerate(rows) if int(r) in sign]
            if not ref:
                continue
            gn = torch.nn.functional.normalize(g.double(), dim=1)
            s = sum(w * (gn @ gn[k]) for k, w in ref) / len(ref)
            total[rows] += s.numpy()
            count[rows] += 1
        rows = np.array([i for i in range(n_train) if count[i] > 0 and i not in sign])
        return {
            "rows": rows,
            "scores": total[rows] / count[rows] if len(rows) else np.zeros(0),
            "used": {
                "input": "revealed dL/dh' per training step (own record)",
                "known_labels": len(sign),
            },
        }

    def score(self, guess: dict[str, Any], world: World) -> dict[str, Any]:
        y = _binary_truth(world, self.params.positive, guess["rows"])
        auc = metrics.roc_auc(guess["scores"], y)
        return {"auc": auc, "leak_auc": metrics.leak_auc(guess["scores"], y), "ap": auc, "n_rows": len(y)}


class ModelCompletionOptions(_PassiveOptions):
    n_known: int = Field(default=40, ge=1, description="training records whose label the attacker knows")
    features: Literal["sent", "bottom"] = Field(
        default="sent", description="sent: bottom output after the party's embedding defenses; bottom: before"
    )
    hidden: list[int] = Field(default=[32], description="hidden sizes of the completion head")


class ModelCompletion(_PassiveAttack):
    name = "model_completion"
    options = ModelCompletionOptions

    def knowledge(self, world: World) -> dict[str, Any]:
        known = self._known(world, self.params.n_known)
        known["classes"] = int(world.active.own["classes"])
        return known

    def run(self, view: View) -> dict[str, Any]:
        p, own, prior = self.params, view.own, view.prior
        pre = "sent" if p.features == "sent" else "h"
        x_tr, x_te = own[f"{pre}_train"].float(), own[f"{pre}_test"].float()
        rows = torch.as_tensor(prior["known_rows"])
        proba = fit_classifier(
            x_tr[rows], torch.as_tensor(prior["known_labels"]), prior["classes"], hidden=p.hidden, seed=p.seed
        )(x_te)
        return {
            "proba": proba,
            "used": {
                "input": f"own final bottom-model output ({p.features}) of train and test records",
                "known_labels": len(rows),
            },
        }

    def score(self, guess: dict[str, Any], world: World) -> dict[str, Any]:
        y = world.active.own["y_test"].numpy()
        proba = guess["proba"]
        out: dict[str, Any] = {"accuracy": metrics.accuracy(proba.argmax(1), y), "n_test": len(y)}
        out["ap"] = out["accuracy"]
        # guessing the most frequent class: what a label-blind attacker scores
        out["chance"] = float(np.bincount(y).max() / len(y)) if len(y) else float("nan")
        if proba.shape[1] == 2:
            out["auc"] = metrics.roc_auc(proba[:, 1], y)
        return out


for _cls in (LabelNorm, LabelDirection, ModelCompletion):
    ATTACKS.add(_cls.name, _cls)
