"""The initial bottom weights are their owner's secret (SECURITY.md §7, §6a).

The attacker is the active party under ``plain``, holding everything the
protocol file gives it: the shared seed, each passive party's model entry and
input width. Its best guess of a passive party's initial bottom model is the
one the shared seed builds. It is handed the party's true training inputs for
the first batch (more than it holds), so the only unknown is the model: it
predicts the embeddings that party sends at step 0 and is scored by R^2 against
what that party actually sent. ``right`` opts into ``init: seeded``, and the
guess reproduces its embeddings exactly (the attack works); ``left`` keeps the
default ``init: private`` (its rank's own secret randomness), and the guess
explains none of them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from securevfl.config import ModelSpec
from securevfl.models import build_bottom
from tests.support.protocols import small_digits
from tests.support.runs import run_doc


def _r2(guess: np.ndarray, truth: np.ndarray) -> float:
    return 1.0 - float(((guess - truth) ** 2).sum()) / float(((truth - truth.mean(0)) ** 2).sum())


def test_the_seeded_guess_of_a_private_bottom_model_explains_none_of_its_embeddings(tmp_path: Path):
    doc = small_digits(epochs=1, max_steps=1)
    doc["parties"]["passive"][0]["model"]["init"] = "private"
    assert doc["parties"]["passive"][1]["model"]["init"] == "seeded"
    doc["runtime"] = {"dump_views": True}
    run_doc(doc, tmp_path)
    r2 = {}
    for rank, party in ((1, "left"), (2, "right")):
        own = torch.load(tmp_path / "ranks" / f"rank{rank}.view.pt", weights_only=False)["own"]
        first = own["forwards"][0]
        assert first["phase"] == "train"
        _, sent = own["embeddings"][0]
        x = own["x_train"][torch.as_tensor(first["rows"])]
        spec = ModelSpec.model_validate({**doc["parties"]["passive"][rank - 1]["model"], "init": "seeded"})
        guess = build_bottom(spec, x.shape[1], seed=doc["training"]["seed"], party=party)
        with torch.no_grad():
            r2[party] = _r2(guess(x).double().numpy(), sent.double().numpy())
    assert r2["right"] > 1 - 1e-9, r2  # the shared seed rebuilds a seeded model exactly
    # no better than guessing the embeddings' mean: over 200 private initialisations of this model
    # on these rows the seeded guess scored R^2 between -29 and -5.2 (median -14)
    assert r2["left"] < 0.0, r2
