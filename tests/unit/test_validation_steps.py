"""Each step of the load-time cross-check (securevfl.validation.check_protocol)
on its own: a schema-valid protocol goes through one step at a time, and each
step refuses exactly the mistake it is for, naming its YAML path."""

from __future__ import annotations

from typing import Any

import pytest

from securevfl.config import Protocol
from securevfl.defenses.crdp import CrdpOptions
from securevfl.defenses.hashvfl import HashOptions
from securevfl.errors import ConfigError, UnsupportedCombination
from securevfl.exchange.mpc import MpcOptions
from securevfl.validation import (
    check_attacks,
    check_checkpoints,
    check_dataset,
    check_defenses,
    check_exchange,
    check_input_shapes,
    check_protocol,
    check_standardize_lists,
    resolve_attacks,
    resolve_components,
    resolve_defenses,
    resolve_exchange,
)
from tests.support.protocols import load_yaml, small_digits


def _schema(doc: dict[str, Any]) -> Protocol:
    """The protocol as the schema gives it: nothing cross-checked yet."""
    return Protocol.model_validate(doc)


def test_the_exchange_is_resolved_with_its_typed_options_and_checked_against_the_training():
    doc = small_digits()
    doc["exchange"] = {"backend": "mpc", "params": {"provider": "TTP"}}
    proto = _schema(doc)
    backend, options = resolve_exchange(proto)
    assert backend.name == "mpc" and isinstance(options, MpcOptions) and options.provider == "TTP"
    check_exchange(proto, backend, options)
    doc["training"]["local_steps"] = 2  # FedBCD needs A to hold the interactive layer in the clear
    with pytest.raises(UnsupportedCombination) as err:
        check_exchange(_schema(doc), backend, options)
    assert err.value.path == "training.local_steps"
    doc["exchange"] = {"backend": "nope"}
    with pytest.raises(ConfigError) as err:
        resolve_exchange(_schema(doc))
    assert err.value.path == "exchange.backend"


def test_checkpoints_are_refused_with_attacks_alone():
    doc = small_digits()
    doc["training"]["checkpoint_every"] = 1
    check_checkpoints(_schema(doc))
    doc["attacks"] = [{"name": "label_norm"}]
    with pytest.raises(UnsupportedCombination) as err:
        check_checkpoints(_schema(doc))
    assert err.value.path == "training.checkpoint_every"


def test_the_dataset_step_checks_each_partys_columns_and_model():
    doc = small_digits()
    check_dataset(_schema(doc))
    doc["parties"]["passive"][1]["model"] = None
    with pytest.raises(ConfigError) as err:
        check_dataset(_schema(doc))
    assert err.value.path == "parties.passive[1].model"


def test_a_cnn_input_shape_must_hold_the_partys_columns():
    doc = small_digits()
    left = doc["parties"]["passive"][0]
    left["model"] = {"kind": "cnn", "out": 8, "input_shape": [1, 8, 8]}  # 64 values
    with pytest.raises(ConfigError) as err:
        check_input_shapes(_schema(doc))
    assert err.value.path == "parties.passive[0].model.input_shape"


def test_a_standardize_list_must_name_numeric_columns_of_its_party():
    """Part of the dataset step: checked where the protocol fixes the party's columns."""
    doc = small_digits()
    doc["parties"]["passive"][0]["preprocess"] = {"standardize": ["px_0_0", "px_0_4"]}  # px_0_4: not left's
    with pytest.raises(ConfigError, match="party 'left'") as err:
        check_standardize_lists(_schema(doc))
    assert err.value.path == "parties.passive[0].preprocess.standardize"
    with pytest.raises(ConfigError):
        check_dataset(_schema(doc))
    doc["parties"]["passive"][0]["preprocess"] = {"standardize": ["px_0_0"]}
    check_standardize_lists(_schema(doc))


def test_defenses_and_attacks_resolve_per_party_in_file_order():
    doc = small_digits()
    doc["parties"]["passive"][1]["defenses"] = [{"name": "hashvfl", "params": {"dp": "rr", "epsilon": 4.0}}]
    doc["attacks"] = [{"name": "label_norm", "params": {"party": "right"}}]
    proto = _schema(doc)
    backend, _ = resolve_exchange(proto)
    parties = resolve_defenses(proto, backend)
    assert [(p.name, p.side, p.index) for p in parties] == [
        ("active", "active", None),
        ("left", "passive", 0),
        ("right", "passive", 1),
    ]
    (d,) = parties[2].defenses
    assert isinstance(d.options, HashOptions) and d.path == "parties.passive[1].defenses[0]"
    (a,) = resolve_attacks(proto, backend)
    assert a.name == "label_norm" and a.path == "attacks[0]"
    check_attacks(proto, resolve_components(proto))
    doc["attacks"] = [{"name": "label_norm", "params": {"party": "nobody"}}]
    proto = _schema(doc)
    with pytest.raises(ConfigError) as err:
        check_attacks(proto, resolve_components(proto))
    assert err.value.path == "attacks[0].params.party"


def test_the_cross_check_step_sees_every_partys_options():
    """crdp's merged scope is refused when another crdp party keeps its own: a check
    only the resolved components of every party can make."""
    doc = load_yaml("crdp_mpc_merged.yaml")
    proto = _schema(doc)
    comps = resolve_components(proto)
    assert all(o.delta_scope == "merged_secure" for _, _, o in comps.running(CrdpOptions))
    check_defenses(proto, comps)
    doc["parties"]["passive"][1]["defenses"][0]["params"]["delta_scope"] = "own"
    proto = _schema(doc)
    with pytest.raises(ConfigError) as err:
        check_defenses(proto, resolve_components(proto))
    assert err.value.path == "parties.passive[1].defenses[0].params.delta_scope"


def test_check_protocol_returns_the_components_it_resolved():
    proto = _schema(small_digits())
    comps = check_protocol(proto)
    assert comps.exchange.name == "plain" and [p.name for p in comps.parties] == ["active", "left", "right"]
