"""Label inference by a passive party (docs/methods/label-dp.md §1; anchors note: VFLAIR's
Norm/DirectionbasedScoring after Li et al. 2022, arXiv 2102.08504, and model
completion after Fu et al., USENIX Security 2022; docs/methods/hashvfl.md §5.4).

Threat model: the attacking passive party P_i is honest-but-curious. Its view is
the gradient dL/dh'_i the exchange revealed to it at every training step (under
``plain`` the ledger's ``embedding_grad``; under ``mpc``/``ckks``/``paillier`` the
value the backend reveals to P_i alone; the party records it as it arrives), its
own features and its trained bottom model. Rows are identified through the shared
batch schedule. Scores are graded against A's true labels, which the attack never
sees except for the few ``n_known`` training labels it is explicitly given.

Each also reads its guess as a test of every record's label (``record_test``: the counts of
"says ``positive``" against the truth and the lower bound on epsilon they imply; a score
attack's threshold is chosen on a held-out half of its rows, model completion's decision is
its arg-max class; :class:`securevfl.attacks.metrics.RecordTest`).

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
  accuracy (and AUC for binary tasks). ``semi_supervised: none`` fits the head on
  the known labels only; ``mixmatch`` adds Fu et al.'s semi-supervised step
  (:mod:`securevfl.attacks.mixmatch`), with the party's training records as the
  unlabelled pool. Its augmentation (``augment``): ``input`` adds Gaussian noise
  (``augment_std`` times each input column's std over the party's training rows)
  to the party's own model input and passes it through its own frozen bottom
  model and, for ``features: sent``, its own embedding defenses in evaluation
  mode (under HashVFL a noisy input flips code bits the way the real channel
  would); ``feature`` adds the noise to the z-scored features directly. Rebuilding
  its own models takes their architecture from the protocol, which every party
  holds (prior ``protocol``); the weights are the party's own (``own.bottom``,
  ``own.defense_modules``).
"""

from __future__ import annotations

from typing import Any, Literal, TypeVar

import numpy as np
import torch
from pydantic import Field

import securevfl.attacks.metrics as metrics
from securevfl.attacks.base import Attack, AttackOptions, View, World
from securevfl.attacks.learners import fit_classifier
from securevfl.attacks.mixmatch import fit_mixmatch
from securevfl.attacks.views import own_layout, steps_per_row
from securevfl.components import Components
from securevfl.defenses.base import build_stack
from securevfl.errors import ProtocolError
from securevfl.models import build_bottom


class _PassiveOptions(AttackOptions):
    party: str | None = Field(default=None, description="the attacking passive party (default: the first)")


class _ScoringOptions(_PassiveOptions):
    positive: int = Field(
        default=1, ge=0, description="the class scored as positive (one-vs-rest on multi-class tasks)"
    )


PassiveOptionsT = TypeVar("PassiveOptionsT", bound=_PassiveOptions)


class _PassiveAttack(Attack[PassiveOptionsT]):
    adversary = "passive"
    needs_classes = "it infers class labels"

    def adversary_party(self, world: World) -> str:
        return world.passive(self.params.party).party

    def _known(self, world: World, n: int) -> dict[str, Any]:
        """``n`` training records whose true label the attacker is given."""
        a = world.active.own
        n_train = len(a.train_idx)
        g = np.random.default_rng(self.params.seed)
        rows = np.sort(g.choice(n_train, size=min(n, n_train), replace=False)) if n else np.zeros(0, int)
        return {"known_rows": rows, "known_labels": a.y_train[torch.as_tensor(rows)].numpy()}

    @staticmethod
    def _grads(view: View) -> list[list[torch.Tensor]]:
        own = view.own
        return steps_per_row(own.forwards, own.grads, len(own.train_idx))


def _binary_truth(world: World, positive: int, rows: np.ndarray) -> np.ndarray:
    y = world.active.own.y_train.numpy()[rows]
    return (y == positive).astype(int)


def _record_test(params: _ScoringOptions, world: World, scores: np.ndarray, y: np.ndarray) -> dict[str, Any]:
    """The score attack read as a test of each record's label (``record_test``: counts on a
    held-out half, threshold chosen on the other; :func:`securevfl.attacks.metrics.threshold_test`),
    at the run's delta; nothing when a half lacks either class."""
    test = metrics.threshold_test(
        scores, y, positive=params.positive, seed=params.seed, delta=world.proto.privacy.delta
    )
    return {} if test is None else {"record_test": test.to_json()}


class LabelNormOptions(_ScoringOptions):
    pass


class LabelNorm(_PassiveAttack[LabelNormOptions]):
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
        out = {"auc": auc, "auc_raw": metrics.roc_auc(guess["scores"], y), "ap": auc, "n_rows": len(y)}
        return out | _record_test(self.params, world, guess["scores"], y)


class LabelDirectionOptions(_ScoringOptions):
    n_known: int = Field(default=10, ge=1, description="training records whose label the attacker knows")


class LabelDirection(_PassiveAttack[LabelDirectionOptions]):
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
        n_train = len(own.train_idx)
        total = np.zeros(n_train)
        count = np.zeros(n_train)
        for f, g in zip(own.forwards, own.grads, strict=True):
            rows = np.asarray(f["rows"])
            ref = [(k, sign[int(r)]) for k, r in enumerate(rows) if int(r) in sign]
            if not ref:
                continue
            gn = torch.nn.functional.normalize(g.double(), dim=1)
            s = sum(w * (gn @ gn[k]) for k, w in ref) / len(ref)
            assert isinstance(s, torch.Tensor)
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
        out = {"auc": auc, "leak_auc": metrics.leak_auc(guess["scores"], y), "ap": auc, "n_rows": len(y)}
        return out | _record_test(self.params, world, guess["scores"], y)


