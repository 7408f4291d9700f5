"""Random orthogonal factors for the HE backends' joint start of W_i (pure numpy).

W_i^0 (d x o) is drawn as a product of two secret factors, one per party, each
uniform on its manifold (:mod:`securevfl.exchange.he`, "Start"):

* d >= o: W_i^0 = c R_A F_P, R_A a Haar-random d x d orthogonal matrix drawn by A,
  F_P a uniformly random d x o matrix with orthonormal columns drawn by P_i;
* d < o:  W_i^0 = c F_A R_P, F_A a uniformly random d x o matrix with orthonormal
  rows drawn by A, R_P a Haar-random o x o orthogonal matrix drawn by P_i.

Why each party's factor tells it nothing about W_i^0 (d >= o; the other case is
its transpose): the uniform distribution on the d x o matrices with orthonormal
columns (the Stiefel manifold) is invariant under left multiplication by any
orthogonal matrix and right multiplication by any o x o orthogonal matrix. Given
A's R_A, W_i^0 / c = R_A F_P with F_P uniform is uniform; given P_i's F_P,
R_A F_P with R_A Haar is uniform. So W_i^0 is independent of R_A and independent
of F_P: c times a uniformly random partial isometry, an orthogonal initialisation
(Saxe, McClelland and Ganguli, ICLR 2014). The larger side must carry the Haar
factor: with d > o, a product F_A R_P would keep the column space of A's F_A.

c = sqrt(o / (3 min(d, o))) gives W_i^0 the squared Frobenius norm o / 3 that
torch's default Linear initialisation (variance 1 / (3 d) per entry) has on
average, so the interactive layer starts at the scale ``plain`` does.

Draws come from the party's :class:`~securevfl.csprng.SecretStream`: Gaussian
matrices orthonormalised by QR with the signs of R's diagonal moved into Q,
which makes Q exactly Haar-distributed (Mezzadri, "How to generate random
matrices from the classical compact groups", Notices of the AMS 2007).
"""

from __future__ import annotations

import math

import numpy as np

from securevfl.csprng import SecretStream


def orthonormal_columns(stream: SecretStream, rows: int, cols: int) -> np.ndarray:
    """A uniformly random rows x cols matrix with orthonormal columns (rows >= cols):
    Q of the QR decomposition of a Gaussian matrix, signs fixed so that R has a
    positive diagonal; for rows == cols a Haar-random orthogonal matrix."""
    if rows < cols:
        raise ValueError(f"orthonormal columns need rows >= cols, got {rows} x {cols}")
    q, r = np.linalg.qr(stream.normal_np((rows, cols)))
    signs = np.sign(np.diag(r))
    signs[signs == 0] = 1.0
    return q * signs


def orthonormal_rows(stream: SecretStream, rows: int, cols: int) -> np.ndarray:
    """A uniformly random rows x cols matrix with orthonormal rows (rows <= cols)."""
    return orthonormal_columns(stream, cols, rows).T


def haar(stream: SecretStream, n: int) -> np.ndarray:
    """A Haar-random n x n orthogonal matrix."""
    return orthonormal_columns(stream, n, n)


def gain(d: int, o: int) -> float:
    """c: W_i^0 = c times a partial isometry has squared Frobenius norm o / 3, the mean
    of torch's default Linear initialisation (variance 1 / (3 d) per entry)."""
    return math.sqrt(o / (3.0 * min(d, o)))
