"""``crdp``: CRDP-FL, vertically federated learning with correlated differential
privacy (spec 003; Zhao et al., Electronics 2022).

Threat model (spec 003 §1): the other organisations are honest-but-curious and
try to infer records from what an organisation releases during training. The
organisation itself sees its raw rows (central DP at organisation level; the
paper's "LDP" label is wrong, §6 item 8).

Mapping onto securevfl's split model: an organisation is a passive party; the
paper's released intermediate ``Phi_k = h_k(D_k; theta_k)`` is the party's
bottom-model output ``h``, and what crosses the wire is ``h' = h + Lap(b)`` with
``b = Delta / eps3`` per element on every training step (Algorithm 5, line 9).
Under ``mpc``/``ckks``/``paillier`` that noisy ``h'`` is additionally hidden
inside the secure interactive layer. Before training, :meth:`select_features`
runs Algorithm 1 on the party's training rows (stability selection, the DP
Pearson filter with ``eps1``, the MCD-raised threshold, the exponential-mechanism
feature optimisation with ``eps2``) and keeps the chosen columns for train and
test alike. Pure math: :mod:`securevfl.privacy.correlated`,
:mod:`securevfl.privacy.feature_selection`.

Faithful defaults reproduce the paper's choices; ``variant: fixed`` (or the
individual options) switch to spec 003's fixes: ``pearson: strict`` (global
sensitivity 2, eps1 split over the pairs), ``delta_u: strict`` (the utility's real
sensitivity), ``sensitivity: clipped`` (each coordinate of ``h`` clipped, so the
record sensitivity ``s`` holds).

``delta_scope`` says whose columns ``Delta_CS_p`` (the noise scale) is computed
on: ``own`` (default) the party's kept columns alone; ``merged_secure`` the
merged data of every crdp party's kept columns (spec 003 §2.5(f), Eq. 30), via the
defense's collective set-up step: match counts are additive over disjoint
column sets, so the parties secret-share their count matrices in CrypTen, the
threshold and the max row sum are taken in MPC, and only the scalar is opened
(spec 003 §7.3; :mod:`securevfl.privacy.secure_sum`). It needs the ``mpc``
backend (CrypTen and its TTP dealer are already up there) and is refused at load
under any other backend.
"""

from __future__ import annotations

import math
import time
from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field, field_validator

from securevfl.config import Protocol
from securevfl.data.datasets import feature_columns
from securevfl.data.partition import resolve_partition
from securevfl.defenses.base import DEFENSES, CollectiveContext, Defense, DefenseContext, DefenseOptions
from securevfl.errors import ConfigError, DataError, ProtocolError, UnsupportedCombination
from securevfl.privacy.accountant import EpsDeltaRelease, LaplaceRelease, Mechanism, Plan, Release
from securevfl.privacy.correlated import (
    MergedSensitivity,
    UnboundedRelease,
    communication_scale,
    laplace_noise,
    match_counts,
    paper_epsilon,
    quantile_codes,
    record_sensitivity,
    sound_epsilon,
    utility_sensitivity,
)
from securevfl.privacy.feature_selection import (
    Selection,
    SelectionConfig,
    pca_leverage_selector,
    select_features,
)
from securevfl.privacy.secure_sum import secure_merged_sensitivity
from securevfl.seeding import derive_seed


