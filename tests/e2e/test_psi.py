"""PSI alignment end to end: three parties with their own CSV files, partly
overlapping and shuffled IDs, one OS process per rank (real launcher)."""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from securevfl.errors import DataError, SecureVFLError
from tests.support.runs import run_doc

ROWS = 400


def make_ids(n: int, seed: int, prefix: str = "cust") -> list[str]:
    rng = random.Random(seed)
    hexes: set[str] = set()
    while len(hexes) < n:
        hexes.add(f"{rng.getrandbits(24):06x}")
    return [f"{prefix}-{h}-{i:04d}" for i, h in enumerate(sorted(hexes))]


def write_party(
    path: Path, ids: list[str], rng: np.random.Generator, *, label: bool, features: int = 0
) -> None:
    frame = pd.DataFrame({"id": ids})
    for j in range(features):
        frame[f"f{j}"] = rng.normal(size=len(ids)).round(4)
    if label:
        frame["label"] = rng.integers(0, 2, size=len(ids))
    frame.to_csv(path, index=False)


def csv_protocol(tmp_path: Path, ids: dict[str, list[str]]) -> dict[str, Any]:
    """Write one CSV per party and a protocol that reads them: 'bank' (active,
    labels only), 'shop' and 'telco' (passive, numeric features)."""
    rng = np.random.default_rng(0)
    write_party(tmp_path / "bank.csv", ids["bank"], rng, label=True)
    write_party(tmp_path / "shop.csv", ids["shop"], rng, label=False, features=4)
    write_party(tmp_path / "telco.csv", ids["telco"], rng, label=False, features=3)
    model = {"kind": "mlp", "hidden": [16], "out": 8}
    return {
        "name": "psi-csv",
        "dataset": {"name": "csv", "test_fraction": 0.2},
        "parties": {
            "active": {
                "name": "bank",
                "source": {"path": str(tmp_path / "bank.csv"), "label_column": "label"},
            },
            "passive": [
                {"name": "shop", "source": {"path": str(tmp_path / "shop.csv")}, "model": model},
                {"name": "telco", "source": {"path": str(tmp_path / "telco.csv")}, "model": model},
            ],
        },
        "interactive": {"out": 8},
        "training": {"epochs": 1, "batch_size": 64, "seed": 0},
    }


def overlapping_ids() -> dict[str, list[str]]:
    """400 IDs per party, ~250 shared by all three, each file in its own order."""
    universe = make_ids(560, seed=1)
    common, rest = universe[:250], universe[250:]
    rng = random.Random(3)
    out = {}
    for k, name in enumerate(["bank", "shop", "telco"]):
        # 150 more per party, overlapping pairwise with the next party's extras
        extra = rest[k * 100 : k * 100 + 150] if k < 2 else rest[200:300] + rest[:50]
        own = common + extra
        rng.shuffle(own)
        out[name] = own
    return out


@pytest.mark.timeout(180)
def test_csv_parties_align_on_the_three_way_intersection(tmp_path, monkeypatch):
    ids = overlapping_ids()
    assert all(len(v) == ROWS and len(set(v)) == ROWS for v in ids.values())
    inter = set(ids["bank"]) & set(ids["shop"]) & set(ids["telco"])
    assert len(inter) == 250
    assert len(set(ids["bank"]) & set(ids["shop"])) > len(inter)  # pairwise overlap is larger
    doc = csv_protocol(tmp_path, ids)
    monkeypatch.setenv("SECUREVFL_AUDIT_OPENS", "1")  # ranks record the files they open
    out = tmp_path / "run"

    result = run_doc(doc, out)

    rows = result["rows"]
    assert rows["aligned"] == len(inter)
    assert rows["train"] + rows["test"] == len(inter)
    assert rows["test"] == round(0.2 * len(inter))
    digest = hashlib.sha256("\n".join(sorted(inter)).encode()).hexdigest()[:16]
    files = {"bank": "bank.csv", "shop": "shop.csv", "telco": "telco.csv"}
    for rank, party in enumerate(["bank", "shop", "telco"]):
        summary = json.loads((out / "ranks" / f"rank{rank}.summary.json").read_text())
        assert summary["party"] == party
        assert summary["n_aligned"] == len(inter)
        assert summary["aligned_digest"] == digest, f"rank {rank}"
        assert summary["has_labels"] is (rank == 0)
        # each rank opened its own file and no other party's
        opened = {Path(p).name for p in summary["opened_files"]}
        assert files[party] in opened, (rank, opened)
        assert not (set(files.values()) - {files[party]}) & opened, (rank, opened)
    assert result["history"], "training ran"


@pytest.mark.timeout(120)
def test_disjoint_ids_fail_with_empty_intersection(tmp_path):
    ids = {
        "bank": make_ids(60, seed=4, prefix="bank"),
        "shop": make_ids(60, seed=5, prefix="shop"),
        "telco": make_ids(60, seed=6, prefix="telco"),
    }
    doc = csv_protocol(tmp_path, ids)
    with pytest.raises(SecureVFLError) as info:
        run_doc(doc, tmp_path / "run")
    assert isinstance(info.value, DataError), repr(info.value)
    assert "empty intersection" in str(info.value)
