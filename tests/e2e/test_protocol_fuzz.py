"""Malformed protocol files through ``securevfl run``: each mutation of a shipped
protocol exits 2 within 10 s with a message naming the file (and, for a bad
field, its YAML path), no traceback, and nothing trained or written.

The mutations are deterministic: types, signs, zeros, non-finite and huge numbers,
missing and unknown keys, component parameters, binary and empty files, models
and party counts beyond the stated limits, attack labels that are paths, and data
files that are no regular file. They run
in-process through :func:`securevfl.cli.main` (the same code path as the
console script, minus the interpreter start-up); a few also run as real
subprocesses to check the exit code the shell sees.
"""

from __future__ import annotations

import copy
import math
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from securevfl.app.comparison import read_comparison_file
from securevfl.cli import main
from tests.support.protocols import PROTOCOLS
from tests.support.runs import cli

Path_ = list[str | int]

# fields that exist in every shipped protocol after defaults are filled in,
# and values that are invalid for each of them
NUMERIC_FIELDS: list[Path_] = [
    ["training", "lr"],
    ["training", "epochs"],
    ["training", "batch_size"],
    ["interactive", "lr"],
    ["interactive", "out"],
    ["dataset", "test_fraction"],
    ["runtime", "peer_timeout_s"],
    ["runtime", "user_code_timeout_s"],
    ["privacy", "delta"],
    ["parties", "passive", 0, "model", "out"],
]
BAD_VALUES: dict[str, Any] = {
    "negative": -1,
    "zero": 0,
    "inf": math.inf,
    "neg_inf": -math.inf,
    "nan": math.nan,
    "huge_float": 1.0e308,
    "huge_int": 10**30,
    "string": "ten",
    "list": [1, 2],
}


def _set(doc: dict[str, Any], path: Path_, value: Any) -> None:
    node: Any = doc
    for key in path[:-1]:
        node = node.setdefault(key, {}) if isinstance(key, str) else node[key]
    node[path[-1]] = value


def _delete(doc: dict[str, Any], path: Path_) -> None:
    node: Any = doc
    for key in path[:-1]:
        node = node[key]
    del node[path[-1]]


#: the shipped protocol files; a comparison file (the demo's) lists protocols, it is not one
PROTOCOL_FILES = [
    f
    for f in sorted(PROTOCOLS.glob("*.yaml")) + sorted((PROTOCOLS / "demo").glob("*.yaml"))
    if read_comparison_file(f) is None
]


