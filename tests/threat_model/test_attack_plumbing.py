"""The attack harness end to end on a short plain run (default path): attacks
run after training on the saved views, results land in result.json under the
documented keys, and each says what the adversary used."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from securevfl.app.launcher import launch
from securevfl.app.loader import load_checked_dict, load_protocol_dict
from securevfl.errors import ConfigError
from tests.support.protocols import small_digits
from tests.support.runs import run_doc


def test_attacks_need_recorded_views(tmp_path: Path) -> None:
    doc = small_digits()
    doc["attacks"] = [{"name": "label_norm"}]
    doc["runtime"] = {"record_views": False}
    with pytest.raises(ConfigError) as err:
        launch(load_checked_dict(doc), tmp_path, progress=False)
    assert err.value.path == "runtime.record_views"


def test_unknown_attack_option_is_refused_at_load() -> None:
    doc = small_digits()
    doc["attacks"] = [{"name": "feature_reconstruction", "params": {"aux_fraction": 2.0}}]
    with pytest.raises(ConfigError) as err:
        load_protocol_dict(doc)
    assert "attacks[0].params" in str(err.value)


@pytest.mark.parametrize(
    ("attack", "field"), [("feature_reconstruction", "target"), ("label_direction", "party")]
)
def test_attack_naming_an_unknown_party_is_refused_at_load(attack: str, field: str) -> None:
    """A misspelt victim or attacker fails before training, not after it."""
    doc = small_digits()
    doc["attacks"] = [{"name": attack, "params": {field: "lefft"}}]
    with pytest.raises(ConfigError) as err:
        load_protocol_dict(doc)
    assert err.value.path == f"attacks[0].params.{field}"
    assert "'lefft' is not a passive party" in str(err.value) and "left" in str(err.value)
    doc["attacks"][0]["params"][field] = "left"
    load_protocol_dict(doc)  # a real passive party loads


def test_attacks_run_after_training_on_the_adversaries_views(tmp_path: Path) -> None:
    doc = small_digits(epochs=2)
    doc["attacks"] = [
        {"name": "feature_reconstruction", "params": {"image_shape": [8, 4], "grid_rows": 4}},
        {"name": "label_norm", "params": {"party": "right"}},
        {"name": "label_norm", "params": {"label": "norm_left"}},
        {"name": "online_reconstruction"},
    ]
    res = run_doc(doc, tmp_path)
    att = res["attacks"]
    assert set(att) == {"feature_reconstruction", "label_norm", "norm_left", "online_reconstruction"}
    assert att == json.loads((tmp_path / "result.json").read_text())["attacks"]
    fr = att["feature_reconstruction"]
    assert (fr["adversary"], fr["victim"]) == ("active", "left")
    assert fr["used"]["aux_rows"] == round(0.2 * res["rows"]["train"])
    assert fr["nmse"] == min(fr["nmse_raw"], 1.0) and fr["ap"] == pytest.approx(1 - fr["nmse"])
    # measured after 2 epochs (24 steps, seed 0): nmse 0.296; h' already leaks
    assert fr["nmse"] < 0.6
    assert (tmp_path / "attacks" / "feature_reconstruction.npz").is_file()
    assert att["label_norm"]["adversary"] == "right" and att["norm_left"]["adversary"] == "left"
    assert att["label_norm"]["n_rows"] == res["rows"]["train"]
    online = att["online_reconstruction"]
    # R_I took one step per training batch A received, and was scored after each epoch
    assert online["used"]["train_steps_observed"] == res["train_steps"]
    assert online["rounds"] == [0, 1] and online["n_test"] == res["rows"]["test"]
    assert online["nmse"] == pytest.approx(sum(online["nmse_per_pass"]) / 2)
    # measured (seed 0): nmse per pass 1.180, 0.971: R_I is still learning after 24 steps
    assert online["nmse_per_pass"][1] < online["nmse_per_pass"][0]
    # the passive party's recorded gradients are exactly what the ledger received (plain)
    v = torch.load(tmp_path / "ranks" / "rank1.view.pt", weights_only=False)
    ledger = [t for _, t in v["received"]["embedding_grad"]]
    assert len(ledger) == len(v["own"]["grads"]) == res["train_steps"]
    assert all(torch.equal(a, b) for a, b in zip(ledger, v["own"]["grads"], strict=True))
