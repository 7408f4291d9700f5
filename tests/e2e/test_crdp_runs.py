"""``crdp`` end to end with the real launcher (one OS process per rank): the
defense runs under ``plain``, ``mpc`` and ``ckks`` on breast_cancer (3 passive
parties), each party keeps a subset of its columns, and ``result.json`` carries
the sound figure and the paper's own claim for every CRDP-FL release."""

from __future__ import annotations

import copy
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support.protocols import load_yaml
from tests.support.runs import own_reports, run_doc

# every run here takes ~2-3 min on the shared 2-core box (measured), hence slow
pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]


def _doc(backend: str, **params: Any) -> dict[str, Any]:
    """protocols/crdp_<backend>.yaml shrunk to 6 steps of batch 64."""
    doc = load_yaml(f"crdp_{backend}.yaml")
    doc["training"].update({"epochs": 1, "batch_size": 64, "max_steps": 6})
    for p in doc["parties"]["passive"]:
        p["defenses"][0]["params"].update(params)
        p["model"]["init"] = "seeded"  # runs compared with each other start alike
    return doc


def _check_privacy(result: dict[str, Any], out: Path, *, finite: bool) -> None:
    priv = result["privacy"]
    assert priv["steps_run"] == 6
    for party in ("p1", "p2", "p3"):
        mechs = priv["parties"][party]["mechanisms"]
        assert set(mechs) == {"crdp.pearson", "crdp.feature_optimization", "crdp.communication"}
        comm = mechs["crdp.communication"]
        # eps1 = eps2 = eps3 = 1, m = 10, t = 6 steps, N = 3 parties
        assert comm["claim"]["epsilon"] == 6.0
        assert comm["claim"]["paper_total_epsilon"] == max(1.0, 10 * 1.0 + 6 * 1.0)
        assert comm["claim"]["spec_sound_epsilon"] == 3 * 1.0 + 1.0 + 6 * 1.0
        assert math.isfinite(priv["parties"][party]["total"]["epsilon"]) == finite
        rep = own_reports(out)[party]["crdp"]  # the statistics: the party's own file
        # result.json: what the options give, declared to every party
        assert result["defense_report"][party]["crdp"]["record_sensitivity_s"] == rep["record_sensitivity_s"]
        assert "em_probabilities" not in result["defense_report"][party]["crdp"]
        assert 0 < rep["columns_kept"] <= 10
        assert rep["noised_releases"] == 6
        assert rep["laplace_scale"] > 0


@pytest.mark.parametrize("backend", ["plain", "mpc", "ckks"])
def test_crdp_runs_under_backend(backend: str, tmp_path: Path):
    result = run_doc(_doc(backend), tmp_path)
    assert result["backend"] == backend
    assert result["n_passive"] == 3
    _check_privacy(result, tmp_path, finite=False)  # faithful: unit sensitivity leaves h unbounded
    assert 0.0 <= result["test_auc"] <= 1.0


def test_crdp_fixed_variant_reports_finite_epsilon(tmp_path: Path):
    result = run_doc(_doc("plain", variant="fixed"), tmp_path)
    _check_privacy(result, tmp_path, finite=True)
    for party in ("p1", "p2", "p3"):
        mechs = result["privacy"]["parties"][party]["mechanisms"]
        assert mechs["crdp.pearson"]["epsilon"] == pytest.approx(1.0, abs=1e-3)
        assert mechs["crdp.feature_optimization"]["epsilon"] == pytest.approx(1.0, abs=1e-3)


def test_noise_off_and_selection_off_is_bit_for_bit_the_undefended_run(tmp_path: Path):
    """eps3 = inf with feature selection off: the defense is the identity, and the
    run equals the same protocol without it (separate RNG streams for the DP
    noise and the batch schedule)."""
    off = _doc("plain", eps3=math.inf, feature_selection=False)
    bare = _doc("plain")
    for p in bare["parties"]["passive"]:
        p.pop("defenses")
    a = run_doc(off, tmp_path / "off")
    b = run_doc(bare, tmp_path / "bare")
    assert a["history"] == b["history"] and a["history"][0]["train_loss"] > 0
    assert a["test_auc"] == b["test_auc"]


