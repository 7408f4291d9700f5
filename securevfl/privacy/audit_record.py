"""One audit record: what the audit of one mechanism found (``result.json``:
``privacy.parties.<party>.audit``, a list of these; docs/privacy.md, "The audit").

A record compares a lower bound on a mechanism's per-release epsilon, measured by running the
defense's own hook on canaries at its declared boundary (:mod:`securevfl.privacy.audit`), with
the epsilon a claim gives one release. ``claim`` says whose claim: ``sound`` is the accountant's,
``nominal`` the source paper's. ``basis`` says which canary pair: ``declared sensitivity`` (the
boundary the mechanism declares) or ``released scale`` (the scale the run actually released, for
a boundary nothing enforces; ``scale`` is then a coarse power-of-two bucket of it, the one
statistic of a party's data an audit record discloses, SECURITY.md §7).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

Basis = Literal["declared sensitivity", "released scale"]
Claim = Literal["sound", "nominal"]
AuditMethod = Literal["gdp", "clopper-pearson", "none"]
Verdict = Literal["consistent", "violated", "unaudited"]


def verdict_of(epsilon_lower: float, per_release: float) -> Verdict:
    """``violated`` when the audited lower bound exceeds the claimed per-release epsilon."""
    return "violated" if epsilon_lower > per_release else "consistent"


def scale_bucket(scale: float) -> float:
    """A released scale rounded up to a power of two (the coarse figure an audit record may carry);
    a non-positive or non-finite scale stays as it is."""
    if not (scale > 0 and math.isfinite(scale)):
        return scale
    return float(2.0 ** math.ceil(math.log2(scale)))


@dataclass(frozen=True)
class AuditRecord:
    """The audit of one mechanism at one basis (see the module docstring)."""

    mechanism: str
    basis: Basis
    claim: Claim
    per_release: float  # the claimed epsilon of one release
    composed: float  # the claimed epsilon over the run
    epsilon_lower: float
    delta: float
    confidence: float
    trials: int
    method: AuditMethod
    verdict: Verdict
    seconds: float
    reason: str | None = None  # why a mechanism was not audited
    scale: float | None = None  # released scale, as a power-of-two bucket (basis "released scale")

    @property
    def violated_sound(self) -> bool:
        """A sound claim the audit refutes (the implementation or its accounting is wrong)."""
        return self.verdict == "violated" and self.claim == "sound"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "mechanism": self.mechanism,
            "basis": self.basis,
            "claim": self.claim,
            "epsilon_claimed": {"per_release": self.per_release, "composed": self.composed},
            "epsilon_lower": self.epsilon_lower,
            "delta": self.delta,
            "confidence": self.confidence,
            "trials": self.trials,
            "method": self.method,
            "verdict": self.verdict,
            "seconds": round(self.seconds, 4),
        }
        if self.reason is not None:
            out["reason"] = self.reason
        if self.scale is not None:
            out["scale"] = self.scale
        return out

    @classmethod
    def from_json(cls, row: dict[str, Any]) -> AuditRecord:
        claimed = row["epsilon_claimed"]
        return cls(
            mechanism=row["mechanism"],
            basis=row["basis"],
            claim=row["claim"],
            per_release=float(claimed["per_release"]),
            composed=float(claimed["composed"]),
            epsilon_lower=float(row["epsilon_lower"]),
            delta=float(row["delta"]),
            confidence=float(row["confidence"]),
            trials=int(row["trials"]),
            method=row["method"],
            verdict=row["verdict"],
            seconds=float(row["seconds"]),
            reason=row.get("reason"),
            scale=row.get("scale"),
        )
