"""Predictions spend privacy (docs/privacy.md, "Predictions spend privacy").

Every ``securevfl predict`` of a model whose defenses add noise at evaluation is
a fresh noisy release of each predicted record: averaging the releases of k
predictions removes the noise as k grows, and the composed epsilon grows with
them. A prediction's releases about one record are a function of the protocol
alone (the defenses' :meth:`~securevfl.defenses.base.Defense.prediction_mechanisms`),
so every rank can price every party's prediction before anything is sent.

The math here is pure: :class:`PredictionSpend` composes this prediction's
releases with every earlier prediction's (read back from the party's ledger
through :func:`release_of`) with the one accountant, and :func:`check_budget`
refuses a prediction that would take the composed total above the party's
declared ``prediction_budget``. The total is the composition of the releases
themselves, not a sum of epsilons, and it assumes the worst case: that every
prediction released the same records. It does not include the releases made
during training: predicted records may be other people than the training rows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from securevfl.errors import ConfigError
from securevfl.privacy.accountant import (
    EpsDeltaRelease,
    GaussianRelease,
    LaplaceRelease,
    NonPrivateRelease,
    RandomizedResponseRelease,
    Release,
    epsilon,
)
from securevfl.privacy.correlated import UnboundedRelease

#: What the running total covers, as prediction.json and the command say it.
COVERS = (
    "every prediction of this saved model, composed as releases of the same records (the worst case); "
    "the training releases are not included (predicted records may be other people)"
)

_KINDS: dict[str, Callable[[dict[str, Any], int], Release]] = {
    "gaussian": lambda d, n: GaussianRelease(count=n, noise_multiplier=float(d["noise_multiplier"])),
    "laplace": lambda d, n: LaplaceRelease(count=n, scale=float(d["scale"])),
    "randomized_response": lambda d, n: RandomizedResponseRelease(
        count=n, epsilon=float(d["epsilon"]), classes=int(d["classes"])
    ),
    "eps_delta": lambda d, n: EpsDeltaRelease(count=n, epsilon=float(d["epsilon"]), delta=float(d["delta"])),
    "non_private": lambda d, n: NonPrivateRelease(count=n),
    "unbounded": lambda d, n: UnboundedRelease(count=n, reason=str(d.get("reason", ""))),
}


def release_of(doc: dict[str, Any]) -> Release:
    """The release a :meth:`Release.describe` document describes (its inverse).
    Raises ValueError for a document no release kind writes."""
    kind = doc.get("kind") if isinstance(doc, dict) else None
    make = _KINDS.get(kind) if isinstance(kind, str) else None
    if make is None:
        raise ValueError(f"release kind {kind!r} (known: {', '.join(sorted(_KINDS))})")
    try:
        count = doc["count"]
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise ValueError(f"count {count!r} is not a non-negative integer")
        return make(doc, count)
    except (KeyError, TypeError) as exc:
        raise ValueError(f"{kind} release lacks or mistypes {exc}") from None


@dataclass(frozen=True)
class PredictionSpend:
    """One party's prediction priced: ``releases``, what this prediction releases
    about each predicted record; ``earlier``, each earlier prediction's releases
    of the same saved model; ``delta``, the run's ``privacy.delta``."""

    party: str
    releases: tuple[Release, ...]
    earlier: tuple[tuple[Release, ...], ...]
    delta: float

    @property
    def spends(self) -> bool:
        """Whether this prediction releases anything the accountant prices."""
        return any(r.count for r in self.releases)

    @property
    def epsilon(self) -> float:
        """This prediction's releases composed."""
        return epsilon(list(self.releases), self.delta)

    @property
    def total_before(self) -> float:
        """Every earlier prediction's releases composed (0 before the first)."""
        return epsilon([r for e in self.earlier for r in e], self.delta)

    @property
    def total(self) -> float:
        """Every earlier prediction's releases and this one's, composed."""
        return epsilon([r for e in self.earlier for r in e] + list(self.releases), self.delta)

    @property
    def predictions(self) -> int:
        """How many predictions the total covers, this one included."""
        return len(self.earlier) + 1

    def report(self, budget: float | None) -> dict[str, Any]:
        """The party's entry of ``prediction.json``'s ``privacy``."""
        return {
            "epsilon": self.epsilon,
            "delta": self.delta,
            "releases": [r.describe() for r in self.releases],
            "total": {
                "epsilon": self.total,
                "delta": self.delta,
                "predictions": self.predictions,
                "covers": COVERS,
            },
            "budget": None if budget is None else {"epsilon": budget},
        }


def spend_of(
    party: str, releases: Sequence[Release], earlier: Sequence[Sequence[dict[str, Any]]], delta: float
) -> PredictionSpend:
    """A :class:`PredictionSpend` from this prediction's releases and the earlier
    predictions' release descriptions (as a ledger keeps them)."""
    return PredictionSpend(
        party, tuple(releases), tuple(tuple(release_of(d) for d in e) for e in earlier), delta
    )


def check_budget(spend: PredictionSpend, budget: float | None, *, path: str) -> None:
    """Refuse (:class:`~securevfl.errors.ConfigError`, exit code 2) a prediction
    whose releases would take the party's composed total above ``budget``; the
    message names the party, the budget, the total so far and what this
    prediction would add."""
    if budget is None or not spend.spends:
        return
    total = spend.total
    if total <= budget:
        return
    n = len(spend.earlier)
    raise ConfigError(
        f"party '{spend.party}': this prediction is refused: it would spend epsilon={spend.epsilon:.4g} "
        f"(delta={spend.delta:g}) and take the composed total of this model's predictions to "
        f"{total:.4g}, above the party's prediction budget epsilon={budget:g} ({n} earlier "
        f"prediction{'' if n == 1 else 's'} composed: {spend.total_before:.4g}); nothing was released",
        path=path,
    )
