"""Components are resolved once: every component's options are validated at load
(or, in a rank the launcher spawned, once when it resolves the JSON it received),
and nothing a rank does afterwards validates them again; the typed query answers
"what does party X run"."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from pydantic import BaseModel

from securevfl.app.harness import attack_keys
from securevfl.app.loader import load_protocol_dict, resolve_protocol
from securevfl.app.rank_layout import layout_of
from securevfl.attacks import ATTACKS
from securevfl.attacks.targeted_pgd import hash_options
from securevfl.components import components_of, is_resolved
from securevfl.config import Protocol
from securevfl.defenses import DEFENSES
from securevfl.defenses.base import build_stack, collective_defenses
from securevfl.defenses.crdp import CrdpOptions
from securevfl.defenses.hashvfl import ConsistencyOptions, HashOptions
from securevfl.defenses.spending import allowed_steps, spent
from securevfl.errors import ProtocolError
from securevfl.exchange import EXCHANGES
from securevfl.privacy.step_budget import plan_for
from tests.support.protocols import small_digits

N_TRAIN = 1437


def _doc() -> dict[str, Any]:
    """HashVFL with its DP add-on on both passive parties (so a budget has something
    to search over), the consistency loss at A, and two attacks that read the
    parties' hashvfl options."""
    doc = small_digits()
    for p in doc["parties"]["passive"]:
        p["model"]["out"] = 4
        # without BatchNorm a step releases a record's own 4 bits: cheap to account
        p["defenses"] = [{"name": "hashvfl", "params": {"dp": "rr", "epsilon": 4.0, "batchnorm": False}}]
    doc["parties"]["active"]["defenses"] = [{"name": "hashvfl_consistency", "params": {"weight": 1.0}}]
    doc["attacks"] = [
        {"name": "targeted_pgd", "params": {"party": "left"}},
        {"name": "label_norm", "params": {"label": "norm_left", "party": "left"}},
    ]
    doc["privacy"] = {"noise_seed": 0, "budget": {"epsilon": 20.0}}
    return doc


@pytest.fixture
def validations(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Count every validation of a registered component's options model."""
    models = {reg.get(n).options for reg in (DEFENSES, ATTACKS, EXCHANGES) for n in reg.names()}
    counts: Counter[str] = Counter()
    original = BaseModel.model_validate.__func__

    def counting(cls: type[BaseModel], obj: Any, *args: Any, **kwargs: Any) -> BaseModel:
        if cls in models:
            counts[cls.__name__] += 1
        return original(cls, obj, *args, **kwargs)

    monkeypatch.setattr(BaseModel, "model_validate", classmethod(counting))
    return counts


#: one per component entry of _doc: the backend, 2 x hashvfl, the consistency loss, 2 attacks
ONCE = {
    "NoOptions": 1,
    "HashOptions": 2,
    "ConsistencyOptions": 1,
    "TargetedPGDOptions": 1,
    "LabelNormOptions": 1,
}


def _rank_work(proto: Protocol) -> None:
    """What a rank and the launcher do with a loaded protocol after load: the layout,
    the wire form of each party's embedding, every party's defense stack, the
    budget's binary search over the planned steps, the collective steps, the
    accounting, and the attack harness's keys and hashvfl look-ups."""
    layout_of(proto)
    for p in proto.parties.passive:
        _ = components_of(proto).party(p.name).sends_codes
        build_stack(proto, p.name, "passive", p.defenses)
    build_stack(proto, proto.parties.active.name, "active", proto.parties.active.defenses)
    assert allowed_steps(proto, N_TRAIN) == 12  # of 24 planned: the binary search ran
    spent(proto, plan_for(10, N_TRAIN, proto.training))
    collective_defenses(proto)
    attack_keys(proto)
    assert hash_options(proto, 0) is not None


def test_options_are_validated_once_at_load_and_never_again(validations: Counter[str]) -> None:
    proto = load_protocol_dict(_doc())
    assert dict(validations) == ONCE
    _rank_work(proto)
    assert dict(validations) == ONCE  # the budget's search alone builds every stack many times


def test_a_spawned_rank_validates_the_options_it_receives_once(validations: Counter[str]) -> None:
    loaded = load_protocol_dict(_doc())
    validations.clear()
    # the launcher hands each rank the protocol as JSON; the rank resolves it once
    proto = resolve_protocol(Protocol.model_validate_json(loaded.model_dump_json()))
    assert dict(validations) == ONCE
    assert resolve_protocol(proto) is proto  # already resolved: nothing validated again
    _rank_work(proto)
    assert dict(validations) == ONCE


def test_an_unresolved_protocol_is_refused_by_name() -> None:
    bare = Protocol.model_validate_json(load_protocol_dict(_doc()).model_dump_json())
    assert not is_resolved(bare)
    with pytest.raises(ProtocolError, match="no resolved components"):
        build_stack(bare, "left", "passive")


def test_what_a_party_runs_is_answered_with_typed_options() -> None:
    comps = components_of(load_protocol_dict(_doc()))
    left = comps.options("left", HashOptions)
    assert isinstance(left, HashOptions) and left.dp == "rr" and left.epsilon == 4.0
    assert comps.options("active", HashOptions) is None
    consistency = comps.options("active", ConsistencyOptions)
    assert consistency is not None and consistency.weight == 1.0
    assert comps.runs("right", "hashvfl") and not comps.runs("right", "crdp")
    assert [(i, n) for i, n, _ in comps.running(HashOptions)] == [(0, "left"), (1, "right")]
    assert comps.running(CrdpOptions) == []
    assert [a.name for a in comps.attacks] == ["targeted_pgd", "label_norm"]
    assert [d.path for d in comps.party("right").defenses] == ["parties.passive[1].defenses[0]"]


def test_build_stack_refuses_another_partys_entries() -> None:
    doc = _doc()
    doc["parties"]["passive"][1]["defenses"] = []
    doc["parties"]["active"]["defenses"] = []
    doc["attacks"] = []
    proto = load_protocol_dict(doc)
    with pytest.raises(ProtocolError, match="not party 'right'"):
        build_stack(proto, "right", "passive", proto.parties.passive[0].defenses)
