"""Label DP from the Python API: train the digits task with randomized response on
the active party's labels at a few epsilons and print accuracy against the label
epsilon the accountant reports.

    .venv/bin/python examples/label_dp_tradeoff.py
"""

from __future__ import annotations

import math
from pathlib import Path

import yaml

from securevfl.app.launcher import launch
from securevfl.app.loader import load_protocol_dict

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    base = yaml.safe_load((ROOT / "protocols" / "plain.yaml").read_text())
    base["training"]["epochs"] = 3
    print(f"{'label eps':>10} {'test acc':>9} {'eps reported':>13}")
    for eps in (math.inf, 2.0, 0.5):
        doc = dict(base, name=f"label_dp_{eps}")
        doc["parties"] = dict(
            base["parties"],
            active={"name": "active", "defenses": [{"name": "label_dp", "params": {"epsilon": eps}}]},
        )
        out = ROOT / "runs" / "examples" / doc["name"]
        result = launch(load_protocol_dict(doc), out, progress=False, overwrite=True)
        spent = result["privacy"]["parties"]["active"]["total"]["epsilon"]
        print(f"{eps:>10} {result['test_accuracy']:>9.4f} {spent:>13.4g}")


if __name__ == "__main__":
    main()
