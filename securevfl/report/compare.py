"""Comparison of several runs: one row per protocol, as a table, JSON, CSV and a
markdown report. Reads only result records."""

from __future__ import annotations

import csv
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

COLUMNS: list[tuple[str, str]] = [
    ("protocol", "protocol"),
    ("backend", "backend"),
    ("dataset", "dataset"),
    ("n_parties", "parties"),
    ("test_accuracy", "test acc"),
    ("test_auc", "test AUC"),
    ("epochs", "epochs"),
    ("time_per_step_s", "s/step"),
    ("bytes_per_step", "bytes/step"),
]


def fmt(key: str, value: Any) -> str:
    if value is None:
        return "-"
    if key in ("test_accuracy", "test_auc"):
        return f"{value:.4f}"
    if key == "time_per_step_s":
        return f"{value * 1000:.2f} ms" if value < 1 else f"{value:.2f} s"
    if key == "bytes_per_step":
        return human_bytes(value)
    return str(value)


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def rows(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: r.get(k) for k, _ in COLUMNS} for r in results]


def print_table(results: list[dict[str, Any]], title: str = "securevfl") -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=title)
    for _, head in COLUMNS:
        t.add_column(head, justify="right" if head not in ("protocol", "backend", "dataset") else "left")
    for r in rows(results):
        t.add_row(*[fmt(k, r[k]) for k, _ in COLUMNS])
    import sys

    Console(width=None if sys.stdout.isatty() else 160).print(t)


def markdown_table(results: list[dict[str, Any]]) -> str:
    lines = [
        "| " + " | ".join(h for _, h in COLUMNS) + " |",
        "|" + "|".join("---" for _ in COLUMNS) + "|",
    ]
    for r in rows(results):
        lines.append("| " + " | ".join(fmt(k, r[k]) for k, _ in COLUMNS) + " |")
    return "\n".join(lines)


def write_comparison(out_dir: Path, results: list[dict[str, Any]]) -> dict[str, Path]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    table = rows(results)
    paths = {
        "json": out_dir / "compare.json",
        "csv": out_dir / "compare.csv",
        "markdown": out_dir / "report.md",
    }
    paths["json"].write_text(json.dumps(table, indent=2))
    with open(paths["csv"], "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=[k for k, _ in COLUMNS])
        w.writeheader()
        w.writerows(table)
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    body = [
        f"# securevfl comparison ({stamp})",
        "",
        markdown_table(results),
        "",
        "Time per step is measured at the active party; bytes per step are summed over the "
        "ledger of every rank (payload bytes of each message, counted once at its sender).",
        "",
    ]
    paths["markdown"].write_text("\n".join(body))
    return paths