def _training_codes(doc: dict[str, Any], out: Path, party: str, keep: list[int]) -> np.ndarray:
    """Recompute a party's quantile codes of its kept columns on the training rows
    from its materialized file, the way every rank derives them: the sorted ID
    intersection, the shared split, training-row z-scoring."""
    from securevfl.app.loader import load_protocol_dict
    from securevfl.data.partition import dataset_standardize, party_source
    from securevfl.data.party_data import load_party_data, split_indices, standardize
    from securevfl.privacy.correlated import quantile_codes
    from securevfl.seeding import generator

    proto = load_protocol_dict(copy.deepcopy(doc))
    data_dir = out / "data"
    names = [proto.parties.active.name] + [p.name for p in proto.parties.passive]
    raws = {n: load_party_data(party_source(proto, n, data_dir), n, is_active=n == names[0]) for n in names}
    common = sorted(set.intersection(*(set(r.ids) for r in raws.values())))
    raw = raws[party]
    pos = {i: k for k, i in enumerate(raw.ids)}
    x = raw.x[[pos[i] for i in common]]
    tr, te = split_indices(len(common), proto.dataset.test_fraction, generator(proto.training.seed, "split"))
    x_tr = x[tr]
    if dataset_standardize(proto, data_dir):
        x_tr, _ = standardize(x_tr, x[te])
    return quantile_codes(np.asarray(x_tr, dtype=np.float64)[:, keep], 10)


def test_merged_secure_sensitivity_equals_the_central_value(tmp_path: Path):
    """``delta_scope: merged_secure`` under ``mpc``: every crdp party's noise is
    calibrated to the Delta_CS_p that CrypTen computed on the merged counts, and
    it equals Eq. 30 computed centrally on the concatenated kept columns of the
    same training rows (threshold: the opened mean MCD, guarded by w0)."""
    from securevfl.privacy.correlated import (
        distributed_cs,
        match_counts,
        merged_correlated_sensitivity,
        merged_threshold,
    )

    doc = _doc("mpc_merged")
    doc["privacy"] = {"noise_seed": 0}
    t0 = time.perf_counter()
    result = run_doc(doc, tmp_path)
    wall = time.perf_counter() - t0
    _check_privacy(result, tmp_path, finite=False)
    reps = {p: own_reports(tmp_path)[p]["crdp"] for p in ("p1", "p2", "p3")}
    codes = {p: _training_codes(doc, tmp_path, p, r["alpha_final"]) for p, r in reps.items()}
    merged = np.concatenate(list(codes.values()), axis=1)
    n_cols = merged.shape[1]
    thr = merged_threshold(0.4, [r["mcd"] for r in reps.values()])
    central = distributed_cs(match_counts(merged) / n_cols, thr)  # s = 1: faithful 'unit'
    ref = merged_correlated_sensitivity(
        [match_counts(c) for c in codes.values()],
        [c.shape[1] for c in codes.values()],
        [r["mcd"] for r in reps.values()],
        0.4,
    )
    assert ref.delta_unit == pytest.approx(central, abs=1e-12)
    for p, r in reps.items():
        m = r["merged"]
        assert r["delta_scope"] == "merged_secure"
        assert m["parties"] == 3 and m["columns"] == n_cols == sum(x["columns_kept"] for x in reps.values())
        assert m["threshold"] == pytest.approx(thr, abs=1e-4)  # opened in 16-bit fixed point
        # integer counts at precision 0: the opened max row sum is exact, divided by l
        assert r["delta_used"] == pytest.approx(central, rel=1e-12), p
        assert r["laplace_scale"] == pytest.approx(r["delta_used"] / 1.0)  # eps3 = 1
        assert r["delta_used"] != r["delta_cs_p"]  # not the own-columns value
        comm = result["privacy"]["parties"][p]["mechanisms"]["crdp.communication"]
        assert comm["claim"]["delta_scope"] == "merged_secure"
    # not a theorem (docs/methods/crdp-fl.md makes no such claim): the merged data has more columns, so its
    # records agree on a smaller share of them; measured 3.33 vs 7.67 / 8.83 / 17.5 here
    assert central < min(r["delta_cs_p"] for r in reps.values())
    print(f"merged_secure run: {wall:.1f} s wall, Delta_CS_p merged {central:.4f}")
