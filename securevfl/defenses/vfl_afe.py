"""VFL-AFE: Gaussian DP on shared embeddings with adaptive rescaling and distribution
adjustment (docs/methods/vfl-afe.md; Mi et al. 2023), registered as ``embedding_dp``.

Threat model (docs/methods/vfl-afe.md §1): an honest-but-curious active party, or an eavesdropper on the
passive -> active channel, sees every embedding a passive party releases and tries to invert
it or infer membership. The protected unit is one passive party's feature row. Under the
crypto backends the active party never sees the embedding in the clear; the noise is still
added before encryption/sharing (docs/methods/vfl-afe.md §9), so it also guards whatever is finally opened.

Per batch, at train and at evaluation (every released row is noised, docs/methods/vfl-afe.md §2.9):
clip each row to L2 norm ``t`` -> (variants R/full) rescale by ``s = 2t / Delta~`` -> add
``N(0, (2 sigma t)^2)``. After the gradient comes back, variants D/full fuzzy-cluster it and
add a contrastive loss; R/full add the KL loss that keeps pairwise distances Gaussian.

What is guaranteed (docs/methods/vfl-afe.md §7): vanilla is an ``(eps, delta)`` Gaussian release per row and
per step, conditional on the passive model; the accountant composes those releases. Paper-mode
rescaling is local-sensitivity calibration: its true per-release multiplier is ``sigma / s``,
which the accountant uses (``s_max`` if capped, else the largest ``s`` observed). The
``rescale_mode: dp`` variant (ours) rescales with privately estimated centre and spread and
re-clips, so each row keeps sensitivity ``2t``; its estimates are accounted as releases too.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Literal

import torch
from pydantic import Field, field_validator, model_validator

import securevfl.defenses._afe as _afe
from securevfl.defenses.base import Defense, DefenseContext, DefenseOptions
from securevfl.errors import ConfigError
from securevfl.privacy import gaussian as gm
from securevfl.privacy.accountant import GaussianRelease, Mechanism, Plan, Release
from securevfl.privacy.boundary import EmbeddingBoundary
from securevfl.privacy.correlated import UnboundedRelease
from securevfl.seeding import derive_seed

#: The flag every VFL-AFE accounting record carries (docs/methods/vfl-afe.md §7, critique 2 and 6).
NOT_DATASET_DP = "theta-channel and batch coupling not accounted; not dataset-level DP"
UNCAPPED = (
    "paper-mode rescaling is uncapped: the multiplier sigma/s has no bound the options give (s is "
    "computed from each batch), so no finite figure; set s_max for one (the party's own report gives "
    "the multiplier at the largest s it observed)"
)


class EmbeddingDPOptions(DefenseOptions):
    """Options of ``embedding_dp`` (defaults: docs/methods/vfl-afe.md §3; paper-faithful where the paper
    says)."""

    variant: Literal["vanilla", "R", "D", "full"] = Field(
        default="full", description="vanilla = clip+noise; R = +rescaling and L_KL; D = +FCM and L_CL"
    )
    epsilon: float | None = Field(
        default=1.0, gt=0, description="claimed per-release eps; null = no noise, for ablations"
    )
    delta: float = Field(default=1e-2, gt=0, lt=1, description="claimed per-release delta (paper: 1e-2)")
    calibration: Literal["classic", "analytic"] = "classic"
    clip: float | None = Field(default=1.0, gt=0, description="L2 clip t; null only without noise")
    k: float = Field(default=3.0, gt=0, description="quantile multiplier of the sensitivity estimate")
    sens_estimator: Literal["quantile", "max"] = "quantile"
    rescale_mode: Literal["paper", "dp"] = "paper"
    s_max: float | None = Field(default=None, ge=1.0, description="cap on the paper-mode factor s")
    rescale_grad: bool = Field(
        default=False, description="let gradients flow through s (docs/methods/vfl-afe.md §2.8)"
    )
    est_epsilon: float = Field(
        default=1.0, gt=0, description="rescale_mode dp: per-batch eps of each centre/spread estimate"
    )
    alpha: float = Field(default=1.0, ge=0, description="weight of L_KL")
    beta: float = Field(default=0.1, ge=0, description="weight of L_CL")
    confidence: float = Field(default=0.7, ge=0, le=1, description="FCM filter threshold c")
    classes: int | None = Field(default=None, ge=2, description="number of classes C (variants D, full)")
    cl_mode: Literal["push", "pull", "literal"] = "push"
    fcm_m: float = Field(default=2.0, gt=1)
    fcm_iter: int = Field(default=100, ge=1)
    fcm_tol: float = Field(default=1e-5, gt=0)
    kl_bins: int = Field(default=64, ge=4)
    eval_noise: bool = Field(
        default=True, description="noise evaluation releases too (docs/methods/vfl-afe.md §2.9)"
    )

    @field_validator("epsilon", mode="before")
    @classmethod
    def _inf_is_none(cls, v: Any) -> Any:
        # inf does not survive the protocol's JSON hand-off to the ranks; null does
        return None if isinstance(v, float) and math.isinf(v) and v > 0 else v

    @property
    def eps(self) -> float:
        return math.inf if self.epsilon is None else self.epsilon

    @model_validator(mode="after")
    def _consistent(self) -> EmbeddingDPOptions:
        if self.variant in ("D", "full") and self.classes is None:
            raise ValueError(f"variant '{self.variant}' clusters gradients and needs 'classes' (C)")
        if self.clip is None and self.epsilon is not None:
            raise ValueError(
                "'clip' may be None only without noise (epsilon null): noise needs a bounded sensitivity"
            )
        if self.rescale_mode == "dp" and self.clip is None:
            raise ValueError("rescale_mode 'dp' needs 'clip'")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            gm.noise_multiplier(self.eps, self.delta, self.calibration)
            if self.rescale_mode == "dp":
                gm.noise_multiplier(self.est_epsilon, self.delta, self.calibration)
        return self

    @property
    def rescales(self) -> bool:
        return self.variant in ("R", "full")

    @property
    def adjusts(self) -> bool:
        return self.variant in ("D", "full")


class EmbeddingDP(Defense[EmbeddingDPOptions]):
    """VFL-AFE's passive-side mechanism (docs/methods/vfl-afe.md §2, §8.1): clip, optional rescale, Gaussian
    noise on every released embedding; optional FCM + contrastive and KL local losses.
    Passive only, needs nothing from the backend (the noise is added before the exchange)."""

    name = "embedding_dp"
    sides = frozenset({"passive"})
    local_steps_refusal = (
        "its rescaling and sensitivity estimate are fitted on each released batch, and its gradient "
        "adjustment (fuzzy c-means, docs/methods/vfl-afe.md §2.6) on the gradient of that release; stale "
        "gradients over R local steps match neither"
    )
    options = EmbeddingDPOptions

    def __init__(self, params: EmbeddingDPOptions, ctx: DefenseContext):
        super().__init__(params, ctx)
        p = params
        if p.rescales and p.rescale_mode == "paper" and p.s_max is None and ctx.proto.privacy.budget:
            raise ConfigError(
                "paper-mode rescaling has no data-independent bound on s, so a budget cannot be planned; "
                "set 's_max' or use rescale_mode 'dp'",
                path="privacy.budget",
            )
        self.sigma = gm.noise_multiplier(p.eps, p.delta, p.calibration)
        self.est_sigma = (
            gm.noise_multiplier(p.est_epsilon, p.delta, p.calibration) if p.rescale_mode == "dp" else 0.0
        )
        self.t = p.clip if p.clip is not None else 1.0
        self.gen = ctx.noise_stream("embedding_dp", "noise")  # private, never the shared seed
        self.fcm_seed = derive_seed(ctx.seed, "embedding_dp", ctx.party, "fcm")
        self.steps = 0
        self.s_train: list[float] = []
        self.s_eval: list[float] = []
        self.dt_train: list[float] = []
        self.log: dict[str, list[float]] = {"kl": [], "cl": [], "keep_frac": []}
        self.centre: torch.Tensor | None = None  # rescale_mode dp: last private estimates
        self.scale: float = 1.0
        self._hc: torch.Tensor | None = None
        self._hs: torch.Tensor | None = None
        self._g: torch.Tensor | None = None

    # -- forward -----------------------------------------------------------------------------
    def embed(self, h: torch.Tensor, *, train: bool) -> torch.Tensor:
        p = self.params
        hc = gm.clip_rows(h, p.clip) if p.clip is not None else h
        hs = hc
        if p.rescales and p.rescale_mode == "paper":
            if hc.shape[0] >= 3:
                src = hc if p.rescale_grad else hc.detach()
                dt = gm.estimate_sensitivity(src, p.k, p.sens_estimator)
                hs, s = gm.rescale(hc, self.t, dt, grad=p.rescale_grad, s_max=p.s_max)
                (self.s_train if train else self.s_eval).append(float(s))
                if train:
                    self.dt_train.append(float(dt))
            # fewer than 3 rows: no spread to estimate, s = 1 (docs/methods/vfl-afe.md §2.5 guards)
        elif p.rescales:  # rescale_mode dp: private centre/spread, then re-clip (sensitivity 2t)
            if train:
                self.centre, r = gm.dp_centre_scale(hc, self.t, self.est_sigma, self.gen)
                self.scale = self.t / r
                self.s_train.append(self.scale)
            if self.centre is not None:
                hs = gm.clip_rows(self.scale * (hc - self.centre), self.t)
        if train:
            self._hc, self._hs = hc, hs
            self.steps += 1
        if train or p.eval_noise:
            return gm.add_noise(hs, self.sigma, self.t, self.gen)
        return hs

    # -- backward ----------------------------------------------------------------------------
    def grad(self, g: torch.Tensor) -> torch.Tensor:
        if self.params.adjusts:
            self._g = g.detach()
        return g

    def local_loss(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor | None:
        p = self.params
        parts: list[torch.Tensor] = []
        if p.rescales and p.alpha > 0 and self._hc is not None and self._hc.shape[0] >= 3:
            kl = _afe.kl_gaussian_loss(gm.pairwise_distances(self._hc), p.alpha, p.kl_bins)
            self.log["kl"].append(float(kl.detach()))
            parts.append(kl)
        if p.adjusts and self._g is not None and self._hs is not None and p.classes is not None:
            n = self._g.shape[0]
            _, ids, conf = _afe.fcm(
                self._g * n,
                p.classes,
                m=p.fcm_m,
                max_iter=p.fcm_iter,
                tol=p.fcm_tol,
                seed=self.fcm_seed + self.steps,
            )
            cl = _afe.contrastive_loss(self._hs, ids, conf, p.confidence, p.beta, p.cl_mode)
            self.log["cl"].append(float(cl.detach()))
            self.log["keep_frac"].append(float((conf >= p.confidence).double().mean()))
            parts.append(cl)
        self._hc = self._hs = self._g = None
        if not parts:
            return None
        return sum(parts[1:], parts[0])

    # -- accounting --------------------------------------------------------------------------
    def _s_bound(self) -> tuple[float | None, str | None]:
        """The rescaling factor the sound figure assumes, from the options alone (None:
        no bound), and how it was obtained. Never the factors this run observed: those
        are statistics of the party's data (they stay in :meth:`report`)."""
        p = self.params
        if not p.rescales or p.rescale_mode == "dp":
            return 1.0, None
        if p.s_max is not None:
            return p.s_max, f"paper-mode rescaling capped at s_max={p.s_max:g}: multiplier sigma/s_max"
        return None, UNCAPPED

    def mechanisms(self, plan: Plan) -> list[Mechanism]:
        """Per-record releases of one passive party over ``plan`` (docs/methods/vfl-afe.md §7): one Gaussian
        row release per step the record was in (or per evaluation, for a test row) at the effective
        multiplier ``sigma / s``; in ``rescale_mode dp`` also two estimate releases per step. Uncapped
        paper-mode rescaling has no bound on ``s`` that the options give, so its releases are
        unbounded (the multiplier at the largest ``s`` observed is in :meth:`report`, the party's own)."""
        p = self.params
        if self.sigma == 0:
            return []
        count = max(plan.record_releases, plan.evaluations if p.eval_noise else 0)
        s, why = self._s_bound()
        release: Release = (
            UnboundedRelease(count=count, reason="uncapped paper-mode rescaling: no bound on s")
            if s is None
            else GaussianRelease(count=count, noise_multiplier=self.sigma / s)
        )
        releases = [release]
        notes = [
            NOT_DATASET_DP,
            "count = max(training steps a record was in, evaluations of a test row)",
        ]
        if why:
            notes.append(why)
        if p.rescales and p.rescale_mode == "dp":
            releases.append(GaussianRelease(count=2 * plan.record_releases, noise_multiplier=self.est_sigma))
            notes.append("rescale_mode dp: per-batch private centre and spread composed as Gaussian releases")
        if not p.eval_noise:
            notes.append("eval_noise off: evaluation rows are released without noise and are not protected")
        if p.calibration == "classic" and p.eps >= 1:
            notes.append("classic calibration used outside Lemma 3.3's range (eps < 1)")
        claim = {
            "source": "Mi et al. 2023, Thm 3.4/3.6 (docs/methods/vfl-afe.md §7)",
            "epsilon": p.epsilon,
            "delta": p.delta,
            "per": "one released embedding row, one step; no composition claimed",
            "sigma": self.sigma,
            "calibration": p.calibration,
        }
        if p.rescales and p.rescale_mode == "paper":
            p2 = 0.5 * (1.0 + math.erf(p.k / math.sqrt(2.0)))
            claim["delta_prime"] = f"delta/(p1*p2), p2={p2:.5f}, p1 unstated"
        # one row clipped to L2 norm t moves by at most 2t (replace-one); the noise std 2*sigma*t
        # makes that a release of multiplier sigma (sigma/s after paper-mode rescaling by s)
        boundary = EmbeddingBoundary(sensitivity=2.0 * self.t, norm="l2")
        return [Mechanism(self.name, tuple(releases), claim=claim, notes=tuple(notes), boundary=boundary)]

    def prediction_mechanisms(self) -> list[Mechanism]:
        """One prediction releases each predicted record's row once, as an evaluation does: at the
        multiplier ``sigma / s`` of :meth:`mechanisms` under ``eval_noise`` (unbounded for uncapped
        paper-mode rescaling), without noise otherwise (no finite figure)."""
        p = self.params
        if self.sigma == 0:
            return []
        s, why = self._s_bound()
        release: Release
        if not p.eval_noise:
            release = UnboundedRelease(
                count=1, reason="eval_noise off: predicted rows are released without noise"
            )
        elif s is None:
            release = UnboundedRelease(count=1, reason="uncapped paper-mode rescaling: no bound on s")
        else:
            release = GaussianRelease(count=1, noise_multiplier=self.sigma / s)
        notes = [NOT_DATASET_DP, "one release of each predicted record's row per prediction"]
        if why:
            notes.append(why)
        claim = {
            "source": "Mi et al. 2023, Thm 3.4/3.6 (docs/methods/vfl-afe.md §7)",
            "epsilon": p.epsilon,
            "delta": p.delta,
            "per": "one released embedding row; no composition claimed",
        }
        return [Mechanism(self.name, (release,), claim=claim, notes=tuple(notes))]

    def report(self) -> dict[str, Any]:
        """Rescaling statistics, the effective per-release eps at the largest ``s``, and the
        adjustment diagnostics (docs/methods/vfl-afe.md §7, §8.1 item 9)."""
        p = self.params
        out: dict[str, Any] = {
            "variant": p.variant,
            "sigma": self.sigma,
            "noise_std": 2.0 * self.sigma * self.t,
            "calibration": p.calibration,
            "claimed_epsilon": p.epsilon,
            "claimed_delta": p.delta,
            "steps": self.steps,
        }
        if self.sigma > 0:
            out["single_release_epsilon"] = gm.gaussian_epsilon(self.sigma, p.delta)
        if p.rescales:
            out["rescale_mode"] = p.rescale_mode
            out["s_train"] = gm.empirical_quantiles(self.s_train)
            out["s_eval"] = gm.empirical_quantiles(self.s_eval)
            if self.dt_train:
                out["delta_tilde_train"] = gm.empirical_quantiles(self.dt_train)
            seen = self.s_train + self.s_eval
            if seen and self.sigma > 0 and p.rescale_mode == "paper":
                s_max = max(1.0, max(seen))
                out["noise_multiplier_at_s_max"] = self.sigma / s_max
                out["effective_epsilon_at_s_max"] = gm.effective_epsilon(self.sigma, s_max, p.delta)
        for key, vals in self.log.items():
            if vals:
                out[f"{key}_mean"] = sum(vals) / len(vals)
        return out

    def public_report(self) -> dict[str, Any]:
        """The options, the noise multiplier and std they give, and the exact
        single-release epsilon of that multiplier (all from the options alone)."""
        out = super().public_report()
        out.update(sigma=self.sigma, noise_std=2.0 * self.sigma * self.t)
        if self.sigma > 0:
            out["single_release_epsilon"] = gm.gaussian_epsilon(self.sigma, self.params.delta)
        return out
