"""Means and 95% intervals over seeds, checked against hand-computed Student-t
intervals (t-table values: t_{0.975,1} = 12.706, t_{0.975,2} = 4.303,
t_{0.975,4} = 2.776), and the aggregation of comparison runs per protocol."""

from __future__ import annotations

import math

import pytest

from securevfl.report.aggregate import RunRecord, summarize
from securevfl.report.stats import mean_interval, t_quantile


def test_t_quantiles_match_the_table() -> None:
    assert t_quantile(2) == pytest.approx(12.706, abs=1e-3)
    assert t_quantile(3) == pytest.approx(4.303, abs=1e-3)
    assert t_quantile(5) == pytest.approx(2.776, abs=1e-3)


def test_three_seeds_hand_computed() -> None:
    # mean 0.84; s = sqrt((0.04^2 + 0 + 0.04^2) / 2) = 0.04; half = 4.303 * 0.04 / sqrt(3) = 0.09937
    iv = mean_interval([0.80, 0.84, 0.88])
    assert iv is not None
    assert iv.mean == pytest.approx(0.84)
    assert iv.half == pytest.approx(0.09937, abs=1e-4)
    assert (iv.lo, iv.hi) == pytest.approx((0.74063, 0.93937), abs=1e-4)
    assert iv.values == (0.80, 0.84, 0.88) and iv.n == 3


def test_two_and_five_seeds_hand_computed() -> None:
    # [1, 3]: s = sqrt(2); half = 12.706 * sqrt(2) / sqrt(2) = 12.706
    two = mean_interval([1.0, 3.0])
    assert two is not None and two.mean == 2.0 and two.half == pytest.approx(12.706, abs=1e-3)
    # [2, 4, 4, 4, 6]: mean 4, s = sqrt(8 / 4) = 1.4142; half = 2.776 * 1.4142 / sqrt(5) = 1.7559
    five = mean_interval([2, 4, 4, 4, 6])
    assert five is not None and five.mean == 4.0 and five.half == pytest.approx(1.7559, abs=1e-3)


def test_one_seed_missing_values_and_infinity() -> None:
    one = mean_interval([0.7])
    assert one is not None and one.half is None and one.lo is None
    assert mean_interval([None, math.nan]) is None
    kept = mean_interval([0.5, None, math.nan, 0.7])
    assert kept is not None and kept.values == (0.5, 0.7)
    inf = mean_interval([math.inf, math.inf])
    assert inf is not None and math.isinf(inf.mean) and inf.half is None


def _result(name, backend, acc, ap, *, defenses=None):
    return {
        "protocol": name,
        "backend": backend,
        "dataset": "digits",
        "test_accuracy": acc,
        "test_auc": None,
        "time_per_step_s": 0.01,
        "bytes_per_step": 1000,
        "defenses": defenses or {},
        "privacy": {},
        "attacks": {"recon": {"ap": ap}},
    }


def test_summary_per_protocol_over_seeds_and_dcs_against_the_same_seed() -> None:
    recs = []
    for seed, (acc_ref, acc_def) in enumerate([(0.90, 0.80), (0.94, 0.82), (0.92, 0.84)]):
        recs.append(RunRecord("mpc", "mpc", seed, _result("mpc", "mpc", acc_ref, 0.6)))
        recs.append(
            RunRecord(
                "mpc_dp[eps=1]",
                "mpc_dp",
                seed,
                _result("mpc_dp", "mpc", acc_def, 0.1, defenses={"left": ["embedding_dp"]}),
                point={"eps": 1},
            )
        )
    s = summarize(recs)
    assert [g.label for g in s.groups] == ["mpc", "mpc_dp[eps=1]"]
    ref, dp = s.groups
    assert ref.seeds == [0, 1, 2] and dp.point == {"eps": 1}
    acc = ref.metrics["test_accuracy"]
    assert acc is not None and acc.mean == pytest.approx(0.92)
    assert acc.half == pytest.approx(4.303 * 0.02 / math.sqrt(3), abs=1e-4)
    # bytes are the same every seed: a zero-width interval
    assert ref.metrics["bytes_per_step"].half == 0.0
    # DCS of seed 1 scores 0.82 against the reference of seed 1 (0.94), not seed 0
    d1 = 1 / (1 + math.sqrt(0.5 * 0.1**2 + 0.5 * 0.12**2))
    assert dp.runs[1]["dcs"] == pytest.approx(d1)
    assert len(s.runs) == 6 and s.runs[1]["seed"] == 0 and s.runs[1]["protocol"] == "mpc_dp[eps=1]"
    flat = dp.flat()
    assert flat["n_seeds"] == 3 and flat["attack:recon"] == pytest.approx(0.1)
    assert flat["attack:recon_lo"] == pytest.approx(0.1)
