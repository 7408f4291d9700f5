"""The ``crdp`` defense (docs/methods/crdp-fl.md): options and load-time checks, feature selection
decided once on training rows, the Laplace release on embeddings, the accounting
it declares, and the CrypTen secure sum of per-party statistics across real
processes."""

from __future__ import annotations

import copy
import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from sklearn.datasets import load_breast_cancer

from securevfl.app.loader import load_checked_dict, load_protocol_dict
from securevfl.defenses import DEFENSES
from securevfl.defenses.base import build_stack
from securevfl.defenses.spending import spent
from securevfl.errors import ConfigError, ProtocolError, UnsupportedCombination
from securevfl.privacy.accountant import Plan
from securevfl.privacy.correlated import (
    correlation_matrix,
    distributed_cs,
    match_counts,
    quantile_codes,
)
from securevfl.privacy.step_budget import plan_for
from tests.support.protocols import load_yaml


def _doc(*, noise_seed: int | None = 0, **params: Any) -> dict[str, Any]:
    doc = load_yaml("breast_cancer.yaml")
    doc["privacy"] = {"noise_seed": noise_seed}  # pinned: these tests check determinism
    for p in doc["parties"]["passive"]:
        p["defenses"] = [{"name": "crdp", "params": dict(params)}]
    return doc


def _stack(party: str = "p1", *, noise_seed: int | None = 0, **params: Any):
    checked = load_checked_dict(_doc(noise_seed=noise_seed, **params))
    proto = checked.protocol
    spec = next(p for p in proto.parties.passive if p.name == party)
    return build_stack(proto, checked.components, party, "passive", spec.defenses), proto


@pytest.fixture(scope="module")
def bc() -> tuple[np.ndarray, np.ndarray]:
    x = load_breast_cancer().data[:, :10]
    mu, sd = x[:400].mean(0), x[:400].std(0)
    return (x[:400] - mu) / sd, (x[400:] - mu) / sd


COLS = [f"c{i}" for i in range(10)]


# -- registration and options ------------------------------------------------------------


def test_registered_passive_only_and_backend_agnostic():
    cls = DEFENSES.get("crdp")
    assert cls.sides == frozenset({"passive"})
    assert cls.requires == frozenset()
    for backend in ("plain", "mpc", "ckks", "paillier"):
        doc = _doc()
        doc["exchange"] = {"backend": backend}
        load_protocol_dict(doc)


def test_refused_at_the_active_party():
    doc = _doc()
    doc["parties"]["active"]["defenses"] = [{"name": "crdp"}]
    with pytest.raises(UnsupportedCombination) as exc:
        load_protocol_dict(doc)
    assert "parties.active.defenses[0]" in str(exc.value)


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"eps3": 0}, "eps3"),
        ({"theta": 1.5}, "theta"),
        ({"pearson": "loose"}, "pearson"),
        ({"bogus": 1}, "bogus"),
    ],
)
def test_bad_options_name_the_field(params, field):
    with pytest.raises(ConfigError) as exc:
        load_protocol_dict(_doc(**params))
    assert field in str(exc.value)


def test_variant_sets_the_flaw_options():
    faithful, _ = _stack()
    fixed, _ = _stack(variant="fixed")
    mixed, _ = _stack(variant="fixed", pearson="paper")
    get = lambda st, k: st.defenses[0].params.resolved(k)  # noqa: E731
    assert [get(faithful, k) for k in ("pearson", "delta_u", "sensitivity")] == ["paper", "paper", "unit"]
    assert [get(fixed, k) for k in ("pearson", "delta_u", "sensitivity")] == ["strict", "strict", "clipped"]
    assert get(mixed, "pearson") == "paper" and get(mixed, "sensitivity") == "clipped"


# -- feature selection ------------------------------------------------------------------------


