"""VFL-AFE's adjustment pieces and the ``embedding_dp`` defense (docs/methods/vfl-afe.md §8.2 items 7-12, plus
options validation and the accountant record of §7)."""

from __future__ import annotations

import itertools
import math
import warnings

import numpy as np
import pytest
import torch

from securevfl.app.loader import load_checked_dict, load_protocol_dict
from securevfl.csprng import SecretStream
from securevfl.defenses import DEFENSES
from securevfl.defenses import _afe as afe
from securevfl.defenses.base import DefenseContext
from securevfl.defenses.vfl_afe import NOT_DATASET_DP, EmbeddingDP, EmbeddingDPOptions
from securevfl.errors import ConfigError
from securevfl.privacy import gaussian as gm
from securevfl.privacy.accountant import GaussianRelease, Plan, account
from tests.support.protocols import small_digits


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _blobs(
    n_per: int = 50, dim: int = 6, seed: int = 0, sep: float = 10.0
) -> tuple[torch.Tensor, torch.Tensor]:
    g = _gen(seed)
    centres = torch.randn(3, dim, generator=g, dtype=torch.float64) * sep
    y = torch.arange(3).repeat_interleave(n_per)
    x = centres[y] + torch.randn(3 * n_per, dim, generator=g, dtype=torch.float64)
    return x, y


def _same_partition(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a[:, None] == a[None, :], b[:, None] == b[None, :])


# -- 7. FCM -----------------------------------------------------------------------------------


def test_fcm_memberships_and_purity():
    x, y = _blobs()
    u, ids, conf = afe.fcm(x, 3, seed=1)
    assert u.dtype == torch.float64
    assert torch.allclose(u.sum(1), torch.ones(len(x), dtype=torch.float64), atol=1e-9)
    assert torch.equal(conf, u.max(1).values)
    assert afe.purity(ids, y) > 0.99


def test_fcm_invariant_to_permutation_and_scale():
    x, _ = _blobs(seed=2)
    _, ids, _ = afe.fcm(x, 3, seed=3)
    perm = torch.randperm(len(x), generator=_gen(4))
    _, ids_p, _ = afe.fcm(x[perm], 3, seed=3)
    assert _same_partition(ids[perm], ids_p)
    _, ids_s, _ = afe.fcm(x * 1e-4, 3, seed=3)
    assert _same_partition(ids, ids_s)


def test_fcm_centres_match_scikit_fuzzy():
    skfuzzy = pytest.importorskip("skfuzzy")
    x, _ = _blobs(seed=5)
    u, _, _ = afe.fcm(x, 3, m=2.0, max_iter=1000, tol=1e-10, seed=6)
    ours = afe.fcm_centres(x, u).numpy()
    ref, *_ = skfuzzy.cluster.cmeans(x.numpy().T, 3, 2.0, error=1e-10, maxiter=1000, seed=7)
    best = min(np.abs(ours[list(p)] - ref).max() for p in itertools.permutations(range(3)))
    assert best < 1e-4


def _linear_head_grads(coef: np.ndarray, y: np.ndarray, seed: int) -> torch.Tensor:
    """Rows ``(p1 - y) (w_1 - w_0)`` of a 2-logit softmax-CE linear head, with ``|p1 - y| = coef``."""
    w = np.random.default_rng(seed).normal(size=(2, 8))
    p1 = np.where(y == 1, 1 - coef, coef)
    return torch.as_tensor((p1 - y)[:, None] * (w[1] - w[0])[None, :])


def test_label_leak_gradients_split_by_sign():
    """§1: with a linear head and binary labels, the gradient's sign on its common direction is
    the label (which side is which is arbitrary)."""
    rng = np.random.default_rng(8)
    y = rng.integers(0, 2, 200)
    g = _linear_head_grads(rng.uniform(0.01, 0.99, 200), y, 9).numpy()
    _, sv, vt = np.linalg.svd(g, full_matrices=False)
    assert sv[1] < 1e-10 * sv[0]  # collinear rows
    side = (g @ vt[0] > 0).astype(int)
    assert (side == y).all() or (side == 1 - y).all()


def test_fcm_recovers_labels_when_balanced_and_confident():
    rng = np.random.default_rng(10)
    y = np.repeat([0, 1], 128)
    g = _linear_head_grads(rng.uniform(0.3, 0.9, 256), y, 11)
    _, ids, conf = afe.fcm(g * 256, 2, seed=12)
    keep = conf >= 0.7
    assert keep.float().mean() > 0.5
    assert afe.purity(ids, torch.as_tensor(y), keep) == 1.0


