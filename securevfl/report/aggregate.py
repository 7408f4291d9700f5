"""Runs over seeds, summarized: one row per compared protocol (a protocol at one
grid point) with the mean and 95% interval (:mod:`securevfl.report.stats`) of
every metric, and the per-seed rows it came from.

The per-seed rows are the comparison rows of :func:`securevfl.report.compare.rows`,
computed seed by seed, so a defended run's DCS is scored against the undefended
run of the same seed. Pure functions over result records: no I/O."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from securevfl.report.audit import entries as audit_entries
from securevfl.report.audit import worst_verdict
from securevfl.report.rows import (
    BOUND,
    COST_KEYS,
    METRICS_BASE,
    OPTIONAL,
    attack_chance,
    metric_range,
    rows,
)
from securevfl.report.stats import Interval, mean_interval

TEXT_FIELDS = ("backend", "defenses", "dataset", "audit")


@dataclass(frozen=True)
class RunRecord:
    """One finished run of a comparison: its label (protocol name, plus the grid
    point), protocol name, grid point (key -> value), seed, result record and
    folder (relative paths in the result resolve against it)."""

    label: str
    base: str
    seed: int
    result: dict[str, Any]
    point: dict[str, Any] = field(default_factory=dict)
    folder: str | None = None


@dataclass
class Group:
    """One compared protocol over its seeds."""

    label: str
    base: str
    point: dict[str, Any]
    text: dict[str, Any]
    seeds: list[int]
    metrics: dict[str, Interval | None]
    runs: list[dict[str, Any]]  # the per-seed rows

    def mean(self, key: str) -> float | None:
        iv = self.metrics.get(key)
        return None if iv is None else iv.mean

    def flat(self) -> dict[str, Any]:
        """protocol, text fields, n_seeds, the audit's verdict, then per metric its mean, lo and hi."""
        out: dict[str, Any] = {"protocol": self.label, **{k: self.text.get(k) for k in TEXT_FIELDS}}
        out["n_seeds"] = len(self.seeds)
        out["audit"] = out.pop("audit")  # after the run's description, before the numbers
        for key, iv in self.metrics.items():
            out[key] = None if iv is None else iv.mean
            out[f"{key}_lo"] = None if iv is None else iv.lo
            out[f"{key}_hi"] = None if iv is None else iv.hi
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "protocol": self.label,
            "base": self.base,
            "point": self.point,
            **self.text,
            "seeds": self.seeds,
            "metrics": {
                k: None
                if iv is None
                else {
                    "mean": iv.mean,
                    "half": iv.half,
                    "lo": iv.lo,
                    "hi": iv.hi,
                    "noisy": iv.noisy,
                    "values": list(iv.values),
                }
                for k, iv in self.metrics.items()
            },
        }


@dataclass
class Summary:
    groups: list[Group]
    attacks: list[str]
    runs: list[dict[str, Any]]  # every per-seed row, in run order
    chance: dict[str, float] = field(default_factory=dict)  # attack -> its chance level
    keys: list[str] = field(default_factory=list)  # the metrics, in table order

    def metric_keys(self) -> list[str]:
        return self.keys


def metric_keys(attacks: Sequence[str]) -> list[str]:
    """The numeric columns, in table order."""
    head = [k for k in METRICS_BASE if k not in ("time_per_step_s", "bytes_per_step")]
    tail = ["time_per_step_s", "bytes_per_step", *COST_KEYS]
    bounds = [f"{BOUND}{a}" for a in attacks]
    return head + bounds + [f"attack:{a}" for a in attacks] + (["dcs"] if attacks else []) + tail


def measured(result: dict[str, Any]) -> dict[str, Any]:
    """A run's audit records for the report's prose, as JSON (``records``: every one, with
    its party)."""
    return {"records": [asdict(r) for r in audit_entries(result)]}


def summarize(records: Sequence[RunRecord]) -> Summary:
    """Per-seed rows (each seed's runs scored together), then one :class:`Group`
    per label in first-seen order with every metric's mean and interval."""
    attacks = sorted({k for r in records for k in (r.result.get("attacks") or {})})
    per_run: dict[int, dict[str, Any]] = {}
    for seed in dict.fromkeys(r.seed for r in records):
        idx = [i for i, r in enumerate(records) if r.seed == seed]
        results = [{**records[i].result, "protocol": records[i].label} for i in idx]
        table, _ = rows(results, attacks=attacks)
        for i, row in zip(idx, table, strict=True):
            rec = records[i]
            recs = rec.result.get("attacks") or {}
            grids = {a: v["grid"] for a, v in recs.items() if isinstance(v, dict) and v.get("grid")}
            per_run[i] = {
                **row,
                "seed": rec.seed,
                "base": rec.base,
                "point": rec.point,
                "folder": rec.folder,
                "grids": grids,
                "measured": measured(rec.result),
            }
    runs = [per_run[i] for i in range(len(records))]
    # the regression metrics (and a defense's cost against its reference) only where some run has them
    keys = [
        k
        for k in metric_keys(attacks)
        if (k not in OPTIONAL and k not in COST_KEYS and not k.startswith(BOUND))
        or any(r.get(k) is not None for r in runs)
    ]
    groups: list[Group] = []
    for label in dict.fromkeys(r.label for r in records):
        mine = [(rec, per_run[i]) for i, rec in enumerate(records) if rec.label == label]
        first_rec, first_row = mine[0]
        groups.append(
            Group(
                label=label,
                base=first_rec.base,
                point=first_rec.point,
                text={
                    **{k: first_row.get(k) for k in TEXT_FIELDS},
                    "audit": worst_verdict([str(row.get("audit")) for _, row in mine]),
                    "delta": (first_rec.result.get("privacy") or {}).get("delta"),
                },
                seeds=[rec.seed for rec, _ in mine],
                metrics={
                    k: mean_interval([row.get(k) for _, row in mine], bounds=metric_range(k)) for k in keys
                },
                runs=[row for _, row in mine],
            )
        )
    chance: dict[str, float] = {}
    for r in records:
        for a, rec in (r.result.get("attacks") or {}).items():
            if isinstance(rec, dict) and rec.get("ap") is not None:
                chance.setdefault(a, attack_chance(a, rec))
    return Summary(groups, attacks, runs, chance, keys)
