"""DRAVL: passive-side defenses against input reconstruction from embeddings
(docs/methods/dravl.md; Sun et al., "Defending against Reconstruction Attack in Vertical
Federated Learning", ~2021).

Threat model (docs/methods/dravl.md §1.2): an honest-but-curious active party A that sees the
embeddings h' a passive party P sends and trains a decoder to recover P's raw
inputs. The defender is P alone: every term below is a loss P adds to its own
bottom model's objective, so nothing new crosses the wire and A's code path is the
vanilla one under every backend (plain, mpc, ckks, paillier). There is no formal
guarantee (no DP, no MI bound); the effect is empirical.

Registered defenses:

* ``dravl``: the unified loss of docs/methods/dravl.md §3.4 (paper eq. 4) with three independent
  weights, a weight of 0 switching a module off, so every combination is one entry:

  - AR (§3.1): ``alpha_r * ||R(GRL_lambda(h)) - X||^2``: one combined update of the
    bottom model and a simulated reconstructor R, the gradient reversal layer making
    it ascent for the bottom model. ``ar_inner_steps = k > 0`` (our fix, not in the
    paper) first trains R for k steps on ``h.detach()`` with its own optimizer, so
    the bottom model fights a fitted decoder instead of a lagging one.
  - NR (§3.2): ``alpha_n * ||R'_frozen(h) - N||^2``, N noise shaped like X; it moves
    the bottom model only (R' is called with detached parameters). R' is R when AR
    is on; otherwise it is trained on ``h.detach()`` so it never makes h more
    invertible.
  - dCor (§3.3): ``alpha_d * log dCor(X, h)`` (or plain dCor), V-statistic, float64.

* ``gaussian_noise``: the paper's embedding-noise baseline (§3.5), ``h' = h + N(0, s^2)``,
  optionally also at evaluation. Not DP: nothing is clipped or accounted.

X, the reconstruction target and first dCor argument, is the party's own feature
row as given to its bottom model (already z-scored on training rows when the
dataset standardizes): a fixed representation, never a trainable one (§4.3).

Both defenses report leakage metrics of their last evaluation pass (V-dCor between
X and the embedding, its permutation baseline, bias-corrected dCor^2) in the
party's own ``ranks/rank<R>.defense_report.json``; these are computed locally by P
and sent nowhere (``result.json`` gets only the options, ``Defense.public_report``).
"""

from __future__ import annotations

import hashlib
from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field, model_validator
from torch import nn

from securevfl import optim
from securevfl.csprng import SecretStream
from securevfl.defenses.base import Defense, DefenseContext, DefenseOptions
from securevfl.errors import ConfigError, DataError
from securevfl.models import mlp
from securevfl.privacy.dcor import batched_metrics, dcor_loss, v_dcor
from securevfl.seeding import generator, seeded

Reduction = Literal["sum_feat_mean_batch", "mean_all"]
NoiseKind = Literal["gaussian", "uniform"]

# The paper's named runs (docs/methods/dravl.md §8.10); DRAVL's alpha_n is not in the paper,
# we assume the NR_0.001 value. ``embnoise_{s}`` is the ``gaussian_noise`` defense.
PRESETS: dict[str, dict[str, Any]] = {
    "vanilla": {},
    "nr_0.001": {"alpha_n": 0.001},
    "dcor_0.01": {"alpha_d": 0.01},
    "dcor_0.1": {"alpha_d": 0.1},
    "dcor_0.01_plain": {"alpha_d": 0.01, "dcor_log": False},
    "dcor_0.1_plain": {"alpha_d": 0.1, "dcor_log": False},
    "dravl": {"alpha_r": 0.01, "alpha_n": 0.001, "alpha_d": 0.01},
}


# -- pieces (pure functions and one autograd op) --------------------------------


class GradReverse(torch.autograd.Function):
    """Gradient reversal (Ganin & Lempitsky 2015): identity forward, ``-lambda * g``
    backward (docs/methods/dravl.md §3.1)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, lam: float) -> torch.Tensor:
        ctx.lam = lam
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        return -ctx.lam * g, None


def grad_reverse(x: torch.Tensor, lam: float) -> torch.Tensor:
    """``GRL_lambda(x)``."""
    return GradReverse.apply(x, lam)


def reconstruction_loss(pred: torch.Tensor, target: torch.Tensor, reduction: Reduction) -> torch.Tensor:
    """``||pred - target||^2``: summed over features and averaged over the batch
    (docs/methods/dravl.md default), or averaged over every element."""
    sq = (pred - target) ** 2
    return sq.sum(1).mean() if reduction == "sum_feat_mean_batch" else sq.mean()


def nr_loss(r: nn.Module, h: torch.Tensor, noise: torch.Tensor, reduction: Reduction) -> torch.Tensor:
    """``||R'(h) - N||^2`` through R' with detached parameters: the gradient reaches
    h (and the bottom model) but never R' (docs/methods/dravl.md §3.2)."""
    frozen = {k: v.detach() for k, v in r.named_parameters()}
    rec = torch.func.functional_call(r, frozen, (h,))
    return reconstruction_loss(rec, noise, reduction)


