"""Federated prediction end to end (docs/design.md §12), real processes: ``securevfl
predict`` on rows of the training parties' files gives the training run's
evaluation exactly on ``plain``; ``securevfl party --predict`` (one process per
organization) gives the same file; bad models, files and folders exit 2 naming
the party and the field, before anything is overwritten.

One tiny CSV run (three parties: the active one with labels and a feature of its
own; 'shop' with a categorical column and missing values, declared preprocessing;
'web' z-scored by default) is shared by every test here."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch
from sklearn.metrics import roc_auc_score

from securevfl.cli import main
from tests.support.protocols import write_yaml
from tests.support.runs import cli, party_process

pytestmark = pytest.mark.timeout(600)

N = 160


def _exports(folder: Path) -> dict[str, Path]:
    """Three organizations' files: string IDs, partial overlap, shuffled; the
    label depends on every party's columns."""
    rng = np.random.default_rng(7)
    ids = np.array([f"cust-{i:04d}" for i in range(N)])
    a, b, c, d, t = (rng.normal(size=N) for _ in range(5))
    region = rng.choice(["north", "south", "east"], size=N)
    label = ((a + c - d + 0.5 * t + (region == "east")) > 0).astype(int)
    b_missing = b.copy()
    b_missing[rng.random(N) < 0.05] = np.nan
    tables = {
        "bank": (slice(0, N - 10), pd.DataFrame({"id": ids, "tenure": t, "churn": label})),
        "shop": (slice(5, N), pd.DataFrame({"id": ids, "a": a, "b": b_missing, "region": region})),
        "web": (slice(0, N - 5), pd.DataFrame({"id": ids, "c": c, "d": d})),
    }
    paths = {}
    for party, (rows, frame) in tables.items():
        part = frame.iloc[rows].sample(frac=1.0, random_state=1)
        paths[party] = folder / f"{party}.csv"
        part.to_csv(paths[party], index=False)
    return paths


def _protocol(files: dict[str, Path], **training: Any) -> dict[str, Any]:
    model = {"kind": "mlp", "hidden": [8], "out": 4}
    return {
        "name": "churn",
        "dataset": {"name": "csv", "test_fraction": 0.25},
        "parties": {
            "active": {
                "name": "bank",
                "source": {
                    "path": str(files["bank"]),
                    "label_column": "churn",
                    "feature_columns": ["tenure"],
                },
                "model": model,
            },
            "passive": [
                {
                    "name": "shop",
                    "source": {"path": str(files["shop"])},
                    "model": model,
                    "preprocess": {
                        "categorical": {"columns": ["region"], "other": False},
                        "impute": {"strategy": "median", "indicator": True},
                    },
                },
                {"name": "web", "source": {"path": str(files["web"])}, "model": model},
            ],
        },
        "exchange": {"backend": "plain"},
        "interactive": {"out": 4},
        "training": {"epochs": 3, "batch_size": 16, "lr": 0.01, "seed": 0, **training},
        "runtime": {"dump_views": True},
    }


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder = tmp_path_factory.mktemp("predict")
    files = _exports(folder)
    proto = write_yaml(folder / "churn.yaml", _protocol(files))
    run = folder / "run"
    r = cli("run", str(proto), "--out", str(run), "--quiet")
    assert r.returncode == 0, r.stderr[-3000:]
    view = torch.load(run / "ranks" / "rank0.view.pt", weights_only=False)["own"]
    test_ids = [view["ids"][i] for i in view["test_idx"]]
    return {"folder": folder, "files": files, "proto": proto, "run": run, "view": view, "test_ids": test_ids}


def _only(src: Path, ids: list[str], dest: Path, **change: Any) -> Path:
    """A party's file restricted to ``ids``, with columns changed or dropped."""
    frame = pd.read_csv(src, dtype={"id": str})
    frame = frame[frame["id"].isin(ids)]
    for col, value in change.items():
        if value is None:
            frame = frame.drop(columns=[col])
        else:
            frame[col] = value
    frame.to_csv(dest, index=False)
    return dest


