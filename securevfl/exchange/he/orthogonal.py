"""The two parties' secret factors of the HE backends' joint start of W_i (pure numpy).

W_i^0 (d x o) is the product of a factor from each party
(:mod:`securevfl.exchange.he.protocol`, "Start")::

    W_i^0 = R_A G_P      R_A: a Haar-random d x d orthogonal matrix drawn by A,
                         G_P: a d x o matrix of independent N(0, 1 / (3 d)) entries drawn by P_i.

It is a Gaussian initialisation: the law of a matrix of independent centred Gaussians is
invariant under any orthogonal map of its columns' space, so for every fixed R_A the
product R_A G_P has G_P's law. Hence W_i^0 is exactly a d x o matrix of independent
N(0, 1 / (3 d)) entries (the variance of torch's default Linear initialisation, so
the interactive layer starts at the scale ``plain`` does), and it is independent of
A's R_A: A's view of the start is its own factor, its own masks and masked values
(the protocol's), and W_i^0 is distributed given all of it as a fresh Gaussian start.
So what A then receives, z_i = h'_i W_i^0 at step 0, is distributed as under a Gaussian
start of the same shape drawn by someone else: a random Gaussian projection of P_i's
embedding rows, whose Gram matrix h W W^T h^T is h h^T distorted by a Wishart matrix A
does not know.

P_i knows G_P, so it knows W_i^0 up to A's unknown rotation R_A of its column space:
W_i^0 = U S V^T with S and V known to P_i (those of G_P) and U uniformly random to it.
What P_i receives, dL/dh'_i = g W^T = g V S U^T (g = dL/dz), then has the law it has
under a Gaussian start, and knowing V S does not undo U: the Gram matrix of what it
gets, g V S^2 V^T g^T, is g g^T distorted by the (Wishart) metric V S^2 V^T, which
P_i cannot remove without g itself. P_i's view has the same form as under the
orthogonal start this replaces (W_i^0 = c R_A F_P, F_P with orthonormal columns:
P_i knew W up to R_A), with one difference that is the point of the change: there
W's singular values were all c, so W W^T (d <= o) or W^T W (d >= o) was c^2 times
the identity and z_i (or dL/dh'_i) was an exactly scaled rotation of P_i's embedding
rows (of dL/dz), their norms, distances and nearest neighbours included; here they
are a Gaussian matrix's (tests/threat_model/test_he_start_geometry.py plays both
attacks against a Gaussian start of the same shape).

Draws come from the party's :class:`~securevfl.csprng.SecretStream`: a Gaussian matrix
orthonormalised by QR with the signs of R's diagonal moved into Q, which makes Q
exactly Haar-distributed (Mezzadri, "How to generate random matrices from the
classical compact groups", Notices of the AMS 2007).
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


def haar(stream: SecretStream, n: int) -> np.ndarray:
    """A Haar-random n x n orthogonal matrix: A's factor R_A (n = d)."""
    return orthonormal_columns(stream, n, n)


def init_std(d: int) -> float:
    """The standard deviation of W_i^0's entries: sqrt(1 / (3 d)), that of torch's
    default Linear initialisation (uniform on +-1 / sqrt(d)) for d inputs."""
    return 1.0 / math.sqrt(3.0 * d)


def gaussian_factor(stream: SecretStream, d: int, o: int) -> np.ndarray:
    """P_i's factor G_P: d x o independent N(0, 1 / (3 d)) entries."""
    return init_std(d) * stream.normal_np((d, o))