def sample_noise(
    shape: tuple[int, ...], kind: NoiseKind, mean: float, std: float, stream: SecretStream
) -> torch.Tensor:
    """NR noise in input space: Gaussian ``N(mean, std^2)`` or uniform on
    ``mean +- sqrt(3) std`` (same mean and variance), float32 on the CPU, from the
    party's secret stream."""
    if kind == "gaussian":
        return (mean + std * stream.normal(shape)).float()
    half = std * 3.0**0.5
    return (mean - half + 2.0 * half * stream.uniform(shape)).float()


def _row_key(row: np.ndarray) -> bytes:
    return hashlib.sha256(np.ascontiguousarray(row).tobytes()).digest()[:16]


def embedding_dim(ctx: DefenseContext) -> int:
    """The width of the party's bottom-model output (its ``model.out``)."""
    for spec in ctx.proto.parties.passive:
        if spec.name == ctx.party and spec.model is not None:
            return spec.model.out
    raise ConfigError(f"party '{ctx.party}' has no bottom model to defend", path="parties.passive")


# -- evaluation probe, shared by both defenses ---------------------------------


class _EvalProbe:
    """Keeps the party's feature matrices (seen by ``select_features``) and the
    embeddings of the latest evaluation pass, to report leakage metrics on the
    test rows. The passive party selects features for its training rows, then its
    test rows, and evaluates test rows in order, so the last evaluation pass lines
    up with the last matrix of the same row count."""

    def __init__(self, seed: int, party: str, max_rows: int):
        self.max_rows = max_rows
        self.inputs: list[np.ndarray] = []
        self.clean: list[torch.Tensor] = []
        self.sent: list[torch.Tensor] = []
        self.in_eval = False
        self.gen = generator(seed, "dravl-probe", party)

    def saw_inputs(self, x: np.ndarray) -> None:
        self.inputs.append(x)

    def saw(self, clean: torch.Tensor, sent: torch.Tensor, *, train: bool) -> None:
        if train:
            self.in_eval = False
            return
        if not self.in_eval:
            self.clean, self.sent, self.in_eval = [], [], True
        self.clean.append(clean.detach().cpu())
        self.sent.append(sent.detach().cpu())

    def report(self) -> dict[str, Any]:
        if not self.clean:
            return {}
        clean, sent = torch.cat(self.clean), torch.cat(self.sent)
        match = [x for x in self.inputs if len(x) == len(clean)]
        if not match:
            return {}
        n = min(len(clean), self.max_rows)
        x = torch.as_tensor(match[-1][:n])
        out: dict[str, Any] = {"eval_rows": n, "input_dims": int(x.reshape(n, -1).shape[1])}
        out["sent"] = batched_metrics(x, sent[:n], generator=self.gen)
        if not torch.equal(clean, sent):
            out["clean"] = batched_metrics(x, clean[:n], generator=self.gen)
        return out


# -- DRAVL ----------------------------------------------------------------------


