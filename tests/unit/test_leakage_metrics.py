"""Statistical leakage metrics of docs/methods/hashvfl.md §5.3 (§8.2 item 17: SSIM(x, x) = 1,
DCOR(x, x) = 1, KL(P, P) = 0, plus hand-computed values) and the clustering
scores of the label-leak probe (§8.2 item 19: AMI, matched accuracy)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from securevfl.attacks import metrics


def _images(n: int = 5, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).random((n, 8, 4))


def test_identity_values_of_ssim_dcor_and_kl():
    x = _images()
    assert np.allclose(metrics.ssim(x, x, 1.0), 1.0, atol=1e-12)
    assert np.allclose(metrics.dcor_pixels(x, x), 1.0, atol=1e-12)
    assert np.array_equal(metrics.kld_pixels(x, x), np.zeros(len(x)))


def test_dcor_hand_value_and_affine_invariance():
    # a = [0, 1, 2], b = [0, 1, 0]: dCov^2 = 8/81, dVar^2 = 40/81 and 16/81, so dCor^2 = 1/sqrt(10)
    a = np.array([[[0.0, 1.0, 2.0]]])
    b = np.array([[[0.0, 1.0, 0.0]]])
    assert metrics.dcor_pixels(a, b)[0] == pytest.approx(10**-0.25, abs=1e-12)
    x = _images(3)
    assert np.allclose(metrics.dcor_pixels(x, 3.0 * x - 1.0), 1.0, atol=1e-12)
    # a constant image has no distance variance: dCor is 0 by convention, not nan
    assert metrics.dcor_pixels(np.zeros((1, 2, 2)), x[:1, :2, :2])[0] == 0.0
    # independent noise images: far from 1
    y = _images(40, seed=1)
    assert metrics.dcor_pixels(_images(40), y).mean() < 0.5


def test_kld_hand_value_and_direction():
    # shifted to the minimum: P = [0, 1/4, 3/4], Q = [0, 3/4, 1/4], so KL(P || Q) = ln(3) / 2
    raw = np.array([[[0.0, 1.0, 3.0]]])
    rec = np.array([[[0.0, 3.0, 1.0]]])
    assert metrics.kld_pixels(raw, rec)[0] == pytest.approx(0.5 * math.log(3), abs=1e-4)
    # blind to brightness and contrast, sensitive to where the mass lies
    x = _images(4)
    assert np.allclose(metrics.kld_pixels(x, 2.0 * x + 5.0), 0.0, atol=1e-12)
    assert (metrics.kld_pixels(x, _images(4, seed=3)) > 0.05).all()
    p = metrics.pixel_distribution(np.array([2.0, 2.0, 2.0]))
    assert np.allclose(p, 1 / 3) and p.sum() == pytest.approx(1.0)


def _reference_ami(u: np.ndarray, v: np.ndarray) -> float:
    """AMI from its definition (Vinh et al. 2010): (MI - E[MI]) / (mean(H_u, H_v) - E[MI]),
    E[MI] summed over the hypergeometric distribution of every contingency cell."""
    n = len(u)
    us, vs = np.unique(u), np.unique(v)
    a = np.array([(u == x).sum() for x in us])
    b = np.array([(v == x).sum() for x in vs])
    mi = 0.0
    for i, x in enumerate(us):
        for j, z in enumerate(vs):
            nij = int(((u == x) & (v == z)).sum())
            if nij:
                mi += nij / n * math.log(n * nij / (a[i] * b[j]))
    emi = 0.0
    for ai in a:
        for bj in b:
            for nij in range(max(1, ai + bj - n), min(ai, bj) + 1):
                pmf = math.comb(ai, nij) * math.comb(n - ai, bj - nij) / math.comb(n, bj)
                emi += pmf * nij / n * math.log(n * nij / (ai * bj))
    h = lambda c: -sum(k / n * math.log(k / n) for k in c)  # noqa: E731
    return (mi - emi) / ((h(a) + h(b)) / 2 - emi)


def test_ami_hand_values_and_definition():
    y = np.array([0, 0, 1, 1])
    assert metrics.adjusted_mutual_info(y, np.array([3, 3, 7, 7])) == pytest.approx(1.0)
    # MI = 0, E[MI] = ln(2)/3, H = ln 2 each: AMI = (0 - ln2/3) / (ln2 - ln2/3) = -1/2
    assert metrics.adjusted_mutual_info(y, np.array([0, 1, 0, 1])) == pytest.approx(-0.5)
    rng = np.random.default_rng(0)
    u, v = rng.integers(0, 3, 30), rng.integers(0, 4, 30)
    v[:15] = u[:15]
    assert metrics.adjusted_mutual_info(u, v) == pytest.approx(_reference_ami(u, v), abs=1e-10)
    # independent labels: about 0
    big = [
        metrics.adjusted_mutual_info(rng.integers(0, 10, 2000), rng.integers(0, 10, 2000)) for _ in range(3)
    ]
    assert max(abs(a) for a in big) < 0.01


def test_matched_accuracy_uses_the_best_one_to_one_matching():
    y = np.array([0, 0, 1, 1, 2])
    assert metrics.matched_accuracy(y, np.array([5, 5, 7, 7, 7])) == pytest.approx(0.8)
    assert metrics.matched_accuracy(y, np.array([2, 2, 0, 0, 1])) == 1.0
    with pytest.raises(ValueError):
        metrics.matched_accuracy(y, y[:3])


def test_code_reconstruction_score_reports_ssim_dcor_and_kld():
    """The scoring pairs each class's reconstruction with every test image of that
    class: a perfect reconstruction of a one-image class scores SSIM = DCOR = 1 and
    KLD = 0; noise scores worse on all three."""
    from types import SimpleNamespace

    from securevfl.attacks.base import View, World
    from securevfl.attacks.code_reconstruction import CodeReconstruction, CodeReconstructionOptions

    rng = np.random.default_rng(0)
    x_te = rng.random((2, 32)).astype(np.float32)
    victim = View(1, "left", {}, {"x_test": torch.as_tensor(x_te), "x_train": torch.as_tensor(x_te)})
    active = View(0, "active", {}, {"y_test": torch.tensor([0, 1])})
    layout = SimpleNamespace(passive=[SimpleNamespace(party="left")], active=SimpleNamespace(party="active"))
    world = World(None, None, layout, {"left": victim, "active": active}, Path("."))  # type: ignore[arg-type]
    attack = CodeReconstruction(CodeReconstructionOptions(image_shape=(8, 4)))
    perfect = attack.score({"recon": x_te.reshape(2, 8, 4), "binary": True}, world)
    assert perfect["ssim"] == pytest.approx(1.0) and perfect["dcor"] == pytest.approx(1.0)
    assert perfect["kld"] == pytest.approx(0.0, abs=1e-12) and perfect["dcor_std"] == pytest.approx(0.0)
    noisy = attack.score({"recon": rng.random((2, 8, 4)), "binary": True}, world)
    assert noisy["ssim"] < 0.5 and noisy["dcor"] < perfect["dcor"] and noisy["kld"] > 0.05
    assert {"dcor_mean_image", "kld_mean_image", "kld_std"} <= set(noisy)
