"""The ``crdp`` defense at one passive party: private feature selection before
training, Laplace noise calibrated to the correlated sensitivity on every
released embedding, and the load-time checks. Its accounting is
:mod:`.accounting`, its collective step :mod:`.collective`."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch

import securevfl.defenses.crdp.collective as collective
from securevfl.components import Components
from securevfl.config import Protocol
from securevfl.data.catalog import feature_columns
from securevfl.data.partition import resolve_partition
from securevfl.defenses.base import CollectiveContext, Defense, DefenseContext
from securevfl.defenses.crdp.accounting import crdp_mechanisms, crdp_prediction_mechanisms
from securevfl.defenses.crdp.options import CrdpOptions
from securevfl.errors import ConfigError, DataError, ProtocolError, UnsupportedCombination
from securevfl.exchange.mpc import MpcOptions
from securevfl.privacy.accountant import Mechanism, Plan
from securevfl.privacy.correlated import (
    MergedSensitivity,
    communication_scale,
    laplace_noise,
    match_counts,
    quantile_codes,
    record_sensitivity,
)
from securevfl.privacy.feature_selection import (
    Selection,
    SelectionConfig,
    pca_leverage_selector,
    select_features,
)
from securevfl.snapshot import ComponentState, capture_attributes, restore_attributes


class Crdp(Defense[CrdpOptions]):
    """CRDP-FL at one passive party (docs/methods/crdp-fl.md §2.3-2.8): private feature selection
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
        self._noise_rng = ctx.noise_stream("crdp", "noise")  # private
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
        rng = self.ctx.noise_stream("crdp", "select")  # private
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

    # -- the merged sensitivity (collective set-up, docs/methods/crdp-fl.md §2.5(f), §7.3) ---------------
    @classmethod
    def joins_collective(cls, proto: Protocol, components: Components) -> bool:
        """Every party rank joins when some passive party runs crdp with ``merged_secure``."""
        return collective.joins(components)

    @classmethod
    def collective(cls, comm: CollectiveContext, mine: list[Defense[Any]]) -> None:
        """Every MPC party runs this at the same point (:mod:`.collective`): each
        crdp party contributes its kept columns' match counts, column count and
        MCD, the others nothing; each crdp party then scales the opened
        ``Delta_CS_p`` at ``s = 1`` by its own ``s``."""
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
        merged, seconds = collective.merged_sensitivity(comm, local)
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
        """``merged_secure`` needs CrypTen (a backend offering ``mpc``) and the
        correlated noise; what it needs of the other parties and of the backend's
        options is checked by :meth:`cross_check`."""
        assert isinstance(params, CrdpOptions)
        if params.delta_scope != "merged_secure":
            return
        if "mpc" not in backend.capabilities:
            raise UnsupportedCombination(
                f"crdp delta_scope 'merged_secure' sums the parties' match counts in CrypTen MPC, "
                f"which backend '{backend.name}' does not run (no CrypTen communicator, no dealer rank); "
                "use backend 'mpc', or delta_scope 'own'",
                path=f"{path}.params.delta_scope",
                source=source,
            )
        if params.noise != "correlated":
            raise ConfigError(
                f"delta_scope 'merged_secure' computes the merged Delta_CS_p, which only noise "
                f"'correlated' uses (got noise '{params.noise}')",
                path=f"{path}.params.noise",
                source=source,
            )

    @classmethod
    def cross_check(
        cls, proto: Protocol, components: Components, params: Any, *, path: str, source: str | None = None
    ) -> None:
        """Every crdp party on the same scope and, with ``merged_secure``, the same
        ``w0`` (the merged data has one threshold) and the ``mpc`` backend's TTP
        dealer (its correlated randomness)."""
        assert isinstance(params, CrdpOptions)
        crdp = collective.crdp_parties(components)
        where = f"{path}.params.delta_scope"
        if params.delta_scope != "merged_secure":
            if any(o.delta_scope == "merged_secure" for _, _, o in crdp):
                raise ConfigError(
                    "every crdp party must use the same delta_scope: the merged data is made of all "
                    "their columns",
                    path=where,
                    source=source,
                )
            return
        mpc = components.exchange_options(MpcOptions)
        if mpc is not None and mpc.provider != "TTP":
            raise UnsupportedCombination(
                "crdp delta_scope 'merged_secure' compares secret-shared counts, which needs a "
                "trusted dealer's correlated randomness; under provider TFP rank 0 (the active "
                "party) would generate it and could open every count: use provider TTP",
                path=where,
                source=source,
            )
        w0s = {o.w0 for _, _, o in crdp}
        if len(w0s) > 1:
            raise ConfigError(
                f"with delta_scope 'merged_secure' every crdp party needs the same w0 (got {sorted(w0s)}): "
                "the merged data has one threshold",
                path=f"{path}.params.w0",
                source=source,
            )

    # -- accounting ------------------------------------------------------------------
    def mechanisms(self, plan: Plan) -> list[Mechanism]:
        """The three releases of docs/methods/crdp-fl.md §2.8 (:func:`.accounting.crdp_mechanisms`).
        The claim names the ``delta_scope``; the value used is in :meth:`report`
        (``delta_used``), since it depends on the data."""
        n_orgs = len(collective.crdp_parties(self.ctx.components))
        return crdp_mechanisms(self.p, plan, width=self.width, s=self.s, n_orgs=n_orgs)

    def prediction_mechanisms(self) -> list[Mechanism]:
        """One prediction releases each predicted record's embedding once
        (:func:`.accounting.crdp_prediction_mechanisms`); the selection's releases
        are of the training rows and are not repeated."""
        return crdp_prediction_mechanisms(self.p)

    def public_report(self) -> dict[str, Any]:
        """The options, the modes they resolve to and the record sensitivity ``s``
        they give (all from the protocol). Everything the selection and the noise
        scale computed from the data is in :meth:`report`, the party's own."""
        return {
            **super().public_report(),
            "pearson": self.p.resolved("pearson"),
            "delta_u_mode": self.p.resolved("delta_u"),
            "sensitivity": self.p.resolved("sensitivity"),
            "record_sensitivity_s": self.s,
        }

    # -- state ------------------------------------------------------------------------
    def checkpoint_state(self) -> ComponentState:
        """The default state plus the merged sensitivity of a ``merged_secure`` run (a
        value every crdp party opened in the collective step), so a saved model's copy
        (prediction, ``securevfl audit``) adds noise at the scale the run used."""
        state = capture_attributes(self)
        if self.merged is not None:
            state.meta["merged"] = dataclasses.asdict(self.merged)
        return state

    def restore(self, state: ComponentState) -> None:
        meta = dict(state.meta)
        merged = meta.pop("merged", None)
        restore_attributes(
            self,
            ComponentState(dict(state.tensors), meta),
            owner=f"defense 'crdp' of party '{self.ctx.party}'",
        )
        if merged is not None:
            self.merged = MergedSensitivity(**merged)

    def report(self) -> dict[str, Any]:
        """The party's own account of its selection and noise (docs/methods/crdp-fl.md, "What
        is reported"): scores, candidates and their sensitivities, the exponential
        mechanism's probabilities, the MCD, the chosen columns and the noise scale.
        All computed from its data: kept by the party, sent nowhere."""
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
