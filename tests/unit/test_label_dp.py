"""docs/methods/label-dp.md §4: randomized response on labels, its kinds, its DP audit and its
accounting. Statistical checks use fixed seeds and exact binomial / chi-square
tests at alpha = 1e-3 (the spec's level)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

from securevfl.csprng import SecretStream
from securevfl.errors import DataError
from securevfl.privacy.randomized_response import (
    detect_kind,
    flip_probability,
    keep_probability,
    randomize,
    transition_matrix,
)

N = 100_000
ALPHA = 1e-3


def gen(seed: int = 0) -> SecretStream:
    return SecretStream.from_seed(seed, "test")


def binomial_ok(k: int, n: int, p: float) -> bool:
    return stats.binomtest(k, n, p).pvalue > ALPHA


@pytest.mark.parametrize("eps", [0.5, 1.0, 3.0])
def test_binary_flip_rate_matches(eps: float) -> None:
    y = torch.randint(0, 2, (N,), generator=torch.Generator().manual_seed(1))
    out = randomize(y, eps, gen(2))
    flips = int((out != y).sum())
    assert binomial_ok(flips, N, flip_probability(eps))
    # and a wrong rate is rejected by the same test (the check has power)
    assert not binomial_ok(flips, N, flip_probability(eps) + 0.01)


@pytest.mark.parametrize("eps", [0.5, 2.0])
def test_kary_keep_rate_and_uniform_moves(eps: float) -> None:
    k = 10
    y = torch.randint(0, k, (N,), generator=torch.Generator().manual_seed(3))
    out = randomize(y, eps, gen(4), classes=k)
    moved = out != y
    assert binomial_ok(int(moved.sum()), N, 1 - keep_probability(eps, k))
    # off-class moves are uniform over the other K-1 classes: the offset (out - y) mod K
    offsets = ((out[moved] - y[moved]) % k).numpy()
    counts = np.bincount(offsets, minlength=k)[1:]
    assert stats.chisquare(counts).pvalue > ALPHA
    assert counts.min() > 0


def test_eps_inf_is_identity_and_eps_zero_is_uniform() -> None:
    y = torch.randint(0, 10, (N,), generator=torch.Generator().manual_seed(5))
    assert torch.equal(randomize(y, math.inf, gen(6), classes=10), y)
    out = randomize(y, 0.0, gen(7), classes=10)
    assert stats.chisquare(np.bincount(out.numpy(), minlength=10)).pvalue > ALPHA
    # independence from the input at eps = 0: the agreement rate is 1/K
    assert binomial_ok(int((out == y).sum()), N, 0.1)
    yb = torch.ones(N, dtype=torch.long)
    assert binomial_ok(int(randomize(yb, 0.0, gen(8)).sum()), N, 0.5)


@pytest.mark.parametrize(
    "labels,classes,kind",
    [
        (torch.tensor([0, 1, 1, 0]), None, "binary"),
        (torch.tensor([[0.0], [1.0], [1.0]]), None, "binary"),
        (torch.eye(4)[[0, 2, 3, 1]], None, "onehot"),
        (torch.tensor([0, 5, 9, 2]), 10, "index"),
    ],
)
def test_each_kind_comes_back_as_itself(labels, classes, kind) -> None:
    assert detect_kind(labels, classes) == kind
    out = randomize(labels, 1.0, gen(9), classes=classes)
    assert out.shape == labels.shape and out.dtype == labels.dtype
    assert detect_kind(out, classes) == kind


@pytest.mark.parametrize(
    "labels,classes,match",
    [
        (torch.tensor([0, 2, 1]), None, "binary labels must be 0 or 1"),
        (torch.tensor([[1.0, 1.0, 0.0], [0.0, 1.0, 0.0]]), None, "one-hot"),
        (torch.tensor([0, 10]), 10, r"0\.\.9"),
        (torch.tensor([0.5, 1.0]), None, "integer-valued"),
        (torch.zeros(2, 2, 2), None, "shape"),
    ],
)
def test_malformed_labels_get_a_clear_error(labels, classes, match) -> None:
    with pytest.raises(DataError, match=match):
        randomize(labels, 1.0, gen(), classes=classes)


@pytest.mark.parametrize("eps", [0.0, 0.3, 1.0, 4.0])
@pytest.mark.parametrize("k", [2, 3, 5])
def test_exact_likelihood_ratio_is_at_most_e_eps(eps: float, k: int) -> None:
    """Neighbouring label sets differ in one label: for every output, the
    probability ratio under the two true labels is at most e^eps, with equality
    (the bound is tight, so the mechanism spends exactly eps)."""
    m = transition_matrix(eps, k)
    assert torch.allclose(m.sum(1), torch.ones(k, dtype=torch.float64))
    ratio = (m.unsqueeze(1) / m.unsqueeze(0)).max().item()
    assert ratio <= math.exp(eps) * (1 + 1e-12)
    assert ratio == pytest.approx(math.exp(eps), rel=1e-9)


def test_binary_rule_is_the_two_class_kary_rule() -> None:
    for eps in (0.1, 1.0, 5.0):
        assert flip_probability(eps) == pytest.approx(1 - keep_probability(eps, 2))


def test_same_seed_same_noise() -> None:
    y = torch.randint(0, 10, (1000,), generator=torch.Generator().manual_seed(11))
    assert torch.equal(randomize(y, 1.0, gen(12), classes=10), randomize(y, 1.0, gen(12), classes=10))
    assert not torch.equal(randomize(y, 1.0, gen(12), classes=10), randomize(y, 1.0, gen(13), classes=10))


def _proto(eps: float | None, budget: float | None = None):
    from securevfl.app.loader import load_checked_dict
    from tests.support.protocols import small_digits

    doc = small_digits()
    doc["parties"]["active"]["defenses"] = [{"name": "label_dp", "params": {"epsilon": eps}}]
    if budget is not None:
        doc["privacy"] = {"budget": {"epsilon": budget}}
    return load_checked_dict(doc)


def test_accountant_reports_the_label_epsilon_once() -> None:
    from securevfl.defenses.spending import spent
    from securevfl.privacy.step_budget import plan_for

    checked = _proto(0.7)
    proto = checked.protocol
    for steps in (0, 5, 40):
        parties = spent(checked, plan_for(steps, 1437, proto.training))
        rec = parties["active"]["mechanisms"]["label_dp.randomized_response"]
        assert rec["epsilon"] == pytest.approx(0.7, abs=1e-3)  # reuse across epochs costs nothing more
        assert parties["active"]["total"]["epsilon"] == pytest.approx(0.7, abs=1e-3)
        assert set(parties) == {"active"}  # passive parties spent nothing
    inf = spent(_proto(None), plan_for(5, 1437, proto.training))  # null: no noise
    assert math.isinf(inf["active"]["total"]["epsilon"])


def test_budget_below_the_label_release_is_refused_before_training() -> None:
    from securevfl.defenses.spending import allowed_steps
    from securevfl.errors import ConfigError

    assert allowed_steps(_proto(0.5, budget=1.0), 1437) == 24  # 2 epochs of 12 steps: all allowed
    with pytest.raises(ConfigError, match=r"spent before the first training step") as exc:
        allowed_steps(_proto(2.0, budget=1.0), 1437)
    assert exc.value.path == "privacy.budget.epsilon"


def test_options_refuse_negative_epsilon() -> None:
    from securevfl.errors import ConfigError
    from securevfl.validation import check_protocol

    with pytest.raises(ConfigError, match=r"defenses\[0\]"):
        check_protocol(_proto(-1.0).protocol)


def test_label_dp_at_a_passive_party_is_refused_at_load() -> None:
    from securevfl.app.loader import load_protocol_dict
    from securevfl.errors import UnsupportedCombination
    from securevfl.validation import check_protocol
    from tests.support.protocols import small_digits

    doc = small_digits()
    doc["parties"]["passive"][0]["defenses"] = [{"name": "label_dp", "params": {"epsilon": 1.0}}]
    with pytest.raises(UnsupportedCombination, match=r"active party, not the passive party") as exc:
        check_protocol(load_protocol_dict(doc))
    assert exc.value.path == "parties.passive[0].defenses[0]"
