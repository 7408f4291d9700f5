"""Attack metric math (securevfl/attacks/metrics.py), without parties."""

from __future__ import annotations

import math

import numpy as np
import pytest

from securevfl.attacks import metrics


def test_normalized_mse_is_one_for_the_mean_predictor_and_zero_for_perfect():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(50, 6))
    mean = x.mean(0)
    assert metrics.normalized_mse(np.broadcast_to(mean, x.shape), x, mean)["nmse"] == pytest.approx(1.0)
    assert metrics.normalized_mse(x, x, mean)["nmse"] == 0.0


def test_normalized_mse_is_clipped_but_reports_the_raw_value():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(50, 6))
    bad = x + 3.0  # worse than the mean predictor
    out = metrics.normalized_mse(bad, x, x.mean(0))
    assert out["nmse_raw"] > 1.5
    assert out["nmse"] == 1.0
    assert out["mse"] == pytest.approx(np.mean((bad - x) ** 2))


def test_normalized_mse_of_a_half_way_guess():
    x = np.array([[0.0], [2.0]])
    guess = np.array([[0.5], [1.5]])  # error 0.5 per row; the mean (1) errs by 1
    assert metrics.normalized_mse(guess, x, np.array([1.0]))["nmse"] == pytest.approx(0.25)


def test_psnr_known_value():
    true = np.zeros((4, 4))
    pred = np.full((4, 4), 1.0)
    assert metrics.psnr(pred, true, 16.0) == pytest.approx(10 * math.log10(256.0))
    assert metrics.psnr(true, true, 1.0) == math.inf
    with pytest.raises(ValueError):
        metrics.psnr(pred, true, 0.0)


def test_ssim_identity_noise_and_inversion():
    rng = np.random.default_rng(2)
    imgs = rng.uniform(0, 16, size=(10, 8, 4))
    assert np.allclose(metrics.ssim(imgs, imgs, 16.0), 1.0)
    noisy = imgs + rng.normal(0, 4, size=imgs.shape)
    very = imgs + rng.normal(0, 12, size=imgs.shape)
    s_noisy, s_very = metrics.ssim(noisy, imgs, 16.0).mean(), metrics.ssim(very, imgs, 16.0).mean()
    assert 1.0 > s_noisy > s_very
    assert metrics.ssim(16.0 - imgs, imgs, 16.0).mean() < 0  # contrast inverted: anti-correlated
    with pytest.raises(ValueError):
        metrics.ssim(imgs[0], imgs[0], 16.0)


def test_ssim_matches_the_closed_form_on_one_window():
    """A 3x3 image with a 3x3 window has one position: SSIM is the Wang et al.
    formula on the Gaussian-weighted moments."""
    rng = np.random.default_rng(3)
    x, y = rng.uniform(0, 1, (1, 3, 3)), rng.uniform(0, 1, (1, 3, 3))
    w = metrics.gaussian_window(3)
    mx, my = (w * x[0]).sum(), (w * y[0]).sum()
    vx, vy = (w * x[0] ** 2).sum() - mx**2, (w * y[0] ** 2).sum() - my**2
    cxy = (w * x[0] * y[0]).sum() - mx * my
    c1, c2 = 0.01**2, 0.03**2
    want = (2 * mx * my + c1) * (2 * cxy + c2) / ((mx**2 + my**2 + c1) * (vx + vy + c2))
    assert metrics.ssim(x, y, 1.0)[0] == pytest.approx(want)


def test_roc_auc_against_sklearn_with_ties():
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(4)
    y = rng.integers(0, 2, 200)
    s = np.round(rng.normal(size=200) + y, 1)  # rounded: many ties
    assert metrics.roc_auc(s, y) == pytest.approx(roc_auc_score(y, s))
    assert math.isnan(metrics.roc_auc(s, np.ones(200)))


def test_leak_auc_ignores_orientation():
    y = np.array([0, 0, 1, 1])
    assert metrics.roc_auc(np.array([4, 3, 2, 1]), y) == 0.0
    assert metrics.leak_auc(np.array([4, 3, 2, 1]), y) == 1.0
    assert metrics.leak_auc(np.array([1, 2, 1, 2]), y) == 0.5


def test_dcs_ideal_point_and_distance():
    assert metrics.dcs(mp=0.9, ap=0.0, mp_ref=0.9) == 1.0
    # AP 0.5 above the ideal, no utility loss: 1 / (1 + sqrt(0.5 * 0.25))
    assert metrics.dcs(0.9, 0.5, 0.9) == pytest.approx(1 / (1 + math.sqrt(0.125)))
    assert metrics.dcs(0.9, 0.6, 0.9, ap_ideal=0.5, beta=0.0) == pytest.approx(1 / 1.1)
    # a defense that lowers AP at no MP cost scores higher than one that costs MP
    assert metrics.dcs(0.9, 0.55, 0.9, ap_ideal=0.5) > metrics.dcs(0.6, 0.55, 0.9, ap_ideal=0.5)
    with pytest.raises(ValueError):
        metrics.dcs(0.9, 0.5, 0.9, beta=1.5)


def test_total_variation():
    assert metrics.total_variation(np.ones((4, 4))) == 0.0
    img = np.zeros((2, 2))
    img[1, 0] = 1.0  # one vertical step at the only interior pixel
    assert metrics.total_variation(img) == pytest.approx(1.0)


def test_membership_loss_threshold_cut_separates_the_shadow_records() -> None:
    """The threshold attack model puts its cut where the shadow in/out records
    are best separated, and calls members the records at or below it."""
    from securevfl.attacks.membership import _LossThreshold

    loss_in = np.array([0.01, 0.02, 0.05, 0.3])
    loss_out = np.array([0.04, 0.9, 1.5, 2.0])
    x = np.column_stack([np.zeros(8), np.concatenate([loss_in, loss_out])])  # loss is the last feature
    cut = _LossThreshold().fit(x, np.array([1, 1, 1, 1, 0, 0, 0, 0]))
    assert cut.cut == 0.3  # 7 of 8 right (0.04 out is called in); 0.05 gets 6, 0.9 gets 6
    np.testing.assert_array_equal(cut.predict(np.array([[0, 0.29], [0, 0.3], [0, 0.31]])), [1, 1, 0])
    assert cut.score(np.array([[0, 0.1], [0, 1.0]]))[0] > cut.score(np.array([[0, 0.1], [0, 1.0]]))[1]
