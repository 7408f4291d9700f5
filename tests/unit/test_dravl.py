"""DRAVL mechanics (docs/methods/dravl.md §9.2-9.4, the parts that need no training run):
gradient reversal, AR/NR gradient routing, the NR expectation identity, noise
shape and resampling, the embedding-noise baseline, options and presets.

The defense objects are the real ones, built from a real protocol; the bottom
model F is a small stand-in module where a test needs one."""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from securevfl.app.loader import load_checked_dict, load_protocol_dict
from securevfl.csprng import SecretStream
from securevfl.defenses import DEFENSES
from securevfl.defenses.base import DefenseContext, build_stack
from securevfl.defenses.dravl import (
    PRESETS,
    Dravl,
    DravlOptions,
    GaussianNoise,
    grad_reverse,
    nr_loss,
    reconstruction_loss,
    sample_noise,
)
from securevfl.errors import ConfigError
from tests.support.protocols import small_digits

Q = 16  # small_digits bottoms output 16 values
D_X = 8


def ctx(seed: int = 0) -> DefenseContext:
    checked = load_checked_dict(small_digits(seed=seed))
    return DefenseContext(
        checked.protocol, checked.components, "left", "passive", seed, SecretStream.from_seed(seed, "test")
    )


def make(cls=Dravl, d_x: int = D_X, **params) -> Dravl:
    d = cls(cls.options.model_validate(params), ctx())
    d.select_features(np.zeros((5, d_x), dtype=np.float32), [f"c{i}" for i in range(d_x)])
    return d


def batch(n: int = 32, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, D_X, generator=g), torch.randn(n, Q, generator=g)


# -- registration and options ---------------------------------------------------------


def test_registered_passive_only():
    assert DEFENSES.get("dravl") is Dravl and DEFENSES.get("gaussian_noise") is GaussianNoise
    assert Dravl.sides == GaussianNoise.sides == frozenset({"passive"})
    assert Dravl.requires == GaussianNoise.requires == frozenset()


def test_presets_and_overrides():
    o = DravlOptions.model_validate({"preset": "dravl"})
    assert (o.alpha_r, o.alpha_n, o.alpha_d) == (0.01, 0.001, 0.01)
    assert DravlOptions.model_validate({"preset": "dcor_0.1", "alpha_d": 0.5}).alpha_d == 0.5
    assert DravlOptions.model_validate({"preset": "dcor_0.1_plain"}).dcor_log is False
    assert set(PRESETS) >= {"vanilla", "nr_0.001", "dcor_0.01", "dcor_0.1", "dravl"}


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"alpha_d": -1.0}, "alpha_d"),
        ({"lambda": 1.0}, "lambda"),
        ({"preset": "dcor_9"}, "preset"),
        ({"ar_inner_steps": -2}, "ar_inner_steps"),
    ],
)
def test_bad_options_name_the_field(params, field):
    doc = small_digits()
    doc["parties"]["passive"][0]["defenses"] = [{"name": "dravl", "params": params}]
    with pytest.raises(ConfigError, match=field) as exc:
        load_protocol_dict(doc)
    assert "parties.passive[0].defenses[0].params" in str(exc.value)


def test_refused_at_the_active_party():
    doc = small_digits()
    doc["parties"]["active"]["defenses"] = [{"name": "gaussian_noise", "params": {"std": 1.0}}]
    with pytest.raises(ConfigError, match="passive party"):
        load_protocol_dict(doc)


def test_all_weights_zero_adds_nothing():
    d = make()
    x, h = batch()
    assert d.modules() == [] and d.local_loss(x, h) is None
    assert d.embed(h, train=True) is h


def test_reconstructor_shape_and_seeded():
    a, b = make(alpha_r=0.1), make(alpha_r=0.1)
    (ra,) = a.modules()
    (rb,) = b.modules()
    assert ra(torch.zeros(3, Q)).shape == (3, D_X)
    for pa, pb in zip(ra.parameters(), rb.parameters(), strict=True):
        assert torch.equal(pa, pb)


# -- 7. gradient reversal -------------------------------------------------------------


def test_grl_forward_identity_backward_reversed():
    z = torch.randn(5, 4, dtype=torch.float64, requires_grad=True)
    w = torch.randn(5, 4, dtype=torch.float64)
    out = grad_reverse(z, 0.7)
    assert torch.equal(out, z)
    (out * w).sum().backward()
    assert torch.allclose(z.grad, -0.7 * w, atol=0, rtol=0)
    # gradcheck-style, sign flipped: the analytic Jacobian is -lambda times the
    # finite-difference Jacobian of the forward (the identity)
    z2 = torch.randn(3, 2, dtype=torch.float64)
    analytic = torch.autograd.functional.jacobian(lambda v: grad_reverse(v, 0.7), z2).reshape(6, 6)
    step = 1e-6
    numeric = torch.stack(
        [
            ((grad_reverse(z2 + step * e, 0.7) - grad_reverse(z2 - step * e, 0.7)) / (2 * step)).reshape(-1)
            for e in torch.eye(6, dtype=torch.float64).reshape(6, 3, 2)
        ],
        dim=1,
    )
    assert torch.allclose(numeric, torch.eye(6, dtype=torch.float64), atol=1e-8)
    assert torch.allclose(analytic, -0.7 * numeric, atol=1e-8)


