"""Measured privacy of one run, from its result record alone: what each DP mechanism
claims, the lower bound the privacy audit measured at its boundary (``privacy.parties.
<party>.audit``; docs/privacy.md, "The audit"), and the lower bound each record-level
attack's own counts imply (an attack's ``record_test``). Pure functions over result records.

A row of the comparison shows the claim per release of the record it reports, that
record's ``epsilon_lower`` and a verdict: the strongest lower bound among the sound-claim
records of every party, unless a sound claim is violated, which is then the one shown. A
run without any DP mechanism claims nothing: its claim is infinite, and the attacks are
what measured its privacy. Nominal claims (a paper's own figure) are kept for the prose,
never shown as the row's verdict: the sound accountant's figure is what holds."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from securevfl.attacks.metrics import RecordTest

#: the worst verdict first: how several records (or seeds) of one row combine
VERDICTS = ("violated", "consistent", "unaudited")
#: a row whose runs ran no DP mechanism: nothing is claimed, the claim is infinite
NO_DP = "no DP"
#: a row with DP mechanisms but no audit record (a run from before the audit)
NOT_AUDITED = "-"


@dataclass(frozen=True)
class AuditEntry:
    """One audit record of ``result.json`` (``privacy.parties.<party>.audit[i]``) as the
    report reads it, with the party it belongs to."""

    party: str
    mechanism: str
    basis: str
    claim: str  # "sound" | "nominal"
    per_release: float
    composed: float | None
    epsilon_lower: float | None
    delta: float | None
    confidence: float | None
    trials: int | None
    method: str
    verdict: str  # "consistent" | "violated" | "unaudited"
    seconds: float | None
    reason: str | None = None  # why a mechanism was not audited

    @classmethod
    def from_json(cls, party: str, rec: dict[str, Any]) -> AuditEntry:
        claimed = rec.get("epsilon_claimed") or {}
        return cls(
            party=party,
            mechanism=str(rec.get("mechanism")),
            basis=str(rec.get("basis", "")),
            claim=str(rec.get("claim", "sound")),
            per_release=_claim(claimed.get("per_release")),
            composed=_number(claimed.get("composed"), None),
            epsilon_lower=_number(rec.get("epsilon_lower"), None),
            delta=_number(rec.get("delta"), None),
            confidence=_number(rec.get("confidence"), None),
            trials=None if rec.get("trials") is None else int(rec["trials"]),
            method=str(rec.get("method", "none")),
            verdict=str(rec.get("verdict", "unaudited")),
            seconds=_number(rec.get("seconds"), None),
            reason=rec.get("reason"),
        )

    @property
    def margin(self) -> float:
        """How far the lower bound lies above the claim (positive: violated)."""
        return -math.inf if self.epsilon_lower is None else self.epsilon_lower - self.per_release


def _number(value: Any, default: float | None) -> float | None:
    """A JSON number as a float; ``Infinity`` (how result.json writes an unbounded epsilon)
    is read by json already, the strings "inf"/"Infinity" are accepted too."""
    if value is None:
        return default
    if isinstance(value, str):
        return math.inf if value.lower().lstrip("+") in ("inf", "infinity") else float(value)
    return float(value)


def _claim(value: Any) -> float:
    """A claimed epsilon; a missing one claims nothing (inf)."""
    out = _number(value, math.inf)
    return math.inf if out is None else out


def entries(result: dict[str, Any]) -> list[AuditEntry]:
    """Every audit record of a run, party by party in the record's order."""
    parties = (result.get("privacy") or {}).get("parties") or {}
    return [
        AuditEntry.from_json(party, rec)
        for party, entry in parties.items()
        for rec in (entry.get("audit") or [])
        if isinstance(rec, dict)
    ]


def has_dp(result: dict[str, Any]) -> bool:
    """Whether any party of the run ran a DP mechanism (the accountant reported one)."""
    return bool((result.get("privacy") or {}).get("parties"))


def strongest(recs: list[AuditEntry]) -> AuditEntry | None:
    """The record a row (or a party) reports among sound-claim records: a violated one if any
    (the one whose bound lies furthest above its claim), else the largest lower bound; an
    unaudited record only when nothing was measured."""
    sound = [r for r in recs if r.claim == "sound"]
    if not sound:
        return None
    violated = [r for r in sound if r.verdict == "violated"]
    if violated:
        return max(violated, key=lambda r: r.margin)
    measured = [r for r in sound if r.epsilon_lower is not None and r.verdict != "unaudited"]
    if measured:
        return max(measured, key=lambda r: (r.epsilon_lower or 0.0, -r.per_release))
    return sound[0]


def per_party(result: dict[str, Any]) -> dict[str, AuditEntry]:
    """Each audited party's reported sound-claim record (:func:`strongest`)."""
    recs = entries(result)
    out: dict[str, AuditEntry] = {}
    for party in dict.fromkeys(r.party for r in recs):
        best = strongest([r for r in recs if r.party == party])
        if best is not None:
            out[party] = best
    return out


def row_audit(result: dict[str, Any]) -> dict[str, Any]:
    """The comparison row's measured-privacy fields: ``eps_release`` (the reported record's
    claim per release; inf for a run without DP), ``eps_lower`` (its audited lower bound)
    and ``audit`` (its verdict, naming party and mechanism when violated; ``no DP`` without a
    DP mechanism, ``-`` for DP that no record audited)."""
    if not has_dp(result):
        return {"eps_release": math.inf, "eps_lower": None, "audit": NO_DP}
    best = strongest(list(per_party(result).values()))
    if best is None:
        return {"eps_release": None, "eps_lower": None, "audit": NOT_AUDITED}
    verdict = best.verdict
    if verdict == "violated":
        verdict = f"violated ({best.party}: {best.mechanism})"
    return {"eps_release": best.per_release, "eps_lower": best.epsilon_lower, "audit": verdict}


def worst_verdict(verdicts: list[str]) -> str:
    """One row's verdict over its seeds: violated beats consistent beats unaudited (a
    violation on any seed is the row's); the text of the first seed with that verdict."""
    for v in VERDICTS:
        hit = next((x for x in verdicts if x.startswith(v)), None)
        if hit is not None:
            return hit
    return verdicts[0] if verdicts else NOT_AUDITED


def record_test(rec: dict[str, Any]) -> RecordTest | None:
    """An attack result's ``record_test`` (a record-level attack's counts), typed; None when
    it has none."""
    data = rec.get("record_test") if isinstance(rec, dict) else None
    return None if not data else RecordTest.from_json(data)


def attack_bound(rec: dict[str, Any]) -> float | None:
    """The lower bound on epsilon an attack's own counts imply (None: not a record-level
    attack, or its rows lacked a class)."""
    test = record_test(rec)
    return None if test is None else test.epsilon_lower
