"""The HE backends' joint start of W_i (:mod:`securevfl.exchange.he.orthogonal`,
:mod:`securevfl.exchange.he.protocol`, "Start").

W_i^0 = R_A G_P: A's Haar-random d x d orthogonal matrix times P_i's d x o matrix
of independent N(0, 1 / (3 d)) entries. The security argument rests on one fact,
tested here numerically: with R_A held fixed (A's view), the product has G_P's
Gaussian law, so it is independent of A's factor. Then the protocol: in a real
pair run the two shares add up to a matrix at the Gaussian start's scale whose
singular values are spread as a Gaussian matrix's (not the equal ones of a scaled
orthogonal matrix), while neither share is it.
tests/threat_model/test_he_initial_shares.py plays the attacks on the shares,
tests/threat_model/test_he_start_geometry.py those on the start's geometry.
"""

from __future__ import annotations

import numpy as np
import pytest

from securevfl.csprng import SecretStream
from securevfl.exchange.he.orthogonal import gaussian_factor, haar, init_std, orthonormal_columns
from securevfl.exchange.paillier import PaillierOptions
from tests.support.he_pair import run_pair


@pytest.mark.parametrize(("rows", "cols"), [(16, 16), (16, 8), (7, 3)])
def test_factors_are_orthonormal(rows, cols):
    st = SecretStream.from_seed(0, "test-orthogonal")
    q = orthonormal_columns(st, rows, cols)
    np.testing.assert_allclose(q.T @ q, np.eye(cols), atol=1e-12)
    h = haar(st, rows)
    np.testing.assert_allclose(h @ h.T, np.eye(rows), atol=1e-12)
    with pytest.raises(ValueError):
        orthonormal_columns(st, cols - 1, cols)


@pytest.mark.parametrize(("d", "o"), [(64, 64), (64, 16), (16, 64), (30, 10)])
def test_the_gaussian_factor_has_torch_s_linear_scale(d, o):
    """Entries of variance 1 / (3 d), that of torch's default Linear initialisation
    (uniform on +-1 / sqrt(d)): over 200 draws of d o entries the variance estimate's
    relative sd is sqrt(2 / (200 d o)) <= 0.008 (d o >= 300); 0.05 here."""
    st = SecretStream.from_seed(1, "test-gaussian")
    g = np.stack([gaussian_factor(st, d, o) for _ in range(200)])
    assert float(g.var()) == pytest.approx(1.0 / (3.0 * d), rel=0.05)
    assert init_std(d) == pytest.approx(
        np.std(np.random.default_rng(0).uniform(-1, 1, 10**6)) / np.sqrt(d), rel=0.01
    )


def _second_moments(draw, n: int) -> np.ndarray:
    """The empirical E[vec(W) vec(W)^T] over n draws."""
    v = np.stack([draw().ravel() for _ in range(n)])
    return v.T @ v / n


def test_the_product_does_not_depend_on_a_s_factor():
    """W = R G with R Haar (d x d) and G Gaussian (d x o): holding R fixed (what A
    knows), G's randomness makes W Gaussian with G's second moments E[W_ij W_kl] =
    delta_ik delta_jl / (3 d) (and mean 0: no linear estimate of W from R). Over 20,000
    draws the largest deviation was 0.0013 to 0.0016 in five runs (entries 1 / (3 d) =
    0.056); 0.006 here. Positive control: W = G_A + G_P, two Gaussian halves of variance
    1 / (6 d), with A's half G_A held fixed, deviates by more than 0.015 (0.06 to 0.24
    in five runs)."""
    d, o, n = 6, 3, 20_000
    st = SecretStream.from_seed(2, "test-independence")
    r0 = haar(st, d)
    m = _second_moments(lambda: r0 @ gaussian_factor(st, d, o), n)
    assert np.abs(m - np.eye(d * o) / (3 * d)).max() < 0.006
    half = gaussian_factor(st, d, o) / np.sqrt(2)
    halves = _second_moments(lambda: half + gaussian_factor(st, d, o) / np.sqrt(2), 2_000)
    assert np.abs(halves - np.eye(d * o) / (3 * d)).max() > 0.015


def _options(backend: str):
    if backend == "ckks":
        pytest.importorskip("tenseal")
        from securevfl.exchange.ckks import CkksOptions

        return CkksOptions()
    return PaillierOptions(threads=1)


@pytest.mark.parametrize("backend", ["ckks", pytest.param("paillier", marks=pytest.mark.slow)])
@pytest.mark.parametrize(("d", "o"), [(16, 8), (8, 16)])
def test_the_shares_add_up_to_a_gaussian_start(backend, d, o):
    """W^A + W^P = W_i^0 at the Gaussian start's scale (|W|_F^2 / (o / 3) has mean 1
    and sd sqrt(2 / (d o)) = 0.125 for d o = 128; within 0.5 here), with singular values
    spread as a Gaussian matrix's: for a 16 x 8 one the largest over the smallest is
    about (4 + 2.8) / (4 - 2.8), and it was above 2.3 in 2,000 simulated draws (a scaled
    orthogonal start: 1); above 1.5 here. Each share alone is W_i^0 plus or minus P_i's
    re-drawn U (entries up to 2^16 or 2^78)."""
    rng = np.random.default_rng(0)
    run = run_pair(backend, _options(backend), [rng.normal(size=(32, d))], [rng.normal(size=(32, o)) * 0.01])
    assert not run.errors, run.errors
    w = run.start()
    assert float((w * w).sum()) / (o / 3.0) == pytest.approx(1.0, abs=0.5)
    s = np.linalg.svd(w, compute_uv=False)
    assert s.max() / s.min() > 1.5
    assert run.a_share0 is not None and run.p_share0 is not None
    assert np.abs(run.a_share0).max() > 1e3 and np.abs(run.p_share0).max() > 1e3
