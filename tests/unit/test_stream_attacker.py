"""docs/methods/dravl.md §5 mode 1 and §8.8: the online evaluation attacker R_I, the day-chunked
stream, per-day averages, per-feature R² and log-loss."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from securevfl.attacks.metrics import log_loss, per_feature_r2
from securevfl.attacks.stream import DayMetrics, OnlineReconstructor, day_chunks


def test_online_reconstructor_learns_a_linear_map_and_never_sends_a_gradient_back():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(6, 4, generator=g)
    r = OnlineReconstructor(6, 4, seed=1)
    z0 = torch.randn(256, 6, generator=g)
    before = r.mse(z0, z0 @ w)
    for _ in range(300):
        z = torch.randn(64, 6, generator=g).requires_grad_(True)
        r.observe(z, z @ w)
        assert z.grad is None  # the embedding's producer gets nothing from R_I
    assert r.steps == 300
    assert r.mse(z0, z0 @ w) < before / 10


def test_online_reconstructor_init_is_seeded_and_leaves_the_global_rng_alone():
    state = torch.random.get_rng_state()
    a, b = OnlineReconstructor(5, 3, seed=7), OnlineReconstructor(5, 3, seed=7)
    assert torch.equal(torch.random.get_rng_state(), state)
    for pa, pb in zip(a.net.parameters(), b.net.parameters(), strict=True):
        assert torch.equal(pa, pb)
    c = OnlineReconstructor(5, 3, seed=8)
    assert not torch.equal(next(a.net.parameters()), next(c.net.parameters()))


def test_day_chunks_cover_the_rows_in_order():
    days = day_chunks(10, 3)
    assert [d.tolist() for d in days] == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]
    assert len(day_chunks(10_000, 7)) == 7
    with pytest.raises(ValueError):
        day_chunks(3, 4)


def test_day_metrics_average_per_day_values():
    m = DayMetrics()
    m.add(auc=0.6, log_loss=0.7, mse=2.0, target_var=4.0)
    m.add(auc=0.8, log_loss=0.5, mse=1.0, target_var=2.0)
    assert m.averages() == pytest.approx({"auc": 0.7, "log_loss": 0.6, "mse": 1.5, "nmse": 0.5})


def test_per_feature_r2_and_log_loss():
    true = np.array([[0.0, 1.0, 5.0], [2.0, 3.0, 5.0]])
    pred = np.array([[1.0, 1.0, 5.0], [1.0, 3.0, 5.0]])
    r2 = per_feature_r2(pred, true)
    assert r2[0] == pytest.approx(0.0) and r2[1] == pytest.approx(1.0) and math.isnan(r2[2])
    assert log_loss(np.array([0.5, 0.5]), np.array([0, 1])) == pytest.approx(math.log(2))
    assert log_loss(np.array([1.0]), np.array([0])) == pytest.approx(-math.log(1e-7))
    with pytest.raises(ValueError):
        per_feature_r2(pred[:, :2], true)


def _forwards() -> tuple[list[dict], list[torch.Tensor], torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    phi = torch.randn(6, 2, generator=g)
    fw = [
        {"phase": "train", "round": 0, "rows": [0, 1, 2]},
        {"phase": "train", "round": 1, "rows": [3, 4, 5]},
        {"phase": "eval", "round": 1, "rows": [0, 1]},
        {"phase": "train", "round": 2, "rows": [5, 0, 2]},
        {"phase": "eval", "round": 2, "rows": [0, 1, 2]},
    ]
    ts = [torch.randn(len(f["rows"]), 4, generator=g) for f in fw]
    return fw, ts, phi


def test_replay_trains_on_training_forwards_in_order_and_predicts_each_evaluation_pass():
    """The registered online attacker (docs/methods/dravl.md §5 mode 1 over a launcher run):
    replaying the view in arrival order is R_I trained during the run."""
    from securevfl.attacks.online_reconstruction import replay

    fw, ts, phi = _forwards()
    rec = OnlineReconstructor(4, 2, seed=5)
    passes = replay(fw, ts, phi, 3, rec)
    assert rec.steps == 3 and [r for r, _ in passes] == [1, 2]
    first, last = passes[0][1], passes[1][1]
    assert torch.isnan(first[2]).all() and not torch.isnan(first[:2]).any()  # pass 1 did not cover row 2
    assert not torch.isnan(last).any()
    # the same reconstructor driven by hand, step by step
    ref = OnlineReconstructor(4, 2, seed=5)
    ref.observe(ts[0], phi[[0, 1, 2]])
    ref.observe(ts[1], phi[[3, 4, 5]])
    with torch.no_grad():
        assert torch.equal(first[:2], ref.net(ts[2]))
    ref.observe(ts[3], phi[[5, 0, 2]])
    with torch.no_grad():
        assert torch.equal(last, ref.net(ts[4]))


def test_replay_refuses_a_view_whose_tensors_do_not_match_its_forwards():
    from securevfl.attacks.online_reconstruction import replay
    from securevfl.errors import ProtocolError

    fw, ts, phi = _forwards()
    with pytest.raises(ProtocolError, match="5 forwards"):
        replay(fw, ts[:-1], phi, 3, OnlineReconstructor(4, 2))
    ts[1] = ts[1][:2]
    with pytest.raises(ProtocolError, match="train/1: 2 rows for 3"):
        replay(fw, ts, phi, 3, OnlineReconstructor(4, 2))