def test_fcm_kept_purity_below_one_when_one_class_is_confident():
    """The spec's caveat: negatives confidently classified (|p1 - y| near 0) and positives not
    put some positives in the negatives' cluster with membership above c. Seeds 13-17 gave
    kept-row purity 0.835-0.852 at c=0.7, keeping 92-95% of rows (spec's numpy check: 0.88)."""
    rng = np.random.default_rng(13)
    y = np.repeat([0, 1], 128)
    coef = np.where(y == 0, rng.uniform(0.0, 0.05, 256), rng.uniform(0.0, 0.9, 256))
    g = _linear_head_grads(coef, y, 14)
    _, ids, conf = afe.fcm(g * 256, 2, seed=15)
    assert 0.75 < afe.purity(ids, torch.as_tensor(y), conf >= 0.7) < 0.95


# -- 8. contrastive loss ----------------------------------------------------------------------


def _brute_cl(h, ids, conf, c, beta, mode):
    n = len(h)
    total = 0.0
    for j in range(n):
        for k in range(n):
            if conf[j] < c or conf[k] < c or j == k:
                continue
            same = bool(ids[j] == ids[k])
            d = float((h[j] - h[k]).norm())
            if mode == "pull":
                total += d if same else 0.0
            else:
                total += 0.0 if same else d
    sign = -1.0 if mode == "push" else 1.0
    return sign * beta * total / n**2


@pytest.mark.parametrize("mode", ["push", "pull", "literal"])
def test_contrastive_matches_brute_force(mode):
    g = _gen(20)
    h = torch.randn(12, 4, generator=g, dtype=torch.float64)
    ids = torch.randint(0, 3, (12,), generator=g)
    conf = torch.rand(12, generator=g, dtype=torch.float64)
    got = float(afe.contrastive_loss(h, ids, conf, 0.3, 0.5, mode))
    assert got == pytest.approx(_brute_cl(h, ids, conf, 0.3, 0.5, mode), rel=1e-9)


def test_contrastive_zero_cases_and_filtered_rows_get_no_gradient():
    h = torch.randn(6, 3, generator=_gen(21), dtype=torch.float64, requires_grad=True)
    one = torch.zeros(6, dtype=torch.long)
    assert float(afe.contrastive_loss(h, one, torch.ones(6), 0.5, 1.0).detach()) == 0.0
    ids = torch.tensor([0, 1, 0, 1, 0, 1])
    conf = torch.tensor([0.9, 0.2, 0.2, 0.2, 0.2, 0.2])
    assert float(afe.contrastive_loss(h, ids, conf, 0.5, 1.0).detach()) == 0.0  # one row kept
    conf = torch.tensor([0.9, 0.9, 0.9, 0.1, 0.1, 0.1])
    afe.contrastive_loss(h, ids, conf, 0.5, 1.0).backward()
    assert torch.equal(h.grad[3:], torch.zeros(3, 3, dtype=torch.float64))
    assert h.grad[:3].abs().sum() > 0


def _between(h: torch.Tensor, ids: torch.Tensor) -> float:
    d = torch.cdist(h, h)
    return float(d[ids[:, None] != ids[None, :]].mean())


@pytest.mark.parametrize("mode,grows", [("push", True), ("literal", False)])
def test_contrastive_push_separates_literal_pulls_together(mode, grows):
    x, y = _blobs(n_per=10, dim=4, seed=22, sep=1.0)
    h = x.clone().requires_grad_(True)
    afe.contrastive_loss(h, y, torch.ones(len(y)), 0.5, 1.0, mode).backward()
    after = h.detach() - 1.0 * h.grad
    assert (_between(after, y) > _between(x, y)) == grows


# -- 9. KL loss -------------------------------------------------------------------------------


def test_kl_gaussian_vs_exponential_scale_invariant_finite_gradient():
    """Spec sanity values (mean of 20 draws): Gaussian P=2016 ~0.004, exponential ~0.27."""
    g = _gen(23)
    gauss = torch.randn(2016, generator=g, dtype=torch.float64) + 10
    expo = torch.empty(2016, dtype=torch.float64).exponential_(generator=g)
    assert float(afe.kl_gaussian_loss(gauss)) < 0.01
    assert float(afe.kl_gaussian_loss(expo)) > 0.2
    assert float(afe.kl_gaussian_loss(expo * 37.0)) == pytest.approx(
        float(afe.kl_gaussian_loss(expo)), rel=1e-9
    )
    d = expo.clone().requires_grad_(True)
    afe.kl_gaussian_loss(d, alpha=2.0).backward()
    assert torch.isfinite(d.grad).all() and d.grad.abs().sum() > 0


