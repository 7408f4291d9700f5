"""The active party subtracts two predictions' noisy embeddings (SECURITY.md, "Prediction").

Threat: under ``plain`` A receives every h'_i = release(h_i) + noise at prediction, as
at evaluation; ``embedding_dp`` (evaluation noise, on by default) and
``gaussian_noise`` (``at_eval``, on by default) add fresh noise so that A sees each
record only through it. A chooses which of its IDs it puts into a prediction, and
may ask for several. Were each prediction's noise streams rewound to the key and
position saved with the model, every prediction would add the same noise at the same
position: two predictions of the same records would be identical, and with one ID
left out of the second, the rows behind it shift by one under an unchanged noise
sequence, so A's row-by-row difference of the two is the difference of two records'
clean releases, noise-free.

The test trains a small ``plain`` run (``embedding_dp`` at one passive party,
``gaussian_noise`` at the other; private noise keys, no pinned ``noise_seed``),
then predicts the same records twice and once with one ID dropped, and plays A with
exactly what A receives (the h'_i of its prediction views) and the aligned IDs it
writes in ``predictions.csv``. The noise-free releases it is scored against are
recomputed from each passive party's saved model with the noise scale set to 0.
Each difference must carry fresh noise of the declared scale on both sides:
E||n_1 - n_2||^2 = 2 d std^2 per row. On code that rewinds the streams
(commit 099986d) the two predictions are bit-identical and the attack error is
exactly 0.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch

from securevfl.app.loader import load_checked_dict
from securevfl.app.model_io import load_party_model
from securevfl.app.predict import predict_local, records_source
from securevfl.app.rank_layout import layout_of
from securevfl.components import CheckedProtocol
from securevfl.data.party_data import load_new_records
from securevfl.defenses.base import build_stack
from securevfl.defenses.dravl import GaussianNoise
from securevfl.defenses.vfl_afe import EmbeddingDP
from securevfl.models import build_bottom
from securevfl.schedule import eval_batches
from tests.support.protocols import load_yaml, small_digits
from tests.support.runs import run_doc

pytestmark = pytest.mark.timeout(300)

ROWS = 200  # records each prediction scores: batches of 64, 64, 64, 8
DROP = 70  # the aligned position of the ID the third prediction leaves out (in batch 1)
STD = 0.5  # gaussian_noise's std at party 'right'
# mean over rows of ||noise difference||^2 / (2 d std^2): 1 for fresh noise, 0 for a replay.
# Its standard deviation over ~190 rows of d = 16 is about 0.026; five of them each side.
LOW, HIGH = 0.87, 1.13


def _doc() -> dict[str, Any]:
    doc = small_digits(epochs=1, batch_size=64, max_steps=3)
    doc["privacy"] = {"delta": 0.01}  # no noise_seed: every run's noise keys are private and fresh
    doc["runtime"] = {"dump_views": True}  # A's prediction view: every h'_i it receives
    left, right = doc["parties"]["passive"]
    afe = copy.deepcopy(load_yaml("vfl_afe_plain.yaml")["parties"]["passive"][0]["defenses"])
    left["defenses"] = afe  # full VFL-AFE, paper-mode rescaling, evaluation noise on
    right["defenses"] = [
        {"name": "gaussian_noise", "params": {"std": STD, "at_eval": True, "eval_metrics": False}}
    ]
    return doc


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One training run and three predictions: twice the same records, once with
    the ID at aligned position DROP left out of party 'left''s file."""
    root = tmp_path_factory.mktemp("replay")
    doc = _doc()
    run_doc(doc, root / "run")
    checked = load_checked_dict(copy.deepcopy(doc))
    files = {p: next((root / "run" / "data").glob(f"*/{p}.csv")) for p in ("left", "right")}
    ids = sorted(pd.read_csv(files["left"], dtype={"id": str})["id"])[:ROWS]
    dropped = ids[DROP]

    def cut(party: str, keep: list[str], name: str) -> str:
        frame = pd.read_csv(files[party], dtype={"id": str})
        dest = root / f"{name}-{party}.csv"
        frame[frame["id"].isin(keep)].to_csv(dest, index=False)
        return f"{party}={dest}"

    same = [cut(p, ids, "same") for p in ("left", "right")]
    less = [cut("left", [i for i in ids if i != dropped], "less"), same[1]]
    preds = {}
    for name, data in (("first", same), ("second", same), ("dropped", less)):
        predict_local(root / "run", root / name, data=data)
        preds[name] = _received(root / name)
    assert preds["first"]["ids"] == ids and preds["dropped"]["ids"] == ids[:DROP] + ids[DROP + 1 :]
    return {"root": root, "checked": checked, "preds": preds, "data": {"left": same[0], "right": same[1]}}