def test_selection_decided_on_train_and_applied_to_test(bc):
    x_tr, x_te = bc
    st, _ = _stack()
    xs, cols = st.select_features(x_tr, COLS)
    report = copy.deepcopy(st.report()["crdp"])
    keep = report["alpha_final"]
    assert 0 < len(keep) <= 10 and cols == [COLS[i] for i in keep]
    assert np.array_equal(xs, x_tr[:, keep])
    xt, cols_t = st.select_features(x_te, COLS)
    assert cols_t == cols and np.array_equal(xt, x_te[:, keep])
    assert st.report()["crdp"] == report  # the test call decided nothing new


def test_selection_is_deterministic_per_seed_and_party(bc):
    x_tr, _ = bc
    a, _ = _stack("p1")
    b, _ = _stack("p1")
    a.select_features(x_tr, COLS)
    b.select_features(x_tr, COLS)
    assert a.report() == b.report()


def test_unpinned_noise_is_private_entropy_not_the_shared_seed(bc):
    """Without privacy.noise_seed each party draws fresh OS entropy, so nobody who
    knows the protocol seed can regenerate (and subtract) its noise."""
    x_tr, _ = bc
    a, _ = _stack("p1", noise_seed=None)
    b, _ = _stack("p1", noise_seed=None)
    ka, kb = a.defenses[0].ctx.noise.state(), b.defenses[0].ctx.noise.state()
    assert ka["key"] != kb["key"] and not ka["pinned"] and not kb["pinned"]
    a.select_features(x_tr, COLS)
    b.select_features(x_tr, COLS)
    h = torch.zeros(8, a.defenses[0].d_out, dtype=torch.float64)
    assert not torch.equal(a.embed(h, train=True), b.embed(h, train=True))


def test_feature_selection_off_keeps_every_column(bc):
    x_tr, _ = bc
    st, _ = _stack(feature_selection=False)
    xs, cols = st.select_features(x_tr, COLS)
    assert cols == COLS and np.array_equal(xs, x_tr)
    rep = st.report()["crdp"]
    # Delta_CS_p is the Eq. 30 value on all ten columns at the raised threshold
    w = correlation_matrix(quantile_codes(x_tr, 10))
    assert rep["delta_cs_p"] == pytest.approx(distributed_cs(w, rep["w0_raised"]))


def test_noise_scale_follows_the_chosen_sensitivity(bc):
    x_tr, _ = bc
    scales = {}
    for noise in ("correlated", "count", "plain"):
        st, _ = _stack(noise=noise, eps3=0.5)
        st.select_features(x_tr, COLS)
        rep = st.report()["crdp"]
        scales[noise] = rep["laplace_scale"]
        expected = {"correlated": rep["delta_cs_p"], "count": rep["delta_gs"], "plain": 1.0}[noise]
        assert rep["laplace_scale"] == pytest.approx(expected / 0.5)
    # GDP-FL's count sensitivity >= CRDP-FL's correlated one >= plain DP
    assert scales["count"] >= scales["correlated"] >= scales["plain"]


# -- the release ----------------------------------------------------------------------------


def test_embed_refuses_before_selection():
    st, _ = _stack()
    with pytest.raises(ProtocolError):
        st.embed(torch.zeros(2, 16), train=True)


def test_embed_adds_fresh_laplace_noise_to_the_sent_copy_only(bc):
    x_tr, _ = bc
    st, _ = _stack(eps3=0.5)
    st.select_features(x_tr, COLS)
    scale = st.report()["crdp"]["laplace_scale"]
    h = torch.randn(256, 16, requires_grad=True)
    h_before = h.detach().clone()
    a = st.embed(h, train=True)
    b = st.embed(h, train=True)
    assert torch.equal(h.detach(), h_before)  # own h untouched
    d1, d2 = (a - h).detach().numpy().ravel(), (b - h).detach().numpy().ravel()
    assert not np.allclose(d1, d2)  # fresh per release
    # Laplace(b): E|X| = b; 4096 draws, std of the mean |X| is b / 64
    assert abs(np.abs(d1).mean() / scale - 1.0) < 0.1
    # gradient reaches h unchanged (noise is an additive constant)
    a.sum().backward()
    assert torch.equal(h.grad, torch.ones_like(h))
    assert torch.equal(st.embed(h, train=False), h)  # no noise at evaluation (faithful)
    assert st.report()["crdp"]["noised_releases"] == 2


