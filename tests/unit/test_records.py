"""Typed records: a rank's summary, the result record, a party's own view."""

from __future__ import annotations

import json

import pytest
import torch
from pydantic import ValidationError

from securevfl.attacks.base import View
from securevfl.errors import ProtocolError
from securevfl.records import OwnReport, OwnView, RankSummary, ResultRecord


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


def test_a_summary_holds_no_selected_column_count() -> None:
    """The model's input column count after a defense's selection (crdp's is the
    exponential mechanism's output) is the party's own, not a summary field."""
    with pytest.raises(ValidationError):
        RankSummary(rank=1, party="left", role="passive", pid=7, columns=4)
    own = OwnReport(rank=1, party="left", columns=4, defenses={"crdp": {"mcd": 0.25}})
    assert OwnReport.model_validate_json(json.dumps(own.to_json())) == own