# -- 8, 9. AR gradient routing and direction -------------------------------------------


@pytest.mark.parametrize("lam", [1.0, 0.3])
def test_ar_gradient_routing(lam: float):
    alpha = 0.05
    d = make(alpha_r=alpha, grl_lambda=lam)
    (r,) = d.modules()
    x, h0 = batch()
    h = h0.clone().requires_grad_()
    d.local_loss(x, h).backward()
    # manual: the same loss without any GRL
    h2 = h0.clone().requires_grad_()
    params = list(r.parameters())
    ref = reconstruction_loss(r(h2), x, "sum_feat_mean_batch")
    g_h, *g_r = torch.autograd.grad(ref, [h2, *params])
    assert torch.allclose(h.grad, -lam * alpha * g_h, rtol=1e-6, atol=1e-9)
    for p, g in zip(params, g_r, strict=True):
        assert torch.allclose(p.grad, alpha * g, rtol=1e-6, atol=1e-9)


def test_ar_lambda_zero_gives_no_gradient_to_f():
    d = make(alpha_r=0.05, grl_lambda=1.0)
    d.p = d.p.model_copy(update={"grl_lambda": 0.0})  # options refuse 0; the op must still be inert
    x, h0 = batch()
    h = h0.clone().requires_grad_()
    d.local_loss(x, h).backward()
    assert torch.count_nonzero(h.grad) == 0


def test_ar_step_increases_loss_of_fixed_reconstructor():
    torch.manual_seed(0)
    d = make(alpha_r=1.0)
    (r,) = d.modules()
    f = nn.Linear(D_X, Q)
    x, _ = batch(64)
    with torch.no_grad():
        before = float(reconstruction_loss(r(f(x)), x, "sum_feat_mean_batch"))
    opt = torch.optim.SGD(f.parameters(), lr=1e-3)  # R held fixed: only F steps
    opt.zero_grad()
    d.local_loss(x, f(x)).backward()
    opt.step()
    with torch.no_grad():
        after = float(reconstruction_loss(r(f(x)), x, "sum_feat_mean_batch"))
    assert after > before


def test_inner_steps_fit_r_with_its_own_optimizer():
    d = make(alpha_r=0.1, ar_inner_steps=5, inner_lr=1e-2)
    (r,) = d.modules()
    x, h = batch(64)
    start = [p.detach().clone() for p in r.parameters()]
    with torch.no_grad():
        loss0 = float(reconstruction_loss(r(h), x, "sum_feat_mean_batch"))
    out = d.local_loss(x, h.clone().requires_grad_())
    with torch.no_grad():
        assert float(reconstruction_loss(r(h), x, "sum_feat_mean_batch")) < loss0
    assert any(not torch.equal(a, b) for a, b in zip(start, r.parameters(), strict=True))
    assert all(p.grad is None for p in r.parameters())  # the party's step starts clean
    assert out is not None and out.requires_grad


# -- 10-13. NR -----------------------------------------------------------------------------


def test_nr_moves_f_never_r():
    d = make(alpha_r=0.1, alpha_n=0.1)
    (r,) = d.modules()
    f = nn.Linear(D_X, Q)
    x, _ = batch(32)
    before = [p.detach().clone() for p in r.parameters()]
    opt = torch.optim.Adam([*f.parameters(), *r.parameters()], lr=1e-2)
    opt.zero_grad()
    nr_loss(r, f(x), d.noise_like(x), "sum_feat_mean_batch").backward()
    assert all(p.grad is None or torch.count_nonzero(p.grad) == 0 for p in r.parameters())
    assert all(torch.count_nonzero(p.grad) > 0 for p in f.parameters())
    opt.step()
    assert all(torch.equal(a, b) for a, b in zip(before, r.parameters(), strict=True))


@pytest.mark.parametrize(
    ("kind", "mean", "std", "target"), [("gaussian", 0.0, 1.0, 0.0), ("uniform", 0.5, 12**-0.5, 0.5)]
)
def test_nr_expected_gradient_is_shrinkage_to_noise_mean(kind, mean, std, target):
    """E_N dL_n/dZ = d||R(Z) - mu_N||^2/dZ (docs/methods/dravl.md §3.2); T = 4000 draws.
    Measured relative error at this seed: 3.9 % (Gaussian), 0.7 % (U(0,1))."""
    torch.manual_seed(0)
    r = nn.Sequential(nn.Linear(Q, 32), nn.ReLU(), nn.Linear(32, D_X))
    z = torch.randn(16, Q)
    noise = sample_noise((4000, 16, D_X), kind, mean, std, SecretStream.from_seed(1, "test"))
    zz = z.clone().requires_grad_()
    frozen = {k: v.detach() for k, v in r.named_parameters()}
    rec = torch.func.functional_call(r, frozen, (zz,))
    ((rec[None] - noise) ** 2).sum(-1).mean(-1).mean(0).backward()
    z2 = z.clone().requires_grad_()
    ((r(z2) - target) ** 2).sum(1).mean().backward()
    rel = float((zz.grad - z2.grad).norm() / z2.grad.norm())
    assert rel < 0.10, rel