def test_no_noise_when_eps3_infinite_bit_for_bit(bc):
    x_tr, _ = bc
    st, _ = _stack(eps3=None, feature_selection=False)  # null: no noise
    xs, _ = st.select_features(x_tr, COLS)
    assert np.array_equal(xs, x_tr)
    h = torch.randn(64, 16)
    assert torch.equal(st.embed(h, train=True), h)


def test_clipped_sensitivity_clips_and_scales(bc):
    x_tr, _ = bc
    st, _ = _stack(variant="fixed", clip=0.5, eps3=None)
    st.select_features(x_tr, COLS)
    rep = st.report()["crdp"]
    assert rep["record_sensitivity_s"] == 2 * 16 * 0.5
    h = torch.linspace(-3, 3, 32).reshape(2, 16)
    assert torch.equal(st.embed(h, train=True), h.clamp(-0.5, 0.5))


def test_noise_at_eval_option(bc):
    x_tr, _ = bc
    st, _ = _stack(noise_at_eval=True)
    st.select_features(x_tr, COLS)
    h = torch.zeros(8, 16)
    assert not torch.equal(st.embed(h, train=False), h)


# -- accounting -----------------------------------------------------------------------------


def _plan() -> Plan:
    proto = load_protocol_dict(_doc())
    return plan_for(200, 426, proto.training)


def test_faithful_accounting_is_unbounded_with_the_paper_claim_alongside():
    plan = _plan()
    st, _ = _stack()
    mechs = {m.name: m for m in st.mechanisms(plan)}
    assert set(mechs) == {"crdp.pearson", "crdp.feature_optimization", "crdp.communication"}
    claim = mechs["crdp.communication"].claim
    assert claim["paper_total_epsilon"] == max(1.0, 10 * 1.0 + plan.steps * 1.0)
    assert claim["spec_sound_epsilon"] == 3 * 1.0 + 1.0 + plan.steps * 1.0
    assert claim["t"] == plan.steps and claim["N"] == 3
    out = spent(load_checked_dict(_doc()), plan)["p1"]
    assert out["mechanisms"]["crdp.communication"]["epsilon"] == math.inf  # unit s: nothing bounds h
    # paper-mode Pearson: Lap(1/eps1) on 45 pairs with true sensitivity 2 each
    assert out["mechanisms"]["crdp.pearson"]["releases"] == [
        {"kind": "eps_delta", "epsilon": 90.0, "delta": 0.0, "count": 1}
    ]
    # paper-mode EM: Delta_u = 1 used, n s = 426 true
    assert out["mechanisms"]["crdp.feature_optimization"]["epsilon"] == pytest.approx(426.0, abs=1e-3)


def test_fixed_accounting_is_finite_and_matches_the_releases():
    plan = _plan()
    out = spent(load_checked_dict(_doc(variant="fixed", eps3=0.5)), plan)["p2"]
    mech = out["mechanisms"]
    assert mech["crdp.pearson"]["epsilon"] == pytest.approx(1.0, abs=1e-3)
    assert mech["crdp.feature_optimization"]["epsilon"] == pytest.approx(1.0, abs=1e-3)
    assert mech["crdp.communication"]["releases"] == [
        {"kind": "laplace", "scale": 2.0, "count": plan.record_releases}
    ]
    # basic composition bounds the PLD figure from above
    assert mech["crdp.communication"]["epsilon"] <= plan.record_releases * 0.5 + 1e-6
    assert out["total"]["epsilon"] <= 2.0 + plan.record_releases * 0.5 + 1e-6
    assert math.isfinite(out["total"]["epsilon"])


def test_mechanisms_do_not_depend_on_the_data(bc):
    """Every rank plans budgets from the protocol alone: the declared releases
    are the same before and after the party selected its features."""
    x_tr, _ = bc
    plan = _plan()
    st, _ = _stack(variant="fixed")
    before = st.mechanisms(plan)
    st.select_features(x_tr, COLS)
    assert st.mechanisms(plan) == before


