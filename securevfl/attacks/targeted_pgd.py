"""Targeted PGD by a passive party on its own test-time submission (docs/methods/hashvfl.md
§5.5, Table V).

Threat model: a malicious passive party P_a wants the server to predict a
target class y_t for chosen test records by changing only what it submits for
them. White-box, as in the paper: its declared prior is the server function
(the active party's top model, bias and interactive blocks W_i, rebuilt by
:mod:`securevfl.attacks.server`; they exist in the clear only under
``active_sees_embeddings``) and the other parties' final test submissions (their
``sent_test``). Its own bottom model and defense modules (HashVFL's BatchNorm,
median threshold) are in its own view.

The attack (docs/methods/hashvfl.md §5.5):

    x_m = x_{m-1} - eta * sign(grad CE(f_top(.., Sign(x_{m-1}), ..), y_t))
    phi = clip(x_m - x_0, -omega, omega);  x_m = x_0 + phi

* ``perturb: pre_sign`` (default; the [GAP] resolved as the spec suggests):
  x_0 = v~, the party's pre-Sign value (BatchNorm in evaluation mode, minus the
  median threshold under ``balance: median``); the submission is Sign(x_M), the
  gradient through Sign the straight-through identity (docs/methods/hashvfl.md §2.4).
* ``perturb: code``: x_0 is the +-1 code itself, re-signed after each step.
* Without hashing, x_0 is the float embedding the party sends and the
  submission is x_M itself (the paper's "Base" column).

Records: ``samples`` test rows drawn (seeded) among those whose true label is
not y_t. Metric per (omega, eta) cell: ASR = % of them predicted y_t after the
attack; also over the subset the server classified correctly before, the clean
rate of y_t predictions, and the mean number of changed code bits.
docs/methods/hashvfl.md §8.2 item 18: if |phi| < min |v~| per record, no code bit can change,
so the ASR is 0 (tests/unit/test_hash_evaluators.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field

from securevfl.attacks.base import Attack, AttackOptions, View, World
from securevfl.attacks.server import ServerModel, server_check, server_from_view
from securevfl.components import Components
from securevfl.config import Protocol
from securevfl.defenses.hashvfl import HashOptions
from securevfl.errors import ProtocolError
from securevfl.privacy import hashing
from securevfl.records import OwnView

BN_EPS = 1e-5  # HashVFL's BatchNorm1d eps (docs/methods/hashvfl.md §2.3)


# -- pure functions ---------------------------------------------------------------------------------


def bn_eval(h: torch.Tensor, state: dict[str, torch.Tensor], eps: float = BN_EPS) -> torch.Tensor:
    """BatchNorm1d in evaluation mode from its state dict (docs/methods/hashvfl.md §2.3)."""
    return (h - state["running_mean"]) / torch.sqrt(state["running_var"] + eps) * state["weight"] + state[
        "bias"
    ]


def presign_values(
    h: torch.Tensor,
    modules: list[dict[str, torch.Tensor]],
    *,
    batchnorm: bool,
    balance: str = "off",
    balance_eval: str = "running",
) -> torch.Tensor:
    """The pre-Sign value v~ of HashVFL at evaluation, whose Sign is the code the
    party sends: BN_eval(h) (or h without BN), minus the median threshold under
    ``balance: median`` (BN of the running median, or the column median of
    ``h``'s rows taken as one evaluation batch with ``balance_eval: batch``).
    ``modules`` are the party's defense-module states in order (BN, median)."""
    bn = next((m for m in modules if "running_var" in m), None) if batchnorm else None
    u = bn_eval(h, bn) if bn is not None else h
    if balance != "median":
        return u
    if balance_eval == "batch" and h.shape[0] > 1:
        return u - hashing.column_median(u)
    med = next(m for m in modules if "running" in m)["running"][None].to(u.dtype)
    return u - (bn_eval(med, bn) if bn is not None else med)


def targeted_pgd(
    f: Callable[[torch.Tensor], torch.Tensor],
    x0: torch.Tensor,
    target: int,
    *,
    omega: float | torch.Tensor,
    eta: float,
    iterations: int,
    binary: bool,
) -> torch.Tensor:
    """Targeted sign-gradient PGD on a submission (docs/methods/hashvfl.md §5.5); returns what
    is submitted after ``iterations`` steps: Sign(x_M) when ``binary`` (gradient
    through Sign by the straight-through identity), else x_M. ``f`` maps a B x d
    submission to logits; ``omega`` is a scalar or a per-record B x 1 radius."""
    x0 = x0.detach()
    y = torch.full((x0.shape[0],), target, dtype=torch.long)
    om = torch.as_tensor(omega, dtype=x0.dtype)
    x = x0.clone()
    for _ in range(iterations):
        x.requires_grad_(True)
        sub = hashing.sign_ste(x) if binary else x
        (g,) = torch.autograd.grad(F.cross_entropy(f(sub), y), x)
        step = x.detach() - eta * g.sign()
        x = x0 + torch.maximum(torch.minimum(step - x0, om), -om)
    return hashing.sign(x) if binary else x.detach()


def pick_rows(labels: np.ndarray, target: int, n: int, seed: int) -> np.ndarray:
    """``n`` test rows (sorted) drawn without replacement among those whose
    label is not ``target`` (all of them when fewer)."""
    cand = np.flatnonzero(labels != target)
    g = np.random.default_rng(seed)
    return np.sort(g.choice(cand, size=min(n, len(cand)), replace=False))


# -- the attack -------------------------------------------------------------------------------------


class TargetedPGDOptions(AttackOptions):
    party: str | None = Field(default=None, description="the attacking passive party (default: the first)")
    target_class: int = Field(default=0, ge=0, description="y_t (paper: class 0)")
    samples: int = Field(default=100, ge=1, description="attacked test records, label != y_t (paper: 100)")
    omegas: list[float] = Field(
        default=[1.0, 2.0], min_length=1, description="clip radii omega (paper: 1, 2)"
    )
    etas: list[float] = Field(default=[0.1, 1.0], min_length=1, description="step sizes eta (paper: 0.1, 1)")
    iterations: int = Field(default=20, ge=1, description="PGD steps (paper: unspecified; spec: 10-40)")
    perturb: Literal["pre_sign", "code"] = Field(
        default="pre_sign", description="pre_sign: perturb v~ and re-hash; code: perturb the +-1 code"
    )


def hash_options(proto: Protocol, components: Components, index: int) -> HashOptions | None:
    """The ``index``-th passive party's ``hashvfl`` options (validated at load), or
    None when it does not hash."""
    return components.options(proto.parties.passive[index].name, HashOptions)


def view_presign(own: OwnView, hp: HashOptions) -> torch.Tensor:
    """:func:`presign_values` of a passive party's final test outputs, from its
    own view and its ``hashvfl`` options (:func:`hash_options`)."""
    return presign_values(
        own.h_test,
        own.defense_modules,
        batchnorm=hp.batchnorm,
        balance=hp.balance,
        balance_eval=hp.balance_eval,
    )


class TargetedPGD(Attack[TargetedPGDOptions]):
    name = "targeted_pgd"
    adversary = "passive"
    needs_classes = "it drives test records towards a target class"
    requires = frozenset({"active_sees_embeddings"})
    options = TargetedPGDOptions

    def adversary_party(self, world: World) -> str:
        return world.passive(self.params.party).party

    def knowledge(self, world: World) -> dict[str, Any]:
        """White-box prior (docs/methods/hashvfl.md §5.5): the server function, the other
        parties' final test submissions, and which records to attack."""
        p = self.params
        a = world.active.own
        if p.target_class >= int(a.classes):
            raise ProtocolError(f"target_class {p.target_class} is not a class (classes: {a['classes']})")
        idx = world.locate(self.params.party)[0]
        names = [r.party for r in world.layout.passive]
        return {
            "index": idx,
            "server": server_from_view(world.proto, world.layout, a, world.components.code),
            "peers": {n: world.views[n].own.sent_test for n in names if n != names[idx]},
            "order": names,
            "hash": hash_options(world.proto, world.components, idx),
            "rows": pick_rows(a.y_test.numpy(), p.target_class, p.samples, p.seed),
        }

    def run(self, view: View) -> dict[str, Any]:
        p, prior, own = self.params, view.prior, view.own
        hp = prior["hash"]
        rows = torch.as_tensor(prior["rows"])
        binary = hp is not None
        if binary:
            v = view_presign(own, hp)
            clean_match = float((hashing.sign(v) == own.sent_test).float().mean())
            x0 = v[rows] if p.perturb == "pre_sign" else hashing.sign(v[rows])
            clean = hashing.sign(v[rows])
        else:
            clean_match = 1.0
            x0 = clean = own.sent_test[rows].float()
        server: ServerModel = prior["server"]
        hs = [None if n == view.party else prior["peers"][n][rows].float() for n in prior["order"]]

        def f(sub: torch.Tensor) -> torch.Tensor:
            return server([sub if h is None else h for h in hs], rows)

        with torch.no_grad():
            clean_pred = f(clean).argmax(1)
        cells = []
        for omega in p.omegas:
            for eta in p.etas:
                adv = targeted_pgd(
                    f, x0, p.target_class, omega=omega, eta=eta, iterations=p.iterations, binary=binary
                )
                with torch.no_grad():
                    pred = f(adv).argmax(1)
                changed = (adv != clean).float().sum(1) if binary else (adv - clean).abs().amax(1)
                cells.append(
                    {"omega": omega, "eta": eta, "pred": pred.numpy(), "changed": changed.numpy(), "adv": adv}
                )
        return {
            "rows": prior["rows"],
            "binary": binary,
            "clean_pred": clean_pred.numpy(),
            "clean_code_match": clean_match,
            "cells": cells,
            "used": {
                "input": f"{view.party}'s own bottom outputs and defense modules (h_test, BN/median state)",
                "prior": "server function (top, bias, interactive blocks) and the other parties' final test "
                "submissions (white-box, docs/methods/hashvfl.md §5.5)",
                "perturbed": ("pre-Sign v~" if p.perturb == "pre_sign" else "+-1 code")
                if binary
                else "float embedding (no hashing)",
                "records": len(prior["rows"]),
            },
        }

    def score(self, guess: dict[str, Any], world: World) -> dict[str, Any]:
        p = self.params
        y = world.active.own.y_test.numpy()[guess["rows"]]
        t = p.target_class
        clean = guess["clean_pred"]
        correct = clean == y
        grid = []
        for c in guess["cells"]:
            hit = c["pred"] == t
            change = "mean_bits_changed" if guess["binary"] else "mean_max_abs_change"
            grid.append(
                {
                    "omega": c["omega"],
                    "eta": c["eta"],
                    "asr": 100 * float(hit.mean()),
                    "asr_on_correct": 100 * float(hit[correct].mean()) if correct.any() else None,
                    change: float(np.mean(c["changed"])),
                }
            )
        server = self.knowledge_server(world)
        return {
            "attacker": self.adversary_party(world),
            "binary_codes": guess["binary"],
            "perturb": p.perturb if guess["binary"] else "embedding",
            "target_class": t,
            "iterations": p.iterations,
            "records": len(y),
            "records_correct": int(correct.sum()),
            "clean_accuracy": 100 * float(correct.mean()),
            "clean_target_rate": 100 * float((clean == t).mean()),
            "clean_code_match": guess["clean_code_match"],
            "grid": grid,
            **server_check(world, server),
            "ap": max(g["asr"] for g in grid) / 100,
            "chance": float((clean == t).mean()),  # AP* for the DCS: the target rate without the attack
        }

    @staticmethod
    def knowledge_server(world: World) -> ServerModel:
        return server_from_view(world.proto, world.layout, world.active.own, world.components.code)
