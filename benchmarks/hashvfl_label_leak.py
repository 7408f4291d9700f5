"""Label leakage under HashVFL on digits (docs/methods/hashvfl.md §7 items 2-3, §5.4, §8.2
item 19): the gradient label-leak probe (``gradient_clusters``, k-means over the
gradients a passive party received) and passive model completion with and without
MixMatch, on a hashed run and on the same run without hashing, each through the
real launcher (one process per rank).

Arms, on the tests' small digits task (MLP bottoms [32], plain exchange):

* ``floats``: no defense, each passive party sends its ``--bits`` float outputs;
* ``hashvfl``: the faithful profile at d = ``--bits`` (BN + sign + STE, random
  class codes, consistency loss weight 1).

Usage::

    .venv/bin/python benchmarks/hashvfl_label_leak.py --seeds 0 1 2 --out runs/hashvfl_label_leak

Prints one markdown row per (arm, seed) and the per-arm means, and writes every
result.json under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.protocols import small_digits  # noqa: E402
from tests.support.runs import run_doc  # noqa: E402

ATTACKS: list[dict[str, Any]] = [
    {"name": "gradient_clusters", "params": {"label": "gc_row_norm"}},
    {"name": "gradient_clusters", "params": {"label": "gc_row_raw", "normalize": False}},
    {"name": "gradient_clusters", "params": {"label": "gc_step_norm", "points": "per_step"}},
    {
        "name": "gradient_clusters",
        "params": {"label": "gc_step_raw", "points": "per_step", "normalize": False},
    },
    {"name": "gradient_clusters", "params": {"label": "gc_last_row_norm", "epochs": "last"}},
    {"name": "model_completion", "params": {"label": "pla_labelled", "n_known": 40}},
    {
        "name": "model_completion",
        "params": {"label": "pla_mixmatch", "n_known": 40, "semi_supervised": "mixmatch"},
    },
]
COLUMNS = [
    ("gc_row_norm", "ami"),
    ("gc_row_raw", "ami"),
    ("gc_step_norm", "ami"),
    ("gc_step_raw", "ami"),
    ("gc_last_row_norm", "ami"),
    ("gc_row_norm", "accuracy"),
    ("pla_labelled", "accuracy"),
    ("pla_mixmatch", "accuracy"),
]


def protocol(arm: str, seed: int, bits: int, epochs: int) -> dict[str, Any]:
    doc = small_digits(epochs=epochs, batch_size=64, seed=seed)
    for p in doc["parties"]["passive"]:
        p["model"]["out"] = bits
        if arm == "hashvfl":
            p["defenses"] = [{"name": "hashvfl", "params": {}}]
    if arm == "hashvfl":
        doc["parties"]["active"]["defenses"] = [{"name": "hashvfl_consistency", "params": {}}]
    doc["attacks"] = ATTACKS
    return doc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--bits", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "hashvfl_label_leak")
    a = ap.parse_args()
    head = ["arm", "seed", "test acc"] + [f"{k} {m}" for k, m in COLUMNS]
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    rows: dict[str, list[list[float]]] = {}
    for arm in ("floats", "hashvfl"):
        for seed in a.seeds:
            out = a.out / f"{arm}_s{seed}"
            res = run_doc(protocol(arm, seed, a.bits, a.epochs), out, overwrite=True)
            att = res["attacks"]
            vals = [res["test_accuracy"]] + [att[k][m] for k, m in COLUMNS]
            rows.setdefault(arm, []).append(vals)
            print(f"| {arm} | {seed} | " + " | ".join(f"{v:.3f}" for v in vals) + " |", flush=True)
            (out / "label_leak.json").write_text(json.dumps({"arm": arm, "seed": seed, "values": vals}))
    for arm, vals in rows.items():
        means = [statistics.mean(c) for c in zip(*vals, strict=True)]
        print(f"| {arm} | mean | " + " | ".join(f"{v:.3f}" for v in means) + " |")


if __name__ == "__main__":
    main()