def test_budget_stops_a_fixed_run():
    from securevfl.defenses.spending import allowed_steps

    doc = _doc(variant="fixed", eps3=1.0)
    doc["privacy"] = {"budget": {"epsilon": 6.0}}
    steps = allowed_steps(load_checked_dict(doc), 426)
    assert 0 < steps < 14 * 15  # pearson 1 + EM 1 leave about 4 for the communication


# -- CrypTen secure sum across real processes ----------------------------------------------


def _secure_worker(rank: int, world: int, rdv: str, out_dir: str) -> None:
    import torch.distributed as dist

    from securevfl.exchange.mpc.crypten.runtime import serve_dealer, start_crypten, stop_crypten
    from securevfl.privacy.secure_sum import secure_correlated_sensitivity, secure_sum
    from securevfl.runtime.channel import Channel
    from securevfl.runtime.ledger import Ledger

    dist.init_process_group("gloo", init_method=f"file://{rdv}", rank=rank, world_size=world)
    n_mpc = world - 1
    ch = Channel(rank, {r: f"rank{r}" for r in range(world)}, Ledger(rank))
    crypten = start_crypten(ch, world, n_mpc, provider="TTP", on_failure=ch.comm_failure)
    if rank == n_mpc:
        serve_dealer(ch, ch.comm_failure)
        stop_crypten()
        dist.destroy_process_group()
        return
    codes = quantile_codes(load_breast_cancer().data[:40], 10)
    mine = codes[:, rank * 10 : rank * 10 + 10]
    counts = torch.as_tensor(match_counts(mine), dtype=torch.float32)
    total = secure_sum(crypten, counts, (40, 40), sources=list(range(n_mpc)))
    only0 = secure_sum(crypten, torch.tensor([float(rank + 1)]), (1,), sources=list(range(n_mpc)), dst=0)
    cs = secure_correlated_sensitivity(
        crypten, counts, 40, sources=list(range(n_mpc)), n_features=30, w0=0.4, s=2.0
    )
    import crypten.communicator as comm

    if rank == 0:
        c = comm.get()
        c.send_obj("terminate", c.get_ttp_rank(), c.ttp_group)
    stop_crypten()
    sent = sum(r.bytes for r in ch.ledger.records if r.direction == "sent")
    np.savez(
        os.path.join(out_dir, f"rank{rank}.npz"),
        total=total.numpy(),
        only0=np.array([np.nan]) if only0 is None else only0.numpy(),
        cs=np.array([cs]),
        sent=np.array([sent]),
    )
    dist.destroy_process_group()


@pytest.mark.slow  # four fresh interpreters importing CrypTen: ~100 s on the 2-core CI box
@pytest.mark.timeout(300)
def test_crypten_secure_sum_across_processes(tmp_path: Path):
    """Three parties each hold one WDBC block; the dealer is a fourth process.
    The secret-shared sum of their match counts equals the merged counts, and
    the in-MPC Delta_CS_p equals Eq. 30 on the merged data."""
    import torch.multiprocessing as mp

    world = 4
    mp.spawn(_secure_worker, args=(world, str(tmp_path / "rdv"), str(tmp_path)), nprocs=world, join=True)
    codes = quantile_codes(load_breast_cancer().data[:40], 10)
    merged = match_counts(codes)
    expected_cs = distributed_cs(merged / 30.0, 0.4, s=2.0)
    for r in range(world - 1):
        got = np.load(tmp_path / f"rank{r}.npz")
        assert np.array_equal(got["total"], merged.astype(np.float32)), r
        assert got["cs"][0] == pytest.approx(expected_cs, abs=1e-3)
        assert got["sent"][0] > 0  # it really went over the wire
        if r == 0:
            assert got["only0"][0] == 6.0
        else:
            assert np.isnan(got["only0"][0])
    assert expected_cs > 2.0  # the merged sample has correlated records, so the max is not just s


# -- the merged sensitivity (delta_scope: merged_secure) ---------------------------------------


