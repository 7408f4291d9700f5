"""The report's prose comes from the numbers: attacks against their chance level,
crypto-only backends that leave an attack where plain has it, each defense's
utility cost, budgets above eps 8 flagged, and cost per step against plain."""

from __future__ import annotations

from securevfl.report.aggregate import RunRecord, summarize
from securevfl.report.prose import findings


def _res(name, backend, auc, ap, *, defenses=None, eps=None, t=0.01, b=1000):
    return {
        "protocol": name,
        "backend": backend,
        "dataset": "breast_cancer",
        "test_accuracy": auc,
        "test_auc": auc,
        "time_per_step_s": t,
        "bytes_per_step": b,
        "defenses": defenses or {},
        "privacy": {"delta": 1e-5, "parties": {"active": {"total": {"epsilon": eps}}}} if eps else {},
        "attacks": {"label_direction": {"ap": ap, "auc": ap}},
    }


def _text(recs) -> str:
    return "\n".join(findings(summarize(recs)))


def test_prose_follows_the_numbers() -> None:
    recs = []
    for seed, jitter in enumerate((0.0, 0.01)):
        recs += [
            RunRecord("plain", "plain", seed, _res("plain", "plain", 0.99, 0.99 - jitter)),
            RunRecord("mpc", "mpc", seed, _res("mpc", "mpc", 0.99, 0.98 - jitter, t=0.2, b=40_000)),
            RunRecord(
                "mpc_ldp",
                "mpc_ldp",
                seed,
                _res("mpc_ldp", "mpc", 0.95, 0.52 + jitter, defenses={"active": ["label_dp"]}, eps=0.5),
            ),
            RunRecord(
                "mpc_ldp_weak",
                "mpc_ldp_weak",
                seed,
                _res("mpc_ldp_weak", "mpc", 0.70, 0.9, defenses={"active": ["label_dp"]}, eps=20.0),
            ),
        ]
    text = _text(recs)
    assert "2 seeds each (8 runs)" in text
    assert "Above chance under `plain`, `mpc`, `mpc_ldp_weak`; at chance under `mpc_ldp`." in text
    assert "alone leaves it where plaintext training has it: `mpc` 0.97 against `plain` 0.98" in text
    assert (
        "`mpc_ldp` (label_dp) costs 4.0 points of test AUC against `mpc` (0.950 vs 0.990; "
        "the intervals do not overlap)" in text
    )
    assert "`mpc` (mpc, no defense) reaches 0.990 test AUC against `plain` 0.990; the intervals overlap" in (
        text
    )
    assert "`mpc_ldp_weak`: composed eps 20.000 at delta 1e-05 is above 8" in text
    assert "`mpc_ldp`: composed eps 0.500 at delta 1e-05, within 8. It costs 4.0 points" in text
    assert "`mpc` (mpc): 20.0x the time and 40.0x the bytes per step of `plain`" in text


def test_one_seed_says_so_and_ruinous_budgets_are_explained() -> None:
    recs = [
        RunRecord("plain", "plain", 0, _res("plain", "plain", 0.99, 0.99)),
        RunRecord("dp", "dp", 0, _res("dp", "plain", 0.60, 0.5, defenses={"p1": ["embedding_dp"]}, eps=6.0)),
    ]
    text = _text(recs)
    assert "one seed each" in text
    assert "A guarantee of this size costs 39.0 points of test AUC against `plain`" in text
    assert "At chance" not in text  # plain is above chance, dp at chance: a mixed line
    assert "Above chance under `plain`; at chance under `dp`." in text


def test_below_chance_is_not_called_above_and_defenses_cost_against_their_backend() -> None:
    recs = [
        RunRecord("mpc", "mpc", 0, _res("mpc", "mpc", 0.99, 0.9, t=0.2, b=40_000)),
        RunRecord("ldp", "ldp", 0, _res("ldp", "mpc", 0.97, 0.40, defenses={"active": ["label_dp"]}, t=0.1)),
    ]
    text = _text(recs)
    assert "Above chance under `mpc`; below chance under `ldp`." in text
    assert "Closest to chance: `ldp` (-0.10)." in text
    assert "`ldp` (label_dp on mpc): 0.5x the time and 0.0x the bytes per step of `mpc`." in text


def test_a_budget_calibrated_to_eps_8_is_within_8() -> None:
    """The accountant's figure for a release calibrated to eps 8 carries floating-point
    rounding (8.000000000000007); the report does not call that above 8."""
    recs = [
        RunRecord("mpc", "mpc", 0, _res("mpc", "mpc", 0.99, 0.9)),
        RunRecord(
            "dp8",
            "dp8",
            0,
            _res("dp8", "mpc", 0.9, 0.5, defenses={"p1": ["embedding_dp"]}, eps=8.000000000000007),
        ),
        RunRecord(
            "dp9", "dp9", 0, _res("dp9", "mpc", 0.9, 0.5, defenses={"p1": ["embedding_dp"]}, eps=8.001)
        ),
    ]
    text = _text(recs)
    assert "`dp8`: composed eps 8.000 at delta 1e-05, within 8." in text
    assert "`dp9`: composed eps 8.001 at delta 1e-05 is above 8" in text
