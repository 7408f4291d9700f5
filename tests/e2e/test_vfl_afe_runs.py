"""``embedding_dp`` (VFL-AFE, docs/methods/vfl-afe.md) end to end with real processes: it runs under plain,
mpc and ckks (it is passive-only and adds its noise before the exchange), result.json carries the
accountant's record next to the paper's claim, the wire carries only noised embeddings and
gradients (§8.2 item 10), and the identity configuration is unprotected VFL (item 12)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from securevfl.privacy.gaussian import classic_sigma, gdp_composed_epsilon
from tests.support.protocols import SHORT_STEPS, load_yaml, short_sgd_digits, small_digits
from tests.support.runs import own_reports, run_doc

pytestmark = pytest.mark.timeout(900)  # two launches per test; slow only on a loaded machine

AFE = {"variant": "full", "epsilon": 0.5, "delta": 0.01, "classes": 10}
STEPS = 4


def _doc(backend: str, params: dict[str, Any] | None = None, **training: Any) -> dict[str, Any]:
    doc = small_digits(epochs=1, batch_size=32, max_steps=STEPS, **training)
    if backend != "plain":
        base = load_yaml(f"{backend}.yaml")["exchange"]
        doc["exchange"] = {
            "backend": backend,
            "params": {**base.get("params", {}), "weight_init": "seeded", "insecure": True},
        }
    for p in doc["parties"]["passive"]:
        p["defenses"] = [{"name": "embedding_dp", "params": params if params is not None else AFE}]
    doc["privacy"] = {"delta": 0.01}
    return doc


def _check_privacy(result: dict[str, Any], out: Path) -> None:
    priv = result["privacy"]
    assert priv["delta"] == 0.01 and priv["steps_run"] == STEPS
    for party in ("left", "right"):
        rec = priv["parties"][party]["mechanisms"]["embedding_dp"]
        assert rec["claim"]["epsilon"] == 0.5 and rec["claim"]["delta"] == 0.01
        assert "theta-channel and batch coupling not accounted; not dataset-level DP" in rec["notes"]
        (rel,) = rec["releases"]
        # 4 steps of 32 rows over ~1150 training rows: every record is released at most once in
        # training; a test row once at the one evaluation -> count 1
        assert rel["count"] == 1
        # uncapped paper-mode rescaling: no bound on s from the options, so no finite figure
        assert rel["kind"] == "unbounded" and math.isinf(rec["epsilon"])
        # the multiplier at the largest s observed is the party's own
        rep = own_reports(out)[party]["embedding_dp"]
        s_max = max(rep["s_train"]["max"], rep["s_eval"]["max"])  # train and evaluation batches
        z = classic_sigma(0.5, 0.01) / max(1.0, s_max)
        assert rep["noise_multiplier_at_s_max"] == pytest.approx(z)
        assert gdp_composed_epsilon(z, 1, 0.01) < math.inf


@pytest.fixture(scope="module")
def plain_afe(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    """One ``plain`` run with the defense on both passive parties and the views
    dumped (recording them changes nothing in training), shared by the privacy
    record and the wire checks."""
    out = tmp_path_factory.mktemp("afe_plain")
    doc = _doc("plain")
    doc["runtime"] = {"dump_views": True}
    return run_doc(doc, out), out


def _check_run(result: dict[str, Any], out: Path, backend: str) -> None:
    assert result["backend"] == backend and result["train_steps"] == STEPS
    assert result["defenses"] == {"left": ["embedding_dp"], "right": ["embedding_dp"]}
    _check_privacy(result, out)
    declared = result["defense_report"]["left"]["embedding_dp"]
    assert declared["sigma"] == pytest.approx(classic_sigma(0.5, 0.01))
    rep = own_reports(out)["left"]["embedding_dp"]
    assert rep["steps"] == STEPS and rep["s_eval"]["count"] > 0  # evaluation batches were rescaled too
    assert "cl_mean" in rep and "kl_mean" in rep


def test_runs_under_plain_and_reports_privacy(plain_afe: tuple[dict[str, Any], Path]):
    _check_run(*plain_afe, "plain")


# the crypto backends start slower (CrypTen / CKKS keys): marked slow, run with -m slow
@pytest.mark.slow
@pytest.mark.parametrize("backend", ["mpc", "ckks"])
def test_runs_under_crypto_backend_and_reports_privacy(tmp_path: Path, backend: str):
    _check_run(run_doc(_doc(backend), tmp_path), tmp_path, backend)


def test_wire_carries_only_noised_embeddings_and_gradients(plain_afe: tuple[dict[str, Any], Path]):
    result, out = plain_afe
    train = [f for f in result["ledger"]["flows"] if f["phase"] == "train"]
    to_active = {f["tag"] for f in train if f["receiver"] == 0}
    to_passive = {f["tag"] for f in train if f["receiver"] != 0}
    assert to_active == {"embedding"}, to_active
    assert len(to_passive) == 1 and "embedding" not in to_passive, to_passive
    view = torch.load(out / "ranks" / "rank0.view.pt", weights_only=False)
    got = view["received"]["embedding"]
    sent = torch.load(out / "ranks" / "rank1.view.pt", weights_only=False)["own"]["embeddings"]
    assert got and all(t.shape == (32, 16) and t.dtype == torch.float32 for _, t in got[:STEPS])
    # what arrives is what the passive party sent after its noise: the rows are far outside
    # the clip ball (noise std 2*sigma*t = 12.4 per coordinate, 16 coordinates -> norm ~50)
    norms = torch.cat([t.norm(dim=1) for _, t in sent])
    assert float(norms.median()) > 20.0
    assert any(torch.equal(t, s) for _, t in got for _, s in sent)


def test_identity_configuration_matches_unprotected(undefended_short_run, tmp_path: Path):
    """eps = inf, no clipping, adjustments off: z and the loss equal the undefended
    run's (the session's shared one, tests/conftest.py) at every step."""
    _, plain_out = undefended_short_run
    ident = short_sgd_digits(SHORT_STEPS)
    for p in ident["parties"]["passive"]:  # null: no noise
        p["defenses"] = [
            {"name": "embedding_dp", "params": {"variant": "vanilla", "epsilon": None, "clip": None}}
        ]
    result = run_doc(ident, tmp_path)
    assert result["defenses"] == {"left": ["embedding_dp"], "right": ["embedding_dp"]}
    assert result["privacy"] == {}
    ta = torch.load(plain_out / "ranks" / "rank0.trace.pt", weights_only=True)
    tb = torch.load(tmp_path / "ranks" / "rank0.trace.pt", weights_only=True)
    assert len(ta) == len(tb) == SHORT_STEPS
    for a, b in zip(ta, tb, strict=True):
        assert torch.equal(a["z"], b["z"])
        assert np.asarray(a["loss"]) == np.asarray(b["loss"])
