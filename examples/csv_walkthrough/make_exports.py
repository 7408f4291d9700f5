"""Four organizations' CSV exports of scikit-learn's wine data set, the way real
exports look: string IDs, each file missing a few of the others' records and
shuffled, a categorical ``region`` column at one party, and about 3% missing
values in the passive parties' numeric columns.

    .venv/bin/python examples/csv_walkthrough/make_exports.py examples/csv_walkthrough/data

writes ``registry.csv`` (ID and cultivar label: the active party), ``lab.csv``,
``winery.csv`` and ``shop.csv`` (features: the passive parties). Then
``securevfl run examples/csv_walkthrough/protocol.yaml --out runs/csv`` trains on
them with each party's declared ``preprocess`` (README, "Your own CSV files").

It also writes ``new/``: each party's export of records that arrived after
training (new IDs, no cultivar at the registry, the columns in another order plus
one the model never saw, missing values, and a region the lab's training rows
never had, which goes to its "other" column). Score them with the trained model,
every party using its own new file (README, "Prediction")::

    securevfl predict runs/csv --out runs/csv-pred \
        --data registry=examples/csv_walkthrough/data/new/registry.csv \
        --data lab=examples/csv_walkthrough/data/new/lab.csv \
        --data winery=examples/csv_walkthrough/data/new/winery.csv \
        --data shop=examples/csv_walkthrough/data/new/shop.csv

``runs/csv-pred/predictions.csv`` then holds, per new record every party has,
the probability of each cultivar and the most probable one; ``new/answers.csv``
(which no party holds) has the true cultivars to compare with.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd
from sklearn.datasets import load_wine

COLUMNS = {
    "lab": ["alcohol", "malic_acid", "ash", "alcalinity_of_ash"],
    "winery": ["magnesium", "total_phenols", "flavanoids", "nonflavanoid_phenols", "proanthocyanins"],
    "shop": ["color_intensity", "hue", "od280", "proline"],
}
REGIONS = ["north", "south", "east"]
MISSING_SHARE = 0.03
DROP_SHARE = 0.03  # each file lacks this share of the records


def exports(seed: int = 0) -> dict[str, pd.DataFrame]:
    """The four parties' tables (before shuffling and writing)."""
    rng = np.random.default_rng(seed)
    d = load_wine()
    names = [str(c).split("/")[0] for c in d.feature_names]
    x = pd.DataFrame(d.data, columns=names)
    ids = [f"w-{i:04d}" for i in range(len(x))]
    out = {"registry": pd.DataFrame({"id": ids, "cultivar": [f"c{v}" for v in d.target]})}
    for party, cols in COLUMNS.items():
        frame = x[cols].copy()
        mask = rng.random(frame.shape) < MISSING_SHARE
        frame = frame.mask(mask)
        frame.insert(0, "id", ids)
        out[party] = frame
    # the lab's region: mostly three regions, a handful of rows from a rare fourth
    region = rng.choice(REGIONS, size=len(x), p=[0.45, 0.35, 0.20]).astype(object)
    region[rng.choice(len(x), size=3, replace=False)] = "west"
    region[rng.random(len(x)) < MISSING_SHARE] = None
    out["lab"]["region"] = region
    return out


def write_exports(folder: Path, seed: int = 0) -> dict[str, Path]:
    """Write each party's file: its own share of the records, shuffled."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed + 1)
    paths = {}
    for party, frame in exports(seed).items():
        keep = rng.random(len(frame)) >= DROP_SHARE
        frame = frame[keep].sample(frac=1.0, random_state=int(rng.integers(1 << 31)))
        paths[party] = folder / f"{party}.csv"
        frame.to_csv(paths[party], index=False)
    return paths


NEW_RECORDS = 40


def write_new_records(folder: Path, seed: int = 0) -> dict[str, Path]:
    """Each party's export of ``NEW_RECORDS`` records that arrived after training:
    wines near some of the data set's (a little noise on every measurement), new
    IDs, the registry without labels, the columns reordered and an extra column,
    missing values, and one lab row from a region never seen in training."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed + 2)
    base = exports(seed)
    pick = rng.choice(len(base["registry"]), size=NEW_RECORDS, replace=False)
    ids = [f"n-{i:04d}" for i in range(NEW_RECORDS)]
    # the true cultivars, kept aside (no party has them) to check the predictions against
    answers = base["registry"].iloc[pick].reset_index(drop=True).assign(id=ids)
    answers.to_csv(folder / "answers.csv", index=False)
    paths = {}
    for party, frame in base.items():
        new = frame.iloc[pick].reset_index(drop=True).drop(columns=["cultivar"], errors="ignore")
        new["id"] = ids
        numeric = list(COLUMNS.get(party, []))
        if numeric:
            noise = 1.0 + 0.02 * rng.standard_normal((NEW_RECORDS, len(numeric)))
            new[numeric] = new[numeric].to_numpy() * noise
        if party == "lab":
            new.loc[0, "region"] = "central"
        new["export_date"] = "2026-11-23"  # a column the model never saw: not read
        new = new[["export_date", *reversed(new.columns.drop("export_date"))]]
        keep = rng.random(NEW_RECORDS) >= DROP_SHARE
        paths[party] = folder / f"{party}.csv"
        new[keep].sample(frac=1.0, random_state=int(rng.integers(1 << 31))).to_csv(paths[party], index=False)
    return paths


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / "data"
    for party, path in write_exports(target).items():
        print(f"{party:>8}: {path}")
    for party, path in write_new_records(target / "new").items():
        print(f"{party:>8}: {path} (new records; true cultivars in new/answers.csv)")
