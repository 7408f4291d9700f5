"""`securevfl compare` end to end with real processes, on a tiny protocol (two
steps a run): seeds and a grid expand into runs whose report gives mean and
interval per metric and keeps every per-seed result; re-running the same command
runs nothing; deleting one run's folder re-runs only that one; a bad grid key is
refused with its path before anything runs."""

from __future__ import annotations

import json
import re

import pytest

from securevfl.cli import main
from tests.support.protocols import small_digits, write_yaml
from tests.support.runs import cli

EPS = "parties.active.defenses[0].params.epsilon"


def _tiny(tmp_path):
    doc = small_digits(epochs=1, batch_size=256, max_steps=2)
    doc["name"] = "tiny_ldp"
    doc["parties"]["active"]["defenses"] = [{"name": "label_dp", "params": {"epsilon": 1.0}}]
    # randomized response is exactly as private as it claims, so a lower bound at 95% confidence
    # exceeds the claim in up to 5% of honest runs (1.3% for 10 classes at eps 4, 4,000 simulated
    # audits of 10,000 canaries per neighbour); at 99.9% in 0.03% of them
    doc["privacy"]["audit"] = {"confidence": 0.999}
    return write_yaml(tmp_path / "tiny.yaml", doc)


def _markers(out):
    return {p.parent.relative_to(out): p.stat().st_mtime_ns for p in out.rglob("compare-run.json")}


def test_seeds_grid_cache_and_rerun_of_one_deleted_run(tmp_path) -> None:
    f, out = _tiny(tmp_path), tmp_path / "cmp"
    # two seeds of one grid point: the fewest runs that show an interval, a grid and the cache
    args = ("compare", str(f), "--seeds", "0", "1", "--grid", f"{EPS}=4", "--out", str(out), "--quiet")
    first = cli(*args)
    assert first.returncode == 0, first.stderr
    assert "2 runs, 0 already done" in first.stderr and "[2/2] tiny_ldp[epsilon=4] seed 1" in first.stderr
    # mean and interval per metric: "mean ± half", or "mean [lo, hi]" where the metric's range cuts it
    assert re.search(r"(?:± |\s\[)\d", first.stdout)
    doc = json.loads((out / "compare.json").read_text())
    assert [g["protocol"] for g in doc["protocols"]] == ["tiny_ldp[epsilon=4]"]
    assert len(doc["runs"]) == 2 and [r["seed"] for r in doc["runs"]] == [0, 1]
    acc = doc["protocols"][0]["metrics"]["test_accuracy"]
    assert len(acc["values"]) == 2 and acc["lo"] <= acc["mean"] <= acc["hi"]
    eps = doc["protocols"][0]["metrics"]["epsilon"]
    assert eps["values"] == [pytest.approx(4.0, abs=1e-3)] * 2  # the accountant's label eps, per seed
    # measured privacy and the baseline, from the runs themselves: label DP's claim per release,
    # the audit's lower bound below it and its verdict, and the test rows' majority rate
    group = doc["protocols"][0]
    assert group["metrics"]["eps_release"]["values"] == [pytest.approx(4.0, abs=1e-3)] * 2
    lower = group["metrics"]["eps_lower"]["values"]
    assert len(lower) == 2 and all(0 < v <= 4.0 for v in lower)
    assert group["audit"] == "consistent"
    majority = group["metrics"]["test_majority_rate"]["values"]
    assert len(majority) == 2 and all(0.1 <= m < 1 for m in majority)
    for name in ("majority", "eps/release", "eps lower", "audit"):
        assert name in first.stdout
    assert "Measured privacy" in (out / "report.md").read_text()
    assert (out / "grid_curves.png").stat().st_size > 5_000 and (out / "cost.png").is_file()
    before = _markers(out)
    assert len(before) == 2

    again = cli(*args)
    assert again.returncode == 0, again.stderr
    assert "2 runs, 2 already done" in again.stderr and "0 to run" in again.stderr
    assert _markers(out) == before
    assert json.loads((out / "compare.json").read_text())["runs"] == doc["runs"]

    gone = out / "tiny_ldp" / "epsilon=4" / "seed0"
    for p in sorted(gone.rglob("*"), reverse=True):
        p.unlink() if p.is_file() else p.rmdir()
    gone.rmdir()
    third = cli(*args)
    assert third.returncode == 0, third.stderr
    assert "1 already done" in third.stderr and "1 to run" in third.stderr
    after = _markers(out)
    changed = {k for k in after if after[k] != before.get(k)}
    assert changed == {gone.relative_to(out)}


def test_unknown_grid_key_is_refused_with_its_path_before_any_run(tmp_path, capsys) -> None:
    """In-process through :func:`securevfl.cli.main` (the console script's code path
    minus the interpreter start-up): the refusal comes before any run."""
    out = tmp_path / "cmp"
    code = main(["compare", str(_tiny(tmp_path)), "--grid", "training.epochz=1,2", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert "training.epochz" in err and "unknown key" in err
    assert not out.exists()


@pytest.mark.slow
def test_a_defense_sweep_keeps_the_undefended_protocol_as_its_reference_row(tmp_path) -> None:
    """``compare base.yaml ldp.yaml --grid EPS=...``: the grid expands the defended
    protocol only; the undefended one runs once, as the reference row, and the
    report measures each point of the sweep against it."""
    doc = small_digits(epochs=1, batch_size=256, max_steps=2)
    doc["name"] = "tiny_base"
    base, out = write_yaml(tmp_path / "base.yaml", doc), tmp_path / "cmp"
    p = cli("compare", str(base), str(_tiny(tmp_path)), "--grid", f"{EPS}=1,4", "--out", str(out), "--quiet")
    assert p.returncode == 0, p.stderr
    err = " ".join(p.stderr.split())
    assert "3 runs" in err and "tiny_base: the grid's" in err and "as the undefended reference row" in err
    doc_ = json.loads((out / "compare.json").read_text())
    labels = [g["protocol"] for g in doc_["protocols"]]
    assert labels == ["tiny_base", "tiny_ldp[epsilon=1]", "tiny_ldp[epsilon=4]"]
    assert [r["reference"] for r in doc_["runs"]] == [None, "tiny_base", "tiny_base"]
    assert all(r["time_ratio"] > 0 and r["bytes_ratio"] > 0 for r in doc_["runs"][1:])
    assert "vs ref" in p.stdout and "Reference row: `tiny_base`." in (out / "report.md").read_text()
