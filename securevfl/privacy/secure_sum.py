"""Secure summation for CRDP-FL's merged-data statistics (docs/methods/crdp-fl.md §2.5(f), §7.3).

The paper computes the correlated sensitivity ``Delta_CS_p`` and the feature
optimisation over the *merged* data of all organisations, which no organisation
holds (docs/methods/crdp-fl.md §6 item 10). Match counts are additive over disjoint column sets,
so the merged counts are the sum of every organisation's own counts; these
functions compute such sums with CrypTen secret sharing, on CrypTen's
communicator as :func:`securevfl.exchange.crypten_runtime.start_crypten` brings
it up on the session's process group (MPC parties are ranks ``0..n-1``, a
trusted dealer rank serves the correlated randomness that comparisons need).

Who learns what (semi-honest parties, dealer not colluding): every input is
secret-shared by its owner; only the value passed to ``get_plain_text`` is
opened. :func:`secure_sum` opens the sum; :func:`secure_correlated_sensitivity`
thresholds and takes the max row-sum inside MPC, so only the scalar
``Delta_CS_p`` is opened, never a count.

Nothing here truncates. A product of two fixed-point values carries two
fractional scales, and CrypTen divides it back in shares with its local (two
parties) or wraps-based (more) truncation, which silently adds about
+-2^48 with probability |x| / 2^64 per element (docs/design.md §13). CrypTen's
comparisons do such a division too, on every element, when their input has
fractional bits. The correlated sensitivity works on integers, so its counts
are shared at precision 0 (scale 1): comparisons, the 0/1 masks and their
products with the counts stay integers, exact in the ring, and no step divides.
The maximum is a comparison tree of its own (CrypTen's ``max`` breaks ties with
a fixed-point random draw, which would divide again).

Every MPC rank must call these functions at the same point with the same shapes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from securevfl.privacy.correlated import MergedSensitivity, count_threshold, raised_threshold


def _share_sum(
    crypten: Any,
    local: torch.Tensor | None,
    shape: tuple[int, ...],
    sources: Sequence[int],
    *,
    precision: int | None = None,
) -> Any:
    """The sum of every source's ``local``, each secret-shared from its owner, at
    CrypTen's fixed-point precision (``None``: its default, 16 fractional bits) or
    ``precision`` 0 for integers (shared as they are, nothing to truncate later)."""
    rank = crypten.communicator.get().get_rank()
    total = None
    for src in sources:
        t = local if rank == src and local is not None else torch.zeros(shape)
        if precision == 0:
            t = t.double().round()  # integer-valued: encoded exactly at scale 1
        part = crypten.cryptensor(t.float() if precision is None else t, src=src, precision=precision)
        total = part if total is None else total + part
    return total


def _integer_max(crypten: Any, values: Any) -> Any:
    """The maximum of a 1-D shared vector of integers (precision 0) by a tree of
    pairwise comparisons: ceil(log2 n) rounds, each ``b + [a >= b] (a - b)``, all at
    scale 1, so no step truncates (CrypTen's ``max`` would, breaking ties)."""
    v = values
    while v.size(0) > 1:
        half = v.size(0) // 2
        a, b, rest = v[:half], v[half : 2 * half], v[2 * half :]
        top = b + (a >= b) * (a - b)
        v = crypten.cat([top, rest]) if rest.size(0) else top
    return v[0]


def secure_sum(
    crypten: Any,
    local: torch.Tensor | None,
    shape: tuple[int, ...],
    sources: Sequence[int],
    *,
    dst: int | None = None,
) -> torch.Tensor | None:
    """``sum_r local_r`` over the ``sources`` ranks, each term secret-shared from
    its owner; opened to every MPC party (``dst=None``) or to ``dst`` alone
    (others get None). Values are CrypTen fixed point (16 fractional bits): exact
    for integers below 2^46, resolution 1.5e-5 otherwise."""
    if not sources:
        raise ValueError("secure_sum needs at least one source rank")
    total = _share_sum(crypten, local, tuple(shape), sources)
    out = total.get_plain_text(dst=dst)
    rank = crypten.communicator.get().get_rank()
    return out if dst is None or rank == dst else None


def secure_correlated_sensitivity(
    crypten: Any,
    local_counts: torch.Tensor | None,
    n: int,
    sources: Sequence[int],
    *,
    n_features: int,
    w0: float,
    s: float = 1.0,
) -> float:
    """``Delta_CS_p = s max_i sum_j [M_ij >= w0 l] M_ij / l`` of the merged match
    counts ``M = sum_r M_r`` (Eq. 30), with every step after sharing done in MPC
    and only the final scalar opened to every MPC party.

    ``local_counts`` is this rank's ``n x n`` match-count matrix over its own
    columns (None on ranks that contribute nothing), ``n_features`` the merged
    column count ``l``. Counts are integers, shared at precision 0, so the test
    ``M_ij >= w0 l`` is ``M_ij >= ceil(w0 l)`` on integers and the opened maximum
    row sum is exact: no step truncates (module docstring)."""
    if n_features < 1:
        raise ValueError("n_features must be at least 1")
    counts = _share_sum(crypten, local_counts, (n, n), sources, precision=0)
    k0 = count_threshold(w0, n_features)
    mask = counts >= k0
    row = (mask * counts).sum(dim=1)
    top = _integer_max(crypten, row)
    return round(float(top.get_plain_text())) * s / n_features


def secure_merged_sensitivity(
    crypten: Any,
    local: tuple[torch.Tensor, int, float] | None,
    n: int,
    sources: Sequence[int],
    *,
    w0: float,
) -> MergedSensitivity:
    """docs/methods/crdp-fl.md §2.5(e)-(f) across organisations, in MPC: the MPC twin of
    :func:`securevfl.privacy.correlated.merged_correlated_sensitivity`.

    ``local`` is this rank's ``(counts, l_r, mcd_r)``: its ``n x n`` match counts
    over its kept columns of the aligned training rows, its kept column count and
    its own MCD (None on ranks that contribute nothing). Two openings, both to
    every MPC party: the sums ``l = sum_r l_r`` and ``sum_r mcd_r`` (so the
    threshold ``max(w0, mean MCD)`` is public, as the paper shares every MCD in the
    clear), then the scalar ``Delta_CS_p`` at ``s = 1``. No count is opened."""
    if not sources:
        raise ValueError("secure_merged_sensitivity needs at least one source rank")
    stats = None
    if local is not None:
        stats = torch.tensor([float(local[1]), float(local[2])])
    opened = secure_sum(crypten, stats, (2,), sources)
    assert opened is not None
    l_total = round(float(opened[0]))
    mcd = float(opened[1]) / len(sources)
    thr = raised_threshold(w0, mcd)
    counts = None if local is None else torch.as_tensor(local[0])
    delta = secure_correlated_sensitivity(crypten, counts, n, sources, n_features=l_total, w0=thr, s=1.0)
    return MergedSensitivity(delta, l_total, mcd, thr, len(sources))