def _flat(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture(scope="module")
def predicted(trained: dict[str, Any]) -> dict[str, Any]:
    """``securevfl predict`` with the passive parties' files cut to the run's test
    rows (the active party's file still holds every ID: PSI aligns)."""
    files, folder = trained["files"], trained["folder"]
    data = {p: _only(files[p], trained["test_ids"], folder / f"new-{p}.csv") for p in ("shop", "web")}
    out = folder / "pred"
    r = cli("predict", str(trained["run"]), "--out", str(out), *(f"--data={p}={f}" for p, f in data.items()))
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"predictions: {out / 'predictions.csv'}" in r.stdout
    return {"out": out, "data": data}


def test_predict_on_the_test_rows_is_the_training_evaluation(trained, predicted):
    """The same batches as the run's last evaluation, so on ``plain`` every z A is
    revealed and every metric computed from predictions.csv equal the run's bit
    for bit; A's labels are not used."""
    files, run, view, out = trained["files"], trained["run"], trained["view"], predicted["out"]
    pred = pd.read_csv(out / "predictions.csv", dtype={"id": str})
    assert list(pred.columns) == ["id", "score", "class"]
    assert pred["id"].tolist() == sorted(trained["test_ids"])  # aligned order: sorted IDs

    # the z of the run's last evaluation, batch by batch, equal the prediction's
    result = json.loads((run / "result.json").read_text())
    last = result["epochs"] - 1
    trained_z = [
        z
        for f, z in zip(view["forwards"], view["z"], strict=True)
        if f["phase"] == "eval" and f["round"] == last
    ]
    pview = torch.load(out / "ranks" / "rank0.predict_view.pt", weights_only=False)
    assert len(pview["own"]["z"]) == len(trained_z) > 1
    for a, b in zip(trained_z, pview["own"]["z"], strict=True):
        assert torch.equal(a, b)

    # metrics from the file equal the run's (y: the labels of the test rows, in order)
    labels = pd.read_csv(files["bank"], dtype={"id": str}).set_index("id")["churn"]
    y = labels.loc[pred["id"]].to_numpy()
    assert roc_auc_score(y, pred["score"].to_numpy()) == result["test_auc"]
    assert float((pred["class"].to_numpy() == y).mean()) == result["test_accuracy"]

    record = json.loads((out / "prediction.json").read_text())
    assert record["rows"]["aligned"] == len(trained["test_ids"]) and record["backend"] == "plain"
    assert "embedding" in pview["received"]  # plain: A sees h'_i, as at evaluation
    summary = json.loads((out / "ranks" / "rank1.predict_summary.json").read_text())
    assert summary["n_aligned"] == len(trained["test_ids"]) and not summary["has_labels"]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_party_predict_gives_the_local_file(trained, predicted, tmp_path: Path):
    """Each organization starts its own rank with its own output folder of the run
    (here: copies holding only that rank's model) and its own file of new records."""
    run, proto = trained["run"], trained["proto"]
    port = _port()
    procs: list[subprocess.Popen[str]] = []
    for r, party in enumerate(("bank", "shop", "web")):
        own = tmp_path / f"host{r}-run"
        (own / "ranks").mkdir(parents=True)
        shutil.copytree(run / "ranks" / f"rank{r}", own / "ranks" / f"rank{r}")
        data = [f"--data={party}={predicted['data'][party]}"] if party in predicted["data"] else []
        procs.append(party_process(proto, r, port, tmp_path / f"host{r}", "--predict", str(own), *data))
    outs, errs = [], []
    for p in procs:
        try:
            out, err = p.communicate(timeout=300)
            outs.append(out)
            errs.append(err)
        finally:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in procs] == [0, 0, 0], [e[-1500:] for e in errs]
    assert outs[0] == f"predictions: {tmp_path / 'host0' / 'predictions.csv'}\n"
    for r, party in ((1, "shop"), (2, "web")):  # one line from each passive rank
        assert (
            outs[r]
            == f"done: rank {r} (passive '{party}') took part; the active party holds the predictions\n"
        )
    a = pd.read_csv(tmp_path / "host0" / "predictions.csv", dtype={"id": str})
    b = pd.read_csv(predicted["out"] / "predictions.csv", dtype={"id": str})
    pd.testing.assert_frame_equal(a, b)
    assert not (tmp_path / "host1" / "predictions.csv").exists()  # passive hosts get no predictions