class DravlOptions(DefenseOptions):
    """Weights and knobs of docs/methods/dravl.md eq. 4; every weight defaults to 0 (off)."""

    preset: Literal[tuple(PRESETS)] | None = Field(  # type: ignore[valid-type]
        default=None, description="one of the paper's named runs; explicit keys override it"
    )
    alpha_r: float = Field(default=0.0, ge=0, description="AR weight (GRL reconstructor); 0 = off")
    alpha_n: float = Field(default=0.0, ge=0, description="NR weight (noise regularization); 0 = off")
    alpha_d: float = Field(default=0.0, ge=0, description="dCor weight; 0 = off")
    grl_lambda: float = Field(default=1.0, gt=0, description="gradient reversal factor lambda")
    ar_inner_steps: int = Field(
        default=0, ge=0, description="extra steps of R on h.detach() before each GRL step (fix; paper: 0)"
    )
    inner_lr: float | None = Field(
        default=None, gt=0, description="lr of the inner steps (default training.lr)"
    )
    reconstructor_hidden: list[int] = Field(default_factory=lambda: [128, 256])
    reduction: Reduction = "sum_feat_mean_batch"
    nr_noise: NoiseKind = "gaussian"
    nr_mean: float = 0.0
    nr_std: float = Field(default=1.0, gt=0)
    nr_noise_mode: Literal["fresh", "fixed_per_sample"] = Field(
        default="fresh", description="fixed_per_sample: one draw per distinct input row, reused"
    )
    dcor_log: bool = Field(default=True, description="log dCor (paper eq. 3) or plain dCor")
    dcor_eps: float = Field(default=1e-12, ge=0)
    log_eps: float = Field(default=1e-8, gt=0)
    collapse_std: float = Field(default=1e-6, ge=0, description="flag a batch whose h has max std below this")
    eval_metrics: bool = Field(default=True, description="report leakage metrics of the last evaluation")
    eval_rows: int = Field(default=2048, ge=4)

    @model_validator(mode="before")
    @classmethod
    def _apply_preset(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("preset") in PRESETS:
            return {**PRESETS[data["preset"]], **data}
        return data


class Dravl(Defense[DravlOptions]):
    """AR + NR + dCor on the passive party (docs/methods/dravl.md §3, §8.3-8.6): a bottom-model
    loss only; the reconstructor R is P's private module (it joins P's optimizer,
    its optional inner steps use an optimizer of its own)."""

    name = "dravl"
    sides = frozenset({"passive"})
    options = DravlOptions

    def __init__(self, params: DravlOptions, ctx: DefenseContext):
        super().__init__(params, ctx)
        self.p = params
        self.q = embedding_dim(ctx)
        self.d_x: int | None = None
        self.r: nn.Module | None = None
        self.inner_opt: optim.Optimizer | None = None
        self.noise_gen = ctx.noise_stream("dravl", "nr")  # private: the NR targets
        self.fixed_noise: dict[bytes, torch.Tensor] = {}
        self.probe = _EvalProbe(ctx.seed, ctx.party, params.eval_rows)
        self.stats: dict[str, float] = {"steps": 0, "collapsed_batches": 0}

    @property
    def uses_reconstructor(self) -> bool:
        return self.p.alpha_r > 0 or self.p.alpha_n > 0

    def select_features(self, x: np.ndarray, columns: list[str]) -> tuple[np.ndarray, list[str]]:
        width = int(np.prod(x.shape[1:])) if x.ndim > 1 else 1
        if self.d_x is not None and width != self.d_x:
            raise DataError(f"party '{self.ctx.party}': dravl saw {self.d_x} then {width} feature columns")
        self.d_x = width
        if self.p.eval_metrics:
            self.probe.saw_inputs(x)
        return x, columns

    def reconstructor(self) -> nn.Module:
        """R (and R'): ``q -> hidden -> d_x``, ReLU, linear output, built under a
        named seed once the party's feature width is known."""
        if self.r is None:
            if self.d_x is None:
                raise RuntimeError("dravl: select_features must run before the reconstructor is built")
            with seeded(self.ctx.seed, "dravl-reconstructor", self.ctx.party):
                self.r = mlp([self.q, *self.p.reconstructor_hidden, self.d_x])
        return self.r

    def modules(self) -> list[nn.Module]:
        return [self.reconstructor()] if self.uses_reconstructor else []

    def embed(self, h: torch.Tensor, *, train: bool) -> torch.Tensor:
        if self.p.eval_metrics:
            self.probe.saw(h, h, train=train)
        return h

    def embed_local(self, h: torch.Tensor) -> torch.Tensor:
        """h is sent as it is (the defense is a bottom-model loss); no probe entry."""
        return h

    def noise_like(self, x: torch.Tensor) -> torch.Tensor:
        """N for this batch: a fresh draw, or one fixed draw per distinct row of X."""
        p = self.p
        if p.nr_noise_mode == "fresh":
            n = sample_noise(tuple(x.shape), p.nr_noise, p.nr_mean, p.nr_std, self.noise_gen)
            return n.to(device=x.device, dtype=x.dtype)
        rows = x.detach().cpu().numpy()
        out = []
        for row in rows:
            key = _row_key(row)
            if key not in self.fixed_noise:
                self.fixed_noise[key] = sample_noise(
                    tuple(row.shape), p.nr_noise, p.nr_mean, p.nr_std, self.noise_gen
                )
            out.append(self.fixed_noise[key])
        return torch.stack(out).to(device=x.device, dtype=x.dtype)

    def _inner_steps(self, x: torch.Tensor, h: torch.Tensor) -> None:
        r = self.reconstructor()
        if self.inner_opt is None:
            lr = self.p.inner_lr or self.ctx.proto.training.lr
            self.inner_opt = optim.Adam(r.parameters(), lr=lr)
        z = h.detach()
        for _ in range(self.p.ar_inner_steps):
            self.inner_opt.zero_grad(set_to_none=True)
            reconstruction_loss(r(z), x, self.p.reduction).backward()
            self.inner_opt.step()
        self.inner_opt.zero_grad(set_to_none=True)

    def local_loss(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor | None:
        p = self.p
        x = x.reshape(len(x), -1).to(h.dtype)
        if self.d_x is not None and x.shape[1] != self.d_x:
            raise DataError(f"party '{self.ctx.party}': dravl expected {self.d_x} columns, got {x.shape[1]}")
        self.stats["steps"] += 1
        if len(h) > 1 and float(h.detach().std(0).max()) < p.collapse_std:
            self.stats["collapsed_batches"] += 1
        terms: list[torch.Tensor] = []
        if p.alpha_r > 0:
            if p.ar_inner_steps:
                self._inner_steps(x, h)
            l_r = reconstruction_loss(self.reconstructor()(grad_reverse(h, p.grl_lambda)), x, p.reduction)
            terms.append(p.alpha_r * l_r)
            self._track("ar_loss", l_r)
        elif p.alpha_n > 0:  # R' alone: it learns to reconstruct, never pushing h
            l_rp = reconstruction_loss(self.reconstructor()(h.detach()), x, p.reduction)
            terms.append(l_rp)
            self._track("r_prime_loss", l_rp)
        if p.alpha_n > 0:
            l_n = nr_loss(self.reconstructor(), h, self.noise_like(x), p.reduction)
            terms.append(p.alpha_n * l_n)
            self._track("nr_loss", l_n)
        if p.alpha_d > 0:
            l_d = dcor_loss(x, h, use_log=p.dcor_log, eps=p.dcor_eps, log_eps=p.log_eps)
            terms.append(p.alpha_d * l_d.to(h.dtype))
            self._track("train_dcor", v_dcor(x.detach(), h.detach(), p.dcor_eps))
        return sum(terms[1:], terms[0]) if terms else None

    def _track(self, key: str, value: torch.Tensor) -> None:
        """Running mean of a per-step statistic."""
        k = int(self.stats["steps"])
        prev = self.stats.get(key, 0.0)
        self.stats[key] = prev + (float(value.detach()) - prev) / max(k, 1)

    def report(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            k: (int(v) if k in ("steps", "collapsed_batches") else v) for k, v in self.stats.items()
        }
        out["weights"] = {"alpha_r": self.p.alpha_r, "alpha_n": self.p.alpha_n, "alpha_d": self.p.alpha_d}
        if self.p.eval_metrics:
            out["eval"] = self.probe.report()
        return out


# -- embedding-noise baseline ---------------------------------------------------


class GaussianNoiseOptions(DefenseOptions):
    """``h' = h + N(0, std^2 I)`` in the embedding's absolute units."""

    std: float = Field(ge=0, description="noise std s, absolute units of the embedding")
    at_eval: bool = Field(default=True, description="also add noise to evaluation embeddings")
    eval_metrics: bool = Field(default=True, description="report leakage metrics of the last evaluation")
    eval_rows: int = Field(default=2048, ge=4)


class GaussianNoise(Defense[GaussianNoiseOptions]):
    """docs/methods/dravl.md §3.5, the paper's baseline: Gaussian noise on the sent embedding.
    The returned gradient applies to h unchanged (``d h'/d h = I``). Not DP: h is
    not clipped and nothing is accounted; the bottom model can outgrow a fixed s."""

    name = "gaussian_noise"
    sides = frozenset({"passive"})
    options = GaussianNoiseOptions

    def __init__(self, params: GaussianNoiseOptions, ctx: DefenseContext):
        super().__init__(params, ctx)
        self.p = params
        self.gen = ctx.noise_stream("gaussian_noise")  # private, never the shared seed
        self.probe = _EvalProbe(ctx.seed, ctx.party, params.eval_rows)

    def select_features(self, x: np.ndarray, columns: list[str]) -> tuple[np.ndarray, list[str]]:
        if self.p.eval_metrics:
            self.probe.saw_inputs(x)
        return x, columns

    def embed(self, h: torch.Tensor, *, train: bool) -> torch.Tensor:
        out = h
        if self.p.std > 0 and (train or self.p.at_eval):
            noise = self.gen.normal(tuple(h.shape)).to(device=h.device, dtype=h.dtype)
            out = h + self.p.std * noise
        if self.p.eval_metrics:
            self.probe.saw(h, out, train=train)
        return out

    def embed_local(self, h: torch.Tensor) -> torch.Tensor:
        """The noise is additive and constant in h: a local step differentiates h."""
        return h

    def report(self) -> dict[str, Any]:
        out: dict[str, Any] = {"std": self.p.std, "at_eval": self.p.at_eval}
        if self.p.eval_metrics:
            out["eval"] = self.probe.report()
        return out
