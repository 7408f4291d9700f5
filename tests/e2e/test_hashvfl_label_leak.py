"""The label-leak probe and MixMatch model completion on a real HashVFL digits
run through the launcher (docs/methods/hashvfl.md §7 item 2, §5.4, §8.2 item 19): the attacks
run on the passive party's recorded view and report well-formed results. The
amount of leakage is documented (docs, benchmarks/hashvfl_label_leak.py), not
asserted here. Slow: 81 s of CPU, 6 min wall on a loaded 2-core machine."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tests.support.protocols import small_digits
from tests.support.runs import run_doc

pytestmark = [pytest.mark.timeout(900), pytest.mark.slow]


def test_gradient_clusters_and_mixmatch_on_a_hashed_run(tmp_path: Path):
    doc = small_digits(epochs=1, batch_size=64, max_steps=8)
    for p in doc["parties"]["passive"]:
        p["model"]["out"] = 4
        p["defenses"] = [{"name": "hashvfl", "params": {}}]
    doc["parties"]["active"]["defenses"] = [{"name": "hashvfl_consistency", "params": {}}]
    doc["attacks"] = [
        {"name": "gradient_clusters", "params": {"party": "right"}},
        {"name": "gradient_clusters", "params": {"label": "per_step", "points": "per_step", "n_init": 2}},
        {
            "name": "model_completion",
            "params": {"n_known": 20, "semi_supervised": "mixmatch", "epochs": 1},
        },
    ]
    result = run_doc(doc, tmp_path)
    att = result["attacks"]
    rows = 8 * 64  # every row of the 8 batches, once
    gc = att["gradient_clusters"]
    assert gc["adversary"] == "right" and gc["n_points"] == rows
    assert gc["used"]["known_labels"] == 0 and gc["used"]["normalize"] is True
    step = att["per_step"]
    assert step["adversary"] == "left" and step["n_points"] == rows
    for entry in (gc, step):
        assert math.isfinite(entry["ami"]) and -1.0 <= entry["ami"] <= 1.0
        assert 0.0 <= entry["accuracy"] <= 1.0 and entry["ap"] == max(0.0, entry["ami"])
    mc = att["model_completion"]
    assert mc["used"]["semi_supervised"] == "mixmatch" and mc["used"]["augment"] == "input"
    assert mc["used"]["unlabelled"] == result["rows"]["train"] and mc["used"]["known_labels"] == 20
    assert 0.0 <= mc["accuracy"] <= 1.0 and mc["n_test"] == result["rows"]["test"]
