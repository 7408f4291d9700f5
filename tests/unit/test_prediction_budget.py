"""Predictions spend privacy (docs/privacy.md, "Predictions spend privacy"): the
pure parts. A release read back from its description is the same release; the
running total is the accountant's composition of every prediction's releases
(not a sum of epsilons); a budget refuses the prediction that would exceed it,
naming the party, the budget, the total so far and this prediction's figure;
the ledger file is private, atomic and checked when read; each built-in
defense declares what one prediction releases; and a party's budget is its own
policy, outside the protocol digest, so setting it keeps saved models usable."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import pytest

from securevfl.app import prediction_ledger
from securevfl.app.loader import load_checked_dict, load_protocol_dict
from securevfl.defenses.spending import prediction_mechanisms
from securevfl.errors import CheckpointError, ConfigError
from securevfl.privacy.accountant import (
    EpsDeltaRelease,
    GaussianRelease,
    LaplaceRelease,
    NonPrivateRelease,
    RandomizedResponseRelease,
    Release,
    epsilon,
)
from securevfl.privacy.correlated import UnboundedRelease
from securevfl.privacy.gaussian import gaussian_epsilon, noise_multiplier
from securevfl.privacy.prediction_budget import PredictionSpend, check_budget, release_of, spend_of
from securevfl.runtime.layout import Role
from tests.support.protocols import load_yaml, small_digits

RELEASES: list[Release] = [
    GaussianRelease(count=1, noise_multiplier=0.7),
    LaplaceRelease(count=3, scale=2.0),
    RandomizedResponseRelease(count=2, epsilon=1.5, classes=4),
    EpsDeltaRelease(count=1, epsilon=0.5, delta=1e-6),
    NonPrivateRelease(count=1),
    UnboundedRelease(count=1, reason="no noise"),
]


@pytest.mark.parametrize("release", RELEASES, ids=lambda r: type(r).__name__)
def test_a_release_read_back_from_its_description_is_the_same(release: Release):
    assert release_of(json.loads(json.dumps(release.describe()))) == release


@pytest.mark.parametrize(
    "doc",
    [{"kind": "poisson", "count": 1}, {"kind": "gaussian", "count": 1}, {"kind": "laplace", "count": -1}, []],
)
def test_an_unknown_or_malformed_description_is_refused(doc: Any):
    with pytest.raises(ValueError):
        release_of(doc)


def test_the_running_total_composes_the_releases_not_their_epsilons():
    """k Gaussian releases at z compose to one at z/sqrt(k) (closed form), well
    below k times one release's epsilon."""
    z, delta = noise_multiplier(8.0, 1e-2, "analytic"), 1e-2
    one = GaussianRelease(count=1, noise_multiplier=z).describe()
    for k in (1, 2, 5, 10):
        spend = spend_of("left", [GaussianRelease(count=1, noise_multiplier=z)], [[one]] * (k - 1), delta)
        assert spend.predictions == k
        assert spend.epsilon == pytest.approx(gaussian_epsilon(z, delta), rel=1e-12)
        assert spend.total == pytest.approx(gaussian_epsilon(z / math.sqrt(k), delta), rel=1e-9)
        assert spend.total_before == pytest.approx(
            0.0 if k == 1 else gaussian_epsilon(z / math.sqrt(k - 1), delta), rel=1e-9
        )
        if k > 1:
            assert spend.total < k * spend.epsilon
    # a mix is read off the composed PLD, as the accountant does for training
    lap = LaplaceRelease(count=1, scale=2.0)
    spend = spend_of("p1", [lap], [[lap.describe()], [lap.describe()]], 1e-5)
    assert spend.total == pytest.approx(epsilon([LaplaceRelease(count=3, scale=2.0)], 1e-5), rel=1e-6)


def test_an_unbounded_prediction_has_no_finite_total():
    spend = spend_of("left", [UnboundedRelease(count=1, reason="no noise")], [], 1e-5)
    assert math.isinf(spend.epsilon) and math.isinf(spend.total)
    with pytest.raises(ConfigError, match="party 'left'"):
        check_budget(spend, 1e6, path="parties.passive[0].prediction_budget.epsilon")


def _spend(k_before: int) -> PredictionSpend:
    g = GaussianRelease(count=1, noise_multiplier=1.0)
    return spend_of("left", [g], [[g.describe()]] * k_before, 1e-5)