# -- the defense ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def proto():
    return load_checked_dict(small_digits())


NOISE = SecretStream.from_seed(0, "test")  # the defense's noise key, pinned for reproducibility


def _defense(proto, **opts) -> EmbeddingDP:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return EmbeddingDP(
            EmbeddingDPOptions(**opts),
            DefenseContext(proto.protocol, proto.components, "left", "passive", 0, NOISE),
        )


def _step(d: EmbeddingDP, f: torch.nn.Module, x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """The passive train step of securevfl/parties/passive.py, on one process."""
    h = f(x)
    h2 = d.embed(h, train=True)
    obj = (h2 * d.grad(g)).sum()
    local = d.local_loss(x, h)
    if local is not None:
        obj = obj + local
    obj.backward()
    return h2


def test_registered_passive_only_and_backend_free():
    cls = DEFENSES.get("embedding_dp")
    assert cls is EmbeddingDP
    assert cls.sides == frozenset({"passive"}) and cls.requires == frozenset()


def test_gradient_flow_matches_reference(proto):
    """§8.2 item 11: the parameter gradient equals autograd of
    <G, s*clip(f(x))> + alpha KL(pdist(clip f(x))) + CL(s*clip f(x)) with s detached."""
    opts = {"variant": "full", "classes": 3, "epsilon": 0.5, "confidence": 0.0, "beta": 1.0}
    torch.manual_seed(0)
    f = torch.nn.Linear(5, 8)
    x = torch.randn(32, 5, generator=_gen(30))
    g = torch.randn(32, 8, generator=_gen(31)) / 32
    d = _defense(proto, **opts)
    _step(d, f, x, g)
    got = f.weight.grad.clone()

    f.weight.grad = None
    f.bias.grad = None
    h = f(x)
    norm = h.norm(dim=1, keepdim=True)
    hc = h * torch.minimum(torch.ones_like(norm), 1.0 / norm)  # t = 1
    dist = torch.as_tensor(
        [float((hc[j] - hc[k]).detach().norm()) for j in range(32) for k in range(j + 1, 32)],
        dtype=torch.float64,
    )
    s = 2.0 / float(dist.mean() + 3 * dist.std(correction=0))
    hs = s * hc
    ref = _defense(proto, **opts)
    _, ids, conf = afe.fcm(g * 32, 3, seed=ref.fcm_seed + 1)
    obj = (
        (hs * g).sum() + afe.kl_gaussian_loss(torch.pdist(hc)) + afe.contrastive_loss(hs, ids, conf, 0.0, 1.0)
    )
    obj.backward()
    assert torch.allclose(got, f.weight.grad, rtol=1e-4, atol=1e-6)
    assert float(d.s_train[0]) == pytest.approx(s, rel=1e-5)


@pytest.mark.parametrize(
    "variant,rescaled,kl,fcm", [("vanilla", 0, 0, 0), ("R", 1, 1, 0), ("D", 0, 0, 1), ("full", 1, 1, 1)]
)
def test_variant_switches(proto, variant, rescaled, kl, fcm):
    d = _defense(proto, variant=variant, classes=10, epsilon=0.5)
    torch.manual_seed(1)
    f = torch.nn.Linear(8, 16)
    _step(d, f, torch.randn(64, 8, generator=_gen(32)), torch.randn(64, 16, generator=_gen(33)) / 64)
    assert len(d.s_train) == rescaled
    assert len(d.log["kl"]) == kl
    assert len(d.log["cl"]) == fcm
    rep = d.report()
    assert rep["variant"] == variant and ("s_train" in rep) == bool(rescaled)


def test_identity_configuration_is_unprotected_vfl(proto):
    """§8.2 item 12: eps = inf, no clipping, adjustments off -> exactly the unprotected step."""
    d = _defense(proto, variant="vanilla", epsilon=math.inf, clip=None)
    h = torch.randn(16, 4, generator=_gen(34))
    assert torch.equal(d.embed(h, train=True), h) and torch.equal(d.embed(h, train=False), h)
    assert d.local_loss(h, h) is None
    assert d.mechanisms(Plan(10, 100, 16, 2, 1)) == []


def test_noise_does_not_depend_on_data_or_s(proto):
    """§8.2 item 2: with the same seed, the noise drawn is the same whatever the rows and s."""
    outs = []
    for scale in (0.01, 100.0):
        d = _defense(proto, variant="R", epsilon=0.5)
        hc = gm.clip_rows(torch.randn(64, 8, generator=_gen(35), dtype=torch.float64) * scale, 1.0)
        out = d.embed(hc, train=True)
        outs.append((out - hc * d.s_train[-1]).detach())
        assert d.report()["noise_std"] == pytest.approx(2 * gm.classic_sigma(0.5, 1e-2))
    assert torch.allclose(outs[0], outs[1], atol=1e-9)


def test_eval_is_noised_unless_turned_off(proto):
    h = torch.zeros(32, 4)
    assert not torch.equal(_defense(proto, variant="vanilla", epsilon=0.5).embed(h, train=False), h)
    quiet = _defense(proto, variant="vanilla", epsilon=0.5, eval_noise=False)
    assert torch.equal(quiet.embed(h, train=False), h)
    (mech,) = quiet.mechanisms(Plan(10, 100, 16, 2, 3))
    assert any("not protected" in n for n in mech.notes)


def test_small_batches_skip_rescaling(proto):
    d = _defense(proto, variant="R", epsilon=0.5)
    out = d.embed(torch.randn(2, 4, generator=_gen(36)), train=True)
    assert out.shape == (2, 4) and d.s_train == []
    assert d.local_loss(None, None) is None


def test_rescale_mode_dp_keeps_rows_in_ball(proto):
    d = _defense(proto, variant="R", epsilon=math.inf, rescale_mode="dp", est_epsilon=0.5)
    h = torch.randn(64, 8, generator=_gen(37), dtype=torch.float64) * 0.05
    h[:, 0] += 5.0
    out = d.embed(h, train=True)
    assert float(out.norm(dim=1).max()) <= 1.0 + 1e-9  # no noise: the transformed rows themselves
    assert d.s_train[0] > 1.0  # the packed batch is still amplified, but re-clipped


# -- accounting (docs/methods/vfl-afe.md §7) -----------------------------------------------------------------


def test_mechanism_vanilla_record(proto):
    d = _defense(proto, variant="vanilla", epsilon=1.0, delta=1e-2)
    (mech,) = d.mechanisms(Plan(steps=200, n_train=1000, batch_size=50, record_releases=20, evaluations=3))
    assert mech.releases == (GaussianRelease(count=20, noise_multiplier=pytest.approx(3.107511, abs=1e-6)),)
    assert NOT_DATASET_DP in mech.notes
    assert mech.claim["epsilon"] == 1.0 and mech.claim["delta"] == 1e-2
    rec = account({"left": [mech]}, 1e-2)["left"]["mechanisms"]["embedding_dp"]
    assert rec["epsilon"] == pytest.approx(3.797, abs=0.01)
    assert rec["claim"]["epsilon"] == 1.0


def test_mechanism_counts_evaluations_of_test_rows(proto):
    d = _defense(proto, variant="vanilla", epsilon=1.0)
    (mech,) = d.mechanisms(Plan(steps=4, n_train=1000, batch_size=50, record_releases=1, evaluations=5))
    assert mech.releases[0].count == 5


def test_mechanism_paper_rescaling_uses_effective_multiplier(proto):
    plan = Plan(steps=10, n_train=640, batch_size=64, record_releases=1, evaluations=1)
    capped = _defense(proto, variant="R", epsilon=1.0, s_max=2.0)
    (mech,) = capped.mechanisms(plan)
    assert mech.releases[0].noise_multiplier == pytest.approx(gm.classic_sigma(1.0, 1e-2) / 2.0)
    rec = account({"left": [mech]}, 1e-2)["left"]["mechanisms"]["embedding_dp"]
    assert rec["epsilon"] == pytest.approx(1.287, abs=0.01)  # appendix A, s = 2


def test_uncapped_paper_rescaling_is_unbounded_whatever_the_data(proto):
    """Without s_max nothing in the options bounds s, so the accounting (which is
    sent to the active party) is unbounded before and after data, never a figure
    at an observed s (a statistic of the party's data); the observed multiplier is
    in the party's own report."""
    plan = Plan(steps=10, n_train=640, batch_size=64, record_releases=1, evaluations=1)
    d = _defense(proto, variant="R", epsilon=1.0)
    before = d.mechanisms(plan)
    h = torch.randn(128, 32, generator=_gen(38), dtype=torch.float64) * 0.5
    h[:, 0] += 10.0  # offset cap -> s > 3
    d.embed(h, train=True)
    s = d.s_train[0]
    assert s > 3.0
    (mech,) = d.mechanisms(plan)
    assert d.mechanisms(plan) == before
    assert mech.releases[0].describe()["kind"] == "unbounded"
    assert math.isinf(account({"left": [mech]}, 1e-2)["left"]["total"]["epsilon"])
    assert any("uncapped" in n for n in mech.notes)
    rep = d.report()
    assert rep["s_train"]["max"] == pytest.approx(s)
    assert rep["noise_multiplier_at_s_max"] == pytest.approx(gm.classic_sigma(1.0, 1e-2) / s)
    assert rep["effective_epsilon_at_s_max"] == pytest.approx(gm.effective_epsilon(d.sigma, s, 1e-2))
    assert rep["effective_epsilon_at_s_max"] > 2.5
    # what the stack declares public holds none of it: the options and what they give
    assert set(d.public_report()) == {"params", "sigma", "noise_std", "single_release_epsilon"}


def test_mechanism_dp_mode_accounts_estimates(proto):
    d = _defense(proto, variant="R", epsilon=0.5, rescale_mode="dp", est_epsilon=0.5)
    (mech,) = d.mechanisms(Plan(steps=10, n_train=640, batch_size=64, record_releases=3, evaluations=1))
    assert [r.count for r in mech.releases] == [3, 6]
    assert mech.releases[1].noise_multiplier == pytest.approx(gm.classic_sigma(0.5, 1e-2))


# -- options validation -----------------------------------------------------------------------


def _doc_with(params: dict, **privacy) -> dict:
    doc = small_digits()
    doc["parties"]["passive"][0]["defenses"] = [{"name": "embedding_dp", "params": params}]
    if privacy:
        doc["privacy"] = privacy
    return doc


@pytest.mark.parametrize(
    "params,needle",
    [
        ({"variant": "full"}, "needs 'classes'"),
        ({"variant": "vanilla", "epsilon": 8.0}, "unsound"),
        ({"variant": "vanilla", "clip": None}, "without noise"),
        ({"variant": "vanilla", "calibration": "exact"}, "calibration"),
        ({"variant": "vanilla", "bogus": 1}, "unknown key"),
    ],
)
def test_bad_options_refused_at_load_with_path(params, needle):
    with pytest.raises(ConfigError) as exc:
        load_protocol_dict(_doc_with(params))
    assert "parties.passive[0].defenses[0].params" in str(exc.value) and needle in str(exc.value)


def test_analytic_accepts_large_eps():
    proto = load_protocol_dict(_doc_with({"variant": "vanilla", "epsilon": 8.0, "calibration": "analytic"}))
    assert proto.parties.passive[0].defenses[0].params["epsilon"] == 8.0


def test_budget_with_uncapped_paper_rescaling_refused():
    proto = load_checked_dict(_doc_with({"variant": "R"}, budget={"epsilon": 5.0}))
    with pytest.raises(ConfigError, match="s_max"):
        _defense(proto, variant="R")
    _defense(proto, variant="R", s_max=2.0)  # a cap gives a bound the budget can plan with


def test_tiny_effective_multiplier_is_accounted_exactly_and_fast(proto):
    """Per-release eps 40 with s capped at 4.7 gives z ~ 0.03, whose PLD would take minutes: the
    accountant composes Gaussian-only releases in closed form, exactly (docs/methods/vfl-afe.md §7)."""
    import time

    from securevfl.privacy.accountant import account

    d = _defense(proto, variant="R", epsilon=40.0, calibration="analytic", s_max=4.7)
    z = d.sigma / 4.7
    assert z < 0.1
    (mech,) = d.mechanisms(Plan(steps=10, n_train=640, batch_size=64, record_releases=3, evaluations=1))
    assert mech.releases[0].noise_multiplier == pytest.approx(z)
    t0 = time.perf_counter()
    rec = account({"left": [mech]}, proto.protocol.privacy.delta)["left"]["mechanisms"][mech.name]
    assert time.perf_counter() - t0 < 5.0
    assert rec["epsilon"] == pytest.approx(
        gm.gdp_composed_epsilon(z, 3, proto.protocol.privacy.delta), rel=1e-9
    )
