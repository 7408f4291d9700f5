"""Comparison of several runs: one row per compared protocol (utility beside its
majority-class baseline, privacy spent, claimed and audited, what each attack still
achieves, defense capability, time and bytes per step), each metric as its mean and
95% interval over seeds, as a terminal table, JSON, CSV and a markdown report with
plots and prose written from the numbers.

Reads only result records (``result.json``) and the attack artefacts next to
them. Per-run rows: :mod:`securevfl.report.rows`; over seeds:
:mod:`securevfl.report.aggregate`; figures: :mod:`securevfl.report.plots`; prose:
:mod:`securevfl.report.prose`."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from securevfl import jsonfile
from securevfl.csvfile import write_dicts
from securevfl.report import markdown
from securevfl.report.aggregate import RunRecord, Summary, summarize
from securevfl.report.plots import (
    plot_cost,
    plot_digit_grid,
    plot_grid_curves,
    plot_privacy_utility,
    reconstruction_grids,
)
from securevfl.report.prose import findings
from securevfl.report.rows import TEXT, columns, epsilon_spent, fmt, human_bytes, rows
from securevfl.report.stats import Interval

__all__ = [
    "epsilon_spent",
    "human_bytes",
    "markdown_table",
    "print_summary",
    "print_table",
    "records_of",
    "rows",
    "write_comparison",
]


#: the mark of a noisy figure (:attr:`~securevfl.report.stats.Interval.noisy`), explained under the table
NOISY = "~"
NOISY_NOTE = (
    f"**{NOISY}** marks a noisy figure: its 95% interval over seeds is wider than the figure itself "
    "(half-width above the mean), so the seeds disagree by more than the value and neither it nor its "
    "order against another row can be trusted; run more seeds (`--seeds`) or more steps before reading it."
)


def cell(key: str, iv: Interval | None) -> str:
    """A metric over seeds: ``mean ± half`` (just the mean for one seed, or when
    every seed gave the same value); ``mean [lo, hi]`` when the metric's range
    clips the interval (an accuracy's at 1); prefixed with :data:`NOISY` when the
    interval is wider than the mean."""
    if iv is None:
        return "-"
    if iv.half is None or iv.half == 0:
        return fmt(key, iv.mean)
    mark = NOISY if iv.noisy else ""
    if iv.clipped:
        return f"{mark}{fmt(key, iv.mean)} [{fmt(key, iv.lo)}, {fmt(key, iv.hi)}]"
    return f"{mark}{fmt(key, iv.mean)} ± {fmt(key, iv.half)}"


def references(summary: Summary) -> list[str]:
    """The rows the defended rows' cost is measured against, in table order."""
    return list(dict.fromkeys(r["reference"] for r in summary.runs if r.get("reference")))


def cost_note(refs: Sequence[str]) -> str:
    """report.md's note on the cost-of-defense columns, naming the reference rows."""
    named = ", ".join(f"`{md_cell(r)}`" for r in refs)
    return (
        "- **MP drop vs ref**, **s/step vs ref**, **bytes vs ref**: what a defense costs against its "
        "reference row, the undefended protocol on the same dataset and backend (else `plain`), seed by "
        "seed: the main performance lost in points (positive = lost), and the time and bytes per step as "
        f"multiples of the reference's. Reference row{'s' if len(refs) > 1 else ''}: {named}."
    )


def any_noisy(summary: Summary) -> bool:
    """Whether some figure of the table is noisy (its cell carries :data:`NOISY`)."""
    return any(iv is not None and iv.noisy for g in summary.groups for iv in g.metrics.values())


def _table_rows(summary: Summary) -> tuple[list[tuple[str, str]], list[list[str]]]:
    cols = columns(summary.attacks, set(summary.keys))
    several = any(len(g.seeds) > 1 for g in summary.groups)
    head = cols[:4] + ([("n_seeds", "seeds")] if several else []) + cols[4:]
    out = []
    for g in summary.groups:
        line = []
        for key, _ in head:
            if key == "protocol":
                line.append(g.label)
            elif key in TEXT:
                line.append(str(g.text.get(key)))
            elif key == "n_seeds":
                line.append(str(len(g.seeds)))
            else:
                line.append(cell(key, g.metrics.get(key)))
        out.append(line)
    return head, out


def print_summary(summary: Summary, title: str = "securevfl compare") -> None:
    head, body = _table_rows(summary)
    note = NOISY_NOTE.replace("**", "").replace("`", "")
    t = Table(title=escape(title), caption=escape(note) if any_noisy(summary) else None)
    for key, name in head:
        t.add_column(name, justify="left" if key in TEXT else "right")
    for line in body:
        # as text, not console markup: a grid label "plain [training.lr=0.1]" would
        # otherwise lose its bracket as an unknown style, and grid rows look alike
        t.add_row(*(escape(c) for c in line))
    Console(width=None if sys.stdout.isatty() else 240).print(t)


def records_of(results: Sequence[dict[str, Any]], out_dir: Path | None = None) -> list[RunRecord]:
    """Result records of single runs (one seed each) as comparison records; their
    folders are ``out_dir/<protocol>``."""
    return [
        RunRecord(
            label=r["protocol"],
            base=r["protocol"],
            seed=int(r.get("seed") or 0),
            result=r,
            folder=None if out_dir is None else str(Path(out_dir) / r["protocol"]),
        )
        for r in results
    ]


def print_table(results: list[dict[str, Any]], title: str = "securevfl") -> None:
    print_summary(summarize(records_of(results)), title=title)


def md_cell(value: str) -> str:
    """A table cell's text in markdown, shown literally (:func:`securevfl.report.markdown.cell`):
    a ``|`` (a grid value may hold one) escaped, a line break written as ``\\n``."""
    return markdown.cell(value)


def markdown_summary(summary: Summary) -> str:
    head, body = _table_rows(summary)
    lines = ["| " + " | ".join(md_cell(h) for _, h in head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(md_cell(c) for c in line) + " |" for line in body]
    return "\n".join(lines)


def markdown_table(results: list[dict[str, Any]]) -> str:
    return markdown_summary(summarize(records_of(results)))


def write_comparison(
    out_dir: Path,
    records: Sequence[RunRecord] | Sequence[dict[str, Any]],
    axes: dict[str, list[str]] | None = None,
    *,
    title: str = "securevfl comparison",
) -> dict[str, Path]:
    """compare.json (per compared protocol: every metric's mean, interval and
    per-seed values; and every run's row), compare.csv (one row per protocol: mean,
    lo, hi per metric), runs.csv (one row per run), report.md and its figures.
    ``records`` may be plain result records (one seed each, in ``out_dir/<protocol>``);
    ``axes`` names each protocol's grid keys, for the grid curves."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    recs = [r for r in records if isinstance(r, RunRecord)]
    if len(recs) != len(records):
        recs = records_of([r for r in records if isinstance(r, dict)], out_dir)
    summary = summarize(recs)
    paths = {
        "json": out_dir / "compare.json",
        "csv": out_dir / "compare.csv",
        "runs_csv": out_dir / "runs.csv",
        "markdown": out_dir / "report.md",
    }
    doc = {
        "title": title,
        "interval": "95% Student t over seeds (mean +- t_{0.975,n-1} s / sqrt(n))",
        "metrics": summary.metric_keys(),
        "chance": summary.chance,
        "protocols": [g.to_json() for g in summary.groups],
        "runs": summary.runs,
    }
    paths["json"].write_text(jsonfile.dumps(doc, indent=2, default=str))
    write_dicts(paths["csv"], [g.flat() for g in summary.groups])
    write_dicts(
        paths["runs_csv"],
        [{k: v for k, v in r.items() if k not in ("grids", "measured")} for r in summary.runs],
    )
    figures = {
        "privacy_utility": plot_privacy_utility(summary, out_dir / "privacy_utility.png"),
        "grid_curves": plot_grid_curves(summary, axes or {}, out_dir / "grid_curves.png"),
        "cost": plot_cost(summary, out_dir / "cost.png"),
        "reconstruction_grid": plot_digit_grid(
            reconstruction_grids(summary), out_dir / "reconstruction_grid.png"
        ),
    }
    paths.update({k: v for k, v in figures.items() if v is not None})
    refs = references(summary)
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    body = [f"# {markdown.text(title)} ({stamp})", "", markdown_summary(summary), ""]
    body += [
        "- **test acc / AUC**: the model's main performance (MP) on the held-out rows; **majority**: "
        "the share of the most common test label, the accuracy of always predicting it (a result "
        "within 0.01 of it is no better than that).",
        "- **eps**: the largest composed epsilon of any party at the run's delta (sound figure; "
        "see each run's `result.json` `privacy` for per-mechanism values and source claims); "
        "`-` = no DP mechanism.",
        "- **eps/release**, **eps lower**, **audit**: the claimed epsilon per release of the audited "
        "mechanism reported (the strongest sound-claim lower bound over parties, or a violated one), "
        "the privacy audit's lower bound at its stated confidence, and its verdict (docs/privacy.md, "
        '"The audit"); `no DP` = nothing is claimed (eps inf): the attacks are the measurement. '
        "**eps≥ <attack>**: the lower bound a record-level attack's own true/false-positive counts "
        "imply (evidence, not a verdict: the attacker's own features may predict labels).",
        "- **AP <attack>**: attack performance, higher = the adversary learns more "
        "(feature reconstruction: 1 - normalized MSE; label inference: ROC AUC or accuracy; "
        "membership: accuracy).",
        "- **DCS**: defense capability score (VFLAIR style), the mean over attacks of "
        "1 / (1 + sqrt(0.5 (AP - AP_chance)^2 + 0.5 (MP - MP_ref)^2)), MP_ref being the undefended run "
        "on the same backend and seed; 1 = attacker at chance with no utility lost.",
        "- **s/step** at the active party; **bytes/step** summed over every rank's ledger.",
        *([cost_note(refs)] if refs else []),
        "- `mean ± half`: the mean over seeds and its 95% interval; `mean [lo, hi]`: that interval cut "
        "to the metric's range (accuracy, AUC and DCS in [0, 1], an attack's score at most 1, times and "
        "bytes at least 0).",
        *([f"- {NOISY_NOTE}"] if any_noisy(summary) else []),
        "",
        "## What it shows",
        "",
        *findings(summary),
    ]
    sections = (
        ("privacy_utility", "Privacy-utility per attack", ""),
        ("grid_curves", "Grid: utility and attack performance against each grid key", ""),
        ("cost", "Cost per step (log scale)", ""),
        (
            "reconstruction_grid",
            "Feature reconstruction",
            "Top row: the victim party's true features of test rows; below, per protocol (first seed), "
            "what the active party reconstructed from what it received (embeddings under `plain`, z "
            "under crypto backends).",
        ),
    )
    for key, head, text in sections:
        if key in paths:
            body += [f"## {head}", ""] + ([text, ""] if text else []) + [f"![{key}]({paths[key].name})", ""]
    paths["markdown"].write_text("\n".join(body))
    return paths
