"""The one privacy accountant (docs/design.md §7), on ``dp_accounting``'s exact
privacy-loss distributions (PLD); no hand-written RDP.

A DP defense describes what it releases about one record over a planned run as
:class:`Mechanism` objects, each a tuple of :class:`Release` parts (a Gaussian,
Laplace or randomized-response release applied ``count`` times to the same
record). The accountant composes them:

* per mechanism: ``(eps, delta)`` of that mechanism alone over the run;
* per party: every mechanism of that party composed (sequential composition over
  the same records), which is what a budget bounds.

Neighbouring datasets differ in one record replaced (VFL parties hold the same
people; a label or a feature row changes, the row count does not). Releases are
expressed relative to that replacement's sensitivity: a Gaussian release of noise
standard deviation ``sigma * Delta`` where ``Delta`` bounds how far one record can
move the released value has ``noise_multiplier = sigma``.

A mechanism may also carry the source method's own figure (``claim``), reported
verbatim next to the sound one so that a user sees which is which (docs/methods/vfl-afe.md §7,
docs/methods/crdp-fl.md §2.8).

What is dp_accounting's and what is written here:

* dp_accounting's: every release's privacy-loss distribution (its PLD constructors
  for the Gaussian, Laplace and randomized-response mechanisms and for an
  ``(eps, delta)`` guarantee), their composition (``PrivacyLossDistribution.compose``,
  ``self_compose``), the eps at a delta of the composition, and the exact eps of one
  Gaussian (``get_epsilon_gaussian``, via :func:`~securevfl.privacy.gaussian.gaussian_epsilon`).
* Written here, because the library lacks it: the :class:`Release` descriptions
  themselves and the loop that composes them. dp_accounting's own descriptions, its
  ``DpEvent`` classes composed by its ``PLDAccountant``, fix one neighbouring relation
  per accountant and do not fit securevfl's: under ``REPLACE_ONE`` the accountant
  refuses a Laplace event (its multiplier is relative to add/remove-one sensitivity),
  under ``REPLACE_SPECIAL`` it prices randomized response for a different neighbour
  (ln 2 instead of ln 3 for binary RR at noise parameter 0.5), and it has no event for
  a release known only by its ``(eps, delta)`` or for a release with its own PLD
  (:mod:`securevfl.privacy.correlated`). A release here is relative to its own
  replace-one sensitivity, so each kind builds its PLD with the library's constructor
  for that kind. Also written here: :func:`merge_gaussians`, the exact GDP composition
  of Gaussian releases of different multipliers (the library composes Gaussians only
  through their discretized PLDs, which lose accuracy as the composed multiplier
  shrinks).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from dp_accounting.pld import privacy_loss_distribution as pld_lib

from securevfl.privacy.boundary import Boundary
from securevfl.privacy.gaussian import gaussian_epsilon

#: PLD discretization; 1e-4 reproduces docs/methods/vfl-afe.md appendix A to 3 decimals.
VALUE_DISCRETIZATION = 1e-4


@dataclass(frozen=True)
class Release:
    """One kind of release about a record, made ``count`` times; :meth:`pld` is its
    privacy-loss distribution over the ``count`` releases, built with dp_accounting."""

    count: int

    def pld(self) -> pld_lib.PrivacyLossDistribution | None:
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        raise NotImplementedError


@dataclass(frozen=True)
class GaussianRelease(Release):
    """Gaussian noise of std ``noise_multiplier x sensitivity`` (PLD:
    ``from_gaussian_mechanism``; alone, its eps is the library's exact
    ``get_epsilon_gaussian``, see :func:`epsilon`)."""

    noise_multiplier: float = 1.0

    def pld(self) -> pld_lib.PrivacyLossDistribution | None:
        if self.count == 0 or math.isinf(self.noise_multiplier):
            return None
        one = pld_lib.from_gaussian_mechanism(
            standard_deviation=self.noise_multiplier,
            sensitivity=1.0,
            value_discretization_interval=VALUE_DISCRETIZATION,
        )
        return one.self_compose(self.count) if self.count > 1 else one

    def describe(self) -> dict[str, Any]:
        return {"kind": "gaussian", "noise_multiplier": self.noise_multiplier, "count": self.count}


@dataclass(frozen=True)
class LaplaceRelease(Release):
    """Laplace noise of scale ``scale x sensitivity`` (one release is pure
    ``1/scale``-DP; PLD: ``from_laplace_mechanism``)."""

    scale: float = 1.0

    def pld(self) -> pld_lib.PrivacyLossDistribution | None:
        if self.count == 0 or math.isinf(self.scale):
            return None
        one = pld_lib.from_laplace_mechanism(
            parameter=self.scale, sensitivity=1.0, value_discretization_interval=VALUE_DISCRETIZATION
        )
        return one.self_compose(self.count) if self.count > 1 else one

    def describe(self) -> dict[str, Any]:
        return {"kind": "laplace", "scale": self.scale, "count": self.count}


@dataclass(frozen=True)
class RandomizedResponseRelease(Release):
    """K-ary randomized response at ``epsilon`` (keep with e^eps/(K-1+e^eps); PLD:
    ``from_randomized_response``, replace-one neighbours)."""

    epsilon: float = 1.0
    classes: int = 2

    def pld(self) -> pld_lib.PrivacyLossDistribution | None:
        if self.count == 0 or math.isinf(self.epsilon):
            return None
        # equivalently: with probability q answer uniformly over K buckets
        q = self.classes / (self.classes - 1 + math.exp(self.epsilon))
        one = pld_lib.from_randomized_response(
            noise_parameter=min(1.0, q),
            num_buckets=self.classes,
            value_discretization_interval=VALUE_DISCRETIZATION,
        )
        return one.self_compose(self.count) if self.count > 1 else one

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "randomized_response",
            "epsilon": self.epsilon,
            "classes": self.classes,
            "count": self.count,
        }


@dataclass(frozen=True)
class EpsDeltaRelease(Release):
    """A release known only by its ``(eps, delta)`` guarantee (e.g. the
    exponential mechanism, pure ``eps``-DP; PLD: ``from_privacy_parameters``, for
    which dp_accounting has no event)."""

    epsilon: float = 1.0
    delta: float = 0.0

    def pld(self) -> pld_lib.PrivacyLossDistribution | None:
        if self.count == 0:
            return None
        one = pld_lib.from_privacy_parameters(
            pld_lib.common.DifferentialPrivacyParameters(self.epsilon, self.delta),
            value_discretization_interval=VALUE_DISCRETIZATION,
        )
        return one.self_compose(self.count) if self.count > 1 else one

    def describe(self) -> dict[str, Any]:
        return {"kind": "eps_delta", "epsilon": self.epsilon, "delta": self.delta, "count": self.count}


@dataclass(frozen=True)
class NonPrivateRelease(Release):
    """A release with no DP guarantee (e.g. randomized response at eps = inf):
    whatever it is composed with has epsilon = inf."""

    def pld(self) -> pld_lib.PrivacyLossDistribution | None:
        return None

    def describe(self) -> dict[str, Any]:
        return {"kind": "non_private", "count": self.count}


@dataclass(frozen=True)
class Mechanism:
    """What one defense releases about a record over a run.

    ``claim`` is the source method's own privacy statement (reported as given,
    labelled as the paper's); ``notes`` says what the sound figure does not cover.
    ``boundary`` (:mod:`securevfl.privacy.boundary`) names the neighbouring inputs of the
    defense's own hook that the releases are calibrated to, so the audit can test the
    mechanism as it runs; None: not auditable at a boundary (``unaudited_reason`` says why).
    """

    name: str
    releases: tuple[Release, ...]
    claim: dict[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    boundary: Boundary | None = None
    unaudited_reason: str | None = None


@dataclass(frozen=True)
class Plan:
    """The run as far as privacy is concerned: how often each training record
    was released (the maximum over records) and how many steps ran."""

    steps: int
    n_train: int
    batch_size: int
    record_releases: int  # max over training records of the steps it appeared in
    evaluations: int  # evaluation passes over the test rows
    rounds: int | None = None  # communication rounds (FedBCD local steps); None: one per step

    @property
    def communication_rounds(self) -> int:
        return self.steps if self.rounds is None else self.rounds

    @property
    def sampling_rate(self) -> float:
        return min(1.0, self.batch_size / max(1, self.n_train))


def merge_gaussians(releases: list[Release]) -> list[Release]:
    """Gaussian releases about the same record compose exactly to one Gaussian of
    multiplier ``(sum count_i / z_i^2)^(-1/2)`` (mu adds in quadrature, Dong et
    al. 2019); the other releases are kept as they are."""
    gauss = [r for r in releases if isinstance(r, GaussianRelease) and r.count]
    rest = [r for r in releases if not isinstance(r, GaussianRelease)]
    if not gauss:
        return rest
    if any(r.noise_multiplier <= 0 for r in gauss):
        return [NonPrivateRelease(count=1), *rest]
    inv = sum(r.count / r.noise_multiplier**2 for r in gauss)
    finite = [r for r in gauss if not math.isinf(r.noise_multiplier)]
    if not finite:
        return rest
    return [GaussianRelease(count=1, noise_multiplier=inv**-0.5), *rest]


def compose(releases: list[Release]) -> pld_lib.PrivacyLossDistribution | None:
    """The releases' PLDs composed (dp_accounting's ``compose``); None when none
    has one."""
    out = None
    for r in releases:
        p = r.pld()
        if p is None:
            continue
        out = p if out is None else out.compose(p)
    return out


def epsilon(releases: list[Release], delta: float) -> float:
    """Sound eps at ``delta`` of all ``releases`` composed (0 when none, inf when
    any is non-private). Gaussian releases alone are merged into one
    (:func:`merge_gaussians`) whose eps is dp_accounting's exact
    ``get_epsilon_gaussian``; any other mix is read off the composed PLD
    (``get_epsilon_for_delta``)."""
    if any(isinstance(r, NonPrivateRelease) and r.count for r in releases):
        return math.inf
    releases = merge_gaussians(releases)
    if len(releases) == 1 and isinstance(releases[0], GaussianRelease):
        # Gaussian-only: exact in closed form (a PLD's support grows as 1/z^2 for small z)
        return gaussian_epsilon(releases[0].noise_multiplier, delta)
    p = compose(releases)
    return 0.0 if p is None else float(p.get_epsilon_for_delta(delta))


def account(mechanisms: dict[str, list[Mechanism]], delta: float) -> dict[str, Any]:
    """Per party and mechanism ``(eps, delta)``, plus each party's composed total."""
    parties: dict[str, Any] = {}
    for party, mechs in mechanisms.items():
        if not mechs:
            continue
        rows: dict[str, Any] = {}
        every: list[Release] = []
        for m in mechs:
            rel = list(m.releases)
            every += rel
            rows[m.name] = {
                "epsilon": epsilon(rel, delta),
                "delta": delta,
                "releases": [r.describe() for r in rel],
                **({"claim": m.claim} if m.claim else {}),
                **({"notes": list(m.notes)} if m.notes else {}),
            }
        parties[party] = {"mechanisms": rows, "total": {"epsilon": epsilon(every, delta), "delta": delta}}
    return parties
