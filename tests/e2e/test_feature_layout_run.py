"""A party's own CSV with a categorical column trains with the per-category
embedding factory of examples/plugins/embedding_bag.py, which builds its tables
from the FeatureLayout securevfl gives it (docs/extending.md, "What a factory
receives"), and ``securevfl predict`` rebuilds it with the same layout from the
saved preprocessing. Real processes, the real launcher and CLI, plain backend,
one epoch."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from tests.support.protocols import ROOT, write_yaml
from tests.support.runs import cli

pytestmark = pytest.mark.timeout(600)

LAYOUT_ENV = "SVFL_LAYOUT_DIR"

#: the example's factory, wrapped to write down the layout it was given (in the rank that calls it)
RECORDER = """

import dataclasses
import os


def recorded(in_features, out, *, layout, dim=4, hidden=32):
    folder = os.environ.get("SVFL_LAYOUT_DIR")
    if folder:
        doc = {"in_features": in_features, "layout": dataclasses.asdict(layout)}
        with open(os.path.join(folder, f"{os.getpid()}.json"), "w") as f:
            json.dump(doc, f)
    return per_category(in_features, out, layout=layout, dim=dim, hidden=hidden)
"""


def files(folder: Path, n: int = 160) -> tuple[Path, Path]:
    """A label-only bank and a shop whose ``tier`` (with a few missing values)
    and spend decide the label."""
    rng = np.random.default_rng(0)
    ids = [f"c{i:04d}" for i in range(n)]
    tier = rng.choice(["gold", "silver", "bronze"], n)
    spend = rng.lognormal(3, 1, n)
    label = ((tier == "gold") | (spend > 40)).astype(int)
    shop = pd.DataFrame({"id": ids, "spend": spend, "visits": rng.integers(0, 9, n), "tier": tier})
    shop.loc[[5, 17], "tier"] = np.nan
    bank = pd.DataFrame({"id": ids, "label": label})
    folder.mkdir(parents=True, exist_ok=True)
    shop.to_csv(folder / "shop.csv", index=False)
    bank.to_csv(folder / "bank.csv", index=False)
    return folder / "bank.csv", folder / "shop.csv"


def protocol(folder: Path) -> Path:
    bank, shop = files(folder)
    example = (ROOT / "examples" / "plugins" / "embedding_bag.py").read_text()
    (folder / "layout_models.py").write_text(example + "\nimport json\n" + RECORDER)
    doc: dict[str, Any] = {
        "name": "layout",
        "dataset": {"name": "csv", "test_fraction": 0.25},
        "parties": {
            "active": {"name": "bank", "source": {"path": str(bank), "label_column": "label"}},
            "passive": [
                {
                    "name": "shop",
                    "source": {"path": str(shop)},
                    "preprocess": {"categorical": {"columns": ["tier"]}, "standardize": ["spend"]},
                    "model": {"factory": "layout_models:recorded", "params": {"dim": 3}, "out": 4},
                }
            ],
        },
        "exchange": {"backend": "plain"},
        "interactive": {"out": 4},
        "training": {"epochs": 1, "batch_size": 32, "lr": 0.01},
    }
    return write_yaml(folder / "protocol.yaml", doc)


@pytest.mark.slow  # 31 s (run and predict, 9 s of CPU) on the shared 2-core machine
def test_the_per_category_factory_trains_and_predicts_with_the_same_layout(tmp_path: Path):
    proto = protocol(tmp_path / "bundle")
    seen = tmp_path / "layouts"
    seen.mkdir()
    out = tmp_path / "out"
    r = cli("run", str(proto), "--out", str(out), "--quiet", env={LAYOUT_ENV: str(seen)})
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads((out / "result.json").read_text())
    assert 0.0 <= result["test_accuracy"] <= 1.0
    (trained,) = [json.loads(f.read_text()) for f in seen.glob("*.json")]
    pred = tmp_path / "pred"
    r = cli("predict", str(out), "--out", str(pred), env={LAYOUT_ENV: str(seen)})
    assert r.returncode == 0, r.stderr[-3000:]
    assert len((pred / "predictions.csv").read_text().splitlines()) == 161
    docs = [json.loads(f.read_text()) for f in seen.glob("*.json")]
    assert len(docs) == 2 and docs[0] == docs[1] == trained  # prediction rebuilt the same layout

    layout = trained["layout"]
    cols = [(c["name"], c["kind"], c["source"], c["category"], c["standardized"]) for c in layout["columns"]]
    assert cols == [
        ("spend", "numeric", "spend", None, True),  # the standardize list: spend alone
        ("visits", "numeric", "visits", None, False),
        ("tier_bronze", "category", "tier", "bronze", False),
        ("tier_gold", "category", "tier", "gold", False),
        ("tier_missing", "category", "tier", "missing", False),  # missing values: their own category
        ("tier_silver", "category", "tier", "silver", False),
    ]
    assert trained["in_features"] == 6 and layout["party"] == "shop"
    (tier,) = layout["categorical"]
    assert (tier["column"], tier["start"], tier["stop"], tier["has_other"]) == ("tier", 2, 6, False)
