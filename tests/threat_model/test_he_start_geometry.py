"""The HE backends' start tells A no more of the geometry of P_i's embeddings (and P_i
no more of that of dL/dz) than a Gaussian start of the same shape.

Under ``ckks`` and ``paillier`` A receives z_i = h'_i W_i at every step, and P_i
receives dL/dh'_i = g W_i^T (g = dL/dz). Neither knows W_i, but if W_i^0 were a
known constant times an orthogonal matrix (the start securevfl had before its
Gaussian one: W_i^0 = c R_A F_P), then for d <= o z_i z_i^T = c^2 h'_i h'_i^T: A
would read the norms, pairwise distances and nearest neighbours of P_i's embedding
rows off z_i at step 0 (and, for d >= o, P_i those of dL/dz off dL/dh'_i). Under a
Gaussian start the same Gram matrix is h'_i h'_i^T distorted by a Wishart matrix
nobody knows.

The attack (each side with what it receives at step 0 of a real run of the protocol:
the registered backend, real keys, one passive party; :mod:`tests.support.he_pair`):
take the received matrix's own Gram matrix as the estimate of the secret's. Scores,
against the truth (used for scoring only): the Gram error, the relative Frobenius
error of the estimate at its best scale (0: the geometry exactly; the attacker is
even given the scale), and the nearest-neighbour agreement, the fraction of rows
whose nearest other row is the same in the estimate as in the truth. Reference: the
same attack on h'_i G (and g G^T) for REFERENCE_DRAWS Gaussian starts G of the same
shape and scale (N(0, 1 / (3 d)) entries) on the same rows; the protocol's start must
score no better than that reference's mean by SIGMAS of its standard deviations.

Measured with B = 64, d = o = 16 (the test's inputs): 2,000 simulated Gaussian starts
score Gram error 0.67 +- 0.032 (lowest 0.56) and agreement 0.29 +- 0.068 (highest
0.53); the bar is about 0.51 and 0.63. The orthogonal start scored Gram error 8e-7
(A) and 3e-6 (P_i) and agreement 1.0 for both sides (``ckks``). The Gaussian start (R_A
G_P, :mod:`securevfl.exchange.he.orthogonal`) over 12 ``ckks`` pair runs on these
inputs: Gram error 0.64 to 0.72 and agreement 0.13 to 0.39 for A, 0.63 to 0.73 and
0.22 to 0.33 for P_i.
"""

from __future__ import annotations

import numpy as np
import pytest

from securevfl.exchange.he.orthogonal import init_std
from securevfl.exchange.paillier import PaillierOptions
from tests.support.he_pair import PairRun, run_pair

pytestmark = pytest.mark.timeout(900)

BATCH, DIM, OUT = 64, 16, 16
REFERENCE_DRAWS = 300
SIGMAS = 5.0


def gram_error(x: np.ndarray, truth: np.ndarray) -> float:
    """min over a of |a X X^T - T T^T|_F / |T T^T|_F for the rows of X and T centred
    (their pairwise distances: what a start could reveal; A can centre z_i as well):
    how far the geometry of what the attacker holds is from the secret's, at the
    attacker's best scale."""
    xc, tc = x - x.mean(axis=0), truth - truth.mean(axis=0)
    e, t = xc @ xc.T, tc @ tc.T
    a = float((e * t).sum() / (e * e).sum())
    return float(np.linalg.norm(a * e - t) / np.linalg.norm(t))


def nearest(x: np.ndarray) -> np.ndarray:
    """Each row's nearest other row (Euclidean)."""
    d2 = ((x[:, None, :] - x[None, :, :]) ** 2).sum(-1)
    np.fill_diagonal(d2, np.inf)
    return d2.argmin(1)


def nn_agreement(x: np.ndarray, truth: np.ndarray) -> float:
    """The fraction of rows whose nearest neighbour in x is their nearest in truth."""
    return float((nearest(x) == nearest(truth)).mean())


def bars(truth: np.ndarray, out: int, rng: np.random.Generator) -> tuple[float, float]:
    """(lowest Gram error, highest agreement) the attack may reach: the reference's
    mean -+ SIGMAS standard deviations, over Gaussian starts truth @ G (G: rows of
    ``truth`` wide, ``out`` columns, N(0, 1 / (3 rows)))."""
    d = truth.shape[1]
    ge, nn = [], []
    for _ in range(REFERENCE_DRAWS):
        x = truth @ (init_std(d) * rng.normal(size=(d, out)))
        ge.append(gram_error(x, truth))
        nn.append(nn_agreement(x, truth))
    return float(np.mean(ge) - SIGMAS * np.std(ge)), float(np.mean(nn) + SIGMAS * np.std(nn))


def inputs(seed: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """One step's h'_i (unit-scale rows) and dL/dz (a mean loss's scale); public test data."""
    rng = np.random.default_rng(seed)
    return [rng.normal(0.0, 1.0, size=(BATCH, DIM))], [rng.normal(0.0, 0.05, size=(BATCH, OUT))]


def attacked(a_sees: np.ndarray, h: np.ndarray, p_sees: np.ndarray, g: np.ndarray) -> list[str]:
    """Both attacks at step 0: A on h'_i from z_i, P_i on dL/dz from dL/dh'_i; what did
    better than the Gaussian reference."""
    rng = np.random.default_rng(1)  # the reference's Gaussian starts
    found = []
    for who, seen, truth, width in (("A", a_sees, h, OUT), ("P_i", p_sees, g, DIM)):
        ge_bar, nn_bar = bars(truth, width, rng)
        ge, nn = gram_error(seen, truth), nn_agreement(seen, truth)
        if ge < ge_bar or nn > nn_bar:
            found.append(
                f"{who} at step 0: Gram error {ge:.3g}, nearest-neighbour agreement {nn:.3f} "
                f"(a Gaussian start: Gram error above {ge_bar:.3f}, agreement below {nn_bar:.3f})"
            )
    return found


def play(run: PairRun, hs: list[np.ndarray], gs: list[np.ndarray]) -> list[str]:
    assert not run.errors, run.errors
    return attacked(run.z[0], hs[0], run.grad[0], gs[0])


def test_the_attack_reads_an_orthogonal_start():
    """Positive control, in numpy: W^0 = c R F (the orthogonal start) gives both sides
    the geometry exactly, and the bar says so; a Gaussian start passes it."""
    hs, gs = inputs(0)
    rng = np.random.default_rng(5)
    st = np.random.default_rng(6)
    q = np.linalg.qr(st.normal(size=(DIM, DIM)))[0] @ np.linalg.qr(st.normal(size=(DIM, OUT)))[0]
    w = np.sqrt(OUT / (3.0 * DIM)) * q
    found = attacked(hs[0] @ w, hs[0], gs[0] @ w.T, gs[0])
    assert len(found) == 2 and all("agreement 1.000" in f for f in found), found
    g = init_std(DIM) * rng.normal(size=(DIM, OUT))
    assert not attacked(hs[0] @ g, hs[0], gs[0] @ g.T, gs[0])


def test_ckks_start_shows_no_more_geometry_than_a_gaussian_start():
    pytest.importorskip("tenseal")
    from securevfl.exchange.ckks import CkksOptions

    hs, gs = inputs(0)
    found = play(run_pair("ckks", CkksOptions(), hs, gs), hs, gs)
    assert not found, "; ".join(found)


@pytest.mark.slow
def test_paillier_start_shows_no_more_geometry_than_a_gaussian_start():
    hs, gs = inputs(0)
    found = play(run_pair("paillier", PaillierOptions(threads=1), hs, gs), hs, gs)
    assert not found, "; ".join(found)
