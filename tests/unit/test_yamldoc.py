"""Reading YAML (securevfl.app.yamldoc): exponent floats as numbers, repeated keys
and alias bombs refused with a message, in the file, in ``--set`` and in ``--grid``."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from securevfl.app.grid import parse_axis
from securevfl.app.loader import load_protocol, parse_override
from securevfl.app.yamldoc import MAX_VALUES, load_yaml
from securevfl.errors import ConfigError
from tests.support.protocols import PROTOCOLS


def alias_bomb(levels: int = 10, width: int = 9) -> str:
    """``levels`` nested levels of ``width`` aliases each: width**levels values."""
    lines = ["l0: &l0 [" + ", ".join(["x"] * width) + "]"]
    for i in range(1, levels):
        lines.append(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * width) + "]")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1e-3", 0.001),
        ("1E5", 100000.0),
        ("1.5e3", 1500.0),
        ("-2e-2", -0.02),
        (".5e1", 5.0),
        ("2.5e+1", 25.0),
    ],
)
def test_exponent_floats_are_numbers(text, value):
    assert yaml.safe_load(f"v: {text}")["v"] in (text, value)  # PyYAML alone: a string for most
    got = load_yaml(f"v: {text}")["v"]
    assert isinstance(got, float) and got == value


@pytest.mark.parametrize("text", ["1e", "e5", "1e-", "1.2.3e4", "'1e-3'", "0x1f", "1_000", "12", "0.5"])
def test_other_scalars_read_as_before(text):
    assert load_yaml(f"v: {text}") == yaml.safe_load(f"v: {text}")


def test_lr_1e_minus_3_in_the_file_and_in_set(tmp_path: Path):
    f = tmp_path / "p.yaml"
    f.write_text((PROTOCOLS / "plain.yaml").read_text().replace("lr: 0.003", "lr: 1e-3"))
    assert load_protocol(f).training.lr == 0.001
    assert load_protocol(PROTOCOLS / "plain.yaml", ["training.lr=1e-3"]).training.lr == 0.001
    assert parse_override("training.lr=2E-4") == (["training", "lr"], 0.0002)
    assert parse_axis("training.lr=1e-3,1e-2").values == (0.001, 0.01)


@pytest.mark.parametrize(
    ("text", "key", "lines"),
    [
        ("name: a\nname: b\n", "name", "lines 1 and 2"),
        ("training:\n  lr: 0.1\n  epochs: 2\n  lr: 0.2\n", "lr", "lines 2 and 4"),
        ("a: [{k: 1, k: 2}]\n", "k", "lines 1 and 1"),
    ],
)
def test_a_repeated_key_is_refused_naming_it(text, key, lines):
    with pytest.raises(ConfigError) as info:
        load_yaml(text, source="p.yaml")
    msg = str(info.value)
    assert msg.startswith("p.yaml: ") and f"the key '{key}' appears twice" in msg and lines in msg, msg


def test_a_merged_key_may_be_set_again():
    doc = load_yaml("base: &b {lr: 0.1, epochs: 2}\ntraining:\n  <<: *b\n  lr: 0.2\n")
    assert doc["training"] == {"lr": 0.2, "epochs": 2}


def test_an_alias_bomb_is_refused_at_once():
    text = alias_bomb()  # 9**10 = 3.5e9 values from under a kilobyte
    assert len(text) < 1000
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match="aliases expand it to more than"):
        load_yaml(text, source="bomb.yaml")
    assert time.monotonic() - t0 < 1.0


def test_aliases_below_the_limit_load():
    doc = load_yaml(alias_bomb(levels=4, width=9))  # 9**4 values: fine
    assert len(doc["l3"]) == 9 and doc["l3"][0][0][0] == ["x"] * 9
    assert 9**6 < MAX_VALUES < 9**7
    with pytest.raises(ConfigError):
        load_yaml(alias_bomb(levels=7, width=9))


@pytest.mark.parametrize("text", ["a: &a [1, *a]\n", "a: &a {k: *a}\n"])
def test_a_recursive_document_is_refused(text):
    with pytest.raises(ConfigError, match="recursive document"):
        load_yaml(text)


def test_a_bad_set_value_names_its_key():
    with pytest.raises(ConfigError, match=r"training\.lr"):
        parse_override("training.lr=[1, 2")
    with pytest.raises(ConfigError, match="appears twice"):
        parse_override("training={lr: 1, lr: 2}")
