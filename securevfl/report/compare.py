"""Comparison of several runs: one row per protocol (utility, privacy spent,
what each attack still achieves, defense capability, time and bytes per step) as
a terminal table, JSON, CSV and a markdown report with plots. Reads only result
records (``result.json``) and the attack artefacts next to them. Plots are drawn on
matplotlib ``Figure`` objects directly, without pyplot, so no global backend is
chosen for the process that imports this module."""

from __future__ import annotations

import csv
import json
import math
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from rich.console import Console
from rich.table import Table

from securevfl.attacks.metrics import dcs

BASE: list[tuple[str, str]] = [
    ("protocol", "protocol"),
    ("backend", "backend"),
    ("defenses", "defenses"),
    ("dataset", "dataset"),
    ("test_accuracy", "test acc"),
    ("test_auc", "test AUC"),
    ("test_r2", "test R²"),
    ("test_rmse", "test RMSE"),
    ("epsilon", "eps"),
    ("time_per_step_s", "s/step"),
    ("bytes_per_step", "bytes/step"),
]
TEXT = {"protocol", "backend", "defenses", "dataset"}
# shown only when some run has them (regression tasks)
OPTIONAL = {"test_r2", "test_rmse"}


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def fmt(key: str, value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if key == "epsilon":
        return "inf" if math.isinf(value) else f"{value:.3g}"
    if key == "time_per_step_s":
        return f"{value * 1000:.2f} ms" if value < 1 else f"{value:.2f} s"
    if key == "bytes_per_step":
        return human_bytes(value)
    if isinstance(value, float):
        return f"{value:.4f}" if key in ("test_accuracy", "test_auc", "test_r2") else f"{value:.3f}"
    return str(value)


# -- per-run figures --------------------------------------------------------------------


def epsilon_spent(result: dict[str, Any]) -> float | None:
    """The largest composed epsilon over parties (None: no DP mechanism ran)."""
    parties = (result.get("privacy") or {}).get("parties") or {}
    vals = [p["total"]["epsilon"] for p in parties.values()]
    return max(vals) if vals else None


def defenses_label(result: dict[str, Any]) -> str:
    names = sorted({d for ds in (result.get("defenses") or {}).values() for d in ds})
    return "+".join(names) if names else "none"


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


def rows(results: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
    """One flat row per run and the attack keys (columns) found in any run."""
    attacks = sorted({k for r in results for k in (r.get("attacks") or {})})
    out = []
    for r in results:
        row: dict[str, Any] = {k: r.get(k) for k, _ in BASE}
        row["defenses"] = defenses_label(r)
        row["epsilon"] = epsilon_spent(r)
        ref = reference_for(r, results)
        scores = []
        for a in attacks:
            rec = (r.get("attacks") or {}).get(a) or {}
            ap = rec.get("ap")
            row[f"attack:{a}"] = ap
            mp, mp_ref = utility(r), utility(ref) if ref else None
            if ap is not None and mp is not None and mp_ref is not None and not math.isnan(ap):
                scores.append(dcs(mp, ap, mp_ref, ap_ideal=attack_chance(a, rec)))
        row["dcs"] = sum(scores) / len(scores) if scores else None
        out.append(row)
    return out, attacks


def columns(attacks: list[str], table: list[dict[str, Any]] | None = None) -> list[tuple[str, str]]:
    """The table's columns; given the ``table`` rows, the regression metrics only
    where some run reports them."""
    base = [(k, h) for k, h in BASE if k not in OPTIONAL or any(r.get(k) is not None for r in table or [])]
    cut = [k for k, _ in base].index("epsilon") + 1
    head = base[:cut] + [(f"attack:{a}", f"AP {a}") for a in attacks]
    return head + ([("dcs", "DCS")] if attacks else []) + base[cut:]


def print_table(results: list[dict[str, Any]], title: str = "securevfl") -> None:
    table, attacks = rows(results)
    cols = columns(attacks, table)
    t = Table(title=title)
    for key, head in cols:
        t.add_column(head, justify="left" if key in TEXT else "right")
    for r in table:
        t.add_row(*[fmt(k, r.get(k)) for k, _ in cols])
    Console(width=None if sys.stdout.isatty() else 200).print(t)


def markdown_table(results: list[dict[str, Any]]) -> str:
    table, attacks = rows(results)
    cols = columns(attacks, table)
    lines = ["| " + " | ".join(h for _, h in cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for r in table:
        lines.append("| " + " | ".join(fmt(k, r.get(k)) for k, _ in cols) + " |")
    return "\n".join(lines)


# -- plots ------------------------------------------------------------------------------


def plot_privacy_utility(results: list[dict[str, Any]], path: Path) -> Path | None:
    """One panel per attack: attack performance (x, lower = more private) against
    main performance (y), one labelled point per protocol."""
    table, attacks = rows(results)
    if not attacks:
        return None
    fig = Figure(figsize=(4.6 * len(attacks), 4.2))
    axes = fig.subplots(1, len(attacks), squeeze=False)
    for ax, a in zip(axes[0], attacks, strict=True):
        for r, row in zip(results, table, strict=True):
            ap, mp = row.get(f"attack:{a}"), utility(r)
            if ap is None or mp is None:
                continue
            marker = "o" if is_reference(r) else "^"
            ax.scatter(ap, mp, marker=marker, s=40)
            ax.annotate(r["protocol"], (ap, mp), fontsize=7, xytext=(3, 3), textcoords="offset points")
        rec = next(((r.get("attacks") or {}).get(a) for r in results if (r.get("attacks") or {}).get(a)), {})
        ax.axvline(attack_chance(a, rec or {}), color="grey", lw=0.8, ls="--")
        ax.set_title(a, fontsize=10)
        ax.set_xlabel("attack performance (AP; dashed = chance)")
        ax.set_ylabel("main performance (test AUC or accuracy)")
        ax.grid(alpha=0.3)
    fig.suptitle("privacy-utility: o = no defense, ^ = defended")
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    return path


def reconstruction_grids(run_dirs: dict[str, Path], results: list[dict[str, Any]]) -> list[tuple[str, Path]]:
    """(protocol, npz) of every feature-reconstruction grid saved by the runs."""
    out = []
    for r in results:
        for rec in (r.get("attacks") or {}).values():
            grid = rec.get("grid") if isinstance(rec, dict) else None
            d = run_dirs.get(r["protocol"])
            if grid and d is not None and (d / grid).exists():
                out.append((r["protocol"], d / grid))
    return out


def plot_digit_grid(grids: list[tuple[str, Path]], path: Path, n: int = 10) -> Path | None:
    """First row: the victim's true features (as images); then one row per
    protocol: what the active party reconstructed from what it received."""
    if not grids:
        return None
    data = [(name, np.load(p)) for name, p in grids]
    orig = data[0][1]["original"][:n]
    n = len(orig)
    vmin, vmax = float(orig.min()), float(orig.max())
    fig = Figure(figsize=(0.9 * n, 1.25 * (len(data) + 1)))
    axes = fig.subplots(len(data) + 1, n, squeeze=False)
    for j in range(n):
        axes[0][j].imshow(orig[j], cmap="gray_r", vmin=vmin, vmax=vmax)
    axes[0][0].set_ylabel("original", rotation=0, ha="right", va="center", fontsize=8)
    for i, (name, arr) in enumerate(data, 1):
        rec = arr["reconstruction"][:n]
        for j in range(n):
            axes[i][j].imshow(rec[j], cmap="gray_r", vmin=vmin, vmax=vmax)
        axes[i][0].set_ylabel(name, rotation=0, ha="right", va="center", fontsize=8)
    for row in axes:
        for ax in row:
            ax.set_xticks([])
            ax.set_yticks([])
    fig.suptitle("feature reconstruction by the active party: true vs reconstructed (test rows)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=130, bbox_inches="tight")
    return path


# -- files ------------------------------------------------------------------------------


def write_comparison(
    out_dir: Path, results: list[dict[str, Any]], run_dirs: dict[str, Path] | None = None
) -> dict[str, Path]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    run_dirs = run_dirs or {r["protocol"]: out_dir / r["protocol"] for r in results}
    table, attacks = rows(results)
    cols = columns(attacks, table)
    paths = {
        "json": out_dir / "compare.json",
        "csv": out_dir / "compare.csv",
        "markdown": out_dir / "report.md",
    }
    paths["json"].write_text(json.dumps(table, indent=2))
    with open(paths["csv"], "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=[k for k, _ in cols])
        w.writeheader()
        w.writerows([{k: r.get(k) for k, _ in cols} for r in table])
    scatter = plot_privacy_utility(results, out_dir / "privacy_utility.png")
    grid = plot_digit_grid(reconstruction_grids(run_dirs, results), out_dir / "reconstruction_grid.png")
    if scatter:
        paths["privacy_utility"] = scatter
    if grid:
        paths["reconstruction_grid"] = grid
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    body = [f"# securevfl comparison ({stamp})", "", markdown_table(results), ""]
    body += [
        "- **test acc / AUC**: the model's main performance (MP) on the held-out rows.",
        "- **eps**: the largest composed epsilon of any party at the run's delta (sound figure; "
        "see each run's `result.json` `privacy` for per-mechanism values and source claims); "
        "`-` = no DP mechanism.",
        "- **AP <attack>**: attack performance, higher = the adversary learns more "
        "(feature reconstruction: 1 - normalized MSE; label inference: ROC AUC or accuracy; "
        "membership: accuracy).",
        "- **DCS**: defense capability score (VFLAIR style), the mean over attacks of "
        "1 / (1 + sqrt(0.5 (AP - AP_chance)^2 + 0.5 (MP - MP_ref)^2)), MP_ref being the undefended run "
        "on the same backend; 1 = attacker at chance with no utility lost.",
        "- **s/step** at the active party; **bytes/step** summed over every rank's ledger.",
        "",
    ]
    if scatter:
        body += ["## Privacy-utility per attack", "", f"![privacy-utility]({scatter.name})", ""]
    if grid:
        body += [
            "## Feature reconstruction",
            "",
            "Top row: the victim party's true features of test rows; below, per protocol, what the "
            "active party reconstructed from what it received (embeddings under `plain`, z under "
            "crypto backends).",
            "",
            f"![reconstruction grid]({grid.name})",
            "",
        ]
    paths["markdown"].write_text("\n".join(body))
    return paths
