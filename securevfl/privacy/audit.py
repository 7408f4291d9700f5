"""The privacy audit of a party's own DP mechanisms as they run (docs/privacy.md, "The audit").

The accountant's epsilon is a statement about a mechanism; nothing in a run checks it against
the code that adds the noise. :func:`audit_stack` does: for every mechanism a defense declares
with a boundary (:mod:`securevfl.privacy.boundary`) it builds a canary pair exactly at that
boundary, runs the defense's own hook on it many times with fresh secret noise, and turns how
well a threshold test tells the two apart into a lower bound on the per-release epsilon
(:mod:`securevfl.privacy.audit_math`: the Gaussian-DP fit of Nasr et al. 2023 for Gaussian
releases, Clopper-Pearson otherwise). A bound above the claimed per-release epsilon is a
verdict at that confidence: the implementation or its accounting is wrong.

How the hooks are run:

* the audit works on a copy of each defense, rebuilt from its options and its checkpoint state
  less its secret streams (as a prediction rebuilds a stack, ``DefenseStack.restore_trained``),
  under a fresh noise key: it neither consumes nor reveals the run's noise stream, and the
  run's own defense instance is not touched (its report is unchanged);
* an embedding boundary: the canaries are ``+-(sensitivity/2) u`` for a random direction ``u``
  of unit norm in the boundary's norm (L2: uniform on the sphere; L1: a random sign vector
  spread evenly over the coordinates, so that a coordinate-wise clip leaves the pair intact),
  so the two rows differ by exactly the sensitivity. The hook is called with batches of the
  run's batch size (at least :data:`MIN_BATCH` rows), half of each batch one canary and half
  the other: the noise is per row, so each row is one trial, and a hook whose output depends
  on the batch (VFL-AFE's paper-mode rescaling, ``rescale_mode: dp``'s centre and spread) sees
  a realistic batch whose batch statistics are the same in every call. The test's score is a
  row's projection on
  ``u`` (L2) or its coordinates clamped to the canaries' and summed along ``u`` (L1, the
  Laplace likelihood ratio);
* a label boundary: labels 0 and 1 (two distinct classes), in one call of the hook over all
  trials (randomized response is per label); the score is "the output is label 0".

The trials are split in two halves: the first chooses the test's threshold, the second is
counted, so the bound needs no correction for the thresholds tried. Where a boundary is
``assumed`` (nothing in the code enforces it), a second record audits the pair at the scale the
run actually released (``released``: the party's own measurement, a power-of-two bucket) against
the source paper's per-release figure (``Mechanism.claim["per_release_epsilon"]``): the sound
accountant already reports an infinite epsilon there.

Imports nothing of the defenses: a stack is anything with ``defenses`` whose items have the
:class:`AuditedDefense` shape.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import time
import warnings
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np
import torch

from securevfl.csprng import SecretStream
from securevfl.privacy import audit_math
from securevfl.privacy.accountant import GaussianRelease, Mechanism, Plan, Release, epsilon
from securevfl.privacy.audit_record import AuditRecord, Basis, Claim, scale_bucket, verdict_of
from securevfl.privacy.boundary import EmbeddingBoundary, LabelBoundary, Norm

__all__ = ["AuditRecord", "audit_stack", "released_scale", "violations"]

#: Why a mechanism without a boundary is not audited, when it does not say.
NO_BOUNDARY = "no boundary declared: the mechanism's neighbouring inputs are not a hook's input"

#: The smallest canary batch the audit passes an embedding hook (fewer, larger calls; with half
#: the rows one canary and half the other, a batch statistic barely depends on the batch size).
MIN_BATCH = 256

#: The quantile of pairwise distances that stands for "the scale the run released".
SCALE_QUANTILE = 0.99
#: At most this many rows enter the pairwise distances (n(n-1)/2 of them).
SCALE_ROWS = 512


class AuditedDefense(Protocol):
    """What the audit uses of a defense (securevfl/defenses/base.py's ``Defense``)."""

    name: str
    params: Any
    ctx: Any

    def mechanisms(self, plan: Plan) -> list[Mechanism]: ...
    def checkpoint_state(self) -> Any: ...
    def restore(self, state: Any) -> None: ...


class AuditedStack(Protocol):
    @property
    def defenses(self) -> Sequence[Any]: ...


# -- the copy under fresh noise ---------------------------------------------------------------


def fresh_copy(defense: Any) -> Any:
    """A new instance of ``defense``'s class from its options and its state less its secret
    streams, under a fresh noise key (its streams are children of that key)."""
    ctx = dataclasses.replace(defense.ctx, noise=SecretStream.fresh())
    with warnings.catch_warnings():  # the run's own instance has said what its options warn about
        warnings.simplefilter("ignore")
        clone = type(defense)(defense.params, ctx)
    # a deep copy: a captured list or dict is the defense's own object, which the copy's hooks
    # would otherwise append to (the run's statistics must stay the run's)
    clone.restore(copy.deepcopy(defense.checkpoint_state().without_secret_streams()))
    return clone


# -- canaries and scores ------------------------------------------------------------------------


def direction(width: int, norm: Norm, rng: np.random.Generator) -> np.ndarray:
    """A random direction of unit ``norm`` in ``width`` dimensions (public: the canaries are
    not secret, the noise the hook adds to them is)."""
    if norm == "l1":
        return rng.choice([-1.0, 1.0], size=width) / width
    v = rng.standard_normal(width)
    return v / np.linalg.norm(v)


def embedding_scores(out: np.ndarray, canary: np.ndarray, norm: Norm) -> np.ndarray:
    """Each output row's score for "it came from ``+canary``": the projection on the canary's
    direction (L2), or, for L1, each coordinate's signed value clamped to the canary's
    magnitude and summed (the likelihood ratio of coordinate-wise Laplace noise)."""
    if norm == "l1":
        mag = np.abs(canary)
        sign = np.sign(canary)
        return np.clip(out * sign, -mag, mag).sum(axis=1)
    return out @ (canary / max(np.linalg.norm(canary), 1e-300))


def released_scale(rows: torch.Tensor | np.ndarray, norm: Norm, *, quantile: float = SCALE_QUANTILE) -> float:
    """A high ``quantile`` of the pairwise distances (in ``norm``) between released-before-noise
    rows: how far apart two of the party's records actually were when released. A statistic of
    the party's data: only :func:`~securevfl.privacy.audit_record.scale_bucket` of it may leave
    the party."""
    x = torch.as_tensor(rows).detach().double().cpu()[:SCALE_ROWS]
    if x.shape[0] < 2:
        return 0.0
    d = torch.pdist(x, p=1.0 if norm == "l1" else 2.0)
    return float(torch.quantile(d, quantile))


def _embedding_width(defense: Any) -> int:
    ctx = defense.ctx
    spec = next((s for s in ctx.proto.parties.passive if s.name == ctx.party), None)
    if spec is None or spec.model is None:
        raise ValueError(f"party '{ctx.party}' has no bottom model: its embedding width is unknown")
    return int(spec.model.out)


@torch.no_grad()
def _embedding_trials(
    defense: Any, b: EmbeddingBoundary, distance: float, trials: int, batch: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    width = _embedding_width(defense)
    canary = (distance / 2.0) * direction(width, b.norm, rng)
    batch = max(2, min(max(batch, MIN_BATCH), trials)) // 2 * 2
    half = batch // 2
    rows = np.concatenate([np.tile(canary, (half, 1)), np.tile(-canary, (half, 1))])
    h = torch.as_tensor(rows, dtype=torch.float32)
    first, second = [], []
    for _ in range(math.ceil(trials / batch)):
        out = defense.embed(h.clone(), train=True).detach().double().cpu().numpy()
        s = embedding_scores(out, canary, b.norm)
        first.append(s[:half])
        second.append(s[half:])
    n = trials // 2
    return np.concatenate(first)[:n], np.concatenate(second)[:n]


@torch.no_grad()
def _label_trials(defense: Any, b: LabelBoundary, trials: int) -> tuple[np.ndarray, np.ndarray]:
    n = trials // 2
    y = torch.cat([torch.zeros(n, dtype=torch.long), torch.ones(n, dtype=torch.long)])
    out = defense.labels(y.clone(), classes=b.classes).detach().cpu().numpy()
    score = (out == 0).astype(np.float64)
    return score[:n], score[n:]


# -- records --------------------------------------------------------------------------------------


def _one(release: Release) -> Release:
    return dataclasses.replace(release, count=1)


def _claimed(m: Mechanism, delta: float) -> tuple[float, float]:
    """The accountant's epsilon of one release of the mechanism's first release (the one its
    boundary describes) and of the whole mechanism over the run."""
    rel = [r for r in m.releases if r.count]
    if not rel:
        return 0.0, 0.0
    return epsilon([_one(rel[0])], delta), epsilon(list(m.releases), delta)


def _method(m: Mechanism) -> audit_math.Method:
    first = m.releases[0] if m.releases else None
    return "gdp" if isinstance(first, GaussianRelease) else "clopper-pearson"


def _trials(
    defense: Any, m: Mechanism, distance: float | None, trials: int, batch: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    b = m.boundary
    if isinstance(b, LabelBoundary):
        return _label_trials(defense, b, trials)
    assert isinstance(b, EmbeddingBoundary)
    return _embedding_trials(defense, b, b.sensitivity if distance is None else distance, trials, batch, rng)


def _unaudited(
    m: Mechanism,
    basis: Basis,
    claim: Claim,
    claimed: tuple[float, float],
    reason: str,
    *,
    delta: float,
    confidence: float,
) -> AuditRecord:
    return AuditRecord(
        mechanism=m.name, basis=basis, claim=claim, per_release=claimed[0], composed=claimed[1],
        epsilon_lower=0.0, delta=delta, confidence=confidence, trials=0, method="none",
        verdict="unaudited", seconds=0.0, reason=reason,
    )  # fmt: skip


def audit_mechanism(
    defense: Any,
    m: Mechanism,
    *,
    plan: Plan,
    delta: float,
    trials: int,
    confidence: float,
    released: float | None = None,
    rng: np.random.Generator | None = None,
) -> list[AuditRecord]:
    """The audit records of one mechanism ``m`` that ``defense`` declared (see the module
    docstring); ``released``: the released-scale bucket for an assumed boundary."""
    rng = rng if rng is not None else np.random.default_rng()
    sound = _claimed(m, delta)
    if m.boundary is None:
        reason = m.unaudited_reason or NO_BOUNDARY
        return [
            _unaudited(m, "declared sensitivity", "sound", sound, reason, delta=delta, confidence=confidence)
        ]
    cases: list[tuple[Basis, Claim, float | None, tuple[float, float]]] = [
        ("declared sensitivity", "sound", None, sound)
    ]
    nominal = m.claim.get("per_release_epsilon")
    if isinstance(m.boundary, EmbeddingBoundary) and m.boundary.assumed and nominal is not None:
        total = m.claim.get("epsilon", nominal)
        cases.append(("released scale", "nominal", released, (float(nominal), float(total))))
    out = []
    method = _method(m)
    for basis, claim, distance, claimed in cases:
        if basis == "released scale" and not (distance is not None and distance > 0):
            why = "the released scale was not recorded"
            out.append(_unaudited(m, basis, claim, claimed, why, delta=delta, confidence=confidence))
            continue
        t0 = time.perf_counter()
        try:
            first, second = _trials(fresh_copy(defense), m, distance, trials, plan.batch_size, rng)
        except Exception as exc:  # a hook that cannot run outside its run: said, never hidden
            why = f"the hook could not run on canaries: {type(exc).__name__}: {exc}"
            out.append(_unaudited(m, basis, claim, claimed, why, delta=delta, confidence=confidence))
            continue
        eps_lb, _ = audit_math.audit_scores(first, second, method=method, delta=delta, confidence=confidence)
        out.append(
            AuditRecord(
                mechanism=m.name, basis=basis, claim=claim, per_release=claimed[0], composed=claimed[1],
                epsilon_lower=eps_lb, delta=delta, confidence=confidence, trials=first.size + second.size,
                method=method, verdict=verdict_of(eps_lb, claimed[0]), seconds=time.perf_counter() - t0,
                scale=distance if basis == "released scale" else None,
            )
        )  # fmt: skip
    return out


def audit_stack(
    stack: AuditedStack,
    plan: Plan,
    *,
    delta: float,
    trials: int,
    confidence: float,
    released: Mapping[str, float] | None = None,
) -> list[AuditRecord]:
    """Audit every mechanism every defense of ``stack`` declares over ``plan`` (module
    docstring); ``released`` maps a mechanism's name to its released-scale bucket (assumed
    boundaries). Mechanisms without a boundary are recorded ``unaudited`` with the reason."""
    out: list[AuditRecord] = []
    for d in stack.defenses:
        for m in d.mechanisms(plan):
            scale = (released or {}).get(m.name)
            out += audit_mechanism(
                d, m, plan=plan, delta=delta, trials=trials, confidence=confidence, released=scale
            )
    return out


def assumed_norms(stack: AuditedStack, plan: Plan) -> dict[str, Norm]:
    """The mechanisms of ``stack`` whose boundary is assumed, with their norms: those whose
    released scale the party measures."""
    return {
        m.name: m.boundary.norm
        for d in stack.defenses
        for m in d.mechanisms(plan)
        if isinstance(m.boundary, EmbeddingBoundary) and m.boundary.assumed
    }


def released_buckets(rows: torch.Tensor, norms: Mapping[str, Norm]) -> dict[str, float]:
    """Each assumed mechanism's released scale over ``rows`` (the party's released-before-noise
    rows), as a power-of-two bucket: the one coarse figure that leaves the party."""
    return {name: scale_bucket(released_scale(rows, norm)) for name, norm in norms.items()}


def violations(records: Sequence[AuditRecord | Mapping[str, Any]]) -> list[AuditRecord]:
    """The records whose sound claim the audit refutes."""
    recs = [r if isinstance(r, AuditRecord) else AuditRecord.from_json(dict(r)) for r in records]
    return [r for r in recs if r.violated_sound]
