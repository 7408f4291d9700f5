"""Promises kept under careless or hostile use, with real processes:

* a data error at one party reaches the other parties as party, column and count,
  never as an ID of that party's file (SECURITY.md, "What error messages may
  contain");
* re-running into a result folder never destroys the earlier result;
* identical protocol files kept in different folders on different hosts agree.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from test_psi import csv_protocol, make_ids

from securevfl.app.launcher import free_port
from tests.support.protocols import ROOT, small_digits, write_yaml
from tests.support.runs import CliRun, cli, party_process

pytestmark = pytest.mark.timeout(300)


def _party(proto: Path, rank: int, port: int, out: Path, cwd: Path = ROOT) -> subprocess.Popen[str]:
    return party_process(proto, rank, port, out, "--quiet", cwd=cwd)


def _ids_of(path: Path) -> set[str]:
    return set(pd.read_csv(path, dtype=str)["id"])


def test_a_data_error_reaches_other_parties_without_any_id(tmp_path):
    ids = make_ids(120, seed=3)
    doc = csv_protocol(tmp_path, {"bank": ids, "shop": ids, "telco": ids})
    # shop's file holds duplicate IDs and a missing value
    shop = pd.read_csv(tmp_path / "shop.csv", dtype={"id": str})
    shop = pd.concat([shop, shop.iloc[[5, 9]]], ignore_index=True)
    shop.loc[17, "f2"] = np.nan
    shop.to_csv(tmp_path / "shop.csv", index=False)
    doc["runtime"] = {"startup_timeout_s": 30.0, "peer_timeout_s": 10.0}
    proto = write_yaml(tmp_path / "p.yaml", doc)
    port = free_port()
    procs = [_party(proto, r, port, tmp_path / f"host{r}") for r in range(3)]
    outs = [p.communicate(timeout=120) for p in procs]
    codes = [p.returncode for p in procs]
    assert codes[1] == 2 and codes[0] != 0 and codes[2] != 0, (codes, [o[1] for o in outs])

    shop_ids = _ids_of(tmp_path / "shop.csv")
    for r in (0, 2):  # bank and telco: the failure names shop, not its IDs
        stderr = outs[r][1]
        error_file = (tmp_path / f"host{r}" / "ranks" / f"rank{r}.error.json").read_text()
        assert "party 'shop'" in stderr and "duplicate IDs in column 'id'" in stderr, stderr
        for text in (stderr, error_file, outs[r][0]):
            leaked = [i for i in shop_ids if i in text]
            assert not leaked, (r, leaked[:3])
    # the owner itself sees which IDs (in its own log and error file only)
    dup = [ids[5], ids[9]]
    own_err = outs[1][1]
    own_file = json.loads((tmp_path / "host1" / "ranks" / "rank1.error.json").read_text())
    assert all(i in own_err for i in dup), own_err
    assert all(i in own_file["detail"] for i in dup) and not any(i in own_file["message"] for i in dup)


def test_identical_protocols_in_different_folders_agree(tmp_path):
    ids = make_ids(150, seed=4)
    src = tmp_path / "src"
    src.mkdir()
    doc = csv_protocol(src, {"bank": ids, "shop": ids, "telco": ids})
    for p in [doc["parties"]["active"], *doc["parties"]["passive"]]:  # relative paths
        p["source"]["path"] = Path(p["source"]["path"]).name
    doc["training"] = {"epochs": 1, "batch_size": 64}
    hosts = []
    for r in range(3):  # each host keeps the same protocol file and its own CSV in its own folder
        h = tmp_path / f"host{r}"
        h.mkdir()
        (h / "p.yaml").write_text(yaml.safe_dump(doc))
        for f in ("bank.csv", "shop.csv", "telco.csv"):
            shutil.copy(src / f, h / f)
        hosts.append(h)
    port = free_port()
    procs = [_party(hosts[r] / "p.yaml", r, port, hosts[r] / "out", cwd=hosts[r]) for r in range(3)]
    outs = [p.communicate(timeout=180) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [o[1][-1500:] for o in outs]
    assert json.loads((hosts[0] / "out" / "result.json").read_text())["rows"]["aligned"] == 150


def _copy_of(run: Path, tmp_path: Path) -> Path:
    out = tmp_path / "run"
    shutil.copytree(run, out)
    return out


def test_rerun_into_a_result_folder_keeps_the_earlier_result(small_cli_run: CliRun, tmp_path):
    proto = small_cli_run.proto
    out = _copy_of(small_cli_run.out, tmp_path)
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert (out / "result.json") in before
    again = cli("run", str(proto), "--out", str(out), "--quiet")
    assert again.returncode == 2, again.stderr
    assert "--out" in again.stderr and "--overwrite" in again.stderr and "Traceback" not in again.stderr
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_overwrite_keeps_other_files_and_survives_a_subfolder_in_ranks(small_cli_run: CliRun, tmp_path):
    proto = small_cli_run.proto
    out = _copy_of(small_cli_run.out, tmp_path)
    (out / "ranks" / "mine").mkdir()
    (out / "ranks" / "notes.txt").write_text("keep me")
    old = json.loads((out / "result.json").read_text())
    proc = cli(
        "run", str(proto), "--out", str(out), "--quiet", "--overwrite", "--set", "training.max_steps=2"
    )
    assert proc.returncode == 0, proc.stderr
    new = json.loads((out / "result.json").read_text())
    assert (old["train_steps"], new["train_steps"]) == (3, 2)
    assert (out / "ranks" / "mine").is_dir() and (out / "ranks" / "notes.txt").read_text() == "keep me"
    assert not list(out.glob(".securevfl-staging-*"))


def test_a_failing_overwrite_leaves_the_earlier_result(small_cli_run: CliRun, tmp_path):
    """A copy of a finished run, overwritten by a run whose 'telco' file holds a
    duplicate ID: the new run fails at rank 2 and the earlier result stays."""
    out = _copy_of(small_cli_run.out, tmp_path)
    before = (out / "result.json").read_bytes()
    ids = make_ids(100, seed=5)
    doc = csv_protocol(tmp_path, {"bank": ids, "shop": ids, "telco": ids})
    doc["training"] = {"epochs": 1, "batch_size": 64}
    proto = write_yaml(tmp_path / "p.yaml", doc)
    (tmp_path / "telco.csv").write_text((tmp_path / "telco.csv").read_text() + f"{ids[0]},1,2,3\n")
    proc = cli("run", str(proto), "--out", str(out), "--quiet", "--overwrite")
    assert proc.returncode == 2, proc.stderr
    assert "duplicate IDs" in proc.stderr and "untouched" in " ".join(proc.stderr.split())
    assert (out / "result.json").read_bytes() == before
    assert (out / "failed-run" / "ranks" / "rank2.error.json").is_file()


def test_a_diverging_run_names_the_party_where_it_diverged(tmp_path):
    # finite but absurd learning rates: the first non-finite tensor is caught by its
    # sender (exit 2, Diverged), not reported as a peer's protocol violation
    doc = small_digits(epochs=1, max_steps=6, lr=1.0e30)
    doc["interactive"]["lr"] = 1.0e30
    proto = write_yaml(tmp_path / "p.yaml", doc)
    proc = cli("run", str(proto), "--out", str(tmp_path / "run"), "--quiet", timeout=120)
    text = " ".join(proc.stderr.split())
    assert proc.returncode == 2, proc.stderr
    assert "training diverged" in text and "lower training.lr" in text, text
    assert "containing NaN" not in text and "Traceback" not in text


def _listing(folder: Path) -> dict[str, tuple[int, int, int]]:
    """Every entry under ``folder``: (mode, size, mtime in ns) by relative path."""
    return {
        str(p.relative_to(folder)): (p.lstat().st_mode, p.lstat().st_size, p.lstat().st_mtime_ns)
        for p in sorted(folder.rglob("*"))
    }


def test_predict_leaves_a_read_only_training_run_as_it_was(small_cli_run: CliRun, tmp_path):
    """``predict`` only reads the training run's folder: a built-in dataset it has to
    build again (the run's ``data/`` is gone) goes to a temporary folder, not the
    run's, so a read-only run predicts and a writable one is left unchanged."""
    run = _copy_of(small_cli_run.out, tmp_path)
    shutil.rmtree(run / "data")
    before = _listing(run)
    for p in (run, *run.rglob("*")):  # read-only (root writes regardless: the listing tells)
        p.chmod(p.stat().st_mode & ~0o222)
    # a short temporary folder: the fork server's socket lives there, and a Unix socket's path
    # holds at most 107 bytes (pytest's own folders under xdist come close)
    scratch = Path(tempfile.mkdtemp(prefix="svfl-"))
    try:
        proc = cli("predict", str(run), "--out", str(tmp_path / "pred"), env={"TMPDIR": str(scratch)})
    finally:
        for p in (run, *run.rglob("*")):
            p.chmod(p.stat().st_mode | 0o200)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "pred" / "predictions.csv").is_file()
    after = _listing(run)
    assert after.keys() == before.keys(), sorted(set(after) ^ set(before))
    assert {k: v[1:] for k, v in after.items()} == {k: v[1:] for k, v in before.items()}
    assert not list(scratch.glob("securevfl-data-*"))  # the temporary dataset went with the prediction
    shutil.rmtree(scratch)
