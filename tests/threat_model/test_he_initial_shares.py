"""The HE backends' initial weight shares tell neither side the other's values.

Under ``ckks`` and ``paillier`` A learns z_i = h'_i W_i and P_i learns
dL/dh'_i = dL/dz W_i^T (the declared outputs); W_i = W^A + W^P exists only as
shares. If a side's share is correlated with W_i (each side drawing its own
Gaussian half of W_i^0 gives correlation 1/sqrt(2)), that side reads the other's
secret off its output by a linear estimate:

* A, from z_i and its share S: the ridge estimate of P_i's embedding rows
  h'_i ~ z_i S^T (S S^T + lam I)^-1;
* P_i, from dL/dh'_i and its share S: the ridge estimate of A's dL/dz ~
  dL/dh'_i S (S^T S + lam I)^-1 (the direction of the label gradient).

The tests play each side with what it holds in a real run of the protocol (the
registered backend, real keys, one passive party; :mod:`tests.support.he_pair`):
its share at the start and at every step, and the output it received at every
step; the truth (P_i's h'_i, A's dL/dz) is used for scoring only. Score: |cos|
between the estimate and the truth over the whole batch (an estimate of zero
scores 0). Bar: the same estimate made with a random matrix in place of the
share, which knows nothing, over RANDOM_DRAWS draws on the same outputs: the
attack must stay below that baseline's mean plus SIGMAS standard deviations.
With d = o = 16, B = 64 and lam = the mean eigenvalue (the attacker's best
weight in simulations), the random estimate scores 0.04 +- 0.03 and its bar is
about 0.25; independent Gaussian halves of W_i^0 scored 0.60 (A) and 0.62 (P_i)
on average over 30 simulated draws, and 0.59 and 0.60 (``ckks``), 0.66 and 0.56
(``paillier``) at step 0 of real runs of that start. The joint start (W_i^0 a
product of the two parties' orthogonal factors, each share W_i^0 -+ P_i's
re-drawn U) scores like a random matrix.
"""

from __future__ import annotations

import numpy as np
import pytest

from securevfl.exchange.paillier import PaillierOptions
from tests.support.he_pair import PairRun, run_pair

pytestmark = pytest.mark.timeout(900)

BATCH, DIM, OUT = 64, 16, 16
STEPS = 4
LAM = 1.0  # ridge weight, relative to the share's mean eigenvalue (the best for the attacker, measured)
RANDOM_DRAWS = 300
SIGMAS = 5.0


def ridge_rows(z: np.ndarray, s: np.ndarray) -> np.ndarray:
    """x with z ~ x s (s: d x o): z s^T (s s^T + lam I)^-1; zero for a zero s."""
    if not np.any(s):
        return np.zeros((z.shape[0], s.shape[0]))
    gram = s @ s.T
    lam = LAM * np.trace(gram) / s.shape[0]
    return z @ s.T @ np.linalg.inv(gram + lam * np.eye(s.shape[0]))


def abs_cos(est: np.ndarray, truth: np.ndarray) -> float:
    n = float(np.linalg.norm(est))
    return 0.0 if n == 0.0 else abs(float((est * truth).sum())) / (n * float(np.linalg.norm(truth)))


def random_bar(out: np.ndarray, truth: np.ndarray, shape: tuple[int, int], rng: np.random.Generator) -> float:
    """Mean + SIGMAS sd of the estimate's score with random Gaussian matrices of
    ``shape`` in place of the share (an estimate that knows nothing)."""
    scores = [abs_cos(ridge_rows(out, rng.normal(size=shape)), truth) for _ in range(RANDOM_DRAWS)]
    return float(np.mean(scores) + SIGMAS * np.std(scores))


def inputs(seed: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Each step's h'_i (what a bottom model gives: unit-scale rows) and dL/dz (a
    mean loss's scale); public test data."""
    rng = np.random.default_rng(seed)
    hs = [rng.normal(0.0, 1.0, size=(BATCH, DIM)) for _ in range(STEPS)]
    gs = [rng.normal(0.0, 0.05, size=(BATCH, OUT)) for _ in range(STEPS)]
    return hs, gs


def play(run: PairRun, hs: list[np.ndarray], gs: list[np.ndarray]) -> list[str]:
    """Both attacks at every step, with the initial share and the share held then;
    returns what did better than random."""
    assert not run.errors, run.errors
    assert run.a_share0 is not None and run.p_share0 is not None
    rng = np.random.default_rng(1)  # the baseline's random matrices
    found = []
    for t in range(STEPS):
        z, h = run.z[t], hs[t]
        bar = random_bar(z, h, (DIM, OUT), rng)
        for name, s in (("initial share", run.a_share0), ("share at the step", run.a_share[t])):
            score = abs_cos(ridge_rows(z, s), h)
            if score > bar:
                found.append(f"A, step {t}, {name}: |cos| {score:.3f} with h'_i (random: below {bar:.3f})")
        grad, g = run.grad[t], gs[t]
        bar = random_bar(grad, g, (OUT, DIM), rng)  # dL/dh = g W^T: estimate g from grad ~ g W^T
        for name, s in (("initial share", run.p_share0), ("share at the step", run.p_share[t])):
            score = abs_cos(ridge_rows(grad, s.T), g)
            if score > bar:
                found.append(f"P_i, step {t}, {name}: |cos| {score:.3f} with dL/dz (random: below {bar:.3f})")
    return found


def test_the_bar_is_met_by_a_share_correlated_1_over_sqrt2():
    """Positive control, in numpy: a share that is one of two independent Gaussian
    halves of W (correlation 1/sqrt(2)) beats the random bar by far on both sides."""
    rng = np.random.default_rng(2)
    hs, gs = inputs(3)
    ga, gp = (rng.normal(size=(DIM, OUT)) / np.sqrt(6 * DIM) for _ in range(2))
    w = ga + gp
    z, grad = hs[0] @ w, gs[0] @ w.T
    assert abs_cos(ridge_rows(z, ga), hs[0]) > max(0.45, random_bar(z, hs[0], (DIM, OUT), rng))
    assert abs_cos(ridge_rows(grad, gp.T), gs[0]) > max(0.45, random_bar(grad, gs[0], (OUT, DIM), rng))


def test_ckks_shares_tell_a_nothing_of_h_and_p_i_nothing_of_dl_dz():
    pytest.importorskip("tenseal")
    from securevfl.exchange.ckks import CkksOptions

    hs, gs = inputs(0)
    found = play(run_pair("ckks", CkksOptions(), hs, gs), hs, gs)
    assert not found, "; ".join(found)


@pytest.mark.slow
def test_paillier_shares_tell_a_nothing_of_h_and_p_i_nothing_of_dl_dz():
    hs, gs = inputs(0)
    found = play(run_pair("paillier", PaillierOptions(threads=1), hs, gs), hs, gs)
    assert not found, "; ".join(found)