def test_the_budget_refuses_the_prediction_that_would_exceed_it():
    path = "parties.passive[0].prediction_budget.epsilon"
    budget = (_spend(2).total + _spend(3).total) / 2  # three fit, the fourth does not
    for k in range(3):
        check_budget(_spend(k), budget, path=path)
    check_budget(_spend(3), None, path=path)  # no budget: never refused
    with pytest.raises(ConfigError) as err:
        check_budget(_spend(3), budget, path=path)
    msg = str(err.value)
    assert err.value.path == path
    assert "party 'left'" in msg and f"prediction budget epsilon={budget:g}" in msg
    assert f"3 earlier predictions composed: {_spend(3).total_before:.4g}" in msg
    assert f"would spend epsilon={_spend(3).epsilon:.4g}" in msg
    assert f"to {_spend(3).total:.4g}" in msg
    # a prediction that releases nothing priced spends nothing, whatever the budget
    check_budget(spend_of("left", [], [], 1e-5), 1e-9, path=path)


# -- the ledger ---------------------------------------------------------------------------


def _model_dir(run: Path, rank: int) -> Path:
    d = run / "ranks" / f"rank{rank}" / "model"
    d.mkdir(parents=True)
    return d


def test_the_ledger_is_private_atomic_and_read_back(tmp_path: Path):
    folder = _model_dir(tmp_path, 1)
    empty = prediction_ledger.read_ledger(tmp_path, 1, "left")
    assert empty.predictions == [] and not (folder / prediction_ledger.LEDGER_FILE).exists()
    ledger = empty
    for rows in (10, 20):
        ledger = prediction_ledger.record(tmp_path, 1, ledger, _spend(len(ledger.predictions)), rows)
    path = folder / prediction_ledger.LEDGER_FILE
    assert path.stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in folder.iterdir()) == [prediction_ledger.LEDGER_FILE]  # no temporary left
    back = prediction_ledger.read_ledger(tmp_path, 1, "left")
    assert [e.rows for e in back.predictions] == [10, 20]
    assert back.predictions[0].releases == [{"kind": "gaussian", "noise_multiplier": 1.0, "count": 1}]


def test_a_corrupted_or_foreign_ledger_is_refused_naming_the_rank_and_file(tmp_path: Path):
    path = _model_dir(tmp_path, 2) / prediction_ledger.LEDGER_FILE
    path.write_text('{"party": "right", "predictions": [{"time": 1}]}')
    with pytest.raises(
        CheckpointError, match=r"rank 2: ranks/rank2/model/prediction_ledger\.json is corrupted"
    ):
        prediction_ledger.read_ledger(tmp_path, 2, "right")
    path.write_text('{"party": "left", "predictions": []}')
    with pytest.raises(CheckpointError, match="'party'"):
        prediction_ledger.read_ledger(tmp_path, 2, "right")


def test_the_ledger_with_an_unknown_release_is_refused_when_priced(tmp_path: Path):
    proto = load_protocol_dict(small_digits())
    path = _model_dir(tmp_path, 1) / prediction_ledger.LEDGER_FILE
    entry = {
        "time": "t",
        "rows": 1,
        "releases": [{"kind": "mystery", "count": 1}],
        "epsilon": 1,
        "delta": 0.1,
    }
    path.write_text(json.dumps({"party": "left", "predictions": [entry]}))
    role = Role(rank=1, kind="passive", party="left", index=0)
    with pytest.raises(CheckpointError, match=r"rank 1: .*prediction_ledger\.json: release kind 'mystery'"):
        prediction_ledger.price(proto, role, proto.parties.passive[0], [], tmp_path)


def test_one_prediction_at_a_time_per_model(tmp_path: Path):
    _model_dir(tmp_path, 1)
    fd = prediction_ledger.hold(tmp_path, 1)
    try:
        with pytest.raises(ConfigError, match="another prediction of this model is running"):
            prediction_ledger.hold(tmp_path, 1)
    finally:
        os.close(fd)
    os.close(prediction_ledger.hold(tmp_path, 1))  # free again


# -- what each built-in defense releases at prediction ------------------------------------


def _with_defense(defense: dict[str, Any], **privacy: Any) -> dict[str, list[Any]]:
    doc = small_digits()
    doc["parties"]["passive"][0]["defenses"] = [defense]
    doc["privacy"].update(privacy)
    return prediction_mechanisms(load_checked_dict(doc))


def _releases(mechs: dict[str, list[Any]], party: str) -> list[Release]:
    return [r for m in mechs[party] for r in m.releases]


