"""Measured privacy and baselines in the comparison, from hand-written result records: a
defended row with a consistent audit, one whose sound claim the audit refutes, a nominal
claim, a crypto-only row that claims nothing (eps inf), a label-inference attack's implied
bound, and a row at its majority rate flagged as no better than predicting it."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from securevfl.attacks.metrics import RecordTest, decision_test, threshold_test
from securevfl.privacy.audit_math import epsilon_lower_from_counts
from securevfl.report.aggregate import RunRecord, summarize
from securevfl.report.compare import markdown_summary, write_comparison
from securevfl.report.prose import findings
from securevfl.report.rows import rows


def _audit(mech, per_release, composed, lower, verdict, *, claim="sound", method="gdp"):
    return {
        "mechanism": mech,
        "basis": "declared sensitivity",
        "claim": claim,
        "epsilon_claimed": {"per_release": per_release, "composed": composed},
        "epsilon_lower": lower,
        "delta": 1e-5,
        "confidence": 0.95,
        "trials": 20000,
        "method": method,
        "verdict": verdict,
        "seconds": 0.12,
    }


def _res(name, backend, acc, *, majority=0.6, auc=None, defenses=None, audits=None, attacks=None):
    """A result record; ``audits`` maps party -> its audit records (a DP run)."""
    privacy = {}
    if audits is not None:
        privacy = {
            "delta": 1e-5,
            "parties": {
                p: {"total": {"epsilon": max(r["epsilon_claimed"]["composed"] for r in recs)}, "audit": recs}
                for p, recs in audits.items()
            },
        }
    return {
        "protocol": name,
        "backend": backend,
        "dataset": "breast_cancer",
        "test_accuracy": acc,
        "test_majority_rate": majority,
        "test_auc": auc,
        "time_per_step_s": 0.01,
        "bytes_per_step": 1000,
        "defenses": defenses or {},
        "privacy": privacy,
        "attacks": attacks or {},
    }


# a label-inference attack's counts: TPR 0.8, FPR 0.2 over 200 + 200 held-out rows
COUNTS = {"tp": 160, "fn": 40, "fp": 40, "tn": 160}
IMPLIED = epsilon_lower_from_counts(160, 40, 40, 160, delta=1e-5, confidence=0.95)


def _label_attack(ap):
    test = RecordTest(
        **COUNTS,
        positive=1,
        rule="threshold",
        threshold=0.3,
        orientation="high",
        chosen_on=400,
        delta=1e-5,
        confidence=0.95,
        epsilon_lower=IMPLIED,
    )
    return {"label_norm": {"ap": ap, "auc": ap, "record_test": test.to_json()}}


RESULTS = [
    _res("plain", "plain", 0.95, auc=0.99, attacks=_label_attack(0.97)),
    _res("mpc", "mpc", 0.95, auc=0.99, attacks=_label_attack(0.96)),
    _res(
        "mpc_afe",
        "mpc",
        0.93,
        auc=0.98,
        defenses={"left": ["embedding_dp"]},
        audits={
            "left": [
                _audit("embedding_dp.gaussian", 0.81, 12.3, 0.74, "consistent"),
                _audit("embedding_dp.gaussian", 0.81, 12.3, 0.52, "consistent", method="clopper-pearson"),
                _audit("embedding_dp.nominal", 0.1, 1.0, 0.74, "violated", claim="nominal"),
            ]
        },
        attacks=_label_attack(0.6),
    ),
    _res(
        "mpc_broken",
        "mpc",
        0.60,
        auc=0.55,
        defenses={"active": ["label_dp"], "left": ["embedding_dp"]},
        audits={
            "active": [_audit("label_dp.randomized_response", 0.5, 0.5, 0.3, "consistent")],
            "left": [_audit("embedding_dp.gaussian", 0.4, 6.0, 1.9, "violated")],
        },
        attacks=_label_attack(0.9),
    ),
]


def test_rows_carry_the_claim_the_audited_bound_and_the_verdict() -> None:
    by = {r["protocol"]: r for r in rows(RESULTS)[0]}
    # the strongest sound-claim bound (gdp 0.74, not clopper-pearson's 0.52), with its claim
    afe = by["mpc_afe"]
    assert (afe["eps_release"], afe["eps_lower"], afe["audit"]) == (0.81, 0.74, "consistent")
    assert afe["epsilon"] == 12.3
    # a violated sound claim is the row's verdict, naming party and mechanism, even beside a
    # consistent one of another party
    broken = by["mpc_broken"]
    assert (broken["eps_release"], broken["eps_lower"]) == (0.4, 1.9)
    assert broken["audit"] == "violated (left: embedding_dp.gaussian)"
    # no DP mechanism: nothing is claimed, the claim is infinite, nothing was audited
    for name in ("plain", "mpc"):
        assert math.isinf(by[name]["eps_release"]) and by[name]["eps_lower"] is None
        assert by[name]["audit"] == "no DP"
    # the attack's implied bound, from its own counts
    assert by["mpc"]["eps_attack:label_norm"] == pytest.approx(IMPLIED)
    assert 1.0 < IMPLIED < math.log(0.8 / 0.2)  # below the point estimate ln(TPR/FPR)


def test_the_table_shows_majority_claim_bound_verdict_and_the_attack_bound() -> None:
    md = markdown_summary(summarize([RunRecord(r["protocol"], r["protocol"], 0, r) for r in RESULTS]))
    head, *body = md.splitlines()
    cols = [c.strip() for c in head.strip("|").split("|")]
    for name in ("test acc", "majority", "test AUC", "eps", "eps/release", "eps lower", "audit"):
        assert name in cols
    assert cols.index("majority") == cols.index("test acc") + 1
    assert "eps≥ label_norm" in cols and cols.index("eps≥ label_norm") < cols.index("AP label_norm")
    line = {r.split("|")[1].strip(): [c.strip() for c in r.strip("|").split("|")] for r in body[1:]}
    afe = line["mpc_afe"]
    assert afe[cols.index("eps/release")] == "0.81" and afe[cols.index("eps lower")] == "0.74"
    assert afe[cols.index("audit")] == "consistent" and afe[cols.index("majority")] == "0.6000"
    assert line["mpc"][cols.index("eps/release")] == "inf" and line["mpc"][cols.index("audit")] == "no DP"
    assert line["mpc"][cols.index("eps lower")] == "-"


def test_a_violation_on_any_seed_is_the_rows_verdict() -> None:
    ok = _res(
        "afe",
        "mpc",
        0.9,
        defenses={"left": ["embedding_dp"]},
        audits={"left": [_audit("embedding_dp.gaussian", 0.8, 9.0, 0.7, "consistent")]},
    )
    bad = _res(
        "afe",
        "mpc",
        0.9,
        defenses={"left": ["embedding_dp"]},
        audits={"left": [_audit("embedding_dp.gaussian", 0.8, 9.0, 0.95, "violated")]},
    )
    s = summarize([RunRecord("afe", "afe", 0, ok), RunRecord("afe", "afe", 1, bad)])
    assert s.groups[0].text["audit"] == "violated (left: embedding_dp.gaussian)"
    assert s.groups[0].metrics["eps_lower"].values == (0.7, 0.95)


def test_prose_reads_the_audit_the_crypto_only_rows_and_the_baseline() -> None:
    text = "\n".join(findings(summarize([RunRecord(r["protocol"], r["protocol"], 0, r) for r in RESULTS])))
    assert (
        "- `mpc_afe`: `embedding_dp.gaussian` claims eps 0.81 per release (12.3 composed) at delta 1e-05; "
        "the audit measured eps ≥ 0.74 (left) (gdp, 20000 trials, 95% confidence, declared sensitivity): "
        "consistent; `embedding_dp.gaussian` claims eps 0.81 per release (12.3 composed) at delta 1e-05; "
        "the audit measured eps ≥ 0.52 (left) (clopper-pearson, 20000 trials"
    ) in text
    assert (
        "the paper's own (nominal) claim for `embedding_dp.nominal`, eps 0.1 per release; the audit measured "
        "eps ≥ 0.74 (left) (gdp, 20000 trials, 95% confidence, declared sensitivity): violated for left "
        "(the paper's figure does not hold; the accountant's is the one that holds)"
    ) in text
    assert (
        "the audit measured eps ≥ 1.9 (left) (gdp, 20000 trials, 95% confidence, declared sensitivity): "
        "violated for left (the bound lies above the claim at that confidence: the implementation or the "
        "accounting is wrong)"
    ) in text
    assert "A lower bound below its claim does not prove the claim" in text
    assert (
        "- `mpc`: no DP mechanism, so no epsilon is claimed (eps inf); the attacks measured label_norm 0.96 "
        f"(chance 0.50); `label_norm`'s counts imply eps ≥ {IMPLIED:.3f} on the labels it guessed."
    ) in text
    # the attack's bound above the smallest sound claim is named with it, as evidence, not a verdict
    assert "Above the smallest claim per release, `embedding_dp.gaussian`'s 0.81, for `label_norm`" in text
    assert "Above the smallest claim per release, `embedding_dp.gaussian`'s 0.4, for `label_norm`" in text
    assert text.count("the audit's verdict, not this figure, decides") == 2
    # within 0.01 of the majority rate: flagged; well above it: not
    assert (
        "- `mpc_broken`: test accuracy 0.600 against a majority rate of 0.600, test AUC 0.550: no better "
        "than predicting the majority class." in text
    )
    assert text.count("no better than predicting the majority class") == 1
    assert (
        "`mpc_afe`: test accuracy 0.930 against a majority rate of 0.600, test AUC 0.980 (+33.0 points)"
        in text
    )


def test_accuracy_below_the_majority_rate_is_flagged_and_old_records_are_read(tmp_path) -> None:
    below = _res("below", "plain", 0.55, majority=0.62)
    old = {k: v for k, v in _res("old", "plain", 0.9).items() if k != "test_majority_rate"}
    text = "\n".join(
        findings(summarize([RunRecord("below", "below", 0, below), RunRecord("old", "old", 0, old)]))
    )
    assert "`below`: test accuracy 0.550 against a majority rate of 0.620: no better than" in text
    assert "`old`: test accuracy" not in text  # nothing to read it against
    paths = write_comparison(tmp_path, [below, old])
    doc = json.loads(paths["json"].read_text())
    assert doc["runs"][0]["audit"] == "no DP" and doc["runs"][0]["test_majority_rate"] == 0.62
    assert "measured" not in paths["runs_csv"].read_text().splitlines()[0]
    assert "**majority**" in paths["markdown"].read_text()


def test_label_attack_counts_choose_the_threshold_on_held_out_rows() -> None:
    """Randomized response at eps 1 on 4000 binary labels, read by a score attack that sees the
    noisy label: the implied bound lies below the mechanism's eps (a bound, not an estimate)
    and above 0.5 (the test is informative); counts cover the held-out half only. Every draw is
    seeded, so the figures are the same in every run (no margin to measure)."""
    rng = np.random.default_rng(3)
    y = rng.integers(0, 2, 4000).astype(bool)
    noisy = y ^ (rng.random(4000) < 1 / (1 + math.e))
    test = threshold_test(noisy + rng.normal(0, 0.1, 4000), y, positive=1, seed=0, delta=1e-5)
    assert test is not None and test.rule == "threshold" and test.chosen_on == 2000
    assert test.tp + test.fn + test.fp + test.tn == 2000
    assert 0.5 < test.epsilon_lower < 1.0
    # an attack that knows nothing implies nothing
    blind = threshold_test(rng.random(4000), y, positive=1, seed=0, delta=1e-5)
    assert blind is not None and blind.epsilon_lower < 0.3
    # its own decision counts every row; a perfect guess of 400 rows implies ln(0.98 / 0.018) ~ 4
    perfect = decision_test(y[:400], y[:400], positive=1, delta=1e-5)
    assert perfect is not None and perfect.fn == perfect.fp == 0 and perfect.epsilon_lower > 3.5
    assert RecordTest.from_json(json.loads(json.dumps(perfect.to_json()))) == perfect
    # one class only: no rate to bound
    assert decision_test(np.ones(5, bool), np.ones(5, bool), positive=1, delta=1e-5) is None
