"""``securevfl audit RUN``: re-audit a finished run's DP mechanisms from its saved models
(imported when the command runs), and the launcher's warning after ``securevfl run``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from securevfl.app.audit_run import PartyAudit, audit_run, audit_table, from_result, violation_lines


def cmd_audit(args: argparse.Namespace) -> int:
    """Print one row per audit record; exit 1 when a sound claim is violated."""
    audits = audit_run(Path(args.run_dir), trials=args.trials, confidence=args.confidence)
    if not any(a.records for a in audits):
        print(f"securevfl audit: {args.run_dir}: no party ran a DP mechanism; nothing to audit")
        return 0
    print("\n".join(audit_table(audits)))
    return _report_violations(audits, prefix="securevfl audit")


def _report_violations(audits: list[PartyAudit], *, prefix: str) -> int:
    lines = violation_lines(audits)
    sound = [a for a in audits for r in a.records if r.violated_sound]
    for line in lines:
        print(f"{prefix}: warning: {line}", file=sys.stderr)
    if sound:
        print(
            f"{prefix}: a sound privacy claim does not hold for the mechanism as it ran "
            "(the implementation or its accounting is wrong)",
            file=sys.stderr,
        )
        return 1
    return 0


def warn_after_run(result: dict[str, Any]) -> None:
    """After a run: a clear warning per violated claim in its result (the run has completed)."""
    _report_violations(from_result(result), prefix="securevfl run")
