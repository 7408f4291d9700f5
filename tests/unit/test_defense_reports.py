"""The report contract of the defense seam (SECURITY.md §7): what a defense
declares public is taken when its stack is built, before any hook has seen
data, so nothing computed from a party's data can enter what the party sends
rank 0; the statistics themselves are the party's own report."""

from __future__ import annotations

import glob
import json
from typing import Any

import numpy as np
import torch
from sklearn.datasets import load_breast_cancer

from securevfl.app.loader import load_checked, load_checked_dict
from securevfl.csprng import SecretStream
from securevfl.defenses.base import Defense, DefenseContext, DefenseOptions, DefenseStack, build_stack
from securevfl.records import RankSummary
from tests.support.protocols import ROOT, load_yaml, small_digits


class _Curious(Defense[DefenseOptions]):
    """A defense whose public report reads what its hooks saw (as a careless one might)."""

    name = "curious_test"

    def __init__(self, params: DefenseOptions, ctx: DefenseContext):
        super().__init__(params, ctx)
        self.seen: float | None = None

    def embed(self, h: torch.Tensor, *, train: bool) -> torch.Tensor:
        self.seen = float(h.sum())
        return h

    def public_report(self) -> dict[str, Any]:
        return {"seen": self.seen}

    def report(self) -> dict[str, Any]:
        return {"seen": self.seen}


def test_the_public_part_is_taken_before_any_data():
    checked = load_checked_dict(small_digits())
    ctx = DefenseContext(checked.protocol, checked.components, "left", "passive", 0, SecretStream.fresh())
    stack = DefenseStack([_Curious(DefenseOptions(), ctx)])
    stack.embed(torch.full((4, 2), 0.37), train=True)
    assert stack.report() == {"curious_test": {"seen": float(torch.full((4, 2), 0.37).sum())}}
    assert stack.public_report() == {"curious_test": {"seen": None}}  # as declared at build


def test_crdp_declares_its_options_and_keeps_its_statistics():
    doc = load_yaml("breast_cancer.yaml")
    for p in doc["parties"]["passive"]:
        p["defenses"] = [{"name": "crdp", "params": {"eps1": 1.0, "eps2": 1.0}}]
    checked = load_checked_dict(doc)
    spec = checked.protocol.parties.passive[0]
    stack = build_stack(checked.protocol, checked.components, spec.name, "passive", spec.defenses)
    before = json.dumps(stack.public_report())
    x = load_breast_cancer().data[:300, :10]
    stack.select_features((x - x.mean(0)) / x.std(0), [f"c{i}" for i in range(10)])
    assert json.dumps(stack.public_report()) == before
    public, own = stack.public_report()["crdp"], stack.report()["crdp"]
    assert public["params"]["eps2"] == 1.0 and public["record_sensitivity_s"] == own["record_sensitivity_s"]
    for key in ("stability_scores", "candidate_delta_cs_p", "em_probabilities", "mcd", "laplace_scale"):
        assert key in own and key not in public, key
    assert np.isclose(sum(own["em_probabilities"]), 1.0)


def test_every_shipped_defense_declares_json_from_the_protocol_alone():
    """Each party's public report of every shipped protocol is what its options give:
    the options themselves plus constants derived from them, and it goes in a
    summary as it is."""
    files = sorted(glob.glob(str(ROOT / "protocols" / "*.yaml")))
    seen = set()
    for path in files:
        checked = load_checked(path)
        proto = checked.protocol
        parties = [(proto.parties.active.name, "active", proto.parties.active.defenses)]
        parties += [(p.name, "passive", p.defenses) for p in proto.parties.passive]
        for name, side, specs in parties:
            pub = build_stack(proto, checked.components, name, side, specs).public_report()
            for d, spec in zip(specs, pub.values(), strict=True):
                seen.add(d.name)
                # the options, defaults added
                assert spec["params"] == d.params | spec["params"], (path, name)
            RankSummary(rank=1, party=name, role="passive", pid=1, defense_report=pub).to_json()
    assert {"crdp", "embedding_dp", "hashvfl", "dravl", "gaussian_noise", "hashvfl_consistency"} <= seen
