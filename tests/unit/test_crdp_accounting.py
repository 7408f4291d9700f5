"""CRDP-FL's accounting as pure functions of its options and the plan (docs/methods/crdp-fl.md §2.8)."""

from __future__ import annotations

import math

import pytest

from securevfl.defenses.crdp import CrdpOptions
from securevfl.defenses.crdp.accounting import (
    communication_release,
    crdp_mechanisms,
    em_release,
    pearson_release,
)
from securevfl.privacy.accountant import EpsDeltaRelease, LaplaceRelease, Plan
from securevfl.privacy.correlated import UnboundedRelease, utility_sensitivity

PLAN = Plan(steps=30, n_train=300, batch_size=32, record_releases=4, evaluations=2)


def test_pearson_paper_mode_composes_sensitivity_two_over_every_pair() -> None:
    r = pearson_release(CrdpOptions(eps1=0.5), width=5)
    assert isinstance(r, EpsDeltaRelease)
    assert r.epsilon == pytest.approx(2 * 0.5 * 10)  # 5 columns: 10 pairs


def test_pearson_strict_mode_is_eps1_and_the_unknowns_are_unbounded() -> None:
    strict = pearson_release(CrdpOptions(eps1=0.5, pearson="strict"), width=5)
    assert isinstance(strict, EpsDeltaRelease) and strict.epsilon == 0.5
    assert isinstance(pearson_release(CrdpOptions(), width=None), UnboundedRelease)
    assert isinstance(pearson_release(CrdpOptions(eps1=None), width=5), UnboundedRelease)


def test_em_release_scales_eps2_by_the_true_over_the_used_utility_sensitivity() -> None:
    p = CrdpOptions(eps2=2.0)
    true_du = utility_sensitivity(p.utility, n=300, s=1.0, w0=p.w0)
    paper = em_release(p, 300, 1.0)
    assert isinstance(paper, EpsDeltaRelease) and paper.epsilon == pytest.approx(2.0 * true_du)
    strict = em_release(CrdpOptions(eps2=2.0, delta_u="strict"), 300, 1.0)
    assert isinstance(strict, EpsDeltaRelease) and strict.epsilon == pytest.approx(2.0)


def test_communication_is_laplace_only_where_h_is_clipped() -> None:
    clipped = communication_release(CrdpOptions(eps3=4.0, variant="fixed"), 7)
    assert isinstance(clipped, LaplaceRelease)
    assert (clipped.count, clipped.scale) == (7, 0.25)
    assert isinstance(communication_release(CrdpOptions(eps3=4.0), 7), UnboundedRelease)  # s = 1 unenforced
    assert isinstance(communication_release(CrdpOptions(eps3=None, variant="fixed"), 7), UnboundedRelease)


def test_mechanisms_carry_the_papers_claims_and_skip_selection_when_it_is_off() -> None:
    p = CrdpOptions(eps1=1.0, eps2=0.5, eps3=0.25, m=3, variant="fixed")
    mechs = crdp_mechanisms(p, PLAN, width=4, s=1.0, n_orgs=2)
    assert [m.name for m in mechs] == ["crdp.pearson", "crdp.feature_optimization", "crdp.communication"]
    comm = mechs[-1]
    assert comm.claim["epsilon"] == pytest.approx(30 * 0.25)  # t = 30 rounds at eps3
    assert comm.claim["paper_total_epsilon"] == pytest.approx(max(1.0, 3 * 0.5 + 30 * 0.25))
    assert comm.claim["N"] == 2
    assert comm.releases[0].count == PLAN.record_releases
    off = crdp_mechanisms(p.model_copy(update={"feature_selection": False}), PLAN, width=4, s=1.0, n_orgs=1)
    assert [m.name for m in off] == ["crdp.communication"]
    assert not math.isinf(comm.releases[0].scale)
