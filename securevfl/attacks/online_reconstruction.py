"""Online feature reconstruction over a launcher run (docs/methods/dravl.md §5, mode 1).

Threat model: the simulated worst-case active party of docs/methods/dravl.md §5. It knows the
ground-truth inputs phi(x) of the victim's *training* records (declared prior
knowledge: all of them, not an auxiliary fraction) and watches the exchange as
it happens. Its reconstructor R_I takes one Adam step on ``(Z_sent, phi(x))``
for every training batch it receives, in arrival order, with an optimizer of its
own; it never sends anything back, so it cannot change the training it watches.

Because R_I only observes, replaying the ledger after the run in arrival order
is the same computation as training it during the run: after the training
stretch that precedes each evaluation pass (one per epoch), R_I predicts phi(x)
of the test records from what A received for them in that pass. The score is
R_I's MSE and nMSE per evaluation pass (docs/methods/dravl.md §5 metric 1, nMSE = MSE / mean
column variance of phi over the test rows) and their average over the passes:
the paper's per-day averaging, with securevfl's epochs in the role of days.
Per-feature R² is reported for the last pass. The post-hoc attacker of §5 mode 2
(the default for claims) is ``feature_reconstruction``.

phi is the victim's model input (``target_space: model_input``: its features
after the protocol's standardisation, docs/methods/dravl.md §4.3 rule 2) or its raw columns
(``raw``). Under ``plain`` R_I reads the victim's embedding; under a crypto
backend, the revealed z (``source``).
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field

import securevfl.attacks.metrics as metrics
from securevfl.attacks.base import Attack, AttackOptions, View, World
from securevfl.attacks.stream import OnlineReconstructor
from securevfl.attacks.views import active_source, active_tensors
from securevfl.errors import ProtocolError
from securevfl.records import OwnView


class OnlineReconstructionOptions(AttackOptions):
    target: str | None = Field(default=None, description="victim passive party (default: the first)")
    source: Literal["auto", "embedding", "z"] = Field(
        default="auto",
        description="what R_I reads: the victim's embedding (plain only) or z; auto = embedding where "
        "the backend shows it to A, else z",
    )
    target_space: Literal["model_input", "raw"] = Field(
        default="model_input",
        description="phi(x): the victim's model input (docs/methods/dravl.md §4.3) or raw columns",
    )
    hidden: list[int] = Field(
        default=[256, 256], description="R_I's hidden sizes (docs/methods/dravl.md §4.2)"
    )
    lr: float = Field(default=1e-3, gt=0, description="R_I's Adam learning rate (docs/methods/dravl.md §4.2)")


def _phi(own: OwnView, space: str) -> tuple[torch.Tensor, torch.Tensor]:
    """phi(x) of the victim's training and test rows, in that order."""
    if space == "model_input":
        return own.x_train.float(), own.x_test.float()
    raw = own.x_raw.float()
    return raw[torch.as_tensor(own.train_idx)], raw[torch.as_tensor(own.test_idx)]


def replay(
    forwards: list[dict[str, Any]],
    tensors: list[torch.Tensor],
    phi_train: torch.Tensor,
    n_test: int,
    reconstructor: OnlineReconstructor,
) -> list[tuple[int, torch.Tensor]]:
    """Train ``reconstructor`` on each training forward in order and, at each
    evaluation pass, predict phi of the test rows that pass covered.

    Returns ``(round, prediction)`` per evaluation pass; ``prediction`` has one
    row per test record (NaN where the pass did not cover it)."""
    if len(forwards) != len(tensors):
        raise ProtocolError(f"view holds {len(tensors)} tensors for {len(forwards)} forwards")
    passes: dict[int, torch.Tensor] = {}
    order: list[int] = []
    for f, t in zip(forwards, tensors, strict=True):
        rows = torch.as_tensor(np.asarray(f["rows"]), dtype=torch.long)
        if t.shape[0] != len(rows):
            raise ProtocolError(f"forward {f['phase']}/{f['round']}: {t.shape[0]} rows for {len(rows)}")
        if f["phase"] == "train":
            reconstructor.observe(t, phi_train[rows])
            continue
        r = int(f["round"])
        if r not in passes:
            passes[r] = torch.full((n_test, phi_train.shape[1]), float("nan"))
            order.append(r)
        with torch.no_grad():
            passes[r][rows] = reconstructor.net(t.float())
    return [(r, passes[r]) for r in order]


class OnlineReconstruction(Attack[OnlineReconstructionOptions]):
    name = "online_reconstruction"
    adversary = "active"
    options = OnlineReconstructionOptions

    def knowledge(self, world: World) -> dict[str, Any]:
        """phi(x) of every training record of the victim (docs/methods/dravl.md §5: the
        reconstructor that knows the ground-truth inputs)."""
        idx, victim = world.locate(self.params.target)
        phi_train, _ = _phi(world.views[victim].own, self.params.target_space)
        source = active_source(world.proto, self.params.source)
        return {
            "victim": victim,
            "victim_index": idx,
            "n_peers": len(world.layout.passive),
            "phi_train": phi_train,
            "source": source,
        }

    def run(self, view: View) -> dict[str, Any]:
        p, prior, own = self.params, view.prior, view.own
        forwards = own.forwards
        tensors, used = active_tensors(view, prior)
        if not tensors:
            raise ProtocolError("the view holds no exchanged tensors (was runtime.record_views off?)")
        phi = prior["phi_train"]
        rec = OnlineReconstructor(tensors[0].shape[1], phi.shape[1], hidden=p.hidden, lr=p.lr, seed=p.seed)
        passes = replay(forwards, tensors, phi, len(own.test_idx), rec)
        if not passes:
            raise ProtocolError("the run has no evaluation pass to score R_I on")
        return {
            "rounds": [r for r, _ in passes],
            "predictions": [pred.numpy() for _, pred in passes],
            "used": {
                "input": f"{used}, in arrival order",
                "train_steps_observed": rec.steps,
                "known_train_rows": len(phi),
            },
        }

    def score(self, guess: dict[str, Any], world: World) -> dict[str, Any]:
        _, victim = world.locate(self.params.target)
        _, true = _phi(world.views[victim].own, self.params.target_space)
        true64 = true.numpy().astype(np.float64)
        var = float(true64.var(0).mean())
        per_pass = []
        for pred in guess["predictions"]:
            seen = ~np.isnan(pred).any(1)
            mse = float(((pred[seen] - true64[seen]) ** 2).mean()) if seen.any() else float("nan")
            per_pass.append(mse)
        nmse = [m / var if var > 0 else float("nan") for m in per_pass]
        last = guess["predictions"][-1]
        seen = ~np.isnan(last).any(1)
        r2 = metrics.per_feature_r2(last[seen], true64[seen])
        return {
            "victim": victim,
            "mse_per_pass": per_pass,
            "nmse_per_pass": nmse,
            "rounds": guess["rounds"],
            "mse": float(np.mean(per_pass)),
            "nmse": float(np.mean(nmse)),
            "nmse_last": nmse[-1],
            "r2_mean_last": float(np.nanmean(r2)),
            "ap": max(0.0, 1.0 - float(np.mean(nmse))),
            "n_test": int(seen.sum()),
        }
