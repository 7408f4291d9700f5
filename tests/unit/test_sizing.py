"""What each party trains, counted at load: the counts are the built models',
``validate`` states them, and a protocol whose parties would train more than the
stated limit or this machine's memory, or that has more passive parties than the
stated limit, is refused naming the field and the limit."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from securevfl.app.loader import load_protocol_dict
from securevfl.cli import main
from securevfl.errors import ConfigError
from securevfl.models import build_bottom, build_interactive, build_top
from securevfl.sizing import check_sizes, party_sizes
from securevfl.validation import input_widths
from tests.support.protocols import PROTOCOLS, load_yaml


def _doc(**changes: Any) -> dict[str, Any]:
    doc = load_yaml("plain.yaml")
    for p in doc["parties"]["passive"]:
        p["model"] = {"kind": "mlp", "hidden": [32], "out": 16}
    doc.update(changes)
    return doc


def _numel(m: torch.nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())


@pytest.mark.parametrize("backend", ["plain", "mpc"])
def test_the_counts_are_the_built_models(backend):
    proto = load_protocol_dict(_doc(exchange={"backend": backend}, top={"hidden": [8]}))
    sizes = {s.party: s for s in party_sizes(proto, input_widths(proto))}
    out = proto.interactive.out
    for p in proto.parties.passive:
        assert p.model is not None
        bottom = _numel(build_bottom(p.model, 32, seed=0, party=p.name))  # 32 columns: half an image
        block = _numel(build_interactive(p.model.out, out, seed=0, party=p.name))
        assert sizes[p.name].total == bottom + (block if backend == "mpc" else 0)
        assert not sizes[p.name].lower_bound
    blocks = sum(_numel(build_interactive(16, out, seed=0, party=p.name)) for p in proto.parties.passive)
    top = _numel(build_top(proto.top, out, 1, seed=0))
    assert sizes["active"].total == blocks + out + top
    assert sizes["active"].lower_bound  # the top model's output layer has one output a class


def test_validate_states_the_parameter_count(capsys):
    assert main(["validate", str(PROTOCOLS / "diabetes_regression.yaml")]) == 0
    out = capsys.readouterr().out
    assert "; parameters: 609 (active 145, clinic 232, lab 232)" in out, out


def _refusal(doc: dict[str, Any]) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_protocol_dict(doc)
    return info.value


@pytest.mark.parametrize(
    ("model", "interactive_out", "field", "count"),
    [
        (
            {"kind": "mlp", "hidden": [65536, 65536], "out": 64},
            64,
            "parties.passive[0].model",
            "4,301,389,888",
        ),
        ({"kind": "mlp", "hidden": [65536], "out": 65536}, 64, "parties.passive[0].model", "4,297,195,520"),
        ({"kind": "mlp", "hidden": [32], "out": 65536}, 65536, "interactive.out", "at least 4,296,146,945"),
    ],
    ids=["hidden", "out", "interactive"],
)
def test_a_model_beyond_the_stated_limit_is_refused_naming_field_and_limit(
    model, interactive_out, field, count
):
    doc = _doc(interactive={"out": interactive_out})
    doc["parties"]["passive"][0]["model"] = model
    err = _refusal(doc)
    assert err.path == field
    assert f"would train {count}" in str(err)
    assert "a party trains at most 2,147,483,648 parameters" in str(err)


def test_a_model_beyond_this_machines_memory_is_refused():
    doc = _doc()
    doc["parties"]["passive"][1]["model"] = {"kind": "mlp", "hidden": [4096, 4096], "out": 16}
    proto = load_protocol_dict(doc)  # 16.9 M parameters: fine on this machine
    with pytest.raises(ConfigError) as info:
        check_sizes(proto, input_widths(proto), memory=256 << 20)  # a machine of 256 MiB
    assert info.value.path == "parties.passive[1].model"
    assert "party 'right' would train 16,982,032 parameters (about 0.3 GiB" in str(info.value)
    assert "this machine has 0.2 GiB of memory" in str(info.value)


def _passive(n: int) -> dict[str, Any]:
    doc = _doc()
    first = doc["parties"]["passive"][0]
    doc["parties"]["passive"] = [
        {**copy.deepcopy(first), "name": f"p{i}", "columns": {"names": [f"px_{i % 8}_{i // 8 % 8}"]}}
        for i in range(n)
    ]
    return doc


def test_the_number_of_passive_parties_has_a_stated_limit():
    assert len(load_protocol_dict(_passive(32)).parties.passive) == 32
    err = _refusal(_passive(33))
    assert err.path == "parties.passive"
    assert "at most 32 items" in str(err) and "not 33" in str(err)
