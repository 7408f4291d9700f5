"""Components are resolved once: every component's options are validated at load
(or, in a rank the launcher spawned, once when it resolves the JSON it received),
and nothing a rank does afterwards validates them again; the typed query answers
"what does party X run"."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

import securevfl
import securevfl.components as components_module
from securevfl.app.harness import attack_keys
from securevfl.app.loader import load_checked, load_checked_dict, load_protocol_dict, resolve_protocol
from securevfl.app.rank_layout import layout_of
from securevfl.attacks import ATTACKS
from securevfl.attacks.targeted_pgd import hash_options
from securevfl.components import CheckedProtocol
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


def _rank_work(checked: CheckedProtocol) -> None:
    """What a rank and the launcher do with a loaded protocol after load: the layout,
    the wire form of each party's embedding, every party's defense stack, the
    budget's binary search over the planned steps, the collective steps, the
    accounting, and the attack harness's keys and hashvfl look-ups."""
    proto, comps = checked.protocol, checked.components
    layout_of(checked)
    for p in proto.parties.passive:
        _ = comps.party(p.name).sends_codes
        build_stack(proto, comps, p.name, "passive", p.defenses)
    build_stack(proto, comps, proto.parties.active.name, "active", proto.parties.active.defenses)
    assert allowed_steps(checked, N_TRAIN) == 12  # of 24 planned: the binary search ran
    spent(checked, plan_for(10, N_TRAIN, proto.training))
    collective_defenses(proto, comps)
    attack_keys(comps)
    assert hash_options(proto, comps, 0) is not None


def test_options_are_validated_once_at_load_and_never_again(validations: Counter[str]) -> None:
    checked = load_checked_dict(_doc())
    assert dict(validations) == ONCE
    _rank_work(checked)
    assert dict(validations) == ONCE  # the budget's search alone builds every stack many times


def test_a_spawned_rank_validates_the_options_it_receives_once(validations: Counter[str]) -> None:
    loaded = load_protocol_dict(_doc())
    validations.clear()
    # the launcher hands each rank the protocol as JSON; the rank resolves it once
    checked = resolve_protocol(Protocol.model_validate_json(loaded.model_dump_json()))
    assert dict(validations) == ONCE
    _rank_work(checked)
    assert dict(validations) == ONCE


def test_the_checked_loader_returns_the_protocol_with_its_components(tmp_path) -> None:
    """What the loader resolved travels with the protocol it checked: the same
    parties, the file's own folder in its code policy, and nothing left on the
    bare protocol for anything to read back."""
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(_doc()), encoding="utf-8")
    checked = load_checked(path)
    assert isinstance(checked, CheckedProtocol)
    assert [p.name for p in checked.components.parties] == ["active", "left", "right"]
    assert checked.components.exchange.name == checked.protocol.exchange.backend
    assert checked.code.beside == str(tmp_path.resolve())
    assert checked.protocol.folder == str(tmp_path.resolve())
    assert not any(isinstance(v, type(checked.components)) for v in vars(checked.protocol).values())
    assert checked.protocol.__pydantic_private__ == {"_folder": str(tmp_path.resolve())}
    assert load_checked_dict(_doc()).protocol.folder is None  # a mapping has no file


def test_nothing_reads_components_back_from_a_protocol() -> None:
    """The checked protocol is passed down: no module of securevfl looks components
    up on a protocol object (the former components_of / attach / _components)."""
    root = Path(securevfl.__file__).parent
    found = [
        f"{path.relative_to(root)}:{i}"
        for path in sorted(root.rglob("*.py"))
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if re.search(r"\bcomponents_of\b|\b_components\b|\bis_resolved\b|\battach\(", line)
    ]
    assert found == []
    assert not hasattr(components_module, "components_of")


def test_what_a_party_runs_is_answered_with_typed_options() -> None:
    comps = load_checked_dict(_doc()).components
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
    checked = load_checked_dict(doc)
    proto = checked.protocol
    with pytest.raises(ProtocolError, match="not party 'right'"):
        build_stack(proto, checked.components, "right", "passive", proto.parties.passive[0].defenses)
