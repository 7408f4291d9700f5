"""The HE backends' joint start of W_i (:mod:`securevfl.exchange.orthogonal`,
:mod:`securevfl.exchange.he`, "Start").

W_i^0 = c R_A F_P (d >= o) or c F_A R_P (d < o): a Haar-random orthogonal factor of
one party times a uniformly random orthonormal factor of the other. The security
argument rests on one fact, tested here numerically: the product is distributed
the same whatever either factor is (uniform on the partial isometries), so it is
independent of each party's own factor. Then the protocol: in a real pair run the
two shares add up to c times a partial isometry, while neither share is it.
tests/threat_model/test_he_initial_shares.py plays the attacks on the shares.
"""

from __future__ import annotations

import numpy as np
import pytest

from securevfl.csprng import SecretStream
from securevfl.exchange.orthogonal import gain, haar, orthonormal_columns, orthonormal_rows
from securevfl.exchange.paillier import PaillierOptions
from tests.support.he_pair import run_pair


@pytest.mark.parametrize(("rows", "cols"), [(16, 16), (16, 8), (7, 3)])
def test_factors_are_orthonormal(rows, cols):
    st = SecretStream.from_seed(0, "test-orthogonal")
    q = orthonormal_columns(st, rows, cols)
    np.testing.assert_allclose(q.T @ q, np.eye(cols), atol=1e-12)
    r = orthonormal_rows(st, cols, rows)
    np.testing.assert_allclose(r @ r.T, np.eye(cols), atol=1e-12)
    h = haar(st, rows)
    np.testing.assert_allclose(h @ h.T, np.eye(rows), atol=1e-12)
    with pytest.raises(ValueError):
        orthonormal_columns(st, cols - 1, cols)


@pytest.mark.parametrize(("d", "o"), [(64, 64), (64, 16), (16, 64), (30, 10)])
def test_the_gain_matches_torch_s_linear_scale(d, o):
    """||c P||_F^2 = o / 3 for a partial isometry P: the mean of d o entries of variance 1 / (3 d)."""
    st = SecretStream.from_seed(1, "test-orthogonal")
    w = gain(d, o) * (haar(st, d) @ orthonormal_columns(st, d, o) if d >= o else orthonormal_rows(st, d, o))
    assert float((w * w).sum()) == pytest.approx(o / 3.0, rel=1e-9)


def _second_moments(draw, n: int) -> np.ndarray:
    """The empirical E[vec(W) vec(W)^T] over n draws."""
    v = np.stack([draw().ravel() for _ in range(n)])
    return v.T @ v / n


@pytest.mark.parametrize("fixed", ["haar", "stiefel"])
def test_the_product_does_not_depend_on_either_factor(fixed):
    """For d >= o, W = R F with R Haar (d x d) and F uniform with orthonormal columns:
    holding either factor fixed (what its owner knows), the other's randomness makes
    W uniform, whose second moments are E[W_ij W_kl] = delta_ik delta_jl / d (and
    whose mean is 0: no linear estimate of W from the fixed factor). Over 20,000 draws
    the largest deviation from I / d was 0.003 to 0.004 in eight runs (entries 1 / d =
    0.17); 0.02 here. Positive control: W = G_A + G_P, two Gaussian halves of variance
    1 / (2 d), with A's half G_A held fixed, deviates by more than 0.05 (0.24 to 0.47 in five runs)."""
    d, o, n = 6, 3, 20_000
    st = SecretStream.from_seed(2, f"test-independence-{fixed}")
    r0, f0 = haar(st, d), orthonormal_columns(st, d, o)
    if fixed == "haar":
        m = _second_moments(lambda: r0 @ orthonormal_columns(st, d, o), n)
    else:
        m = _second_moments(lambda: haar(st, d) @ f0, n)
    assert np.abs(m - np.eye(d * o) / d).max() < 0.02
    half = st.normal_np((d, o)) / np.sqrt(2 * d)
    halves = _second_moments(lambda: half + st.normal_np((d, o)) / np.sqrt(2 * d), 2_000)
    assert np.abs(halves - np.eye(d * o) / d).max() > 0.05


def _options(backend: str):
    if backend == "ckks":
        pytest.importorskip("tenseal")
        from securevfl.exchange.ckks import CkksOptions

        return CkksOptions()
    return PaillierOptions(threads=1)


@pytest.mark.parametrize("backend", ["ckks", pytest.param("paillier", marks=pytest.mark.slow)])
@pytest.mark.parametrize(("d", "o"), [(16, 8), (8, 16)])
def test_the_shares_add_up_to_a_scaled_partial_isometry(backend, d, o):
    """Both cases of the protocol (P_i's factor encrypted when d >= o, A's when d < o):
    W^A + W^P = W_i^0 with orthonormal columns (rows) scaled by c, within the scheme's
    precision (ckks: flooding 7.4e-8 per value; paillier: 2^-20 operands), while each
    share alone is W_i^0 plus or minus P_i's re-drawn U (entries up to 2^16 or 2^78)."""
    rng = np.random.default_rng(0)
    run = run_pair(backend, _options(backend), [rng.normal(size=(32, d))], [rng.normal(size=(32, o)) * 0.01])
    assert not run.errors, run.errors
    w = run.start() / gain(d, o)
    gram = w.T @ w if d >= o else w @ w.T
    np.testing.assert_allclose(gram, np.eye(min(d, o)), atol=1e-5)
    assert run.a_share0 is not None and run.p_share0 is not None
    assert np.abs(run.a_share0).max() > 1e3 and np.abs(run.p_share0).max() > 1e3