class ModelCompletionOptions(_ScoringOptions):
    n_known: int = Field(default=40, ge=1, description="training records whose label the attacker knows")
    features: Literal["sent", "bottom"] = Field(
        default="sent", description="sent: bottom output after the party's embedding defenses; bottom: before"
    )
    hidden: list[int] = Field(default=[32], description="hidden sizes of the completion head")
    semi_supervised: Literal["none", "mixmatch"] = Field(
        default="none",
        description="none: fit on the known labels only; mixmatch: MixMatch over own train rows",
    )
    augment: Literal["input", "feature"] = Field(
        default="input", description="MixMatch augmentation: noise on the bottom input, or on the features"
    )
    augment_std: float = Field(default=0.1, gt=0, description="augmentation noise, in column stds")
    epochs: int = Field(default=25, ge=1, description="MixMatch passes over the unlabelled pool")
    lambda_u: float = Field(default=10.0, ge=0, description="MixMatch weight of the unlabelled loss")


class ModelCompletion(_PassiveAttack[ModelCompletionOptions]):
    name = "model_completion"
    options = ModelCompletionOptions

    def knowledge(self, world: World) -> dict[str, Any]:
        known = self._known(world, self.params.n_known)
        known["classes"] = int(world.active.own.classes)
        if self.params.semi_supervised == "mixmatch" and self.params.augment == "input":
            known["protocol"] = world.proto  # public: the party's own architecture and defenses
            known["components"] = world.components
        return known

    def run(self, view: View) -> dict[str, Any]:
        p, own, prior = self.params, view.own, view.prior
        pre = "sent" if p.features == "sent" else "h"
        x_tr, x_te = own[f"{pre}_train"].float(), own[f"{pre}_test"].float()
        rows = torch.as_tensor(prior["known_rows"])
        labels = torch.as_tensor(prior["known_labels"])
        used: dict[str, Any] = {
            "input": f"own final bottom-model output ({p.features}) of train and test records",
            "known_labels": len(rows),
        }
        if p.semi_supervised == "none":
            proba = fit_classifier(x_tr[rows], labels, prior["classes"], hidden=p.hidden, seed=p.seed)(x_te)
        else:
            augment = self._augmenter(view, x_tr)
            proba = fit_mixmatch(
                x_tr,
                rows,
                labels,
                prior["classes"],
                augment,
                hidden=p.hidden,
                seed=p.seed,
                epochs=p.epochs,
                lambda_u=p.lambda_u,
            )(x_te)
            used |= {"unlabelled": len(x_tr), "semi_supervised": "mixmatch", "augment": p.augment}
        return {"proba": proba, "used": used}

    def _augmenter(self, view: View, x_tr: torch.Tensor):
        """``augment(rows, gen)`` for MixMatch: fresh noisy features of training rows."""
        p, own = self.params, view.own
        if p.augment == "feature":
            scale = p.augment_std * x_tr.std(0, unbiased=False)
            return lambda r, g: x_tr[r] + scale * torch.randn(len(r), x_tr.shape[1], generator=g)
        embed = own_embedding(
            view, view.prior["protocol"], view.prior["components"], sent=p.features == "sent"
        )
        x_in = own.x_train.float()
        scale = p.augment_std * x_in.std(0, unbiased=False)
        return lambda r, g: embed(x_in[r] + scale * torch.randn(len(r), x_in.shape[1], generator=g))

    def score(self, guess: dict[str, Any], world: World) -> dict[str, Any]:
        y = world.active.own.y_test.numpy()
        proba = guess["proba"]
        out: dict[str, Any] = {"accuracy": metrics.accuracy(proba.argmax(1), y), "n_test": len(y)}
        out["ap"] = out["accuracy"]
        # guessing the most frequent class: what a label-blind attacker scores
        out["chance"] = float(np.bincount(y).max() / len(y)) if len(y) else float("nan")
        if proba.shape[1] == 2:
            out["auc"] = metrics.roc_auc(proba[:, 1], y)
        # its own decision (the arg-max class) read as a test of each test label: nothing chosen
        pos = self.params.positive
        test = metrics.decision_test(
            proba.argmax(1) == pos, y == pos, positive=pos, delta=world.proto.privacy.delta
        )
        if test is not None:
            out["record_test"] = test.to_json()
        return out


def own_embedding(view: View, proto: Any, components: Components, *, sent: bool):
    """The party's own frozen bottom model (and, with ``sent``, its embedding
    defenses in evaluation mode) rebuilt from the protocol's architecture and the
    weights in its own view: ``x -> h`` or ``x -> h'``, without gradients."""
    spec = next(s for s in proto.parties.passive if s.name == view.party)
    # a factory is imported under the harness's policy (the local launcher's: the file's own)
    code = components.code
    layout = own_layout(view.own, view.party)
    bottom = build_bottom(
        spec.model, view.own.x_train.shape[1], seed=0, party=view.party, code=code, layout=layout
    )
    bottom.load_state_dict(view.own.bottom)
    bottom.eval()
    stack = build_stack(proto, components, view.party, "passive", spec.defenses)
    modules = stack.modules()
    states = view.own.defense_modules
    if len(modules) != len(states):
        raise ProtocolError(
            f"{view.party}: {len(states)} saved defense module states for {len(modules)} modules"
        )
    for m, st in zip(modules, states, strict=True):
        m.load_state_dict(st)
        m.eval()

    def embed(x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            h = bottom(x)
            return stack.embed(h, train=False).float() if sent else h.float()

    return embed
