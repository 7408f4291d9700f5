"""securevfl.api end to end: a run, its prediction and a comparison from Python,
every party its own OS process, with typed results equal to the files the CLI
writes; a refused call raises securevfl's error and leaves the results alone; and
the example script that compares crypto alone with crypto plus perturbation."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from securevfl import api
from securevfl.errors import ConfigError
from securevfl.report.result import read_own_reports
from tests.support import user_components as uc
from tests.support.protocols import ROOT, small_digits


@pytest.fixture(scope="module")
def api_run(tmp_path_factory: pytest.TempPathFactory) -> api.RunResult:
    """A short plain run through :func:`api.run`, from a mapping with overrides."""
    out = tmp_path_factory.mktemp("api_run") / "run"
    return api.run(small_digits(epochs=1), out=out, overrides={"training.max_steps": 3}, progress=False)


def test_run_returns_the_result_record_typed(api_run: api.RunResult):
    on_disk = json.loads((api_run.folder / "result.json").read_text())
    assert api_run.to_json() == on_disk
    assert api_run.train_steps == 3 and api_run.backend == "plain"
    assert 0.0 <= api_run.test_accuracy <= 1.0  # type: ignore[operator]
    assert len({int(pid) for pid in api_run.party_pids.values()}) == api_run.n_parties  # one process each


def test_a_refused_run_raises_and_keeps_the_earlier_result(api_run: api.RunResult):
    before = (api_run.folder / "result.json").read_text()
    with pytest.raises(ConfigError, match="--overwrite"):
        api.run(small_digits(epochs=1), out=api_run.folder, progress=False)
    with pytest.raises(ConfigError, match="training run's folder"):
        api.predict(api_run, out=api_run.folder)
    assert (api_run.folder / "result.json").read_text() == before


def test_predict_returns_the_predictions(api_run: api.RunResult, tmp_path: Path):
    pred = api.predict(api_run, out=tmp_path / "pred")
    assert isinstance(pred, api.Prediction)
    assert pred.folder == tmp_path / "pred" and pred.path.is_file()
    frame = pred.frame
    assert len(frame) == pred.rows["aligned"] > 0
    assert frame.columns[0] == "id" and frame["id"].map(type).eq(str).all()
    assert list(frame.columns)[1:] == list(pd.read_csv(pred.path).columns)[1:]


def test_compare_runs_a_grid_of_protocols_given_as_data(tmp_path: Path, capfd: pytest.CaptureFixture[str]):
    """A protocol given as a mapping, holding a defense class; the table as a frame
    and as typed rows with each party's privacy. ``progress=False`` prints nothing; the
    protocol file it keeps names the script's class and how to register it for the
    command line."""
    doc = small_digits(epochs=1, max_steps=2)
    doc["parties"]["active"]["defenses"] = [{"name": "label_dp", "params": {"epsilon": 1.0}}]
    doc["parties"]["passive"][0]["defenses"] = [uc.Rounding]
    lr = "training.lr"
    table = api.compare(doc, grid={lr: [0.01, 0.05]}, seeds=[3], out=tmp_path, progress=False)
    frame = table.frame
    assert [row.protocol for row in table.rows] == list(frame["protocol"])
    for row, (_, line) in zip(table.rows, frame.iterrows(), strict=True):
        assert row.test_accuracy == line["test_accuracy"] and row.seeds == (3,)
        spent = row.privacy_of("active")
        assert spent is not None and spent.epsilon == line["epsilon"] == pytest.approx(1.0, abs=1e-3)
        assert row.privacy_of("left") is None
        own = read_own_reports(row.results[0].folder)["left"].defenses
        assert own["test_rounding"]["released"] > 0  # ran in its rank
    assert capfd.readouterr().err == ""  # no status line, no progress
    kept = (tmp_path / "protocols" / f"{doc['name']}.yaml").read_text()
    assert "name: test_rounding" in kept
    assert f"#   defense 'test_rounding': {uc.Rounding.__module__}:Rounding" in kept and "plugins:" in kept
    assert list(frame["protocol"]) == [f"{doc['name']}[lr=0.01]", f"{doc['name']}[lr=0.05]"]
    assert list(frame[lr]) == [0.01, 0.05]
    assert {"n_seeds", "test_accuracy", "test_accuracy_lo", "test_accuracy_hi", "bytes_per_step"} <= set(
        frame
    )
    assert (frame["n_seeds"] == 1).all()
    assert [r.seed for r in table.results()] == [3, 3]
    assert all(r.folder.name == "seed3" and r.train_steps == 2 for r in table.results())
    assert (table.files["csv"]).is_file() and len(pd.read_csv(table.files["csv"])) == 2
    # the folder is a cache: the same comparison again runs nothing and gives the same table
    again = api.compare(doc, grid={lr: [0.01, 0.05]}, seeds=[3], out=tmp_path, progress=False)
    pd.testing.assert_frame_equal(again.frame, frame)


def test_the_crypto_vs_perturbation_example_prints_its_table(tmp_path: Path):
    """examples/compare_crypto_vs_dp.py, small: one row per protocol (crypto only,
    crypto plus embedding DP), the table's columns, and DP spent only by the second."""
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "compare_crypto_vs_dp.py"),
            *("--small", "--backend", "mpc", "--seeds", "0", "--out", str(tmp_path)),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    lines = [re.split(r"\s{2,}", line.strip()) for line in proc.stdout.splitlines()[:3]]
    head, crypto, perturbed = lines
    assert head == [
        "protocol",
        "seeds",
        "test acc",
        "majority",
        "eps",
        "eps/release",
        "eps lower",
        "audit",
        "AP feature rec.",
        "AP model compl.",
        "s/step",
        "MB/step",
    ]
    assert [crypto[0], perturbed[0]] == ["mpc", "mpc_embedding_dp"]
    assert crypto[1] == perturbed[1] == "1"
    assert crypto[4] == "-" and float(perturbed[4]) >= 1.0  # epsilon: none spent without the defense
    # crypto alone claims nothing (eps inf, nothing audited); the defense's claim per release is
    # VFL-AFE's eps 3, and the audit's lower bound does not refute it
    assert crypto[5:8] == ["inf", "-", "no DP"]
    assert float(perturbed[5]) == pytest.approx(3.0, rel=0.01)
    assert 0.0 < float(perturbed[6]) <= float(perturbed[5]) and perturbed[7] == "consistent"
    for row in (crypto, perturbed):
        assert 0.0 <= float(row[2]) <= 1.0 and 0.0 < float(row[3]) < 1.0
        assert all(float(v) >= 0.0 for v in row[8:])
    assert proc.stdout.splitlines()[3] == f"report: {tmp_path / 'report.md'}"
    assert (tmp_path / "protocols" / "mpc_embedding_dp.yaml").is_file()
