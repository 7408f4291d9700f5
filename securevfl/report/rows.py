"""One comparison row per run, from its result record alone: utility beside its
trivial baseline (the test rows' majority rate), privacy spent, claimed and measured
(:mod:`securevfl.report.audit`), what each attack achieved, the defense capability
score (DCS), cost, and a defended run's cost against its reference (the undefended
run it is measured against: utility lost, time and bytes per step as multiples);
and how each value is shown. Pure functions over result records."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from securevfl.attacks.metrics import dcs
from securevfl.report.audit import attack_bound, row_audit

BASE: list[tuple[str, str]] = [
    ("protocol", "protocol"),
    ("backend", "backend"),
    ("defenses", "defenses"),
    ("dataset", "dataset"),
    ("test_accuracy", "test acc"),
    ("test_majority_rate", "majority"),
    ("test_auc", "test AUC"),
    ("test_r2", "test R²"),
    ("test_rmse", "test RMSE"),
    ("epsilon", "eps"),
    ("eps_release", "eps/release"),
    ("eps_lower", "eps lower"),
    ("audit", "audit"),
    ("time_per_step_s", "s/step"),
    ("bytes_per_step", "bytes/step"),
]
TEXT = {"protocol", "backend", "defenses", "dataset", "audit"}
# shown only when some run has them (regression tasks; the majority rate of classification runs)
OPTIONAL = {"test_r2", "test_rmse", "test_majority_rate"}
#: a record-level attack's implied lower bound on epsilon, per attack (``eps_attack:<attack>``)
BOUND = "eps_attack:"
EPSILONS = {"epsilon", "eps_release", "eps_lower"}
METRICS_BASE = [k for k, _ in BASE if k not in TEXT]
#: a defended run against its reference (:func:`reference_for`), shown when some run has one
COST: list[tuple[str, str]] = [
    ("mp_drop", "MP drop vs ref"),
    ("time_ratio", "s/step vs ref"),
    ("bytes_ratio", "bytes vs ref"),
]
COST_KEYS = [k for k, _ in COST]
#: metrics that are shares of the test rows, or ROC AUCs: in [0, 1]
UNIT = {"test_accuracy", "test_majority_rate", "test_auc"}
#: metrics that are counts, durations or epsilons: at least 0
NONNEGATIVE = {"time_per_step_s", "bytes_per_step", "test_rmse", *EPSILONS}


def metric_range(key: str) -> tuple[float, float]:
    """The range a metric's values lie in, which its interval over seeds is
    clipped to: accuracies and AUCs in [0, 1]; an attack's score (AUC, accuracy,
    or 1 - normalized MSE, which may be negative) and R² at most 1; DCS in
    [0, 1]; times, bytes, RMSE and epsilons at least 0."""
    if key in UNIT or key == "dcs":
        return (0.0, 1.0)
    if key.startswith("attack:") or key == "test_r2":
        return (-math.inf, 1.0)
    if key in NONNEGATIVE or key in ("time_ratio", "bytes_ratio") or key.startswith(BOUND):
        return (0.0, math.inf)
    return (-math.inf, math.inf)


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def fmt(key: str, value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if key in EPSILONS or key.startswith(BOUND):
        return "inf" if math.isinf(value) else f"{value:.3g}"
    if key == "time_per_step_s":
        return f"{value * 1000:.2f} ms" if value < 1 else f"{value:.2f} s"
    if key == "bytes_per_step":
        return human_bytes(value)
    if key == "mp_drop":
        return f"{value * 100:.1f} pts"
    if key in ("time_ratio", "bytes_ratio"):
        return f"{value:.2f}x"
    if isinstance(value, float):
        return (
            f"{value:.4f}"
            if key in ("test_accuracy", "test_majority_rate", "test_auc", "test_r2")
            else f"{value:.3f}"
        )
    return str(value)


def epsilon_spent(result: dict[str, Any]) -> float | None:
    """The largest composed epsilon over parties (None: no DP mechanism ran)."""
    parties = (result.get("privacy") or {}).get("parties") or {}
    vals = [p["total"]["epsilon"] for p in parties.values()]
    return max(vals) if vals else None


NOT_PRIVATE = " (pinned noise_seed: not private)"


def defenses_label(result: dict[str, Any]) -> str:
    """The defenses a run used; a run whose defense noise came from a pinned
    ``privacy.noise_seed`` says it is not private (anyone who knows the seed
    regenerates the noise)."""
    names = sorted({d for ds in (result.get("defenses") or {}).values() for d in ds})
    label = "+".join(names) if names else "none"
    return label + NOT_PRIVATE if names and result.get("noise_seed_pinned") else label


def utility(result: dict[str, Any]) -> float | None:
    """Main performance (MP): test AUC for binary tasks, R² for regression, else
    test accuracy."""
    for key in ("test_auc", "test_r2"):
        if result.get(key) is not None:
            return result[key]
    return result.get("test_accuracy")


def attack_chance(name: str, rec: dict[str, Any]) -> float:
    """The attack score of a defense that leaves the attacker at chance (AP*)."""
    if "chance" in rec:
        return float(rec["chance"])
    if "auc" in rec or name.startswith("membership"):
        return 0.5
    return 0.0


def is_reference(result: dict[str, Any]) -> bool:
    return not result.get("defenses")


def reference_for(result: dict[str, Any], results: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The undefended run a defended one is scored against: same backend and
    dataset if present, else the undefended plain run on the dataset."""
    same = [r for r in results if is_reference(r) and r.get("dataset") == result.get("dataset")]
    for r in same:
        if r.get("backend") == result.get("backend"):
            return r
    for r in same:
        if r.get("backend") == "plain":
            return r
    return same[0] if same else None