def test_nr_only_trains_r_prime_on_detached_embedding():
    alpha = 0.2
    d = make(alpha_n=alpha)
    (r,) = d.modules()
    x, h0 = batch()
    h = h0.clone().requires_grad_()
    state = d.noise_gen.state()
    d.local_loss(x, h).backward()
    assert all(p.grad is not None and torch.count_nonzero(p.grad) > 0 for p in r.parameters())
    # h's gradient is exactly alpha * dL_n/dh: the R' term adds nothing to F
    d.noise_gen = SecretStream.from_state(state)
    h2 = h0.clone().requires_grad_()
    (alpha * nr_loss(r, h2, d.noise_like(x), "sum_feat_mean_batch")).backward()
    assert torch.allclose(h.grad, h2.grad, rtol=1e-6, atol=1e-9)
    # and R's gradient is that of the plain reconstruction loss on h.detach()
    ref = torch.autograd.grad(reconstruction_loss(r(h0), x, "sum_feat_mean_batch"), list(r.parameters()))
    for p, g in zip(r.parameters(), ref, strict=True):
        assert torch.allclose(p.grad, g, rtol=1e-6, atol=1e-9)


def test_noise_shape_statistics_and_resampling():
    d = make(alpha_n=0.1, nr_mean=0.5, nr_std=2.0)
    x = torch.zeros(4000, D_X)
    n1, n2 = d.noise_like(x), d.noise_like(x)
    assert n1.shape == x.shape and n1.dtype == x.dtype
    # sampling error of the mean: 2 / sqrt(32000) = 0.011; of the std: ~0.008
    assert abs(float(n1.mean()) - 0.5) < 0.05 and abs(float(n1.std()) - 2.0) < 0.04
    assert not torch.equal(n1, n2)
    u = make(alpha_n=0.1, nr_noise="uniform", nr_mean=0.0, nr_std=1.0).noise_like(x)
    assert float(u.min()) >= -(3**0.5) and float(u.max()) <= 3**0.5
    assert abs(float(u.std()) - 1.0) < 0.02


def test_fixed_per_sample_noise_reused_per_row():
    d = make(alpha_n=0.1, nr_noise_mode="fixed_per_sample")
    x, _ = batch(16)
    a = d.noise_like(x)
    b = d.noise_like(x[torch.tensor([3, 0, 7])])
    assert torch.equal(b, a[torch.tensor([3, 0, 7])])
    assert not torch.equal(a[0], a[1])


# -- dCor term and collapse detector --------------------------------------------------------


def test_dcor_term_value_and_collapse_counter():
    d = make(alpha_d=0.5)
    x, h = batch(64)
    loss = d.local_loss(x, h.clone().requires_grad_())
    from securevfl.privacy.dcor import v_dcor

    assert float(loss.detach()) == pytest.approx(0.5 * float(torch.log(v_dcor(x, h) + 1e-8)), rel=1e-6)
    d.local_loss(x, torch.ones(64, Q).requires_grad_())
    rep = d.report()
    assert rep["steps"] == 2 and rep["collapsed_batches"] == 1
    plain = make(alpha_d=0.5, dcor_log=False)
    assert float(plain.local_loss(x, h)) == pytest.approx(0.5 * float(v_dcor(x, h)), rel=1e-6)


def test_every_combination_gives_a_finite_loss_and_f_gradient():
    x, h0 = batch(64)
    for ar in (0.0, 0.1):
        for nr in (0.0, 0.1):
            for dc in (0.0, 0.1):
                if ar == nr == dc == 0:
                    continue
                d = make(alpha_r=ar, alpha_n=nr, alpha_d=dc, ar_inner_steps=1)
                h = h0.clone().requires_grad_()
                loss = d.local_loss(x, h)
                loss.backward()
                assert torch.isfinite(loss) and torch.count_nonzero(h.grad) > 0, (ar, nr, dc)


def test_feature_width_mismatch_is_a_data_error():
    from securevfl.errors import DataError

    d = make(alpha_d=0.1)
    with pytest.raises(DataError, match="expected 8 columns"):
        d.local_loss(torch.zeros(4, 5), torch.zeros(4, Q))


# -- 16. embedding-noise baseline ---------------------------------------------------------------


