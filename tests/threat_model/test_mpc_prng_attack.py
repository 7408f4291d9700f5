"""A curious MPC party rebuilds its peer's generator from the openings it receives.

In the ``mpc`` backend's pairwise layout every Beaver opening a party sends is its
share of x - a (and y - b), a and b drawn from the stream it shares with the
dealer. Were that stream Mersenne Twister (``torch.Generator``, as CrypTen draws
it) and a share of x zero (A's share of h'_i, P_i's share of dL/dz, as they were),
an opening would be raw generator output: 312 such ring elements give the
generator's state (:mod:`tests.threat_model.mt19937`), and every later draw
follows. Playing P_1 with exactly what P_1 receives (its view of a real run: A's
openings), the attack predicts the rest of A's opening and A's next mask b, and
from the opening W_A - b recovers A's share of W_1, hence W_1. Playing A with A's
view (P_1's openings), it predicts P_1's stream and with it the masks of P_1's
forward openings, behind which are P_1's embeddings. The positive control shows
the attack recovering a ``torch.Generator`` stream drawn as CrypTen's
``generate_random_ring_element`` drew; on a real run every secret draw comes from
AES-256-CTR secret streams (and every opening holds a re-shared input), and the
attack predicts nothing.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

from securevfl.app.checkpoints import model_dir, read_state
from tests.support.protocols import small_digits
from tests.support.runs import run_doc
from tests.threat_model.mt19937 import ELEMENTS, clone_from_ring

pytestmark = pytest.mark.timeout(400)

B, D, OUT = 64, 8, 8  # batch, P_1's embedding width, the interactive layer's output
CHECK = 88  # predicted elements that must match for the clone to count as the generator
STEPS = 6


def predicts(raw: torch.Tensor) -> Any:
    """The clone of the generator that drew ``raw`` (at least 312 + CHECK consecutive
    ring elements) if it predicts the next CHECK of them exactly, else None."""
    if raw.numel() < ELEMENTS + CHECK:
        return None
    clone = clone_from_ring(raw)
    return clone if torch.equal(clone.ring(CHECK), raw[ELEMENTS : ELEMENTS + CHECK]) else None


def hypotheses(opening: torch.Tensor, parts: list[int]) -> list[tuple[str, torch.Tensor]]:
    """Where raw generator output may sit in an opening made of ``parts`` (element
    counts): at the start of every part, as it is or negated (x - a with x = 0)."""
    out, at = [], 0
    for n in parts:
        seg = opening[at : at + n]
        out += [(f"-part@{at}", -seg), (f"+part@{at}", seg)]
        at += n
    return out


def test_positive_control_recovers_a_torch_generator_stream():
    """A party draws its masks as CrypTen drew them (torch.Generator, 64-bit seed from
    os.urandom): 312 opened values of x - a with x = 0 predict the rest of a, the
    next mask b, and so the share W_A behind the opening W_A - b."""
    g = torch.Generator().manual_seed(int.from_bytes(os.urandom(8), "big") - 2**63)
    a = torch.randint(-(2**63), 2**63 - 1, (B, D), generator=g, dtype=torch.long)
    b = torch.randint(-(2**63), 2**63 - 1, (D, OUT), generator=g, dtype=torch.long)
    w_a = (torch.randn(D, OUT) * 2**16).long()
    opening = torch.cat([(0 - a).reshape(-1), (w_a - b).reshape(-1)])
    clone = predicts(-opening[: B * D])
    assert clone is not None
    rest = clone.ring(B * D - ELEMENTS - CHECK + D * OUT)
    b_pred = rest[-D * OUT :].reshape(D, OUT)
    assert torch.equal(opening[B * D :].reshape(D, OUT) + b_pred, w_a)


def _doc() -> dict[str, Any]:
    doc = small_digits(epochs=1, batch_size=B, max_steps=STEPS)
    doc["parties"]["passive"] = [
        {"name": "left", "columns": {"glob": "px_*"}, "model": {"kind": "mlp", "hidden": [16], "out": D}}
    ]
    doc["interactive"] = {"out": OUT}
    doc["exchange"] = {"backend": "mpc"}
    doc["runtime"] = {"dump_views": True}
    return doc


@pytest.fixture(scope="module")
def mpc_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("mpc-prng")
    result = run_doc(_doc(), out)
    assert result["backend"] == "mpc" and result["world_size"] == 3
    return out


def _view(out: Path, rank: int) -> dict[str, Any]:
    return torch.load(out / "ranks" / f"rank{rank}.view.pt", weights_only=False)


def _openings(out: Path, rank: int) -> list[torch.Tensor]:
    return [t.reshape(-1) for _, t in _view(out, rank)["received"]["mpc.open"]]


def _a_share_of_w1(out: Path) -> torch.Tensor:
    """A's share of W_1 at the end of the run (its saved model: the ground truth)."""
    saved = read_state(model_dir(out, 0), rank=0, kind="model", protocol_digest=None)
    (w,) = saved.tensors["exchange"]["w"]
    return w


