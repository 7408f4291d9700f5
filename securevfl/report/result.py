"""The result record of one run (``result.json``), assembled by the active rank
from every rank's summary (both typed: :mod:`securevfl.records`), and each
party's own report beside it (``ranks/rank<R>.defense_report.json``, written by
that party's rank alone)."""

from __future__ import annotations

import platform
import socket
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from securevfl import jsonfile
from securevfl.config import Protocol
from securevfl.exchange.base import ExchangeBackend
from securevfl.private_files import write_private
from securevfl.records import OwnReport, RankSummary, ResultRecord
from securevfl.runtime.layout import Layout
from securevfl.runtime.ledger import merge_summaries

RESULT_FILE = "result.json"


def build_result(
    proto: Protocol,
    backend: type[ExchangeBackend],
    options: BaseModel,
    layout: Layout,
    parts: list[RankSummary],
    pids: dict[int, int],
    *,
    started: float,
    finished: float,
) -> ResultRecord:
    active = parts[0]
    steps = int(active.train_steps or 0)
    ledger = merge_summaries([p.ledger or {} for p in parts], steps)
    info = backend.result_info(options)
    return ResultRecord.model_validate(
        {
            "protocol": proto.name,
            "description": proto.description,
            "backend": info["backend"],
            "backend_params": info["params"],
            "dataset": proto.dataset.name,
            "n_parties": 1 + len(layout.passive),
            "n_passive": len(layout.passive),
            "world_size": layout.world_size,
            "task": active.task,
            "positive_class": active.positive_class,
            "test_accuracy": active.test_accuracy,
            "test_auc": active.test_auc,
            "test_majority_rate": active.test_majority_rate,
            # regression tasks (None otherwise): in the target's own units, on the test rows
            "test_rmse": active.test_rmse,
            "test_mae": active.test_mae,
            "test_r2": active.test_r2,
            "epochs": proto.training.epochs,
            "batch_size": proto.training.batch_size,
            "seed": proto.training.seed,
            "device": proto.training.device,
            "train_steps": steps,
            "time_per_step_s": active.time_per_step_s,
            "step_time_s": active.step_time_s,
            "bytes_per_step": ledger["bytes_per_step"],
            "party_pids": {str(r): pid for r, pid in sorted(pids.items())},
            "ranks": {str(p.rank): {"party": p.party, "role": p.role} for p in parts},
            "rows": {
                "aligned": active.n_aligned,
                "train": active.n_train,
                "test": active.n_test,
            },
            "history": active.history or [],
            "ledger": ledger,
            "privacy": _privacy(proto, parts, steps),
            "attacks": {},  # filled by the attack harness after the run
            "defense_report": {p.party: p.defense_report for p in parts if p.defense_report},
            "replaced_builtins": {p.party: p.replaced_builtins for p in parts if p.replaced_builtins},
            "noise_seed_pinned": proto.privacy.noise_seed is not None,
            "defenses": {
                lay_name: [d.name for d in specs]
                for lay_name, specs in [(proto.parties.active.name, proto.parties.active.defenses)]
                + [(p.name, p.defenses) for p in proto.parties.passive]
                if specs
            },
            "digest": proto.digest(),
            "wall_time_s": finished - started,
            # each rank's wall time per phase and peak resident memory (attacks: added by the harness)
            "phase_s": {str(p.rank): p.phase_s or {} for p in parts},
            "phase_cpu_s": {str(p.rank): p.phase_cpu_s or {} for p in parts},
            "train_cpu_s": {str(p.rank): p.train_cpu_s for p in parts if p.train_cpu_s is not None},
            "peak_rss_mib": {str(p.rank): p.peak_rss_mib for p in parts},
            "machine": {
                "host": socket.gethostname(),
                "platform": platform.platform(),
                "python": platform.python_version(),
            },
        }
    )


def _privacy(proto: Protocol, parts: list[RankSummary], steps: int) -> dict[str, Any]:
    """Every party's own accounting, merged; empty when no DP mechanism ran."""
    per_party: dict[str, Any] = {}
    for p in parts:
        per_party.update(p.privacy or {})
    if not per_party:
        return {}
    active = parts[0]
    budget = proto.privacy.budget
    return {
        "accountant": "pld (dp_accounting), replace-one neighbours",
        "delta": proto.privacy.delta,
        # a pinned noise seed makes the noise removable by anyone who knows it
        "noise_seed_pinned": proto.privacy.noise_seed is not None,
        "parties": per_party,
        "budget": None if budget is None else {"epsilon": budget.epsilon},
        "planned_steps": active.planned_steps,
        "steps_run": steps,
        "stopped_by_budget": bool(_or(active.allowed_steps, steps) < _or(active.planned_steps, steps)),
    }


def _or(value: int | None, default: int) -> int:
    return default if value is None else value


def read_result(out_dir: Path) -> ResultRecord:
    """``out_dir/result.json`` as its record."""
    return ResultRecord.model_validate(jsonfile.loads((Path(out_dir) / RESULT_FILE).read_text()))


def write_result(out_dir: Path, result: ResultRecord) -> Path:
    path = Path(out_dir) / RESULT_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(jsonfile.dumps(result.to_json(), indent=2))
    tmp.replace(path)
    return path


def own_report_path(out_dir: Path, rank: int) -> Path:
    """Where rank ``rank`` keeps its own report (:class:`OwnReport`) in its output folder."""
    return Path(out_dir) / "ranks" / f"rank{rank}.defense_report.json"


def write_own_report(out_dir: Path, report: OwnReport) -> Path:
    path = own_report_path(out_dir, report.rank)
    return write_private(path, jsonfile.dumps(report.to_json(), indent=1))  # its owner's alone


def read_own_reports(out_dir: Path) -> dict[str, OwnReport]:
    """Every party's own report found in ``out_dir``, by party name: all of them
    in a local run's folder (every rank writes to it), only the party's own in
    one ``securevfl party`` rank's folder."""
    out: dict[str, OwnReport] = {}
    for path in sorted((Path(out_dir) / "ranks").glob("rank*.defense_report.json")):
        rep = OwnReport.model_validate(jsonfile.loads(path.read_text()))
        out[rep.party] = rep
    return out