def _ratio(value: Any, base: Any) -> float | None:
    ok = isinstance(value, int | float) and isinstance(base, int | float) and base > 0
    return value / base if ok else None


def defense_cost(result: dict[str, Any], ref: dict[str, Any] | None) -> dict[str, float | None]:
    """What a defended run costs against its reference ``ref`` (the undefended
    run of :func:`reference_for`): ``mp_drop``, the main performance lost (the
    reference's minus the run's: positive = lost), and its time and bytes per
    step as multiples of the reference's. None for an undefended run (it is a
    reference) or without one."""
    if ref is None or is_reference(result):
        return dict.fromkeys(COST_KEYS)
    mp, mp_ref = utility(result), utility(ref)
    return {
        "mp_drop": mp_ref - mp if mp is not None and mp_ref is not None else None,
        "time_ratio": _ratio(result.get("time_per_step_s"), ref.get("time_per_step_s")),
        "bytes_ratio": _ratio(result.get("bytes_per_step"), ref.get("bytes_per_step")),
    }


def rows(
    results: list[dict[str, Any]], attacks: Sequence[str] | None = None
) -> tuple[list[dict[str, Any]], list[str]]:
    """One flat row per run and the attack keys (columns): ``attacks`` when given,
    else those found in any run."""
    attacks = (
        sorted({k for r in results for k in (r.get("attacks") or {})}) if attacks is None else list(attacks)
    )
    out = []
    for r in results:
        row: dict[str, Any] = {k: r.get(k) for k, _ in BASE}
        row["defenses"] = defenses_label(r)
        row["epsilon"] = epsilon_spent(r)
        row.update(row_audit(r))
        ref = reference_for(r, results)
        scores = []
        for a in attacks:
            rec = (r.get("attacks") or {}).get(a) or {}
            ap = rec.get("ap")
            row[f"attack:{a}"] = ap
            row[f"{BOUND}{a}"] = attack_bound(rec)
            mp, mp_ref = utility(r), utility(ref) if ref else None
            if ap is not None and mp is not None and mp_ref is not None and not math.isnan(ap):
                scores.append(dcs(mp, ap, mp_ref, ap_ideal=attack_chance(a, rec)))
        row["dcs"] = sum(scores) / len(scores) if scores else None
        row.update(defense_cost(r, ref))
        row["reference"] = ref.get("protocol") if ref is not None and not is_reference(r) else None
        out.append(row)
    return out, attacks


def columns(attacks: Sequence[str], present: set[str] | None = None) -> list[tuple[str, str]]:
    """The table's columns; the regression metrics, the majority rate and each attack's
    implied bound only when ``present`` (the metric keys some run reports) holds them."""
    have = present or set()
    base = [(k, h) for k, h in BASE if k not in OPTIONAL or k in have]
    cut = [k for k, _ in base].index("audit") + 1
    bounds = [(f"{BOUND}{a}", f"eps≥ {a}") for a in attacks if f"{BOUND}{a}" in have]
    head = base[:cut] + bounds + [(f"attack:{a}", f"AP {a}") for a in attacks]
    cost = [(k, h) for k, h in COST if k in have]
    return head + ([("dcs", "DCS")] if attacks else []) + base[cut:] + cost
