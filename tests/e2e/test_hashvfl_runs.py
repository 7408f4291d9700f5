"""HashVFL end to end with the real launcher (docs/methods/hashvfl.md §8.2 items 8, 13, 15):
only +-1 codes leave a passive party (faithful hash and ``balance: median``), the
backward message is B x d, the active-side half is refused where the backend
hides the codes, and (slow) the digits behaviour of the recommended profile:
accuracy within 3 points of the same run without hashing, every bit balanced."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from securevfl.app.loader import load_protocol, load_protocol_dict
from securevfl.errors import UnsupportedCombination
from tests.support.protocols import PROTOCOLS, load_yaml, small_digits, write_yaml
from tests.support.runs import cli, own_reports, run_doc

pytestmark = pytest.mark.timeout(900)

BITS = 4


def _hashed(
    doc: dict[str, Any],
    *,
    consistency: bool = True,
    bits: int = BITS,
    codes: str = "random",
    hash_params: dict[str, Any] | None = None,
):
    for p in doc["parties"]["passive"]:
        p["model"]["out"] = bits
        p["defenses"] = [{"name": "hashvfl", "params": dict(hash_params or {})}]
    if consistency:
        doc["parties"]["active"]["defenses"] = [{"name": "hashvfl_consistency", "params": {"codes": codes}}]
    return doc


def _fast(backend: str, *, consistency: bool, hash_params: dict[str, Any] | None = None) -> dict[str, Any]:
    doc = _hashed(
        small_digits(epochs=1, batch_size=64, max_steps=4), consistency=consistency, hash_params=hash_params
    )
    doc["exchange"] = {"backend": backend, "params": {}}
    doc["runtime"] = {"dump_views": True}
    return doc


def _view(out: Path, rank: int) -> dict[str, Any]:
    return torch.load(out / "ranks" / f"rank{rank}.view.pt", weights_only=False)


def _received(out: Path, rank: int, tag: str) -> list[tuple[dict[str, Any], torch.Tensor]]:
    """(ledger record, tensor) of every ``tag`` message ``rank`` received, in order:
    the ledger and the recorded views log received messages in the same order."""
    recs = [
        json.loads(line) for line in (out / "ranks" / f"rank{rank}.ledger.jsonl").read_text().splitlines()
    ]
    recs = [r for r in recs if r["direction"] == "recv" and r["tag"] == tag]
    tensors = [t for _, t in _view(out, rank)["received"].get(tag, [])]
    assert len(recs) == len(tensors)
    return list(zip(recs, tensors, strict=True))


def _pm1(t: torch.Tensor) -> bool:
    return bool(((t == 1) | (t == -1)).all())


@pytest.fixture(scope="module", params=[{}, {"balance": "median"}], ids=["faithful", "median"])
def plain_run(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest):
    """One short plain run per hash profile: the faithful one and ``balance: median``."""
    out = tmp_path_factory.mktemp("hashvfl_plain")
    return run_doc(_fast("plain", consistency=True, hash_params=request.param), out), out


def test_only_pm1_codes_leave_a_passive_party_under_plain(plain_run):
    _, out = plain_run
    for rank in (1, 2):
        sent = _view(out, rank)["own"]["embeddings"]
        assert len(sent) == 4
        assert all(_pm1(h) and h.shape == (64, BITS) for _, h in sent)
    got = _received(out, 0, "embedding")
    phases = {r["phase"] for r, _ in got}
    assert phases == {"train", "eval"}  # training and evaluation codes alike
    assert all(_pm1(t) for _, t in got)
    # on the wire the codes are packed bits: ceil(d/8) bytes per row, not 4 d
    for rec, t in got:
        assert rec["dtype"] == "uint8" and rec["shape"] == [t.shape[0], (BITS + 7) // 8]
        assert rec["bytes"] == t.shape[0] * ((BITS + 7) // 8)
    for party in ("left", "right"):
        rep = own_reports(out)[party]["hashvfl"]
        assert rep["non_binary_values_sent"] == 0 and rep["values_sent"] > 0


def test_every_party_batches_the_same_sample_ids(plain_run):
    """docs/methods/hashvfl.md §8.2 item 12's last clause: aligned batches, one shared order of
    the sample IDs for every party (each rank logs the rows of its training
    forwards; A also logs its evaluation forwards)."""
    _, out = plain_run
    per_rank = []
    for rank in (0, 1, 2):
        own = _view(out, rank)["own"]
        ids, train = own["ids"], own["train_idx"]
        per_rank.append(
            [[ids[train[r]] for r in f["rows"]] for f in own["forwards"] if f["phase"] == "train"]
        )
    assert len(per_rank[0]) == 4 and all(len(b) == 64 for b in per_rank[0])
    assert per_rank[0] == per_rank[1] == per_rank[2]


def test_backward_message_is_b_by_d_floats(plain_run):
    _, out = plain_run
    for rank in (1, 2):
        grads = _received(out, rank, "embedding_grad")
        assert len(grads) == 4
        for rec, g in grads:
            assert rec["sender"] == 0 and g.shape == (64, BITS) and g.dtype == torch.float32


def test_consistency_and_detector_report(plain_run):
    _, out = plain_run
    rep = own_reports(out)["active"]["hashvfl_consistency"]
    codes = torch.tensor(rep["class_codes"])
    assert codes.shape == (10, BITS) and len({tuple(r) for r in codes.tolist()}) == 10
    det = rep["detector_last_steps"]
    assert det["steps"] == 4 and 0.0 <= det["pair_flag_rate"] <= 1.0
    assert rep["detector_totals"]["samples"] == 4 * 64


def test_detector_runs_on_test_traffic(plain_run):
    """The detector also watches the evaluation pass (docs/methods/hashvfl.md §2.9 applies it at
    inference): its pairwise flag rate equals the one recomputed from the test
    codes A received."""
    result, out = plain_run
    rep = own_reports(out)["active"]["hashvfl_consistency"]
    ev = rep["detector_eval"]
    assert ev["passes"] == 1 and ev["samples"] == result["rows"]["test"]
    got = [t for r, t in _received(out, 0, "embedding") if r["phase"] == "eval"]
    left, right = torch.cat(got[0::2]), torch.cat(got[1::2])  # peers in rank order per forward
    ham = ((left * right - 1) / -2).sum(1)
    assert ev["pair_flag_rate"] == pytest.approx(float((ham > rep["threshold"]).float().mean()))
    assert 0.0 <= ev["match_class_code_rate"] <= 1.0


@pytest.mark.parametrize(
    "hash_params",
    [
        pytest.param({"batchnorm": False, "quantization_weight": 1.0}, id="greedyhash"),
        pytest.param(
            {"quantization_weight": 1.0, "send": "continuous"}, id="continuous", marks=pytest.mark.slow
        ),
    ],
)
def test_ablation_runs_send_what_they_declare(tmp_path: Path, hash_params: dict[str, Any]):
    """The GreedyHash ablation (docs/methods/hashvfl.md Table X) sends only +-1 and trains with
    the quantization penalty; ``send: continuous`` (the Fig. 6 "w/o consistency"
    arm of the official code) sends the BN output, every value counted as
    non-binary. Neither has the active-side consistency loss."""
    result = run_doc(_fast("plain", consistency=False, hash_params=hash_params), tmp_path)
    got = _received(tmp_path, 0, "embedding")
    assert {r["phase"] for r, _ in got} == {"train", "eval"}
    continuous = hash_params.get("send") == "continuous"
    assert all(((t.abs() != 1).all() if continuous else _pm1(t)) for _, t in got)
    assert result["train_steps"] == 4 and all(math.isfinite(h["train_loss"]) for h in result["history"])
    assert "active" not in result["defense_report"]  # no active-side defense, nothing reported
    assert own_reports(tmp_path)["active"] == {}
    for party in ("left", "right"):
        declared = result["defense_report"][party]["hashvfl"]["params"]
        assert declared["send"] == hash_params.get("send", "codes")
        rep = own_reports(tmp_path)[party]["hashvfl"]
        assert rep["send"] == hash_params.get("send", "codes") and rep["values_sent"] > 0
        assert rep["non_binary_values_sent"] == (rep["values_sent"] if continuous else 0)
        assert rep["quantization_weight"] == 1.0 and 0 < rep["quantization_norm_last"] < math.inf


@pytest.mark.parametrize("backend", ["mpc", pytest.param("ckks", marks=pytest.mark.slow)])
def test_hash_alone_runs_under_crypto_backends(tmp_path: Path, backend: str):
    doc = _fast(backend, consistency=False)
    doc["exchange"]["params"] = {"weight_init": "seeded", "insecure": True}
    result = run_doc(doc, tmp_path)
    assert result["backend"] == backend and result["test_accuracy"] is not None
    for rank in (1, 2):
        sent = _view(tmp_path, rank)["own"]["embeddings"]
        assert sent and all(_pm1(h) for _, h in sent)
    assert "embedding" not in _view(tmp_path, 0)["received"]


@pytest.mark.parametrize("backend", ["mpc", "ckks", "paillier"])
def test_consistency_is_refused_where_the_active_party_cannot_see_codes(backend: str):
    doc = _hashed(small_digits())
    doc["exchange"] = {"backend": backend}
    with pytest.raises(UnsupportedCombination) as exc:
        load_protocol_dict(doc)
    msg = str(exc.value)
    assert exc.value.path == "parties.active.defenses[0]"
    assert "hashvfl_consistency" in msg and "active_sees_embeddings" in msg and backend in msg


def test_cli_validate_accepts_the_protocols_and_names_the_refusal(tmp_path: Path):
    for name in (
        "hashvfl_plain",
        "hashvfl_improved_plain",
        "hashvfl_greedyhash_plain",
        "hashvfl_mpc",
        "hashvfl_ckks",
    ):
        proto = load_protocol(PROTOCOLS / f"{name}.yaml")
        assert proto.name == name
    doc = load_yaml("hashvfl_mpc.yaml")
    doc["parties"]["active"]["defenses"] = [{"name": "hashvfl_consistency"}]
    proc = cli("validate", str(write_yaml(tmp_path / "bad.yaml", doc)), timeout=120)
    assert proc.returncode == 2
    text = " ".join(proc.stderr.split())
    assert "parties.active.defenses[0]" in text and "active_sees_embeddings" in text


# -- behaviour (docs/methods/hashvfl.md §8.2 item 13, plus the balanced-code fix) ----------------------------


def _digits(seed: int, hashed: bool, bits: int) -> dict[str, Any]:
    """The recommended improved profile (protocols/hashvfl_improved_plain.yaml) at
    ``seed``, or, unhashed, the same task with ``bits`` float embeddings."""
    if hashed:
        doc = load_yaml("hashvfl_improved_plain.yaml")
        assert all(p["model"]["out"] == bits for p in doc["parties"]["passive"])
    else:
        doc = load_yaml("plain.yaml")
        doc["interactive"] = {"out": 16}
        for p in doc["parties"]["passive"]:
            p["model"]["out"] = bits
    doc["training"]["seed"] = seed
    for p in doc["parties"]["passive"]:
        p["model"]["init"] = "seeded"  # the seed fixes the initial weights too
    doc["runtime"] = {"dump_views": True}
    return doc


@pytest.mark.slow
def test_digits_accuracy_close_to_unhashed_and_bits_balanced(tmp_path: Path):
    """The issue's acceptance on seed 0 with the recommended profile (d = 8 bits,
    balanced class codes, ``balance: median`` with ``balance_eval: batch``, 10 epochs):
    accuracy within 3 points of 8 float embeddings, every bit's +1 fraction on the
    test codes in [0.4, 0.6], only +-1 on the wire.

    Measured (benchmarks/hashvfl_digits.py, arm median_batch, seeds 0/1/2): hashed
    0.9443/0.9610/0.9331 vs floats 0.9387/0.9694/0.9610 (gaps +0.56/-0.84/-2.79 points);
    every bit of both parties at 0.5014 on the 359 test rows (exact 1/2 per batch, the
    odd last batch of 39 rows one row over)."""
    bits = 8
    base = run_doc(_digits(0, False, bits), tmp_path / "base")
    hashed = run_doc(_digits(0, True, bits), tmp_path / "hashed")
    assert hashed["test_accuracy"] >= base["test_accuracy"] - 0.03, (hashed["test_accuracy"], base)
    # the final evaluation's codes as the active party received them, per sender
    got = [(r, t) for r, t in _received(tmp_path / "hashed", 0, "embedding") if r["phase"] == "eval"]
    last_round = max(r["round"] for r, _ in got)
    for sender, party in ((1, "left"), (2, "right")):
        codes = torch.cat([t for r, t in got if r["round"] == last_round and r["sender"] == sender])
        assert codes.shape == (hashed["rows"]["test"], bits) and _pm1(codes)
        frac = (codes > 0).float().mean(0)
        reported = own_reports(tmp_path / "hashed")[party]["hashvfl"]
        assert reported["non_binary_values_sent"] == 0
        assert torch.allclose(frac, torch.tensor(reported["test_bits"]["plus_fraction"]), atol=1e-4)
        assert ((frac >= 0.4) & (frac <= 0.6)).all(), (party, frac)