def test_bad_prediction_files_exit_2_naming_party_and_field(trained: dict[str, Any], tmp_path: Path):
    """Each party checks its whole file before any message: 'web' lacks a training
    column, 'shop' holds a category its training rows lack (no "other" bucket)."""
    files, ids = trained["files"], trained["test_ids"]
    web = _only(files["web"], ids, tmp_path / "web.csv", d=None)
    shop = _only(files["shop"], ids, tmp_path / "shop.csv", region="central")
    out = tmp_path / "pred"
    r = cli("predict", str(trained["run"]), "--out", str(out), f"--data=web={web}", f"--data=shop={shop}")
    assert r.returncode == 2, r.stderr[-3000:]
    want = {
        1: "party 'shop': column 'region' holds a category its training rows do not have",
        2: "party 'web': its prediction file lacks the training column(s) ['d']",
    }
    assert want[1] in _flat(r.stderr)  # the first rank's error is the run's
    for rank, message in want.items():
        assert message in json.loads((out / "ranks" / f"rank{rank}.error.json").read_text())["message"]
    assert not (out / "predictions.csv").exists()


def _predict_in_process(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """``securevfl predict ARGS`` through :func:`securevfl.cli.main` in this process
    (the console script's code path minus the interpreter start-up), for refusals
    that come before any rank starts: the exit code and stderr."""
    capsys.readouterr()
    code = main(["predict", *args])
    return code, capsys.readouterr().err


def test_corrupted_missing_or_mismatched_models_exit_2(
    trained: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    """Every rank's model is verified before any rank starts (so in-process here);
    a rank started on its own checks its own."""
    run = tmp_path / "run"
    shutil.copytree(trained["run"], run)
    models = run / "ranks" / "rank2" / "model" / "models.pt"
    blob = bytearray(models.read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    models.write_bytes(bytes(blob))
    code, err = _predict_in_process(capsys, str(run), "--out", str(tmp_path / "a"))
    assert code == 2 and "rank 2" in err and "models.pt" in err, err[-2000:]
    assert not (tmp_path / "a").exists()

    shutil.rmtree(run / "ranks" / "rank2" / "model")
    code, err = _predict_in_process(capsys, str(run), "--out", str(tmp_path / "b"))
    assert code == 2 and "rank 2" in err, err[-2000:]
    assert not (tmp_path / "b").exists()

    # a protocol that is not the one the model was trained under: refused at once,
    # before this rank joins any peer
    other = write_yaml(tmp_path / "other.yaml", _protocol(trained["files"], lr=0.02))
    p = party_process(other, 1, _port(), tmp_path / "host1", "--predict", str(trained["run"]), "--quiet")
    _, err = p.communicate(timeout=120)
    assert p.returncode == 2, err[-2000:]
    assert "rank 1" in err and "digest" in _flat(err), err[-2000:]


def test_the_models_of_a_run_that_did_not_finish_are_refused(
    trained: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    """Every rank saves its model before rank 0 writes result.json: a run that failed
    after that (a full disk as rank 0 wrote its result) leaves verified models, which
    predict refuses, saying the run did not finish, with nothing written."""
    run = tmp_path / "run"
    shutil.copytree(trained["run"], run)
    (run / "result.json").unlink()  # rank 0's write failed: no result
    code, err = _predict_in_process(capsys, str(run), "--out", str(tmp_path / "a"))
    assert code == 2 and "holds no result.json: that training run did not finish" in _flat(err), err[-2000:]
    assert "Traceback" not in err and not (tmp_path / "a").exists()
    (run / "result.json").write_text('{"protocol": "churn", "dig')  # cut short by the full disk
    code, err = _predict_in_process(capsys, str(run), "--out", str(tmp_path / "b"))
    assert code == 2 and "cannot be read (JSONDecodeError)" in _flat(err), err[-2000:]
    assert not (tmp_path / "b").exists()


def test_output_folder_is_never_overwritten_unasked(
    trained: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    out = tmp_path / "pred"
    out.mkdir()
    (out / "predictions.csv").write_text("id,score,class\nmine,0.5,1\n")
    code, err = _predict_in_process(capsys, str(trained["run"]), "--out", str(out))
    assert code == 2 and "--overwrite" in _flat(err)
    assert (out / "predictions.csv").read_text().startswith("id,score,class\nmine")
    code, err = _predict_in_process(capsys, str(trained["run"]), "--out", str(trained["run"]), "--overwrite")
    assert code == 2 and "is the training run's folder" in _flat(err)
    assert (trained["run"] / "result.json").is_file()


@pytest.mark.parametrize("overwrite", [False, True])
def test_a_folder_holding_a_training_run_is_never_a_prediction_folder(
    trained: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str], overwrite: bool
):
    """Another training run's folder (a copy of the shared run), or one rank's
    training folder of a run across hosts: refused naming what it holds, with or
    without --overwrite, and left as it was (every file, same bytes)."""
    other = tmp_path / "other-run"
    shutil.copytree(trained["run"], other)
    one_rank = tmp_path / "rank1-run"
    shutil.copytree(trained["run"] / "ranks" / "rank1", one_rank / "ranks" / "rank1")
    for out, named in ((other, "result.json, ranks/rank0/"), (one_rank, "ranks/rank1/")):
        before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
        args = ["--out", str(out)] + (["--overwrite"] if overwrite else [])
        code, err = _predict_in_process(capsys, str(trained["run"]), *args)
        assert code == 2, err[-2000:]
        assert f"{out} holds a training run ({named}" in _flat(err), err[-2000:]
        assert "Traceback" not in err
        assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
        # securevfl party --predict checks the same before its rank starts
        code, err = _predict_party_in_process(capsys, trained, out, overwrite)
        assert code == 2 and "holds a training run" in _flat(err), err[-2000:]
        assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def _predict_party_in_process(
    capsys: pytest.CaptureFixture[str], trained: dict[str, Any], out: Path, overwrite: bool
) -> tuple[int, str]:
    capsys.readouterr()
    args = ["party", str(trained["proto"]), "--rank", "1", "--rendezvous", "tcp://127.0.0.1:1"]
    args += ["--predict", str(trained["run"]), "--out", str(out), "--quiet"]
    code = main(args + (["--overwrite"] if overwrite else []))
    return code, capsys.readouterr().err


@pytest.mark.slow
def test_a_prediction_rank_refuses_peers_started_to_train(trained: dict[str, Any], tmp_path: Path):
    """Rank 0 started with --predict, ranks 1 and 2 started to train: the start-up
    handshake stops all three (exit 2), naming what each was started for."""
    proto, port = trained["proto"], _port()
    procs = [party_process(proto, 0, port, tmp_path / "host0", "--predict", str(trained["run"]), "--quiet")]
    procs += [party_process(proto, r, port, tmp_path / f"host{r}", "--quiet") for r in (1, 2)]
    errs = []
    for p in procs:
        try:
            errs.append(p.communicate(timeout=300)[1])
        finally:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in procs] == [2, 2, 2], [e[-1500:] for e in errs]
    assert "was started to train, this rank to predict" in _flat(errs[0])
    assert "was started to predict, this rank to train" in _flat(errs[1])