def _mutations() -> list[tuple[str, str, Any]]:
    """(id, shipped protocol file, mutated document or raw bytes)."""
    out: list[tuple[str, str, Any]] = []
    for i, f in enumerate(PROTOCOL_FILES):
        base = yaml.safe_load(f.read_text())
        # spread the field x value grid over the files so every pair is covered
        for j, field in enumerate(NUMERIC_FIELDS):
            kind = sorted(BAD_VALUES)[(i + j) % len(BAD_VALUES)]
            doc = copy.deepcopy(base)
            _set(doc, field, BAD_VALUES[kind])
            out.append((f"{f.stem}:{'.'.join(map(str, field))}={kind}", f.name, doc))
        doc = copy.deepcopy(base)
        _set(doc, ["parties", "passive", 0, "model", "hidden"], [-3])
        out.append((f"{f.stem}:hidden=-3", f.name, doc))
        doc = copy.deepcopy(base)
        _set(doc, ["top", "hidden"], [0])
        out.append((f"{f.stem}:top.hidden=0", f.name, doc))
        doc = copy.deepcopy(base)
        _set(doc, ["training", "unknown_option"], 1)
        out.append((f"{f.stem}:unknown_key", f.name, doc))
        doc = copy.deepcopy(base)
        _delete(doc, ["parties"] if i % 2 else ["dataset"])
        out.append((f"{f.stem}:missing_key", f.name, doc))
        defenses = base["parties"]["active"].get("defenses") or base["parties"]["passive"][0].get("defenses")
        if defenses:
            doc = copy.deepcopy(base)
            owner = (
                doc["parties"]["active"]
                if base["parties"]["active"].get("defenses")
                else doc["parties"]["passive"][0]
            )
            owner["defenses"][0].setdefault("params", {})["epsilon"] = math.inf if i % 2 else -2.5
            out.append((f"{f.stem}:defense_param", f.name, doc))
    out.extend(_loader_cases())
    out.append(("binary", "-", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe\x00\x01"))
    out.append(("empty", "-", b""))
    out.append(("nul_bytes", "-", b"name: x\x00\x00\n"))
    out.append(("not_a_mapping", "-", b"- 1\n- 2\n"))
    out.append(("bad_yaml", "-", b"name: [unclosed\n"))
    return out


def _loader_cases() -> list[tuple[str, str, Any]]:
    """What the YAML reader and the schema refuse beyond single fields: an alias
    bomb, a repeated key, a recursive document, a name that is a path, a synthetic
    table too large to build."""
    plain = (PROTOCOLS / "plain.yaml").read_text()
    bomb = "\n".join(
        ["bomb: &l0 [x, x, x, x, x, x, x, x, x]"]
        + [f"bomb{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]" for i in range(1, 10)]
    )
    out: list[tuple[str, str, Any]] = [
        ("alias_bomb", "plain.yaml", (plain + "\n" + bomb + "\n").encode()),
        (
            "alias_bomb_in_params",
            "plain.yaml",
            (bomb + "\n" + plain.replace("backend: plain", "backend: plain\n  params: {x: *l9}")).encode(),
        ),
        ("repeated_key", "plain.yaml", (plain + "\ntraining: {epochs: 1}\n").encode()),
        (
            "repeated_nested_key",
            "plain.yaml",
            plain.replace("  epochs: 10\n", "  epochs: 10\n  epochs: 3\n").encode(),
        ),
        ("recursive", "-", b"name: &a [1, *a]\n"),
    ]
    # an attack's label names OUT/attacks/<label>.npz (the victim's features and their
    # reconstructions): a path, absolute or not, must not reach the file system
    attacked = yaml.safe_load((PROTOCOLS / "demo" / "5_mpc_embedding_dp.yaml").read_text())
    for label, text in (("parent", "../../../../tmp/x"), ("absolute", "/tmp/x"), ("sub", "sub/dir/x")):
        doc = copy.deepcopy(attacked)
        doc["attacks"][0]["params"]["label"] = text
        out.append((f"attack_label_{label}", "5_mpc_embedding_dp.yaml", doc))
    # a party's data file that is no regular file: read without end, or a folder
    for label, path in (("dev_zero", "/dev/zero"), ("folder", "/")):
        model = {"kind": "mlp", "hidden": [16], "out": 8}
        doc = {
            "name": "csv",
            "dataset": {"name": "csv"},
            "parties": {
                "active": {"name": "bank", "source": {"path": path, "label_column": "label"}},
                "passive": [{"name": "shop", "source": {"path": path}, "model": model}],
            },
        }
        out.append((f"data_path_{label}", "-", doc))
    base = yaml.safe_load(plain)
    for label, name in (("parent", "../../x"), ("absolute", "/tmp/x"), ("hidden", ".x"), ("empty", "")):
        doc = copy.deepcopy(base)
        doc["name"] = name
        out.append((f"name_{label}", "plain.yaml", doc))
    # what a protocol may not ask of the machine: models beyond the stated parameter limit,
    # more passive parties than the stated limit (securevfl.sizing, config.MAX_PASSIVE)
    for label, model, interactive in (
        ("hidden_65536x2", {"kind": "mlp", "hidden": [65536, 65536], "out": 64}, 64),
        ("out_65536", {"kind": "mlp", "hidden": [65536], "out": 65536}, 64),
        ("interactive_65536", {"kind": "mlp", "hidden": [16], "out": 65536}, 65536),
    ):
        doc = copy.deepcopy(base)
        doc["parties"]["passive"][0]["model"] = model
        doc["interactive"] = {"out": interactive}
        out.append((f"model_{label}", "plain.yaml", doc))
    many = {
        "name": "many",
        "dataset": {"name": "synthetic", "synthetic": {"rows": 400, "features": 200}},
        "parties": {
            "passive": [
                {"name": f"p{i}", "columns": {"index": [i, i + 1]}, "model": {"out": 4}} for i in range(200)
            ]
        },
    }
    out.append(("passive_200", "-", many))
    synthetic = {
        "name": "syn",
        "dataset": {"name": "synthetic"},
        "parties": {"passive": [{"name": "p", "columns": {"index": [0, 2]}, "model": {"out": 4}}]},
    }
    for label, params in (
        ("rows_1e10", {"rows": 10**10}),
        ("rows_1e10_float", {"rows": 1e10}),
        ("table_too_large", {"rows": 40_000_000, "features": 1000}),
    ):
        doc = copy.deepcopy(synthetic)
        doc["dataset"]["synthetic"] = params
        out.append((f"synthetic_{label}", "-", doc))
    return out


MUTATIONS = _mutations()
#: what the message says besides the file, for cases whose refusal must name more
SAYS = {
    **{f"attack_label_{x}": "at 'attacks[0].params.label'" for x in ("parent", "absolute", "sub")},
    "data_path_dev_zero": "party 'bank': /dev/zero is a character device, not a CSV file",
    "data_path_folder": "party 'bank': / is a folder, not a CSV file",
}


@pytest.fixture(scope="module", autouse=True)
def imported() -> None:
    """Every shipped protocol file validates, once, before the timed cases. The first
    file that names a defense, an attack or an HE backend imports their modules
    (torch, scipy, TenSEAL: 11-15 s in-process at a load average of 9), a one-time
    cost of the process and not what the 10 s bound on a refusal is about; the
    console tests below bound a whole start-up."""
    for f in PROTOCOL_FILES:
        assert main(["validate", str(f)]) == 0, f


def test_enough_mutations():
    assert len(MUTATIONS) >= 50


def _write(tmp_path: Path, content: Any) -> Path:
    f = tmp_path / "protocol.yaml"
    if isinstance(content, bytes):
        f.write_bytes(content)
    else:
        f.write_text(yaml.safe_dump(content, sort_keys=False))
    return f


@pytest.mark.parametrize("case", MUTATIONS, ids=[m[0] for m in MUTATIONS])
def test_mutated_protocol_is_refused_cleanly(tmp_path, capsys, case):
    name, _, content = case
    f = _write(tmp_path, content)
    out = tmp_path / "out"
    t0 = time.monotonic()
    code = main(["run", str(f), "--out", str(out), "--quiet"])
    elapsed = time.monotonic() - t0
    captured = capsys.readouterr()
    assert code == 2, captured.err
    assert elapsed < 10, elapsed
    assert "Traceback" not in captured.err + captured.out
    assert f"securevfl: error: {f}" in captured.err.replace("\n", " ")
    assert SAYS.get(name, "") in " ".join(captured.err.split())
    # nothing trained, nothing written
    assert not (out / "result.json").exists() and not (out / "ranks").exists()


@pytest.mark.parametrize("content", [b"\xff\xfe\x00binary\x00", b""], ids=["binary", "empty"])
def test_binary_and_empty_files_through_the_console(tmp_path, content):
    f = _write(tmp_path, content)
    t0 = time.monotonic()
    proc = cli("run", str(f), "--out", str(tmp_path / "out"), "--quiet", timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert time.monotonic() - t0 < 30  # interpreter and torch start-up included
    assert "Traceback" not in proc.stderr
    assert str(f) in " ".join(proc.stderr.split())
