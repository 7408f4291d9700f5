"""The tutorial's comparison from Python (docs/tutorial.md, "The same study from Python").

Crypto alone (``mpc``) against crypto plus the group's own defense, over three
seeds, with the group's own classes given where a protocol file names things: the
model factory, the defense class and the attack class come from ``bank_lab.py``
beside this script, and securevfl registers them in every party's process (each
rank imports them as ``bank_lab:...``). Prints one line per protocol and writes
the comparison (report.md, compare.csv, ...) to ``--out``.

    python examples/tutorial/study.py --out runs/study
"""

from __future__ import annotations

import argparse
import copy
from pathlib import Path
from typing import Any

import yaml
from bank_lab import ColumnProbe, NoisyRelease, per_category

from securevfl import api

HERE = Path(__file__).resolve().parent


def crypto_only(data: Path) -> dict[str, Any]:
    """mpc.yaml as Python data, with the group's objects in place of their names."""
    doc = yaml.safe_load((HERE / "mpc.yaml").read_text())
    doc.pop("plugins")  # the classes below are registered for the call instead
    parties = [doc["parties"]["active"], *doc["parties"]["passive"]]
    for party in parties:
        party["source"]["path"] = str(data / Path(party["source"]["path"]).name)
        party["model"]["factory"] = per_category
    doc["attacks"] = [
        {"name": ColumnProbe, "params": {"target": "telco", "column": "monthly_bill", "aux_fraction": 0.2}}
    ]
    return doc


def with_defense(doc: dict[str, Any], noise_multiplier: float) -> dict[str, Any]:
    """The same protocol with NoisyRelease at both passive parties."""
    out = copy.deepcopy(doc)
    out["name"] = f"{doc['name']}_noise"
    out["description"] = f"{doc['description']}; noisy_release at telco and shop"
    for party in out["parties"]["passive"]:
        party["defenses"] = [
            {"name": NoisyRelease, "params": {"clip": 1.0, "noise_multiplier": noise_multiplier}}
        ]
    out["privacy"] = {"delta": 1e-5}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="runs/study")
    ap.add_argument("--data", type=Path, default=HERE / "data", help="the folder make_data.py wrote")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--noise", type=float, default=0.5, help="noise_multiplier of the defense")
    args = ap.parse_args()
    crypto = crypto_only(args.data.resolve())
    table = api.compare(
        [crypto, with_defense(crypto, args.noise)], seeds=args.seeds, out=args.out, progress=False
    )
    for row in table.rows:
        probe = row.metrics["attack:column_probe"]
        telco = row.privacy_of("telco")
        eps = "-" if telco is None else f"{telco.epsilon:.1f}"
        print(
            f"{row.protocol:<16} test AUC {row.mean('test_auc'):.3f}  "
            f"column_probe R2 {probe.mean:.3f} [{probe.lo:.3f}, {probe.hi:.3f}]  telco eps {eps}"
        )
    print(f"report: {table.files['markdown']}")


if __name__ == "__main__":  # every party's process imports this script again; only the caller runs
    main()