def _attack(opened: list[torch.Tensor], parts_of: Any) -> list[tuple[int, str, Any]]:
    """Every (opening index, hypothesis, clone) where a clone predicts the opening."""
    hits = []
    for k, o in enumerate(opened):
        for name, raw in hypotheses(o, parts_of(o)):
            clone = predicts(raw)
            if clone is not None:
                hits.append((k, name, clone))
    return hits


def _parts(o: torch.Tensor) -> list[int]:
    """An opening's parts: a training step's backward opening is dL/dz - g alone
    (B x OUT); a forward one (training or evaluation, B' rows) h' - u then W - v."""
    rows, rem = divmod(o.numel() - D * OUT, D)
    return [o.numel()] if o.numel() == B * OUT or rem or rows < 1 else [rows * D, D * OUT]


def test_p1_cannot_rebuild_a_generator_from_the_openings_it_receives(mpc_run: Path):
    """P_1's view: A's openings: in training W_A - v_A (D x OUT) forward and
    dL/dz - g (B x OUT, g A's alone) backward; in the evaluation x_A - a and W_A - b
    (B' x D, then D x OUT). If a part continues as an MT clone predicts, P_1
    predicts A's next draw b and reads A's share of W_1 off W_A - b: from the last
    evaluation opening (after training) it is A's final share, which the test
    checks against A's saved model. No part of any opening continues as predicted."""
    opened = _openings(mpc_run, 1)
    assert len(opened) >= 2 * STEPS
    hits = _attack(opened, _parts)
    truth = _a_share_of_w1(mpc_run)
    recovered = False
    if hits:  # the attack goes on: predict A's whole stream, find each forward opening's u, then v
        k, _, clone = hits[0]
        stream = torch.cat([opened[k][: ELEMENTS + CHECK].neg(), clone.ring(200_000)])
        at = {int(v): i for i, v in enumerate(stream.tolist())}
        last = [o for o in opened if len(_parts(o)) == 2][-1]
        i = at.get(int(-last[0]))
        if i is not None:
            n = last.numel() - D * OUT
            b = stream[i + n : i + n + D * OUT]
            recovered = torch.equal(last[n:] + b, truth.reshape(-1))
    assert not hits, (
        f"P_1 rebuilt A's generator from {len(hits)} opening parts ({hits[0][1]} of opening {hits[0][0]}); "
        f"A's final share of W_1 recovered exactly: {recovered}"
    )


def test_a_cannot_rebuild_p1s_generator_from_the_openings_it_receives(mpc_run: Path):
    """A's view: P_1's openings, h'_1 - u (u P_1's alone) and W_1 - v_1 forward, one
    per training step (P_1 sends nothing in the backward opening), and the
    evaluation's. Were u raw output of an MT stream with h'_1 zero, A would clone
    the stream and read u and v of every step, unmasking h'_1; the opening always
    carries h'_1 itself, and no part of any opening continues as predicted."""
    opened = _openings(mpc_run, 0)
    assert sum(o.numel() == B * D + D * OUT for o in opened) >= STEPS
    hits = _attack(opened, _parts)
    assert not hits, (
        f"A rebuilt P_1's generator from {len(hits)} opening parts ({hits[0][1]} of opening {hits[0][0]})"
    )
