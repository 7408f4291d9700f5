"""Membership inference by the active party with shadow models (Shokri et al.
2017; docs/methods/vfl-afe.md §5.2, adapted to what A sees).

Threat model: A is honest-but-curious and asks whether a record was in the
training set, from its own model's output on that record. Its view: the z the
exchange revealed for every record (its last training step for a training record,
the final evaluation pass for a test record), its own final top model and bias,
and its labels. The target's output for a record is softmax(top(z + b)).

Shadow step (docs/methods/vfl-afe.md §5.2, K = 2 so in:out is 1:1): the shadow pool is half of
the test records (known non-members of the target, with A's labels and z). It is
split into two chunks; shadow model k (same architecture and optimizer as A's top
model) trains on chunk k, and its outputs on chunk k are labelled "in", on the
other chunk "out". One attack model (sklearn gradient boosting on the sorted
probability vector, the true-class probability and the loss) learns in/out from
all shadow outputs. It is evaluated on a balanced set: the other half of the test
records (non-members) and as many random training records (members), both cut to
the smaller of the two counts when the training set is the smaller one. Metric:
accuracy on that set (0.5 = chance) and AUC.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field
from sklearn.ensemble import GradientBoostingClassifier

import securevfl.attacks.metrics as metrics
from securevfl.attacks.base import Attack, AttackOptions, View, World
from securevfl.attacks.views import per_row
from securevfl.models import build_bias, build_top, make_optimizer


class MembershipOptions(AttackOptions):
    shadow_epochs: int | None = Field(
        default=None, ge=1, description="epochs per shadow model (default: training.epochs)"
    )
    attack_model: Literal["boosting", "threshold"] = Field(
        default="boosting",
        description="boosting: gradient boosting on the features below; threshold: one cut on the loss, "
        "placed where it best separates the shadow models' in/out records (transfers better when the "
        "shadows fit less tightly than the target)",
    )


class _LossThreshold:
    """Members are the records whose loss is at most a cut learned on the
    shadows' in/out records (the loss is the last attack feature)."""

    def fit(self, x: np.ndarray, inout: np.ndarray) -> _LossThreshold:
        loss = x[:, -1]
        cuts = np.unique(loss)
        acc = [np.mean((loss <= c) == inout.astype(bool)) for c in cuts]
        self.cut = float(cuts[int(np.argmax(acc))])
        return self

    def predict(self, x: np.ndarray) -> np.ndarray:
        return (x[:, -1] <= self.cut).astype(int)

    def score(self, x: np.ndarray) -> np.ndarray:
        return -x[:, -1]


def attack_features(proba: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Per record: its probability vector sorted descending, the true class's
    probability and the cross-entropy loss."""
    p_true = proba[np.arange(len(y)), y]
    return np.column_stack([-np.sort(-proba, axis=1), p_true, -np.log(np.clip(p_true, 1e-12, None))])


class MembershipInference(Attack[MembershipOptions]):
    name = "membership_inference"
    adversary = "active"
    needs_classes = "its shadow models are classifiers over A's class labels"
    options = MembershipOptions

    def knowledge(self, world: World) -> dict[str, Any]:
        """The architecture and recipe of A's own training (A ran it), and the user
        code the harness may import to rebuild A's top model (a factory of the
        file's own, in the local launcher)."""
        proto = world.proto
        return {"top": proto.top, "training": proto.training, "code": world.components.code}

    def _target(self, view: View):
        own = view.own
        classes = int(own.classes)
        d = own.bias.shape[0]
        top = build_top(view.prior["top"], d, classes, seed=0, code=view.prior["code"])
        top.load_state_dict(own.top)
        top.eval()
        return top, classes

    def run(self, view: View) -> dict[str, Any]:
        own, tr = view.own, view.prior["training"]
        n_train, n_test = len(own.train_idx), len(own.test_idx)
        table = per_row(own.forwards, own.z, n_train, n_test)
        top, classes = self._target(view)
        bias = own.bias
        y_tr, y_te = own.y_train.long(), own.y_test.long()
        g = np.random.default_rng(self.params.seed)
        test_rows = g.permutation(np.flatnonzero(table.test_seen))
        half = len(test_rows) // 2
        shadow, nonmem = test_rows[:half], test_rows[half:]
        seen = np.flatnonzero(table.train_seen)
        n_eval = min(len(nonmem), len(seen))  # balanced: as many members as non-members
        nonmem = nonmem[:n_eval]
        members = g.choice(seen, size=n_eval, replace=False)

        # shadow models: imitate A's top model on shadow chunks
        chunks = [shadow[: half // 2], shadow[half // 2 :]]
        feats, inout = [], []
        epochs = self.params.shadow_epochs or tr.epochs
        for k in range(2):
            net = self._shadow(view, classes, table.test[chunks[k]], y_te[chunks[k]], epochs, seed=k)
            for j, chunk in enumerate(chunks):
                with torch.no_grad():
                    p = torch.softmax(net(table.test[chunk]), 1).numpy()
                feats.append(attack_features(p, y_te[chunk].numpy()))
                inout.append(np.full(len(chunk), int(j == k)))
        x_shadow, y_shadow = np.vstack(feats), np.concatenate(inout)
        predict: Callable[[np.ndarray], np.ndarray]
        score: Callable[[np.ndarray], np.ndarray]
        if self.params.attack_model == "threshold":
            cut = _LossThreshold().fit(x_shadow, y_shadow)
            predict, score = cut.predict, cut.score
        else:
            clf = GradientBoostingClassifier(random_state=self.params.seed).fit(x_shadow, y_shadow)
            predict, score = clf.predict, (lambda q: clf.predict_proba(q)[:, 1])

        with torch.no_grad():
            p_mem = torch.softmax(top(table.train[members] + bias), 1).numpy()
            p_non = torch.softmax(top(table.test[nonmem] + bias), 1).numpy()
        x_eval = np.vstack(
            [attack_features(p_mem, y_tr[members].numpy()), attack_features(p_non, y_te[nonmem].numpy())]
        )
        return {
            "members": members,
            "nonmembers": nonmem,
            "pred": predict(x_eval),
            "score": score(x_eval),
            "used": {
                "input": "revealed z at A (last training step per training record, final evaluation per "
                "test record), A's own top model, bias and labels",
                "shadow_records": len(shadow),
                "shadow_models": 2,
            },
        }

    def _shadow(self, view: View, classes: int, z: torch.Tensor, y: torch.Tensor, epochs: int, seed: int):
        """A fresh copy of A's top-model architecture (plus bias) trained on z of
        one shadow chunk with A's own recipe."""
        tr = view.prior["training"]
        top = build_top(
            view.prior["top"], z.shape[1], classes, seed=self.params.seed + 1 + seed, code=view.prior["code"]
        )
        bias = build_bias(z.shape[1])
        opt = make_optimizer([*top.parameters(), bias], tr)
        g = torch.Generator().manual_seed(self.params.seed + seed)
        for _ in range(epochs):
            for b in torch.randperm(len(z), generator=g).split(tr.batch_size):
                opt.zero_grad()
                F.cross_entropy(top(z[b] + bias), y[b]).backward()
                opt.step()
        top.eval()
        return lambda q: top(q + bias)

    def score(self, guess: dict[str, Any], world: World) -> dict[str, Any]:
        truth = np.concatenate([np.ones(len(guess["members"])), np.zeros(len(guess["nonmembers"]))])
        acc = metrics.accuracy(guess["pred"], truth)
        return {
            "accuracy": acc,
            "auc": metrics.roc_auc(guess["score"], truth),
            "ap": acc,
            "n_eval": len(truth),
        }