def test_embedding_dp_releases_each_row_once_per_prediction():
    params = {"variant": "vanilla", "epsilon": 8.0, "delta": 0.01, "calibration": "analytic"}
    z = noise_multiplier(8.0, 0.01, "analytic")
    got = _with_defense({"name": "embedding_dp", "params": params})
    assert _releases(got, "left") == [GaussianRelease(count=1, noise_multiplier=z)]
    assert got["right"] == [] and got["active"] == []
    # paper-mode rescaling capped at s_max: the multiplier sigma / s_max, as in training
    capped = {**params, "variant": "R", "s_max": 2.0}
    assert _releases(_with_defense({"name": "embedding_dp", "params": capped}), "left") == [
        GaussianRelease(count=1, noise_multiplier=z / 2.0)
    ]
    for unbounded in ({**params, "variant": "R"}, {**params, "eval_noise": False}):
        (r,) = _releases(_with_defense({"name": "embedding_dp", "params": unbounded}), "left")
        assert isinstance(r, UnboundedRelease) and r.count == 1


def test_the_other_defenses_release_at_prediction_what_they_release_at_evaluation():
    doc = load_yaml("crdp_plain.yaml")
    (r,) = _releases(prediction_mechanisms(load_checked_dict(doc)), "p1")
    assert isinstance(r, UnboundedRelease)  # noise_at_eval off (the default): no noise at prediction
    for p in doc["parties"]["passive"]:
        p["defenses"][0]["params"].update(noise_at_eval=True, eps3=0.5, sensitivity="clipped")
    (r,) = _releases(prediction_mechanisms(load_checked_dict(doc)), "p1")
    assert r == LaplaceRelease(count=1, scale=2.0)  # one Laplace release at 1/eps3
    # HashVFL's DP add-on: each of a code's d bits once (no median threshold at evaluation)
    doc = load_yaml("hashvfl_plain.yaml")
    for p in doc["parties"]["passive"]:
        p["defenses"][0]["params"] = {"dp": "rr", "epsilon": 2.0}
    (r,) = _releases(prediction_mechanisms(load_checked_dict(doc)), "left")
    assert r == RandomizedResponseRelease(count=4, epsilon=2.0, classes=2)
    for p in doc["parties"]["passive"]:
        p["defenses"][0]["params"]["dp_at_inference"] = False
    (r,) = _releases(prediction_mechanisms(load_checked_dict(doc)), "left")
    assert isinstance(r, UnboundedRelease)
    # label DP perturbs the training labels once: nothing at prediction
    doc = small_digits()
    doc["parties"]["active"]["defenses"] = [{"name": "label_dp", "params": {"epsilon": 1.0}}]
    assert prediction_mechanisms(load_checked_dict(doc))["active"] == []


# -- the budget field -----------------------------------------------------------------------


def test_the_budget_is_typed_at_load_and_outside_the_digest():
    doc = small_digits()
    base = load_protocol_dict(doc).digest()
    doc["parties"]["passive"][0]["prediction_budget"] = {"epsilon": 5.0}
    proto = load_protocol_dict(doc)
    assert proto.parties.passive[0].prediction_budget is not None
    assert proto.parties.passive[0].prediction_budget.epsilon == 5.0
    assert proto.digest() == base  # a saved model stays usable whatever budget its party sets
    for bad in ({"epsilon": 0}, {"epsilon": -1}, {"eps": 1.0}):
        doc["parties"]["passive"][0]["prediction_budget"] = bad
        with pytest.raises(ConfigError) as err:
            load_protocol_dict(doc)
        assert "parties.passive[0].prediction_budget" in str(err.value)


def test_an_unbounded_prediction_is_kept_in_strict_json_and_read_back(tmp_path: Path):
    """A prediction that releases something no epsilon bounds (epsilon = inf) is
    written as strict JSON ("Infinity", securevfl.jsonfile) and read back as inf."""
    import json
    import math

    from securevfl.privacy.correlated import UnboundedRelease

    folder = _model_dir(tmp_path, 1)
    spend = spend_of("left", [UnboundedRelease(count=1)], [], 1e-5)
    assert spend.epsilon == math.inf
    prediction_ledger.record(tmp_path, 1, prediction_ledger.read_ledger(tmp_path, 1, "left"), spend, 5)

    def refuse(token: str) -> None:
        raise ValueError(f"not JSON: {token}")

    doc = json.loads((folder / prediction_ledger.LEDGER_FILE).read_text(), parse_constant=refuse)
    assert doc["predictions"][0]["epsilon"] == "Infinity"
    back = prediction_ledger.read_ledger(tmp_path, 1, "left")
    assert back.predictions[0].epsilon == math.inf
    again = spend_of("left", [UnboundedRelease(count=1)], [e.releases for e in back.predictions], 1e-5)
    assert again.total_before == math.inf