def test_count_threshold_is_the_smallest_count_reaching_the_weight():
    from securevfl.privacy.correlated import count_threshold

    assert count_threshold(0.4, 10) == 4  # 4/10 = 0.4 counts (>=)
    assert count_threshold(0.41, 10) == 5
    assert count_threshold(0.5158, 18) == 10  # 9.28 -> 10
    assert count_threshold(0.5, 18) == 9
    with pytest.raises(ValueError):
        count_threshold(0.4, 0)


def test_merged_threshold_is_the_guarded_mean_of_the_parties_mcds():
    from securevfl.privacy.correlated import merged_threshold

    assert merged_threshold(0.4, [0.5, 0.6]) == pytest.approx(0.55)
    assert merged_threshold(0.4, [0.3, 0.35]) == 0.4  # guard max(w0, MCD)
    with pytest.raises(ValueError):
        merged_threshold(0.4, [])


def test_merged_sensitivity_is_eq30_on_the_concatenated_columns():
    """Summing the parties' own counts is Eq. 30 on the merged (concatenated)
    columns: the additivity the secure version relies on."""
    from securevfl.privacy.correlated import count_threshold, merged_correlated_sensitivity

    x = load_breast_cancer().data[:120]
    blocks = [quantile_codes(x[:, j : j + 10], 10)[:, :k] for j, k in ((0, 6), (10, 4), (20, 7))]
    mcds = [0.55, 0.48, 0.61]
    got = merged_correlated_sensitivity([match_counts(b) for b in blocks], [6, 4, 7], mcds, 0.4)
    thr = max(0.4, float(np.mean(mcds)))
    central = distributed_cs(match_counts(np.concatenate(blocks, axis=1)) / 17.0, thr)
    assert got.delta_unit == pytest.approx(central, abs=1e-12)
    assert (got.n_features, got.parties, got.threshold) == (17, 3, pytest.approx(thr))
    assert got.delta_unit >= 1.0  # the self term
    assert count_threshold(thr, 17) == 10  # 0.5467 * 17 = 9.29
    with pytest.raises(ValueError):
        merged_correlated_sensitivity([match_counts(blocks[0])], [6, 4], mcds, 0.4)


def _merged_doc(backend: str = "mpc", **params: Any) -> dict[str, Any]:
    doc = _doc(delta_scope="merged_secure", **params)
    doc["exchange"] = {"backend": backend}
    return doc


def test_merged_secure_loads_under_mpc_and_joins_the_collective():
    from securevfl.defenses.base import collective_defenses

    merged = load_checked_dict(_merged_doc())
    assert collective_defenses(merged.protocol, merged.components) == [DEFENSES.get("crdp")]
    own = _doc()
    own["exchange"] = {"backend": "mpc"}
    mine = load_checked_dict(own)
    assert collective_defenses(mine.protocol, mine.components) == []  # default 'own': no collective step


@pytest.mark.parametrize("backend", ["plain", "ckks", "paillier"])
def test_merged_secure_refused_without_crypten(backend: str):
    with pytest.raises(UnsupportedCombination) as exc:
        load_protocol_dict(_merged_doc(backend))
    msg = str(exc.value)
    assert "parties.passive[0].defenses[0].params.delta_scope" in msg
    assert f"backend '{backend}'" in msg and "mpc" in msg


def test_merged_secure_refused_under_tfp():
    doc = _merged_doc()
    doc["exchange"]["params"] = {"provider": "TFP", "insecure": True}
    with pytest.warns(UserWarning, match="TFP"), pytest.raises(UnsupportedCombination) as exc:
        load_protocol_dict(doc)
    assert "TFP" in str(exc.value) and "delta_scope" in str(exc.value)


