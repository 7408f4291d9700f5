"""Predictions spend privacy (docs/privacy.md, "Predictions spend privacy"), real
processes: every ``securevfl predict`` of an embedding-DP model is one more
Gaussian release of each predicted record; the running total in
``prediction.json`` and the party's ledger is the composition of every
prediction's releases, and a prediction that would take it above the party's
``prediction_budget`` is refused (exit 2, naming the party) before any rank
starts, with nothing written.

The expected figures are computed here without the accountant's composition
loop: k Gaussian releases at multiplier z compose to one Gaussian at
``z / sqrt(k)`` (Dong et al. 2019), whose epsilon is dp_accounting's exact
``get_epsilon_gaussian``."""

from __future__ import annotations

import json
import math
import shutil
import socket
from pathlib import Path
from typing import Any

import pytest

from securevfl.app.prediction_ledger import LEDGER_FILE
from securevfl.cli import main
from securevfl.privacy.gaussian import gaussian_epsilon, noise_multiplier
from tests.support.protocols import small_digits, write_yaml
from tests.support.runs import cli, party_process

pytestmark = pytest.mark.timeout(900)

EPS = 8.0  # embedding_dp's per-release epsilon at DELTA (vanilla: clip and noise, s = 1)
DELTA = 1e-2


def _multiplier() -> float:
    return noise_multiplier(EPS, DELTA, "analytic")


def composed(k: int) -> float:
    """Epsilon of k Gaussian releases at the defense's multiplier (closed form)."""
    return gaussian_epsilon(_multiplier() / math.sqrt(k), DELTA)


BUDGET = (composed(3) + composed(4)) / 2  # three predictions fit, the fourth does not


def _protocol(budget: float | None) -> dict[str, Any]:
    doc = small_digits(epochs=1, max_steps=2)
    left = doc["parties"]["passive"][0]
    left["defenses"] = [
        {
            "name": "embedding_dp",
            "params": {"variant": "vanilla", "epsilon": EPS, "delta": DELTA, "calibration": "analytic"},
        }
    ]
    if budget is not None:
        left["prediction_budget"] = {"epsilon": budget}
    doc["privacy"]["delta"] = DELTA
    doc["name"] = "predict_budget"
    return doc


def _train(folder: Path, budget: float | None) -> Path:
    proto = write_yaml(folder / "proto.yaml", _protocol(budget))
    run = folder / "run"
    r = cli("run", str(proto), "--out", str(run), "--quiet")
    assert r.returncode == 0, r.stderr[-3000:]
    return run


def _predict(run: Path, out: Path) -> tuple[dict[str, Any], str]:
    r = cli("predict", str(run), "--out", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads((out / "prediction.json").read_text()), r.stdout


def _ledger(run: Path) -> Path:
    return run / "ranks" / "rank1" / "model" / LEDGER_FILE  # 'left' is rank 1


def _check_running_totals(run: Path, folder: Path, k: int) -> None:
    """k predictions: each one's figure is one release, the total after the j-th
    is the composition of j releases, in prediction.json, the command's output
    and the ledger (one 0600 entry per prediction)."""
    one = composed(1)
    for j in range(1, k + 1):
        record, stdout = _predict(run, folder / f"pred{j}")
        assert set(record["privacy"]) == {"left"}  # 'right' has no defense, the active party none
        left = record["privacy"]["left"]
        assert left["releases"] == [{"kind": "gaussian", "noise_multiplier": _multiplier(), "count": 1}]
        assert left["epsilon"] == pytest.approx(one, rel=1e-9)
        assert left["total"]["predictions"] == j
        assert left["total"]["epsilon"] == pytest.approx(composed(j), rel=1e-9)
        assert f"privacy: party 'left': this prediction epsilon={one:.4g}" in stdout
        assert (
            f"{j} prediction{'' if j == 1 else 's'} of this model composed: epsilon={composed(j):.4g}"
            in stdout
        )
    ledger = json.loads(_ledger(run).read_text())
    assert ledger["party"] == "left" and len(ledger["predictions"]) == k
    assert _ledger(run).stat().st_mode & 0o777 == 0o600
    assert all(e["rows"] == record["rows"]["aligned"] for e in ledger["predictions"])
    assert not (run / "ranks" / "rank2" / "model" / LEDGER_FILE).exists()  # 'right' spends nothing


@pytest.fixture(scope="module")
def budgeted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _train(tmp_path_factory.mktemp("budgeted"), BUDGET)


def test_three_predictions_compose_and_the_fourth_is_refused(
    budgeted: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    """Three predictions fit the budget; the fourth is refused before any rank
    starts (so in-process here): exit 2 naming the party, its budget, the total
    so far and what this prediction would add; no output folder, ledger unchanged.
    A party started on its own (``securevfl party --predict``) checks its own
    budget, from its own protocol file, before it joins any peer."""
    run = tmp_path / "run"
    shutil.copytree(budgeted, run)
    _check_running_totals(run, tmp_path, 3)

    before = _ledger(run).read_bytes()
    out = tmp_path / "pred4"
    capsys.readouterr()
    code = main(["predict", str(run), "--out", str(out)])
    err = " ".join(capsys.readouterr().err.split())
    assert code == 2, err[-3000:]
    assert "party 'left'" in err and "parties.passive[0].prediction_budget.epsilon" in err
    assert f"prediction budget epsilon={BUDGET:g}" in err
    assert f"3 earlier predictions composed: {composed(3):.4g}" in err
    assert f"would spend epsilon={composed(1):.4g}" in err
    assert "Traceback" not in err
    assert not out.exists()  # no predictions.csv, no prediction.json
    assert _ledger(run).read_bytes() == before

    # the party's own file sets its budget (outside the protocol digest: the saved model still loads)
    own = _protocol((composed(3) + BUDGET) / 2)
    proto = write_yaml(tmp_path / "own.yaml", own)
    host = tmp_path / "host1"
    args = ["party", str(proto), "--rank", "1", "--rendezvous", "tcp://127.0.0.1:1", "--quiet"]
    code = main([*args, "--predict", str(run), "--out", str(host)])
    err = " ".join(capsys.readouterr().err.split())
    assert code == 2, err[-3000:]
    assert "party 'left'" in err and f"prediction budget epsilon={(composed(3) + BUDGET) / 2:g}" in err
    assert not (host / "predictions.csv").exists()
    assert _ledger(run).read_bytes() == before


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_ten_predictions_compose(tmp_path: Path):
    """The acceptance's ten predictions of one model (no budget), then an
    eleventh with every organization's rank started on its own: the passive
    party's rank prints its own figure and total, from the same ledger."""
    run = _train(tmp_path, None)
    _check_running_totals(run, tmp_path, 10)

    proto, port = tmp_path / "proto.yaml", _port()
    procs = [party_process(proto, r, port, tmp_path / f"host{r}", "--predict", str(run)) for r in range(3)]
    try:
        outs = [p.communicate(timeout=600) for p in procs]
    finally:
        for p in procs:  # none left behind, whichever failed
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in procs] == [0, 0, 0], [e[-1500:] for _, e in outs]
    said = f"privacy: party 'left': this prediction epsilon={composed(1):.4g} (delta={DELTA:g}); "
    said += (
        f"11 predictions of this model composed: epsilon={composed(11):.4g} (training releases not included)"
    )
    assert outs[1][0].splitlines()[0] == said
    assert "privacy:" not in outs[2][0]  # 'right' spends nothing
    record = json.loads((tmp_path / "host0" / "prediction.json").read_text())
    assert record["privacy"]["left"]["total"]["epsilon"] == pytest.approx(composed(11), rel=1e-9)
