"""Typed records: a rank's summary, the result record and each party's privacy
in it, an epoch record, a party's own view."""

from __future__ import annotations

import json
import math

import pytest
import torch
from pydantic import ValidationError

from securevfl.attacks.base import View
from securevfl.errors import ConfigError, ProtocolError
from securevfl.privacy.accountant import (
    GaussianRelease,
    Mechanism,
    RandomizedResponseRelease,
    account,
    epsilon,
)
from securevfl.records import EpochRecord, OwnReport, OwnView, PrivacyReport, RankSummary, ResultRecord


def test_a_summary_writes_the_fields_its_rank_set_and_reads_back_the_same() -> None:
    passive = RankSummary(rank=1, party="left", role="passive", pid=7, train_steps=3, n_train=32)
    doc = passive.to_json()
    assert doc == {"rank": 1, "party": "left", "role": "passive", "pid": 7, "train_steps": 3, "n_train": 32}
    active = RankSummary(rank=0, party="a", role="active", pid=6, test_auc=None, peak_rss_mib=12)
    assert active.to_json()["test_auc"] is None  # set to null: written as null
    assert "test_accuracy" not in active.to_json()  # never set: not written
    assert active.to_json()["peak_rss_mib"] == 12 and isinstance(active.to_json()["peak_rss_mib"], int)
    assert RankSummary.model_validate(json.loads(json.dumps(doc))).to_json() == doc


@pytest.mark.parametrize(
    "bad",
    [
        {"rank": 1, "party": "p", "role": "passive", "pid": 1, "test_acuracy": 0.9},  # misspelt field
        {"rank": 1, "party": "p", "role": "dealer", "pid": 1},  # no such role
        {"rank": "one", "party": "p", "role": "passive", "pid": 1},
    ],
)
def test_a_malformed_summary_is_refused(bad: dict) -> None:
    with pytest.raises(ValidationError):
        RankSummary.model_validate(bad)


def test_the_result_record_requires_every_field() -> None:
    with pytest.raises(ValidationError, match="backend"):
        ResultRecord.model_validate({"protocol": "p", "description": ""})


def test_an_own_view_reads_fields_and_keeps_its_on_disk_mapping() -> None:
    fields = {"y_test": torch.tensor([1, 0]), "classes": 2, "forwards": []}
    own = OwnView(fields)
    assert torch.equal(own.y_test, fields["y_test"]) and own.classes == 2
    assert own["classes"] == 2 and own.to_dict() == fields and set(own) == set(fields)
    assert own.interactive == {} and own.own_z_test is None  # optional: empty or None
    with pytest.raises(ProtocolError, match="no 'grads'"):
        _ = own.grads


def test_a_view_wraps_a_plain_mapping_as_its_own_view() -> None:
    view = View(1, "left", {}, {"sent_test": torch.ones(2, 3)})
    assert isinstance(view.own, OwnView)
    assert view.own.sent_test.shape == (2, 3)


def _privacy(delta: float = 1e-5) -> dict:
    """result.json's privacy mapping, as rank 0 writes it, over the real accountant."""
    gauss = Mechanism("embedding_dp", (GaussianRelease(count=4, noise_multiplier=1.39),), notes=("per row",))
    rr = Mechanism("label_dp.randomized_response", (RandomizedResponseRelease(count=1, epsilon=1.0),))
    parties = {**account({"left": [gauss]}, delta), **account({"active": [rr, gauss]}, delta)}
    return {
        "accountant": "pld (dp_accounting), replace-one neighbours",
        "delta": delta,
        "noise_seed_pinned": False,
        "parties": parties,
        "budget": {"epsilon": 8.0},
        "planned_steps": 10,
        "steps_run": 8,
        "stopped_by_budget": True,
    }


RANKS = {
    "0": {"party": "active", "role": "active"},
    "1": {"party": "left", "role": "passive"},
    "2": {"party": "right", "role": "passive"},
    "3": {"party": "dealer", "role": "helper"},
}


def test_each_party_s_privacy_is_typed_from_the_accountant_s_record() -> None:
    privacy = _privacy()
    report = PrivacyReport.from_json(privacy)
    assert report is not None and set(report.parties) == {"left", "active"}
    left = report.parties["left"]
    assert (
        left.epsilon
        == privacy["parties"]["left"]["total"]["epsilon"]
        == epsilon([GaussianRelease(count=4, noise_multiplier=1.39)], 1e-5)
    )
    assert left.delta == 1e-5 and left.party == "left"
    assert left.mechanisms["embedding_dp"].notes == ["per row"]
    assert left.mechanisms["embedding_dp"].releases == [
        {"kind": "gaussian", "noise_multiplier": 1.39, "count": 4}
    ]
    active = report.parties["active"]
    assert active.epsilon > max(m.epsilon for m in active.mechanisms.values())  # composed
    assert (report.budget_epsilon, report.steps_run, report.stopped_by_budget) == (8.0, 8, True)
    assert PrivacyReport.from_json({}) is None


def test_a_result_gives_each_party_s_privacy_by_name() -> None:
    result = ResultRecord.model_construct(ranks=RANKS, privacy=_privacy())
    assert result.party_names == ["active", "left", "right"]
    left = result.privacy_of("left")
    assert left is not None and left.epsilon == result.privacy["parties"]["left"]["total"]["epsilon"]
    assert result.privacy_of("right") is None  # no DP mechanism: no epsilon describes it
    with pytest.raises(ConfigError, match=r"no party 'dealer' in this run \(parties: active, left, right\)"):
        result.privacy_of("dealer")
    plain = ResultRecord.model_construct(ranks=RANKS, privacy={})
    assert plain.privacy_report is None and plain.privacy_of("left") is None


def test_an_epoch_record_reads_back_the_same_from_its_json() -> None:
    spent = PrivacyReport.from_json(_privacy()).parties["active"]  # type: ignore[union-attr]
    record = EpochRecord(
        epoch=2,
        epochs=5,
        step=24,
        train_loss=0.5,
        metrics={"test_accuracy": 0.75, "test_auc": None},
        elapsed_s=3.5,
        privacy={"active": spent},
    )
    again = EpochRecord.model_validate_json(record.model_dump_json())
    assert again == record and again.test_accuracy == 0.75 and again.privacy_of("active") == spent
    assert again.privacy_of("left") is None
    unbounded = spent.model_copy(update={"epsilon": math.inf})
    inf = EpochRecord.model_validate_json(
        record.model_copy(update={"privacy": {"active": unbounded}}).model_dump_json()
    )
    assert inf.privacy["active"].epsilon == math.inf
    with pytest.raises(ValidationError):
        EpochRecord.model_validate_json(b'{"epoch": 1}')


def test_a_summary_holds_no_selected_column_count() -> None:
    """The model's input column count after a defense's selection (crdp's is the
    exponential mechanism's output) is the party's own, not a summary field."""
    with pytest.raises(ValidationError):
        RankSummary(rank=1, party="left", role="passive", pid=7, columns=4)
    own = OwnReport(rank=1, party="left", columns=4, defenses={"crdp": {"mcd": 0.25}})
    assert OwnReport.model_validate_json(json.dumps(own.to_json())) == own
