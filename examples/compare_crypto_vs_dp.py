"""Crypto alone against crypto plus perturbation, through securevfl's Python API.

Under a crypto backend the active party never sees a passive party's embedding,
but it still learns what the protocol reveals to it by design: z, the sum of the
parties' contributions to the interactive layer, and the top model it trains on
z. A feature-reconstruction attack decodes a passive party's raw features from z;
model completion infers labels from a passive party's side (SECURITY.md says what
each backend reveals). Crypto does not hide the output it computes; a
perturbation defense on the embedding blurs it, at a price in utility.

This script loads one crypto-only protocol (``protocols/ckks.yaml``, or
``protocols/mpc.yaml`` with ``--backend mpc``), derives from it, in code, the
same protocol with embedding DP at both passive parties (VFL-AFE's vanilla
variant: clip to norm 1 and add Gaussian noise, per-release epsilon 3 at delta
1e-5), gives both the same two attacks by the active party, compares the two over
the seeds, and prints one row per protocol: utility beside the majority rate, the
epsilon spent, claimed per release and audited (the verdict), what each
attack achieved (AP: higher = the adversary learns more) and the cost.

    .venv/bin/python examples/compare_crypto_vs_dp.py [--backend ckks|mpc] [--seeds 0 1 2] [--small]

``--small`` trains for a few steps only (a smoke run: its numbers show that the
pieces fit, not what the defense buys). The comparison folder (``--out``) is a
cache: running the script again reuses every finished run.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

import pandas as pd

from securevfl import api

ROOT = Path(__file__).resolve().parents[1]

#: what the active party attacks in both protocols
ATTACKS = [
    {"name": "feature_reconstruction", "params": {"target": "left", "aux_fraction": 0.2}},
    {"name": "model_completion", "params": {"party": "left", "n_known": 40}},
]
#: the perturbation: VFL-AFE embedding DP, clip + Gaussian noise (docs/methods/vfl-afe.md)
EMBEDDING_DP = {
    "name": "embedding_dp",
    "params": {"variant": "vanilla", "epsilon": 3.0, "delta": 1e-5, "calibration": "analytic", "clip": 1.0},
}
#: --small: a few training steps, and attacks that train briefly
SMALL = {"training.epochs": 1, "training.max_steps": 4, "training.batch_size": 128}

#: the printed table: (column of Comparison.frame, heading)
COLUMNS = [
    ("test_accuracy", "test acc"),
    ("test_majority_rate", "majority"),
    ("epsilon", "eps"),
    ("eps_release", "eps/release"),
    ("eps_lower", "eps lower"),
    ("audit", "audit"),
    ("attack:feature_reconstruction", "AP feature rec."),
    ("attack:model_completion", "AP model compl."),
    ("time_per_step_s", "s/step"),
    ("bytes_per_step", "MB/step"),
]


def protocols(backend: str, small: bool) -> list[Any]:
    """The crypto-only protocol and the same with embedding DP at every passive party."""
    common: dict[str, Any] = {"attacks": ATTACKS, **(SMALL if small else {})}
    crypto = api.load_protocol(ROOT / "protocols" / f"{backend}.yaml", overrides=common)
    defended = {f"parties.passive[{i}].defenses": [EMBEDDING_DP] for i in range(len(crypto.parties.passive))}
    perturbed = api.load_protocol(
        crypto,
        overrides={
            "name": f"{crypto.name}_embedding_dp",
            "description": f"{crypto.description}; embedding DP (eps 3 per release) at every passive party",
            **defended,
        },
    )
    return [crypto, perturbed]


def cell(row: pd.Series, key: str) -> str:
    """A metric's mean, with its 95% interval over seeds when there are several."""
    mean, lo, hi = row.get(key), row.get(f"{key}_lo"), row.get(f"{key}_hi")
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return "-"
    if isinstance(mean, str):  # the audit's verdict
        return mean
    scale = 1e-6 if key == "bytes_per_step" else 1.0
    text = f"{mean * scale:.3g}"
    if row["n_seeds"] > 1 and lo is not None and hi is not None and lo != hi:
        text += f" [{lo * scale:.3g}, {hi * scale:.3g}]"
    return text


def table(frame: pd.DataFrame) -> str:
    """One line per protocol, the columns of :data:`COLUMNS`."""
    head = ["protocol", "seeds", *(name for _, name in COLUMNS)]
    body = [
        [str(r["protocol"]), str(r["n_seeds"]), *(cell(r, k) for k, _ in COLUMNS)]
        for _, r in frame.iterrows()
    ]
    widths = [max(len(line[i]) for line in [head, *body]) for i in range(len(head))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)) for line in [head, *body]
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", choices=["ckks", "mpc"], default="ckks", help="the crypto backend")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--small", action="store_true", help="a few training steps (a smoke run)")
    ap.add_argument(
        "--out", type=Path, help="comparison folder (default: runs/examples/crypto_vs_dp_<backend>)"
    )
    args = ap.parse_args()
    out = (
        args.out
        or ROOT / "runs" / "examples" / f"crypto_vs_dp_{args.backend}{'_small' if args.small else ''}"
    )

    result = api.compare(protocols(args.backend, args.small), seeds=args.seeds, out=out, progress=False)
    print(table(result.frame))
    print(f"report: {result.files['markdown']}")


if __name__ == "__main__":  # every rank re-imports this script when it starts
    main()
