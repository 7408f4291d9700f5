"""securevfl.api end to end with the caller's own objects: a defense class passed
in the protocol mapping runs inside the passive rank; rank 0's epoch records reach
the caller's callback as each epoch ends, equal to the run's history; each
party's privacy is typed; a callback that raises stops every rank and the
exception reaches the caller; a class defined in the running script itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from securevfl import api
from securevfl.defenses.base import DEFENSES
from securevfl.errors import ConfigError
from securevfl.report.result import read_own_reports
from tests.support import user_components as uc
from tests.support.protocols import ROOT, small_digits

pytestmark = pytest.mark.timeout(300)


def _doc(**training: object) -> dict:
    doc = small_digits(**training)
    doc["parties"]["active"]["defenses"] = [{"name": "label_dp", "params": {"epsilon": 2.0}}]
    doc["parties"]["passive"][0]["defenses"] = [{"name": uc.Rounding, "params": {"decimals": 2}}]
    return doc


def test_epoch_records_reach_the_callback_and_a_defense_class_runs_in_its_rank(tmp_path: Path):
    seen: list[api.EpochRecord] = []
    result = api.run(_doc(epochs=3), out=tmp_path / "run", progress=False, on_epoch=seen.append)
    assert [r.epoch for r in seen] == [1, 2, 3] and {r.epochs for r in seen} == {3}
    assert seen[-1].step == result.train_steps and seen[0].step < seen[1].step < seen[2].step
    assert seen[0].elapsed_s < seen[1].elapsed_s < seen[2].elapsed_s
    for record, row in zip(seen, result.history, strict=True):
        assert record.train_loss == row["train_loss"]
        assert record.test_accuracy == row["test_accuracy"]
    # the active party's own label DP, spent before training: the same at every epoch
    spent = result.privacy_of("active")
    assert (
        spent is not None
        and spent.epsilon == pytest.approx(2.0, abs=1e-3)
        and spent.delta == result.privacy["delta"]
    )
    assert (
        spent.epsilon == result.privacy["parties"]["active"]["total"]["epsilon"]
    )  # the dict form is as it was
    assert set(spent.mechanisms) == {"label_dp.randomized_response"}
    # the spending is the same at every epoch; the audit runs once, after training, so only the
    # run's own record carries it
    assert spent.audit and all(a.mechanism == "label_dp.randomized_response" for a in spent.audit)
    assert all(r.privacy_of("active") == spent.model_copy(update={"audit": []}) for r in seen)
    assert all(r.privacy_of("left") is None for r in seen)  # a passive party's accounting is its own
    # the class ran inside the left party's rank, under its name, and only for this call
    assert result.defenses["left"] == ["test_rounding"]
    assert result.defense_report["left"]["test_rounding"] == {"params": {"decimals": 2}}  # public: options
    own = read_own_reports(result.folder)["left"].defenses  # the party's own statistics
    assert own["test_rounding"]["released"] > 0
    assert "test_rounding" not in DEFENSES
    assert result.privacy_of("left") is None  # no DP mechanism: no epsilon describes it
    with pytest.raises(ConfigError, match="no party 'shop'"):
        result.privacy_of("shop")
    on_disk = json.loads((result.folder / "result.json").read_text())
    assert on_disk["privacy"] == result.privacy and result.to_json() == on_disk


class Stop(Exception):
    pass


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_a_factory_callable_and_a_defense_class_run_in_their_ranks_under_the_launch_s_policy(tmp_path: Path):
    """api.run with the factory callable itself (a model's ``factory``) and a
    defense class: the local launch allows their modules (the caller runs every
    party), each rank loads them under that policy, and the right party's saved
    bottom is the factory's module (one linear layer, not the built-in mlp)."""
    doc = _doc(epochs=1, max_steps=2)
    doc["parties"]["passive"][1]["model"] = {"factory": uc.bottom, "out": 16}
    result = api.run(doc, out=tmp_path / "run", progress=False)
    assert result.train_steps == 2
    assert read_own_reports(result.folder)["left"].defenses["test_rounding"]["released"] > 0
    saved = [torch.load(f, map_location="cpu", weights_only=True) for f in tmp_path.rglob("models.pt")]
    bottoms = [s.get("bottom") for s in saved]
    linear = [b for b in bottoms if b is not None and set(b) == {"weight", "bias"}]
    assert linear and all(b["weight"].shape[0] == 16 for b in linear)
    assert "test_rounding" not in DEFENSES


def test_a_callback_that_raises_stops_every_rank(tmp_path: Path):
    def stop(record: api.EpochRecord) -> None:
        raise Stop(f"enough after epoch {record.epoch}")

    out = tmp_path / "run"
    t0 = time.monotonic()
    with pytest.raises(Stop, match="enough after epoch 1"):
        api.run(small_digits(epochs=200, batch_size=32), out=out, progress=False, on_epoch=stop)
    assert time.monotonic() - t0 < 120  # not the 200 epochs
    assert not (out / "result.json").exists()
    pids = json.loads((out / "ranks" / "launcher_pids.json").read_text())  # a fresh folder: written in place
    assert len(pids) == 3
    assert [pid for pid in pids.values() if _alive(pid)] == []


SCRIPT = """
import json, sys
import torch
from securevfl import api
from securevfl.defenses.base import Defense, DefenseOptions
from tests.support.protocols import small_digits


class Halve(Defense[DefenseOptions]):
    name = "script_halve"
    sides = frozenset({"passive"})

    def embed(self, h, *, train):
        return h * 0.5


if __name__ == "__main__":
    doc = small_digits(epochs=1, max_steps=2)
    doc["parties"]["passive"][1]["defenses"] = [Halve]
    epochs = []
    result = api.run(doc, out=sys.argv[1], progress=False, on_epoch=epochs.append)
    print(json.dumps({"defenses": result.defenses, "epochs": [e.epoch for e in epochs]}))
"""


@pytest.mark.slow
def test_a_script_s_own_defense_class_runs_in_the_ranks(tmp_path: Path):
    """A class defined in the running script: every rank imports the script under
    its file name (behind its __main__ guard) and finds the class there. (Default
    suite: tests/unit/test_objects.py, the script's references.)"""
    (tmp_path / "experiment.py").write_text(SCRIPT)
    proc = subprocess.run(
        [sys.executable, "experiment.py", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {
        "defenses": {"right": ["script_halve"]},
        "epochs": [1],
    }
