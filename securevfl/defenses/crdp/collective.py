"""CRDP-FL's collective set-up step: the merged correlated sensitivity
(``delta_scope: merged_secure``, docs/methods/crdp-fl.md §2.5(f), Eq. 30, §7.3).

Match counts are additive over disjoint column sets, so every crdp party
secret-shares its kept columns' count matrix over the aligned training rows (the
same rows in the same order at every party), its column count and its MCD;
parties without crdp (the active party among them) share nothing and so add
zero. The threshold and the max row sum are taken in CrypTen MPC and only the
scalar ``Delta_CS_p`` at ``s = 1``, ``l`` and the mean MCD are opened, to every MPC
party (:mod:`securevfl.privacy.secure_sum`).
"""

from __future__ import annotations

import time

import torch

from securevfl.components import Components
from securevfl.defenses.base import CollectiveContext
from securevfl.defenses.crdp.options import CrdpOptions
from securevfl.privacy.correlated import MergedSensitivity
from securevfl.privacy.secure_sum import secure_merged_sensitivity

#: one party's share of the sum: its kept columns' match counts, their number, its MCD
LocalCounts = tuple[torch.Tensor, int, float]


def crdp_parties(components: Components) -> list[tuple[int, str, CrdpOptions]]:
    """(passive index, name, options) of every passive party running crdp, in
    protocol order (its first crdp entry)."""
    return components.running(CrdpOptions)


def joins(components: Components) -> bool:
    """Every party rank joins when some passive party runs crdp with ``merged_secure``."""
    return any(o.delta_scope == "merged_secure" for _, _, o in crdp_parties(components))


def merged_sensitivity(comm: CollectiveContext, local: LocalCounts | None) -> tuple[MergedSensitivity, float]:
    """Run the secure sum at one party rank (``local``: None where the party runs
    no crdp); returns the opened result and the seconds it took."""
    parties = crdp_parties(comm.components)
    sources = [comm.layout.passive[i].rank for i, _, _ in parties]
    w0 = parties[0][2].w0  # the same at every crdp party (checked at load)
    t0 = time.perf_counter()
    merged = secure_merged_sensitivity(comm.crypten(), local, comm.n_train, sources, w0=w0)
    return merged, time.perf_counter() - t0
