"""FedBCD local steps (``training.local_steps`` = R; docs/methods/crdp-fl.md §2.2 Eq. 14, §7.2
"VFL correctness" with R > 1) with the real launcher: the run's final parameters
equal an in-process reference that uses, at local step r, the peers' embeddings
from the last communication round and the party's own part recomputed fresh; a
run with R > 1 exchanges once per round, one message each way per passive party
of R x n_S x d values; only the sent copies carry a defense's noise."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from securevfl.app.loader import load_checked_dict, load_protocol_dict
from securevfl.config import Protocol
from tests.support.protocols import small_digits
from tests.support.reference import ReferenceSplit, split_state, training_rows
from tests.support.runs import own_reports, run_doc

pytestmark = pytest.mark.timeout(300)

R = 3
STEPS = 7  # rounds of 3, 3 and 1 batches: ceil(7 / 3) = 3 rounds


def _doc(**training: Any) -> dict[str, Any]:
    return small_digits(epochs=1, max_steps=STEPS, local_steps=R, **training)


def fedbcd_reference(
    proto: Protocol,
    data_dir: Path,
    local_steps: int,
    *,
    sent_copies: list[list[torch.Tensor]] | None = None,
    own_transform=lambda h: h,
    stale_own: bool = False,
) -> tuple[dict[str, torch.Tensor], list[list[torch.Tensor]]]:
    """FedBCD in one process, written from docs/methods/crdp-fl.md §2.2 Eq. 14 with the split
    model's roles. At each round the passive parties' bottom outputs of the R
    batches are taken once (``sent_copies[k][j]``, the copies actually sent, when
    given: they carry the defense's noise); A computes dL/dh'_k of every batch at
    the round's parameters; then for r = 1..R, A steps its top model, bias and W_k
    on the round's h'_k, and each passive party steps its bottom model on
    ``<own_transform(h_k), g_k^(r)>``, h_k recomputed with its current parameters
    (``stale_own``: differentiates the round's h_k, at the round's parameters,
    instead: the negative control).
    Returns the final parameters and each party's round-start outputs."""
    from securevfl.models import interactive_optimizer, make_optimizer
    from securevfl.schedule import rounds_of, schedule

    tr = proto.training
    xs, y, classes = training_rows(proto, data_dir)
    passive = proto.parties.passive
    ref = ReferenceSplit(proto, xs, classes)
    bottoms = ref.bottoms
    opt_a = make_optimizer([*ref.top.parameters(), ref.bias], tr)
    opt_w = interactive_optimizer([b.weight for b in ref.blocks], proto.interactive)
    opt_p = [make_optimizer(b.parameters(), tr) for b in bottoms]

    def loss_of(hs: list[torch.Tensor], idx) -> torch.Tensor:
        return F.cross_entropy(ref.logits(hs), y[idx])

    clean: list[list[torch.Tensor]] = [[] for _ in passive]
    j = 0  # batch counter over the run (indexes sent_copies)
    for _, batches, _ in schedule(len(y), tr):
        for rnd in rounds_of(batches, local_steps):
            at_round = [copy.deepcopy(b) for b in bottoms] if stale_own else []
            with torch.no_grad():
                own = [[b(x[idx]) for idx in rnd] for b, x in zip(bottoms, xs, strict=True)]
            for k in range(len(passive)):
                clean[k].extend(own[k])
            sent = own if sent_copies is None else [c[j : j + len(rnd)] for c in sent_copies]
            grads = []  # dL/dh'_k of each batch at the round's parameters
            for r, idx in enumerate(rnd):
                hs = [s[r].clone().requires_grad_(True) for s in sent]
                grads.append(torch.autograd.grad(loss_of(hs, idx), hs))
            for r, idx in enumerate(rnd):
                opt_a.zero_grad()
                opt_w.zero_grad()
                loss_of([s[r] for s in sent], idx).backward()
                opt_a.step()
                opt_w.step()
                for k, (b, x, opt) in enumerate(zip(bottoms, xs, opt_p, strict=True)):
                    opt.zero_grad()
                    if stale_own:  # the round's own h and its Jacobian, not today's
                        b0 = at_round[k]
                        b0.zero_grad()
                        (own_transform(b0(x[idx])) * grads[r][k]).sum().backward()
                        for q, q0 in zip(b.parameters(), b0.parameters(), strict=True):
                            q.grad = q0.grad.clone()
                    else:
                        (own_transform(b(x[idx])) * grads[r][k]).sum().backward()
                    opt.step()
            j += len(rnd)
    return ref.state(), clean


def _gap(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert set(a) == set(b)
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.fixture(scope="module")
def fedbcd_run(tmp_path_factory) -> tuple[Path, Protocol, dict[str, Any]]:
    out = tmp_path_factory.mktemp("fedbcd")
    doc = _doc(optimizer="sgd", lr=0.2)
    result = run_doc(doc, out)
    return out, load_protocol_dict(copy.deepcopy(doc)), result


def test_local_steps_use_the_last_rounds_peer_embeddings_and_a_fresh_own_part(fedbcd_run):
    out, proto, result = fedbcd_run
    assert result["train_steps"] == STEPS
    split = split_state(out, proto)
    ref, _ = fedbcd_reference(proto, out / "data", R)
    assert _gap(split, ref) <= 1e-5, _gap(split, ref)
    # the comparison tells the schedules apart: fresh peers every step (R = 1) and
    # a stale own part each end somewhere else
    per_step, _ = fedbcd_reference(proto, out / "data", 1)
    stale, _ = fedbcd_reference(proto, out / "data", R, stale_own=True)
    gaps = {"reference": _gap(split, ref), "per-step": _gap(split, per_step), "stale own": _gap(split, stale)}
    print("gaps:", gaps)
    assert _gap(split, per_step) > 1e-4
    assert _gap(split, stale) > 1e-4


def test_a_round_is_one_message_each_way_per_passive_party(fedbcd_run):
    out, proto, result = fedbcd_run
    b, d = proto.training.batch_size, proto.parties.passive[0].model.out
    rounds = math.ceil(STEPS / R)
    for rank in (1, 2):
        lines = (out / "ranks" / f"rank{rank}.ledger.jsonl").read_text().splitlines()
        train = [json.loads(x) for x in lines]
        train = [x for x in train if x["phase"] == "train"]
        sent = [(x["tag"], tuple(x["shape"])) for x in train if x["direction"] == "sent"]
        got = [(x["tag"], tuple(x["shape"])) for x in train if x["direction"] == "recv"]
        sizes = [R * b, R * b, (STEPS - 2 * R) * b]  # every digits batch of 128 is full here
        assert sent == [("embedding", (n, d)) for n in sizes]
        assert got == [("embedding_grad", (n, d)) for n in sizes]
        assert sorted({x["round"] for x in train}) == [0, R, 2 * R]
    n_passive = len(proto.parties.passive)
    # the ledger summary counts sent messages: each round, one up and one down per passive party
    assert result["ledger"]["by_phase"]["train"]["messages"] == 2 * rounds * n_passive
    assert result["ledger"]["by_phase"]["train"]["bytes"] == 2 * n_passive * STEPS * b * d * 4


def test_crdp_noise_only_on_the_sent_copies_in_local_steps(tmp_path: Path):
    """crdp (clipped, eps3 = 1) with R = 3: A trains on the noised copies it
    received; each passive party differentiates its own, noise-free, clipped
    output. The reference fed the dumped sent copies reproduces the run."""
    doc = _doc(optimizer="sgd", lr=0.05)
    clip = 1.0
    crdp = {
        "name": "crdp",
        "params": {"variant": "fixed", "feature_selection": False, "eps3": 1.0, "clip": clip},
    }
    for p in doc["parties"]["passive"]:
        p["defenses"] = [copy.deepcopy(crdp)]
    doc["runtime"] = {"dump_views": True}
    result = run_doc(doc, tmp_path)
    checked = load_checked_dict(copy.deepcopy(doc))
    proto = checked.protocol
    from securevfl.app.harness import load_world
    from securevfl.app.rank_layout import layout_of

    world = load_world(checked, layout_of(checked), tmp_path)  # the saved views, loaded weights-only
    sent = [[t for _, t in world.views[p].own["embeddings"]] for p in ("left", "right")]
    assert [len(s) for s in sent] == [STEPS, STEPS]
    ref, clean = fedbcd_reference(
        proto, tmp_path / "data", R, sent_copies=sent, own_transform=lambda h: h.clamp(-clip, clip)
    )
    split = split_state(tmp_path, proto)
    assert _gap(split, ref) <= 1e-5, _gap(split, ref)
    # the wire carried clip(h) + Laplace noise of the reported scale; the own h had none
    for k, party in enumerate(("left", "right")):
        scale = own_reports(tmp_path)[party]["crdp"]["laplace_scale"]
        noise = torch.cat([s - c.clamp(-clip, clip) for s, c in zip(sent[k], clean[k], strict=True)])
        assert float(noise.abs().mean()) == pytest.approx(scale, rel=0.05)  # E|Lap(b)| = b
        comm = result["privacy"]["parties"][party]["mechanisms"]["crdp.communication"]
        assert comm["claim"]["t"] == math.ceil(STEPS / R)  # the paper's t counts rounds
        assert own_reports(tmp_path)[party]["crdp"]["noised_releases"] == STEPS