def test_merged_secure_needs_agreeing_parties_and_correlated_noise():
    mixed = _merged_doc()
    mixed["parties"]["passive"][1]["defenses"][0]["params"]["delta_scope"] = "own"
    with pytest.raises(ConfigError) as exc:
        load_protocol_dict(mixed)
    assert "parties.passive[1].defenses[0].params.delta_scope" in str(exc.value)
    w0 = _merged_doc()
    w0["parties"]["passive"][2]["defenses"][0]["params"]["w0"] = 0.5
    with pytest.raises(ConfigError) as exc:
        load_protocol_dict(w0)
    assert "params.w0" in str(exc.value)
    with pytest.raises(ConfigError) as exc:
        load_protocol_dict(_merged_doc(noise="count"))
    assert "params.noise" in str(exc.value)


def test_merged_secure_embed_waits_for_the_collective_and_then_uses_it(bc):
    from securevfl.privacy.correlated import MergedSensitivity

    checked = load_checked_dict(_merged_doc(variant="fixed", eps3=2.0))
    spec = checked.protocol.parties.passive[0]
    st = build_stack(checked.protocol, checked.components, "p1", "passive", spec.defenses)
    d = st.defenses[0]
    st.select_features(bc[0], COLS)
    assert d._own_counts is not None and d._own_counts.shape == (400, 400)
    own = d.selection.delta_cs_p
    with pytest.raises(ProtocolError, match="collective"):
        st.embed(torch.zeros(2, 16), train=True)
    d._use_merged(MergedSensitivity(3.25, 18, 0.52, 0.52, 3), 1.5)
    assert d.scale == pytest.approx(3.25 * d.s / 2.0)  # s = 2 d_out clip (fixed variant)
    assert d._own_counts is None  # the counts are dropped once shared
    rep = st.report()["crdp"]
    assert rep["delta_scope"] == "merged_secure"
    assert rep["delta_used"] == pytest.approx(3.25 * d.s)
    assert rep["delta_cs_p"] == own  # the own-columns value stays reported alongside
    assert rep["merged"]["columns"] == 18 and rep["merged"]["seconds"] == 1.5
    comm = {m.name: m for m in st.mechanisms(_plan())}["crdp.communication"]
    assert comm.claim["delta_scope"] == "merged_secure"
    assert "delta_used" not in comm.claim  # data-dependent: in the report, not the budget plan
    assert any("merged data" in n for n in comm.notes)


def test_own_scope_reports_its_own_delta(bc):
    st, _ = _stack()
    st.select_features(bc[0], COLS)
    d = st.defenses[0]
    rep = st.report()["crdp"]
    assert rep["delta_scope"] == "own" and rep["merged"] is None
    assert rep["delta_used"] == d.selection.delta_cs_p == rep["delta_cs_p"]
    assert d._own_counts is None  # not kept unless merged_secure


def test_run_collectives_enters_each_needed_step_with_this_ranks_instances():
    """The lifecycle seam: every rank calls the hook of each defense that needs it,
    with its own instances (empty where the party does not run the defense)."""
    from securevfl.app.rank_layout import layout_of
    from securevfl.defenses.base import CollectiveContext, Defense, run_collectives

    calls: list[tuple[str, int]] = []

    class Probe(Defense):
        name = "collective_probe"
        sides = frozenset({"passive"})

        @classmethod
        def joins_collective(cls, proto, components):
            return True

        @classmethod
        def collective(cls, comm, mine):
            calls.append((comm.party, len(mine)))

    DEFENSES.add("collective_probe", Probe)
    try:
        doc = _doc()
        doc["parties"]["passive"][1]["defenses"] = [{"name": "collective_probe"}]
        checked = load_checked_dict(doc)
        proto, comps = checked.protocol, checked.components
        lay = layout_of(checked)
        for rank, party, side, specs in [
            (0, "active", "active", []),
            (1, "p1", "passive", proto.parties.passive[0].defenses),
            (2, "p2", "passive", proto.parties.passive[1].defenses),
        ]:
            st = build_stack(proto, comps, party, side, specs)
            run_collectives(st, CollectiveContext(proto, comps, lay, rank, party, side, 10, frozenset()))
    finally:
        DEFENSES.remove("collective_probe")
    assert calls == [("active", 0), ("p1", 0), ("p2", 1)]  # crdp here is 'own': no step of its own