def test_gaussian_noise_std_and_eval_switch():
    h = torch.randn(512, 64)
    d = make(GaussianNoise, std=2.0, at_eval=False)
    diff = d.embed(h, train=True) - h
    assert abs(float(diff.std()) / 2.0 - 1.0) < 0.02  # 32768 draws: sampling error ~0.4 %
    assert abs(float(diff.mean())) < 0.05
    assert torch.equal(d.embed(h, train=False), h)
    on = make(GaussianNoise, std=2.0)
    assert not torch.equal(on.embed(h, train=False), h)
    zero = make(GaussianNoise, std=0.0)
    assert torch.equal(zero.embed(h, train=True), h)


def test_gaussian_noise_passes_gradient_unchanged():
    d = make(GaussianNoise, std=1.0)
    h = torch.randn(8, Q, requires_grad=True)
    g = torch.randn(8, Q)
    (d.embed(h, train=True) * g).sum().backward()
    assert torch.equal(h.grad, g)


def test_eval_probe_reports_metrics_on_the_last_evaluation():
    d = make(GaussianNoise, d_x=D_X, std=0.5)
    x_test = np.random.default_rng(0).normal(size=(40, D_X)).astype(np.float32)
    d.select_features(x_test, [])
    h = 3.0 * torch.as_tensor(x_test).repeat(1, 2)  # a scaled isometry of x: dCor = 1
    d.embed(torch.randn(7, Q), train=True)
    d.embed(torch.randn(40, Q), train=False)  # an earlier evaluation, replaced below
    d.embed(torch.randn(7, Q), train=True)
    for s in range(0, 40, 16):
        d.embed(h[s : s + 16], train=False)
    rep = d.report()["eval"]
    assert rep["eval_rows"] == 40
    assert rep["clean"]["v_dcor"] > 0.999
    assert rep["sent"]["v_dcor"] < rep["clean"]["v_dcor"]


def test_stack_builds_from_protocol():
    doc = small_digits()
    doc["parties"]["passive"][0]["defenses"] = [
        {"name": "dravl", "params": {"preset": "dravl"}},
        {"name": "gaussian_noise", "params": {"std": 0.1}},
    ]
    checked = load_checked_dict(doc)
    proto = checked.protocol
    stack = build_stack(proto, checked.components, "left", "passive", proto.parties.passive[0].defenses)
    x = np.zeros((10, 32), dtype=np.float32)
    stack.select_features(x, [])
    assert len(stack.modules()) == 1


# -- 9.5 behaviour on the spec's synthetic set (slow) -------------------------------------------
#
# The defense object is driven exactly as the passive party drives it (h = F(x),
# h' = embed(h), obj = (h' * dL/dh').sum() + local_loss(x, h)), in one process, on
# docs/methods/dravl.md §4.4's synthetic data: x_p ~ N(0, I_8) at P, x_a ~ N(0, I_4) at A,
# logit = 1.5 (x0 + x1 - x2 + 0.7 x3 x4) + (xa0 - xa1) - 1.5. The post-hoc attacker
# is a fresh MLP on z-scored embeddings with early stopping, falling back to the
# mean predictor (§5 hygiene), scored by nMSE on disjoint rows.


def synthetic(seed: int, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + seed)
    xp, xa = torch.randn(n, 8, generator=g), torch.randn(n, 4, generator=g)
    logit = 1.5 * (xp[:, 0] + xp[:, 1] - xp[:, 2] + 0.7 * xp[:, 3] * xp[:, 4]) + (xa[:, 0] - xa[:, 1]) - 1.5
    y = torch.bernoulli(torch.sigmoid(logit), generator=g)
    return xp, xa, y


def auc(score: torch.Tensor, y: torch.Tensor) -> float:
    order = torch.argsort(score)
    ranks = torch.empty_like(score)
    ranks[order] = torch.arange(1, len(score) + 1, dtype=score.dtype)
    pos = y == 1
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


BATCH = 512  # docs/methods/dravl.md §4.2 (the paper's n; §3.3 computes dCor on batches of 512)


