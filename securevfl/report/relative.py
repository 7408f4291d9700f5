"""Defended runs against vanilla in the form of docs/methods/dravl.md's headline H11 (§6, §9.5
item 23): the relative change of the attacker's MSE, of dCor and of the task AUC,
in percent of the vanilla value, plus the absolute AUC change and the active-only
AUC (the floor an embedding that carries nothing reaches). Pure functions."""

from __future__ import annotations

import math
from collections.abc import Mapping


def relative_change(value: float, baseline: float) -> float:
    """``100 (value - baseline) / |baseline|`` in percent; nan when the baseline is 0."""
    if baseline == 0:
        return math.nan
    return 100.0 * (value - baseline) / abs(baseline)


def h11_rows(
    runs: Mapping[str, Mapping[str, float]], vanilla: str = "vanilla"
) -> list[dict[str, float | str]]:
    """One row per defended config of ``runs`` (label -> metrics with ``mse``,
    ``dcor`` and ``auc``; the vanilla entry is the baseline): ΔMSE %, ΔdCor %,
    ΔAUC % and the absolute ΔAUC. A metric missing from a config gives nan."""
    if vanilla not in runs:
        raise KeyError(f"no '{vanilla}' entry to compare with (have {sorted(runs)})")
    base = runs[vanilla]
    rows: list[dict[str, float | str]] = []
    for label, m in runs.items():
        if label == vanilla:
            continue

        def rel(key: str, m: Mapping[str, float] = m) -> float:
            return relative_change(m[key], base[key]) if key in m and key in base else math.nan

        d_auc = m["auc"] - base["auc"] if "auc" in m and "auc" in base else math.nan
        rows.append(
            {
                "config": label,
                "mse_pct": rel("mse"),
                "dcor_pct": rel("dcor"),
                "auc_pct": rel("auc"),
                "auc_abs": d_auc,
            }
        )
    return rows


def h11_table(
    runs: Mapping[str, Mapping[str, float]], *, active_only_auc: float, vanilla: str = "vanilla"
) -> str:
    """The H11 summary as a Markdown table, vanilla's absolute values and the
    active-only AUC in the caption line."""
    base = runs.get(vanilla, {})

    def pct(x: float) -> str:
        return "n/a" if math.isnan(x) else f"{x:+.2f} %"

    def num(x: float | None) -> str:
        return "n/a" if x is None or math.isnan(x) else f"{x:.3f}"

    lines = [
        f"vanilla: MSE {num(base.get('mse'))}, dCor {num(base.get('dcor'))}, AUC {num(base.get('auc'))}; "
        f"active-only AUC {num(active_only_auc)}",
        "",
        "| config | ΔMSE % | ΔdCor % | ΔAUC % | ΔAUC (abs) |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in h11_rows(runs, vanilla):
        abs_auc = r["auc_abs"]
        assert isinstance(abs_auc, float)
        lines.append(
            f"| {r['config']} | {pct(float(r['mse_pct']))} | {pct(float(r['dcor_pct']))} | "
            f"{pct(float(r['auc_pct']))} | {'n/a' if math.isnan(abs_auc) else f'{abs_auc:+.4f}'} |"
        )
    return "\n".join(lines)