class CrdpOptions(DefenseOptions):
    """CRDP-FL's parameters (spec 003 Table 1 and its [GAP] defaults)."""

    variant: Literal["faithful", "fixed"] = "faithful"
    eps1: float = Field(1.0, gt=0, description="Pearson-filter budget (inf: no noise)")
    eps2: float = Field(1.0, gt=0, description="exponential-mechanism budget (inf: argmax)")
    eps3: float = Field(1.0, gt=0, description="communication budget per release (inf: no noise)")
    theta: float = Field(0.5, ge=0, le=1, description="stability threshold on S_i")
    theta_per: float = Field(0.9, ge=0, le=1, description="Pearson redundancy threshold")
    w0: float = Field(0.4, ge=0, le=1, description="initial correlation threshold")
    b: float = Field(0.5, gt=0, le=1, description="candidate size as a share of beta")
    m: int = Field(10, ge=1, description="number of candidate feature sets")
    q: int = Field(10, ge=2, description="quantile bins for record correlation")
    n_subsets: int = Field(5, ge=1)
    subsets: Literal["shards", "subsamples"] = "shards"
    base_selector: Literal["pca_leverage"] = "pca_leverage"
    pca_variance: float = Field(0.9, gt=0, le=1)
    beta_includes_unimportant: bool = True
    mcd_parts: int = Field(1, ge=1, description="column parts the MCD averages over")
    utility: Literal["difference", "ratio"] = "difference"
    pearson: Literal["paper", "strict"] | None = None
    delta_u: Literal["paper", "strict"] | None = None
    sensitivity: Literal["unit", "clipped"] | None = None
    clip: float = Field(1.0, gt=0, description="coordinate clip of h when sensitivity is clipped")
    noise: Literal["correlated", "count", "plain"] = "correlated"
    feature_selection: bool = True
    noise_at_eval: bool = False
    delta_scope: Literal["own", "merged_secure"] = Field(
        "own",
        description="Delta_CS_p on the party's own kept columns, or on every crdp party's merged "
        "kept columns, computed in CrypTen MPC (mpc backend only)",
    )

    @field_validator("eps1", "eps2", "eps3", mode="before")
    @classmethod
    def _null_is_infinite(cls, v: Any) -> Any:
        """A protocol writes "no noise" as ``null`` (non-finite numbers are refused at
        load); internally it is eps = inf."""
        return math.inf if v is None else v

    def resolved(self, name: str) -> str:
        """A flaw option's value: as given, else the variant's choice."""
        value = getattr(self, name)
        if value is not None:
            return value
        fixed = {"pearson": "strict", "delta_u": "strict", "sensitivity": "clipped"}
        faithful = {"pearson": "paper", "delta_u": "paper", "sensitivity": "unit"}
        return (fixed if self.variant == "fixed" else faithful)[name]