class _Split:
    """The synthetic split model: F at P (with ``defense``, or none), H at A. F is
    docs/methods/dravl.md §4.2's MLP ``d_x -> 256 -> 128 -> q`` (ReLU, the cut layer too), q = 16
    as in the spec's prototype (§9.6); H is the deep logit plus the wide part on A's
    features (§4.1); Adam at 1e-3 for both (§4.2)."""

    def __init__(self, defense, seed: int, x_fit: torch.Tensor):
        torch.manual_seed(seed)
        self.f = nn.Sequential(
            nn.Linear(8, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 16), nn.ReLU()
        )
        self.deep, self.wide = nn.Linear(16, 1), nn.Linear(4, 1)
        self.defense = defense
        if defense is not None:
            defense.select_features(x_fit.numpy(), [])
        mods = [self.f, *(defense.modules() if defense is not None else [])]
        self.opt_p = torch.optim.Adam([p for m in mods for p in m.parameters()], lr=1e-3)
        self.opt_a = torch.optim.Adam([*self.deep.parameters(), *self.wide.parameters()], lr=1e-3)
        self.bce = nn.BCEWithLogitsLoss()

    def sent(self, x: torch.Tensor, *, train: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """(what P sends, F's clean output) for rows ``x``."""
        h = self.f(x)
        return (self.defense.embed(h, train=train) if self.defense is not None else h), h

    def logit(self, sent: torch.Tensor, xa: torch.Tensor) -> torch.Tensor:
        return (self.deep(sent) + self.wide(xa)).squeeze(1)

    def step(self, x: torch.Tensor, xa: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """One training step (§3.4): A steps H on the sent batch and returns
        G = dL/dZ_sent; P steps F (and R) on ``<Z_sent, G>`` plus the defense's local
        loss. Returns the sent batch, detached."""
        h2, h = self.sent(x, train=True)
        zin = h2.detach().requires_grad_()
        loss = self.bce(self.logit(zin, xa), y)
        self.opt_a.zero_grad()
        loss.backward()
        self.opt_a.step()
        obj = (h2 * zin.grad).sum()
        local = self.defense.local_loss(x, h) if self.defense is not None else None
        if local is not None:
            obj = obj + local
        self.opt_p.zero_grad(set_to_none=True)
        obj.backward()
        self.opt_p.step()
        return h2.detach()


def train_split(defense, seed: int, epochs: int = 3, n: int = 10_000) -> tuple[nn.Module, float]:
    """Split training with ``defense`` at P, ``epochs`` passes in batches of 512;
    returns F and the test AUC."""
    xp, xa, y = synthetic(seed, n + 2000)
    model = _Split(defense, seed, xp[:n])
    g = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        for idx in torch.randperm(n, generator=g).split(BATCH):
            model.step(xp[idx], xa[idx], y[idx])
    with torch.no_grad():
        sent, _ = model.sent(xp[n:], train=False)
        return model.f, auc(model.logit(sent, xa[n:]), y[n:])


def stream_split(defense, seed: int, days: int = 7, n: int = 10_000) -> dict[str, float]:
    """docs/methods/dravl.md's stream protocol (§4.2 "training regime", §5 mode 1): one pass over
    the rows cut into ``days`` chunks in row order; each day is evaluated first (AUC,
    log-loss, the online R_I's MSE on that day's sent embeddings), then trained on
    in batches of 512, R_I observing every training batch. Per-day averages."""
    from securevfl.attacks.metrics import log_loss
    from securevfl.attacks.stream import DayMetrics, OnlineReconstructor, day_chunks

    xp, xa, y = synthetic(seed, n)
    model = _Split(defense, seed, xp)
    r_i = OnlineReconstructor(16, 8, seed=seed)
    out = DayMetrics()
    for day in day_chunks(n, days):
        with torch.no_grad():  # test, then train (progressive validation)
            sent, _ = model.sent(xp[day], train=False)
            prob = torch.sigmoid(model.logit(sent, xa[day]))
            out.add(
                auc=auc(prob, y[day]),
                log_loss=log_loss(prob.numpy(), y[day].numpy()),
                mse=r_i.mse(sent, xp[day]),
                target_var=float(xp[day].var(0).mean()),
            )
        for idx in torch.from_numpy(day).split(BATCH):
            r_i.observe(model.step(xp[idx], xa[idx], y[idx]), xp[idx])
    return out.averages()


def active_only_auc(seed: int, n: int = 10_000) -> float:
    """The floor an embedding that carries nothing leaves (docs/methods/dravl.md §4.4, about
    0.68): A's wide part alone, trained to convergence on its own features."""
    _, xa, y = synthetic(seed, n + 2000)
    torch.manual_seed(seed)
    wide = nn.Linear(4, 1)
    opt = torch.optim.Adam(wide.parameters(), lr=1e-2)
    bce = nn.BCEWithLogitsLoss()
    g = torch.Generator().manual_seed(seed)
    for _ in range(30):
        for idx in torch.randperm(n, generator=g).split(BATCH):
            opt.zero_grad()
            bce(wide(xa[idx]).squeeze(1), y[idx]).backward()
            opt.step()
    with torch.no_grad():
        return auc(wide(xa[n:]).squeeze(1), y[n:])


def attack_nmse(embed, seed: int) -> float:
    """Post-hoc attacker R_I on fresh rows: train 4000 / val 1000 / test 1000;
    docs/methods/dravl.md §4.2's ``q -> 256 -> 256 -> d_x`` with early stopping (§5)."""
    xp, _, _ = synthetic(100 + seed, 6000)
    with torch.no_grad():
        z = embed(xp)
    mu, sd = z[:4000].mean(0), z[:4000].std(0)
    keep = sd > 1e-4  # a (nearly) dead unit on attacker-train rows carries nothing; dividing
    z = torch.where(keep, (z - mu) / sd.clamp_min(1e-4), torch.zeros_like(z))  # by ~0 blows up test rows
    torch.manual_seed(seed)
    r = nn.Sequential(
        nn.Linear(z.shape[1], 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 8)
    )
    opt = torch.optim.Adam(r.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(seed)
    mean = xp[:4000].mean(0)
    best = float(((mean - xp[4000:5000]) ** 2).mean())
    best_state, bad = None, 0
    for _ in range(60):
        for idx in torch.randperm(4000, generator=g).split(128):
            opt.zero_grad()
            ((r(z[idx]) - xp[idx]) ** 2).mean().backward()
            opt.step()
        with torch.no_grad():
            val = float(((r(z[4000:5000]) - xp[4000:5000]) ** 2).mean())
        if val < best - 1e-4:
            best, bad = val, 0
            best_state = {k: v.clone() for k, v in r.state_dict().items()}
        else:
            bad += 1
            if bad >= 5:
                break
    with torch.no_grad():
        if best_state is None:
            pred = mean.expand(1000, 8)
        else:
            r.load_state_dict(best_state)
            pred = r(z[5000:])
        target = xp[5000:]
        return float(((pred - target) ** 2).mean() / target.var(0).mean())


def synthetic_defense(cls, **params):
    d = cls(cls.options.model_validate({"eval_metrics": False, **params}), ctx())
    return d


SEEDS = (0, 1, 2)
XP_EVAL = synthetic(99, 512)[0]  # held-out rows for the dCor metric


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_behaviour_attacker_sanity():
    """§9.5-17: an invertible linear F is read back, a constant F is not."""
    w = torch.randn(8, 16, generator=torch.Generator().manual_seed(0))
    assert attack_nmse(lambda x: x @ w, 0) < 0.05
    assert abs(attack_nmse(lambda x: torch.zeros(len(x), 16), 0) - 1.0) < 0.05


@pytest.fixture(scope="module")
def vanilla_runs() -> dict[str, list[float]]:
    """The undefended split model on the spec's seeds: AUC, attacker nMSE and
    held-out dCor per seed (shared by the behaviour tests below)."""
    return _collect({"vanilla": lambda: None}, XP_EVAL)["vanilla"]


@pytest.mark.slow
@pytest.mark.timeout(3600)  # a safety net only
def test_behaviour_dcor_moves_privacy_the_right_way(vanilla_runs: dict[str, list[float]]):
    """§9.5-19, 3 seeds, 3 epochs, log form: at alpha_d = 0.03 the median nMSE is at
    least 0.08 above vanilla's and the median AUC within 0.01 of it; at 0.1 the
    median held-out dCor is below vanilla's; the collapse detector fires at
    alpha_d = 3. Thresholds are the spec's. Measured: see docs/methods/dravl.md."""
    configs = {
        "dcor_0.03": lambda: synthetic_defense(Dravl, alpha_d=0.03),
        "dcor_0.1": lambda: synthetic_defense(Dravl, alpha_d=0.1),
    }
    med = _medians({"vanilla": vanilla_runs, **_collect(configs, XP_EVAL)})
    assert med["dcor_0.03"]["nmse"] >= med["vanilla"]["nmse"] + 0.08, med
    assert abs(med["dcor_0.03"]["auc"] - med["vanilla"]["auc"]) <= 0.01, med
    assert med["dcor_0.1"]["dcor"] < med["vanilla"]["dcor"], med
    big = synthetic_defense(Dravl, alpha_d=3.0, collapse_std=1e-4)
    _, a = train_split(big, 0)
    print("alpha_d = 3:", big.report()["collapsed_batches"], "collapsed batches, AUC", round(a, 3))
    assert big.report()["collapsed_batches"] > 0, big.report()


@pytest.mark.slow
@pytest.mark.timeout(3600)  # a safety net only
def test_behaviour_embedding_noise_moves_privacy_the_right_way(vanilla_runs: dict[str, list[float]]):
    """§9.5-21, 3 seeds, 3 epochs, the noise baseline ``h + N(0, s^2)``: the median
    nMSE increases over s in {0, 0.5, 2} and exceeds 0.8 on every seed at s = 2; the
    median AUC is non-increasing over the same s; at s = 200 it is more than 0.2
    below vanilla's. The attacker sees the noised embedding. Thresholds are the
    spec's. Measured: see docs/methods/dravl.md."""
    runs: dict[float, dict[str, list[float]]] = {0.0: vanilla_runs}
    for std in (0.5, 2.0, 200.0):
        for seed in SEEDS:
            fn, a = train_split(synthetic_defense(GaussianNoise, std=std), seed)
            gen = torch.Generator().manual_seed(seed)

            def sent(x, fn=fn, gen=gen, std=std):
                return fn(x) + std * torch.randn(len(x), 16, generator=gen)

            row = runs.setdefault(std, {"auc": [], "nmse": []})
            row["auc"].append(a)
            row["nmse"].append(attack_nmse(sent, seed))
    print({s: {k: [round(x, 3) for x in v] for k, v in r.items()} for s, r in runs.items()})
    med = _medians(runs)
    sweep = (0.0, 0.5, 2.0)
    assert all(med[a]["nmse"] < med[b]["nmse"] for a, b in itertools.pairwise(sweep)), med
    assert min(runs[2.0]["nmse"]) > 0.8, runs[2.0]
    assert all(med[a]["auc"] >= med[b]["auc"] for a, b in itertools.pairwise(sweep)), med
    assert med[200.0]["auc"] < med[0.0]["auc"] - 0.2, med


def _medians(runs: dict[Any, dict[str, list[float]]]) -> dict[Any, dict[str, float]]:
    from statistics import median

    return {k: {m: median(v) for m, v in r.items()} for k, r in runs.items()}


def _fit_and_attack(defense, seed: int, xp_eval: torch.Tensor | None = None) -> dict[str, float]:
    """Train the split model with ``defense`` (None: vanilla), then score it: test
    AUC, the post-hoc attacker's nMSE and, given ``xp_eval``, the held-out V-dCor."""
    from securevfl.privacy.dcor import v_dcor

    f, a = train_split(defense, seed)
    out = {"auc": a, "nmse": attack_nmse(f, seed)}
    if xp_eval is not None:
        with torch.no_grad():
            out["dcor"] = float(v_dcor(xp_eval, f(xp_eval)))
    return out


def _collect(configs: dict[str, Any], xp_eval: torch.Tensor | None = None) -> dict[str, dict[str, list]]:
    """Per config, per metric, the values over SEEDS; ``configs`` maps a label to a
    zero-argument factory of a fresh defense (or None for vanilla)."""
    runs: dict[str, dict[str, list[float]]] = {}
    for seed in SEEDS:
        for label, make_defense in configs.items():
            row = _fit_and_attack(make_defense(), seed, xp_eval)
            for k, v in row.items():
                runs.setdefault(label, {}).setdefault(k, []).append(v)
    print({label: {k: [round(x, 3) for x in v] for k, v in r.items()} for label, r in runs.items()})
    return runs


@pytest.fixture(scope="module")
def nr_runs() -> dict[float, dict[str, list[float]]]:
    """NR alone at alpha_n in {0.01, 0.1, 1} on the spec's seeds (items 18 and 22)."""
    configs = {a: (lambda a=a: synthetic_defense(Dravl, alpha_n=a)) for a in (0.01, 0.1, 1.0)}
    return _collect(configs, XP_EVAL)


@pytest.mark.slow
@pytest.mark.timeout(3600)  # a safety net only
def test_behaviour_nr_raises_attacker_error(vanilla_runs, nr_runs):
    """§9.5-18, 3 seeds, 3 epochs: NR at alpha_n = 0.1 raises the median nMSE by at
    least 0.08 over vanilla; the median nMSE is non-decreasing over alpha_n in
    {0, 0.01, 0.1, 1}; the median AUC at alpha_n = 0.01 is within 0.01 of vanilla.
    Thresholds are the spec's. Measured: see docs/methods/dravl.md."""
    sweep = (0.0, 0.01, 0.1, 1.0)
    med = _medians({0.0: vanilla_runs, **nr_runs})
    nmse = [med[a]["nmse"] for a in sweep]
    assert med[0.1]["nmse"] >= med[0.0]["nmse"] + 0.08, med
    assert all(lo <= hi for lo, hi in itertools.pairwise(nmse)), med
    assert abs(med[0.01]["auc"] - med[0.0]["auc"]) <= 0.01, med


@pytest.mark.slow
@pytest.mark.timeout(3600)  # a safety net only
def test_behaviour_ar_with_inner_steps_raises_attacker_error(vanilla_runs):
    """§9.5-20, 3 seeds, 3 epochs: AR with ar_inner_steps = 5 and alpha_r = 0.1
    raises the median nMSE by at least 0.1 over vanilla (the spec's threshold). The
    inner steps use the split model's lr (1e-3), as the spec's prototype did.
    Measured: see docs/methods/dravl.md."""
    configs = {"ar_k5": lambda: synthetic_defense(Dravl, alpha_r=0.1, ar_inner_steps=5, inner_lr=1e-3)}
    med = _medians({"vanilla": vanilla_runs, **_collect(configs, XP_EVAL)})
    assert med["ar_k5"]["nmse"] >= med["vanilla"]["nmse"] + 0.1, med


@pytest.mark.slow
@pytest.mark.timeout(3600)  # a safety net only
def test_behaviour_all_three_modules_together(vanilla_runs, nr_runs) -> None:
    """§9.5-22, AR (paper form, k = 0), NR and dCor all at 0.1, 3 seeds, 3 epochs:
    the median nMSE is at least 0.2 above vanilla's, the median held-out dCor is
    below vanilla's, and the median AUC is below vanilla's and below NR-alone's at
    0.1 (the direction of H10). Not asserted, as the spec says: that the
    combination beats every single module. Measured: see docs/methods/dravl.md."""
    configs = {"all_0.1": lambda: synthetic_defense(Dravl, alpha_r=0.1, alpha_n=0.1, alpha_d=0.1)}
    med = _medians({"vanilla": vanilla_runs, "nr_0.1": nr_runs[0.1], **_collect(configs, XP_EVAL)})
    assert med["all_0.1"]["nmse"] >= med["vanilla"]["nmse"] + 0.2, med
    assert med["all_0.1"]["dcor"] < med["vanilla"]["dcor"], med
    assert med["all_0.1"]["auc"] < med["vanilla"]["auc"], med
    assert med["all_0.1"]["auc"] < med["nr_0.1"]["auc"], med


@pytest.mark.slow
@pytest.mark.timeout(3600)  # a safety net only
def test_known_limitation_ar_without_inner_steps_is_recorded_not_asserted(vanilla_runs):
    """§9.5-20, the faithful k = 0 AR (paper form: R trained only through the AR term
    at alpha_r = 0.1): the spec measured no reliable effect on the post-hoc
    attacker, so its nMSE is recorded (printed with ``-s``, in docs/methods/dravl.md) and
    not compared with vanilla. Asserted only: the runs complete, the AR term was
    active on every step, and the metric is a valid nMSE."""
    nmse, aucs = [], []
    for seed in SEEDS:
        d = synthetic_defense(Dravl, alpha_r=0.1)
        row = _fit_and_attack(d, seed)
        rep = d.report()
        assert rep["steps"] == 3 * math.ceil(10_000 / BATCH) and "ar_loss" in rep, rep
        nmse.append(row["nmse"])
        aucs.append(row["auc"])
    print("AR k = 0, alpha_r = 0.1: nMSE", [round(x, 3) for x in nmse], "AUC", [round(x, 3) for x in aucs])
    print("vanilla: nMSE", [round(x, 3) for x in vanilla_runs["nmse"]])
    assert all(0.0 <= x < 2.0 for x in nmse), nmse


@pytest.mark.slow
@pytest.mark.timeout(3600)  # a safety net only
def test_reporting_format_relative_to_vanilla(vanilla_runs, nr_runs):
    """§9.5-23: the summary prints ΔMSE %, ΔdCor % and ΔAUC % against vanilla (H11's
    form), the absolute ΔAUC and the active-only AUC. The MSE column is the
    attacker's nMSE: per seed it is the MSE over one fixed normaliser (the variance
    of the same attacker-test rows), so its relative change is the MSE's."""
    from statistics import median

    from securevfl.report.relative import h11_rows, h11_table

    runs = {"vanilla": vanilla_runs, **{f"nr_{a}": r for a, r in nr_runs.items()}}
    med = {k: {"mse": v["nmse"], "dcor": v["dcor"], "auc": v["auc"]} for k, v in _medians(runs).items()}
    floor = median(active_only_auc(seed) for seed in SEEDS)
    table = h11_table(med, active_only_auc=floor)
    print(table)
    assert 0.64 <= floor <= 0.72, floor  # docs/methods/dravl.md §4.4: about 0.68
    rows = {r["config"]: r for r in h11_rows(med)}
    assert set(rows) == {"nr_0.01", "nr_0.1", "nr_1.0"}
    for label, r in rows.items():
        assert f"| {label} |" in table
        assert r["auc_abs"] == pytest.approx(med[label]["auc"] - med["vanilla"]["auc"])
        assert r["mse_pct"] == pytest.approx(100 * (med[label]["mse"] / med["vanilla"]["mse"] - 1))


@pytest.mark.slow
@pytest.mark.timeout(1800)  # a safety net only
def test_stream_protocol_with_the_online_attacker():
    """§5 mode 1 / §8.8 on the synthetic set, 3 seeds, 7 days, one pass (20
    batches of 512): the online R_I trains on every sent batch; NR at 1 raises its
    per-day averaged nMSE above vanilla's and lowers the per-day averaged AUC (the
    direction of H6). That R_I sends nothing back and leaves the global RNG alone is
    tested in test_stream_attacker.py. One pass is short, so R_I stays near the mean
    predictor (nMSE about 0.94 on vanilla); the post-hoc attacker is the strong one."""
    from statistics import median

    runs = {k: {"auc": [], "nmse": [], "log_loss": []} for k in ("vanilla", "nr_1")}
    for seed in SEEDS:
        for label, make in (
            ("vanilla", lambda: None),
            ("nr_1", lambda: synthetic_defense(Dravl, alpha_n=1.0)),
        ):
            row = stream_split(make(), seed)
            for k in runs[label]:
                runs[label][k].append(row[k])
    print({k: {m: [round(x, 3) for x in v] for m, v in r.items()} for k, r in runs.items()})
    med = {k: {m: median(v) for m, v in r.items()} for k, r in runs.items()}
    assert med["nr_1"]["nmse"] > med["vanilla"]["nmse"], med
    assert med["nr_1"]["auc"] < med["vanilla"]["auc"], med
    assert all(0.0 < x < 1.5 for r in runs.values() for x in r["log_loss"]), runs