def _received(out: Path) -> dict[str, Any]:
    """What A holds after one prediction: the aligned IDs it wrote, and every h'_i it
    received, per passive party, in aligned row order (A receives from 'left' then
    'right' in every batch). Checked against what each passive rank says it sent."""
    ids = pd.read_csv(out / "predictions.csv", dtype={"id": str})["id"].tolist()
    view = torch.load(out / "ranks" / "rank0.predict_view.pt", weights_only=False)
    msgs = [t.double() for _, t in view["received"]["embedding"]]
    rows = {"left": torch.cat(msgs[0::2]), "right": torch.cat(msgs[1::2])}
    for rank, party in ((1, "left"), (2, "right")):
        own = torch.load(out / "ranks" / f"rank{rank}.predict_view.pt", weights_only=False)["own"]
        sent = torch.cat([t.double() for _, t in own["embeddings"]])
        assert torch.equal(sent, rows[party]) and sent.shape[0] == len(ids)
    return {"ids": ids, **rows}


def _noise_std(checked: CheckedProtocol, party: str) -> float:
    """The declared per-coordinate std of the party's evaluation noise."""
    if party == "right":
        return STD
    stack = build_stack(checked.protocol, checked.components, party, "passive")
    (d,) = stack.defenses
    assert isinstance(d, EmbeddingDP)
    return 2.0 * d.sigma * d.t


def _clean(runs: dict[str, Any], party: str, ids: list[str], data: str) -> torch.Tensor:
    """The party's noise-free releases of ``ids`` (aligned order), batch by batch as
    a prediction computes them: its saved model, its defenses with the noise scale 0."""
    checked: CheckedProtocol = runs["checked"]
    proto = checked.protocol
    role = next(r for r in layout_of(checked).roles if r.party == party)
    model = load_party_model(checked, role, runs["root"] / "run", torch.device("cpu"))
    source = records_source(proto, party, runs["root"] / "run" / "data", Path(data.split("=", 1)[1]))
    records = load_new_records(source, party, model.inputs, preprocess=model.spec.preprocess)
    where = {i: k for k, i in enumerate(records.ids)}
    x = torch.as_tensor(model.features(records)[[where[i] for i in ids]])
    for d in model.stack.defenses:  # the same release, without its noise
        if isinstance(d, EmbeddingDP):
            d.sigma = 0.0
        elif isinstance(d, GaussianNoise):
            d.p = d.p.model_copy(update={"std": 0.0})
    assert model.spec.model is not None
    net = build_bottom(model.spec.model, x.shape[1], seed=proto.training.seed, party=party)
    net.load_state_dict(model.tensors["bottom"])
    out = []
    with torch.no_grad():
        for idx in eval_batches(len(ids), proto.training.batch_size):
            out.append(model.stack.embed(net(x[idx]), train=False).double())
    return torch.cat(out)


def _noise_ratio(diff: torch.Tensor, std: float) -> float:
    """Mean over rows of ||diff||^2 / (2 d std^2): about 1 when ``diff`` is the
    difference of two independent noise draws of that std."""
    return float((diff**2).sum(dim=1).mean() / (2 * diff.shape[1] * std**2))


@pytest.mark.parametrize("party", ["left", "right"])
def test_two_predictions_of_the_same_records_release_fresh_noise(runs, party):
    """Every row differs between the two predictions, by two independent draws of
    the declared noise (the clean releases are the same: same model, same batches)."""
    a, b = runs["preds"]["first"][party], runs["preds"]["second"][party]
    equal = int((a == b).all(dim=1).sum())
    ratio = _noise_ratio(a - b, _noise_std(runs["checked"], party))
    assert equal == 0 and LOW <= ratio <= HIGH, (
        f"party '{party}': {equal} of {a.shape[0]} rows released bit-identically by two predictions; "
        f"mean ||row difference||^2 / (2 d std^2) = {ratio:.4f} (fresh noise: 1)"
    )


@pytest.mark.parametrize("party", ["left", "right"])
def test_one_id_dropped_gives_the_active_party_no_noise_free_difference(runs, party):
    """A plays the replay: it subtracts the rows of the prediction with one ID left out
    from those of the full one, position by position (the noise sequence a rewound
    stream repeats), over the full batches. Before the dropped ID that is a record
    minus itself, after it a record minus the next one. Scored against the
    noise-free releases, A's differences are off by fresh noise of the declared
    scale; a replay would make them exact."""
    std = _noise_std(runs["checked"], party)
    full, less = runs["preds"]["first"], runs["preds"]["dropped"]
    n = 3 * 64  # the full batches (the last one's size differs between the runs)
    attack = full[party][:n] - less[party][:n]
    ids_full, ids_less = full["ids"], less["ids"]
    data = runs["data"][party]
    clean_full = _clean(runs, party, ids_full, data)[:n]
    clean_less = _clean(runs, party, ids_less, data)[:n]
    truth = clean_full - clean_less  # zero rows before DROP, two records' difference after
    error = attack - truth
    ratio = _noise_ratio(error, std)
    shifted = _noise_ratio(error[DROP:], std)
    norms = attack.norm(dim=1)
    assert LOW <= ratio <= HIGH and shifted > LOW - 0.05, (
        f"party '{party}': A's differences are off the noise-free ones by a mean "
        f"||error||^2 / (2 d std^2) = {ratio:.4f} ({shifted:.4f} behind the dropped ID; fresh noise: 1); "
        f"its row norms: max {float(norms.max()):.3f}, against sqrt(2 d) std = "
        f"{float(np.sqrt(2 * attack.shape[1]) * std):.3f} for fresh noise"
    )
