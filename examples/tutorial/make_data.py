"""Three organizations' CSV exports about the same customers, for docs/tutorial.md.

A bank (the active party) wants to predict which customers will default on a
loan. It holds the label and columns of its own; a telecom operator and a
retailer hold other columns about many of the same customers:

* ``bank.csv``: ``customer``, ``default`` (``yes``/``no``: the label),
  ``balance``, ``tenure_years`` and ``account_type`` (categorical);
* ``telco.csv``: ``customer``, ``monthly_bill``, ``data_gb``, ``late_payments``
  and ``plan`` (categorical);
* ``shop.csv``: ``customer``, ``spend``, ``visits`` and ``segment``
  (categorical).

The customers are synthetic: each has a hidden financial stress score, and every
column, the label included, depends on it a little, so each party's columns help
predict a default and the three together help most. The exports look like real
ones: string customer IDs, each file missing a few percent of the customers and
in its own order, and blank cells in every party's columns, the categorical ones
included. Deterministic: the same files on every machine.

    python examples/tutorial/make_data.py            # writes examples/tutorial/data/

also writes ``data/new/``: each party's export of customers who arrived after
training (new IDs, no label at the bank), for ``securevfl predict``, and
``data/new/answers.csv`` (which no party holds) with whether they defaulted.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pandas as pd

CUSTOMERS = 600
NEW_CUSTOMERS = 30
DROP_SHARE = 0.04  # each file lacks this share of the customers
BLANK_SHARE = 0.03  # share of blank cells in each feature column


def customers(n: int, rng: np.random.Generator, prefix: str) -> dict[str, pd.DataFrame]:
    """The three parties' tables for ``n`` customers (complete, in ID order)."""
    stress = rng.standard_normal(n)  # hidden: what drives a default
    ids = [f"{prefix}-{i:05d}" for i in range(n)]
    account = np.where(stress + rng.normal(0, 1.0, n) > 0.8, "basic", "current")
    account[rng.random(n) < 0.15] = "premium"
    plan = rng.choice(["prepaid", "contract", "family"], size=n, p=[0.3, 0.5, 0.2]).astype(object)
    plan[stress > 1.2] = "prepaid"
    segment = np.where(stress > 0.5, "bargain", np.where(stress < -0.7, "loyal", "regular")).astype(object)
    segment[rng.random(n) < 0.1] = "online"
    score = 1.3 * stress + 0.6 * (plan == "prepaid") - 0.4 * (segment == "loyal") + rng.normal(0, 0.6, n)
    bank = pd.DataFrame(
        {
            "customer": ids,
            "default": np.where(score > 0.9, "yes", "no"),
            "balance": np.round(np.exp(8.0 - 0.5 * stress + rng.normal(0, 0.5, n)), 2),
            "tenure_years": np.clip(np.round(8 - 2 * stress + rng.normal(0, 3, n)), 0, 40).astype(int),
            "account_type": account,
        }
    )
    telco = pd.DataFrame(
        {
            "customer": ids,
            "monthly_bill": np.round(45 + 12 * stress + rng.normal(0, 8, n), 2),
            "data_gb": np.round(np.abs(rng.normal(10, 5, n)), 1),
            "late_payments": rng.poisson(np.exp(0.2 + 0.7 * stress)),
            "plan": plan,
        }
    )
    shop = pd.DataFrame(
        {
            "customer": ids,
            "spend": np.round(np.exp(5.5 - 0.4 * stress + rng.normal(0, 0.4, n)), 2),
            "visits": rng.poisson(np.exp(1.5 - 0.3 * stress)),
            "segment": segment,
        }
    )
    return {"bank": bank, "telco": telco, "shop": shop}


def export(frame: pd.DataFrame, rng: np.random.Generator, keep_columns: tuple[str, ...]) -> pd.DataFrame:
    """A party's export: blank cells in its feature columns, a few customers
    missing, its own row order."""
    frame = frame.astype(object)
    for col in frame.columns:
        if col not in keep_columns:
            frame.loc[rng.random(len(frame)) < BLANK_SHARE, col] = None
    kept = frame[rng.random(len(frame)) >= DROP_SHARE]
    return kept.sample(frac=1.0, random_state=int(rng.integers(1 << 31)))


def write(folder: Path, seed: int = 0) -> dict[str, Path]:
    """Write the training exports to ``folder`` and the new customers' exports
    to ``folder / "new"``; returns every file written, by name."""
    rng = np.random.default_rng(seed)  # synthetic data: not a secret
    written: dict[str, Path] = {}
    folder.mkdir(parents=True, exist_ok=True)
    for party, frame in customers(CUSTOMERS, rng, "C").items():
        written[party] = folder / f"{party}.csv"
        export(frame, rng, ("customer", "default")).to_csv(written[party], index=False)
    new = folder / "new"
    new.mkdir(exist_ok=True)
    tables = customers(NEW_CUSTOMERS, rng, "N")
    tables["bank"][["customer", "default"]].to_csv(new / "answers.csv", index=False)
    written["new/answers"] = new / "answers.csv"
    tables["bank"] = tables["bank"].drop(columns=["default"])  # the bank does not know yet
    for party, frame in tables.items():
        written[f"new/{party}"] = new / f"{party}.csv"
        export(frame, rng, ("customer",)).to_csv(written[f"new/{party}"], index=False)
    return written


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / "data"
    for name, path in write(target).items():
        rows = len(pd.read_csv(path))
        print(f"{name:>12}: {os.path.relpath(path)} ({rows} rows)")