class Crdp(Defense):
    """CRDP-FL at one passive party (spec 003 §2.3-2.8): private feature selection
    before training, Laplace noise calibrated to the correlated sensitivity on
    every released embedding during training."""

    name = "crdp"
    sides = frozenset({"passive"})
    requires = frozenset()
    options = CrdpOptions

    def __init__(self, params: CrdpOptions, ctx: DefenseContext):
        super().__init__(params, ctx)
        self.p: CrdpOptions = params
        spec = (
            next(s for s in ctx.proto.parties.passive if s.name == ctx.party)
            if ctx.side == "passive"
            else None
        )
        self.d_out = spec.model.out if spec is not None and spec.model is not None else 1
        self.width = _party_width(ctx)
        self.s = record_sensitivity(self.p.resolved("sensitivity"), d_out=self.d_out, clip=self.p.clip)
        self.selection: Selection | None = None
        self.keep: list[int] | None = None
        self.scale: float | None = None
        self.merged: MergedSensitivity | None = None
        self.merged_seconds: float | None = None
        self._own_counts: np.ndarray | None = None  # kept columns' match counts (merged_secure only)
        self._noise_rng = np.random.default_rng(derive_seed(ctx.noise_seed, "crdp", "noise"))  # private
        self.releases = 0

    # -- data ------------------------------------------------------------------------
    def select_features(self, x: np.ndarray, columns: list[str]) -> tuple[np.ndarray, list[str]]:
        """First call (the training rows): run Algorithm 1 and fix the columns;
        every later call (the test rows) applies the same columns."""
        if x.shape[1] != len(columns):
            raise DataError(f"crdp at '{self.ctx.party}': {x.shape[1]} columns but {len(columns)} names")
        if self.keep is None:
            self._decide(np.asarray(x, dtype=np.float64), columns)
        assert self.keep is not None
        if max(self.keep, default=-1) >= x.shape[1]:
            raise DataError(f"crdp at '{self.ctx.party}': test rows have fewer columns than training rows")
        return x[:, self.keep], [columns[i] for i in self.keep]

    def _decide(self, x: np.ndarray, columns: list[str]) -> None:
        p = self.p
        cfg = SelectionConfig(
            theta=p.theta,
            theta_per=p.theta_per,
            eps1=p.eps1,
            eps2=p.eps2,
            w0=p.w0,
            b=p.b,
            m=p.m,
            q=p.q,
            n_subsets=p.n_subsets,
            subsets=p.subsets,
            pearson=p.resolved("pearson"),
            utility=p.utility,
            delta_u=p.resolved("delta_u"),
            beta_includes_unimportant=p.beta_includes_unimportant,
            s=self.s,
            mcd_parts=p.mcd_parts,
            select=p.feature_selection,
        )
        rng = np.random.default_rng(derive_seed(self.ctx.noise_seed, "crdp", "select"))  # private
        self.selection = select_features(x, cfg, rng, selector=pca_leverage_selector(p.pca_variance))
        self.keep = list(self.selection.alpha_final)
        if p.delta_scope == "merged_secure":  # same bins as the selection: per-column q-quantiles
            self._own_counts = match_counts(quantile_codes(x, p.q)[:, self.keep])
        delta = {
            "correlated": self.selection.delta_cs_p,
            "count": self.selection.delta_gs,
            "plain": self.s,
        }[p.noise]
        self.scale = communication_scale(delta, p.eps3)

    # -- training --------------------------------------------------------------------
    def embed(self, h: torch.Tensor, *, train: bool) -> torch.Tensor:
        """Clip (``sensitivity: clipped``), then add fresh i.i.d. Laplace noise to
        the copy that is sent; the party's own ``h`` is never noised in place."""
        if self.scale is None:
            raise ProtocolError("crdp: embed called before select_features decided the noise scale")
        if self.p.delta_scope == "merged_secure" and self.merged is None:
            raise ProtocolError("crdp: delta_scope merged_secure but the collective step never ran")
        if self.p.resolved("sensitivity") == "clipped":
            h = h.clamp(-self.p.clip, self.p.clip)
        if (train or self.p.noise_at_eval) and self.scale > 0:
            noise = laplace_noise(tuple(h.shape), self.scale, self._noise_rng)
            h = h + torch.as_tensor(noise, dtype=h.dtype, device=h.device)
        if train:
            self.releases += 1
        return h

    def embed_local(self, h: torch.Tensor) -> torch.Tensor:
        """A local step's own recomputation: the clipping, without the noise."""
        if self.p.resolved("sensitivity") == "clipped":
            return h.clamp(-self.p.clip, self.p.clip)
        return h

    # -- the merged sensitivity (collective set-up, spec 003 §2.5(f), §7.3) ---------------
    @classmethod
    def joins_collective(cls, proto: Protocol) -> bool:
        """Every party rank joins when some passive party runs crdp with ``merged_secure``."""
        return any(o.delta_scope == "merged_secure" for _, _, o in _crdp_parties(proto))

    @classmethod
    def collective(cls, comm: CollectiveContext, mine: list[Defense]) -> None:
        """Every MPC party runs this at the same point: each crdp party secret-shares
        its kept columns' match counts over the aligned training rows (the same rows
        in the same order at every party), its column count and its MCD; parties
        without crdp (the active party among them) share nothing and so add zero.
        Only ``l``, the mean MCD and ``Delta_CS_p`` at ``s = 1`` are opened, to every
        MPC party; each crdp party then scales by its own ``s``."""
        parties = _crdp_parties(comm.proto)
        sources = [comm.layout.passive[i].rank for i, _, _ in parties]
        w0 = parties[0][2].w0  # the same at every crdp party (checked at load)
        local = None
        for d in mine:
            assert isinstance(d, Crdp)
            if d.keep is None or d._own_counts is None or d.selection is None:
                raise ProtocolError("crdp: the collective step ran before select_features")
            if d._own_counts.shape != (comm.n_train, comm.n_train):
                raise ProtocolError(
                    f"crdp at '{comm.party}': counts over {d._own_counts.shape[0]} rows, "
                    f"but the run has {comm.n_train} training rows"
                )
            local = (torch.as_tensor(d._own_counts), len(d.keep), d.selection.mcd)
        t0 = time.perf_counter()
        merged = secure_merged_sensitivity(comm.crypten(), local, comm.n_train, sources, w0=w0)
        seconds = time.perf_counter() - t0
        for d in mine:
            assert isinstance(d, Crdp)
            d._use_merged(merged, seconds)

    def _use_merged(self, merged: MergedSensitivity, seconds: float) -> None:
        self.merged = merged
        self.merged_seconds = seconds
        self._own_counts = None
        self.scale = communication_scale(merged.delta_unit * self.s, self.p.eps3)

    @property
    def delta_used(self) -> float | None:
        """The sensitivity the communication noise is calibrated to (None before set-up)."""
        if self.merged is not None:
            return self.merged.delta_unit * self.s
        if self.selection is None:
            return None
        return {
            "correlated": self.selection.delta_cs_p,
            "count": self.selection.delta_gs,
            "plain": self.s,
        }[self.p.noise]

    @classmethod
    def check(
        cls, proto: Protocol, params: Any, *, backend: Any, path: str, source: str | None = None
    ) -> None:
        """``merged_secure`` needs CrypTen with a TTP dealer (the ``mpc`` backend,
        provider TTP), the correlated noise, and every crdp party on the same
        scope and ``w0`` (the merged data has one threshold)."""
        assert isinstance(params, CrdpOptions)
        if params.delta_scope != "merged_secure":
            if any(o.delta_scope == "merged_secure" for _, _, o in _crdp_parties(proto)):
                raise ConfigError(
                    "every crdp party must use the same delta_scope: the merged data is made of all "
                    "their columns",
                    path=f"{path}.params.delta_scope",
                    source=source,
                )
            return
        where = f"{path}.params.delta_scope"
        if "mpc" not in backend.capabilities:
            raise UnsupportedCombination(
                f"crdp delta_scope 'merged_secure' sums the parties' match counts in CrypTen MPC, "
                f"which backend '{backend.name}' does not run (no CrypTen communicator, no dealer rank); "
                "use backend 'mpc', or delta_scope 'own'",
                path=where,
                source=source,
            )
        if proto.exchange.params.get("provider", "TTP") != "TTP":
            raise UnsupportedCombination(
                "crdp delta_scope 'merged_secure' compares secret-shared counts, which needs a "
                "trusted dealer's correlated randomness; under provider TFP rank 0 (the active "
                "party) would generate it and could open every count: use provider TTP",
                path=where,
                source=source,
            )
        if params.noise != "correlated":
            raise ConfigError(
                f"delta_scope 'merged_secure' computes the merged Delta_CS_p, which only noise "
                f"'correlated' uses (got noise '{params.noise}')",
                path=f"{path}.params.noise",
                source=source,
            )
        w0s = {o.w0 for _, _, o in _crdp_parties(proto)}
        if len(w0s) > 1:
            raise ConfigError(
                f"with delta_scope 'merged_secure' every crdp party needs the same w0 (got {sorted(w0s)}): "
                "the merged data has one threshold",
                path=f"{path}.params.w0",
                source=source,
            )

    # -- accounting ------------------------------------------------------------------
    def mechanisms(self, plan: Plan) -> list[Mechanism]:
        """The three releases of spec 003 §2.8 about one training record, composed
        soundly by the shared accountant; the paper's own figures are in ``claim``.

        Data-independent bounds (so every rank can plan a budget): the Pearson
        count uses the party's column count, the communication scale uses
        ``Delta >= s``, which holds for the own and the merged ``Delta_CS_p`` alike
        (the self term). The claim names the ``delta_scope``; the value used is in
        :meth:`report` (``delta_used``), since it depends on the data."""
        p = self.p
        t = plan.communication_rounds  # the paper's t: one per step, or per R (training.local_steps)
        n_orgs = sum(any(d.name == self.name for d in s.defenses) for s in self.ctx.proto.parties.passive)
        paper_total = paper_epsilon(p.eps1, p.eps2, p.m, p.eps3, t)
        spec_sound = sound_epsilon(n_orgs, p.eps1, p.eps2, p.eps3, t)
        total = {
            "paper_total_epsilon": paper_total,
            "paper_total_formula": "max(eps1, m*eps2 + t*eps3)",
            "spec_sound_epsilon": spec_sound,
            "spec_sound_formula": "N*eps1 + eps2 + t*eps3 (paper's sensitivities taken at face value)",
            "t": t,
            "m": p.m,
            "N": n_orgs,
        }
        out = []
        if p.feature_selection:
            out.append(
                Mechanism(
                    "crdp.pearson",
                    (self._pearson_release(),),
                    claim={"epsilon": p.eps1, "statement": "Pearson + Laplace is eps1-DP", **total},
                    notes=_pearson_notes(p.resolved("pearson")),
                )
            )
            out.append(
                Mechanism(
                    "crdp.feature_optimization",
                    (self._em_release(plan.n_train),),
                    claim={
                        "epsilon": p.m * p.eps2,
                        "statement": "the exponential mechanism is m*eps2-DP",
                        **total,
                    },
                    notes=(
                        "the stability selection, the MCD and the candidate sensitivities are computed "
                        "from the data without noise and are not covered",
                    ),
                )
            )
        out.append(
            Mechanism(
                "crdp.communication",
                (self._communication_release(plan.record_releases),),
                claim={
                    "epsilon": t * p.eps3,
                    "statement": "t rounds at eps3 each (a round's R batches are disjoint rows)",
                    "delta_scope": p.delta_scope,  # its data-dependent value: report()["delta_used"]
                    **total,
                },
                notes=self._communication_notes(),
            )
        )
        return out

    def _pearson_release(self) -> Release:
        p = self.p
        if math.isinf(p.eps1):
            return UnboundedRelease(count=1, reason="eps1 = inf: coefficients released without noise")
        if self.p.resolved("pearson") == "strict":
            return EpsDeltaRelease(count=1, epsilon=p.eps1)
        if self.width is None:
            return UnboundedRelease(count=1, reason="column count unknown at plan time")
        pairs = max(1, self.width * (self.width - 1) // 2)
        # each coefficient: Lap(1/eps1) against a true sensitivity of 2, i.e. 2 eps1-DP; basic
        # composition over the pairs (a PLD of dozens of Laplace releases costs ~10 s per party)
        return EpsDeltaRelease(count=1, epsilon=2.0 * p.eps1 * pairs)

    def _em_release(self, n: int) -> Release:
        p = self.p
        if math.isinf(p.eps2):
            return UnboundedRelease(count=1, reason="eps2 = inf: the least-sensitive candidate is taken")
        true_du = utility_sensitivity(p.utility, n=n, s=self.s, w0=p.w0)
        used_du = 1.0 if p.resolved("delta_u") == "paper" else true_du
        return EpsDeltaRelease(count=1, epsilon=p.eps2 * true_du / used_du)

    def _communication_release(self, count: int) -> Release:
        if math.isinf(self.p.eps3):
            return UnboundedRelease(count=count, reason="eps3 = inf: embeddings released without noise")
        if self.p.resolved("sensitivity") == "unit":
            return UnboundedRelease(count=count, reason="s = 1 is assumed but nothing bounds a record's h")
        # scale Delta/eps3 with Delta >= s (the self term): at least 1/eps3 relative to s
        return LaplaceRelease(count=count, scale=1.0 / self.p.eps3)

    def _communication_notes(self) -> tuple[str, ...]:
        notes = [
            "record-level replace-one DP of each released row; correlated records are covered "
            "only through the data-dependent Delta (local sensitivity), which is itself not protected",
            "the bottom model depends on earlier training records; that dependence is not covered",
        ]
        if not self.p.noise_at_eval:
            notes.append("test rows' embeddings are released without noise at evaluation")
        if self.p.resolved("sensitivity") == "unit":
            notes.append("sensitivity 'unit' leaves h unclipped: no finite record-level guarantee")
        if self.p.delta_scope == "merged_secure":
            notes.append(
                "Delta_CS_p is of the merged data of every crdp party's kept columns, computed in CrypTen "
                "MPC; the scalar, the mean MCD and the total column count are opened to every MPC party "
                "without noise"
            )
        else:
            notes.append("Delta_CS_p is of this party's own kept columns (delta_scope 'own')")
        return tuple(notes)

    def report(self) -> dict[str, Any]:
        sel = self.selection
        if sel is None:
            return {}
        return {
            "variant": self.p.variant,
            "pearson": self.p.resolved("pearson"),
            "delta_u_mode": self.p.resolved("delta_u"),
            "sensitivity": self.p.resolved("sensitivity"),
            "noise": self.p.noise,
            "record_sensitivity_s": self.s,
            "stability_scores": sel.scores,
            "important": sel.important,
            "alpha": sel.alpha,
            "beta": sel.beta,
            "moved_by_pearson": sel.moved,
            "pearson_scale": sel.pearson_scale,
            "mcd": sel.mcd,
            "w0_raised": sel.w0_raised,
            "candidates": sel.candidates,
            "candidate_delta_cs_p": sel.candidate_cs,
            "em_probabilities": sel.em_probabilities,
            "delta_u": sel.delta_u,
            "chosen_candidate": sel.chosen,
            "alpha_final": sel.alpha_final,
            "columns_kept": len(sel.alpha_final),
            "delta_cs": sel.delta_cs,
            "delta_cs_p": sel.delta_cs_p,
            "delta_gs": sel.delta_gs,
            "laplace_scale": self.scale,
            "noised_releases": self.releases,
            "delta_scope": self.p.delta_scope,
            "delta_used": self.delta_used,
            "merged": None
            if self.merged is None
            else {
                "delta_cs_p": self.merged.delta_unit * self.s,
                "delta_cs_p_unit": self.merged.delta_unit,
                "columns": self.merged.n_features,
                "mcd": self.merged.mcd,
                "threshold": self.merged.threshold,
                "parties": self.merged.parties,
                "seconds": self.merged_seconds,
            },
        }


def _pearson_notes(mode: str) -> tuple[str, ...]:
    if mode == "paper":
        return (
            "paper mode: Lap(1/eps1) per coefficient; the sound figure uses sensitivity 2 per coefficient "
            "and basic composition over every pair of the party's columns",
        )
    return ("strict mode: sensitivity 2, eps1 split over the pairs by basic composition",)


def _crdp_parties(proto: Protocol) -> list[tuple[int, str, CrdpOptions]]:
    """(passive index, name, options) of every passive party running crdp, in
    protocol order (its first crdp entry)."""
    out = []
    for i, spec in enumerate(proto.parties.passive):
        d = next((d for d in spec.defenses if d.name == "crdp"), None)
        if d is not None:
            out.append((i, spec.name, CrdpOptions.model_validate(d.params)))
    return out


def _party_width(ctx: DefenseContext) -> int | None:
    """The party's column count from the protocol alone (None when only its file knows)."""
    proto = ctx.proto
    spec = next((s for s in proto.parties.passive if s.name == ctx.party), None)
    if spec is None:
        return None
    if spec.source is not None:
        fc = spec.source.feature_columns
        return len(fc) if fc is not None else None
    cols = feature_columns(proto.dataset.name, proto.dataset)
    if cols is None:
        return None
    return len(resolve_partition(proto, cols)[ctx.party])


DEFENSES.add("crdp", Crdp)
