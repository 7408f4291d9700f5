"""A privacy-utility sweep with the comparison grid: label DP (randomized response
at the active party) on the binary breast-cancer task under crypto-only `mpc`,
over several epsilons and seeds, with a passive party inferring labels from its
gradients. One grid axis replaces a hand-written loop over generated protocol
files; the comparison folder caches every finished run, so running this again
only runs what is missing (delete one run's folder and only that one re-runs).

    .venv/bin/python examples/privacy_utility_sweep.py [--seeds 0 1 2] [--eps 0.25 0.5 1 2 4]

The same from the command line:

    securevfl compare protocols/demo/b3_bc_mpc_label_dp.yaml --seeds 0 1 2 \\
        --grid 'parties.active.defenses[0].params.epsilon=0.25,0.5,1,2,4' --out runs/examples/label_dp_sweep

It prints label-inference AUC and test AUC (mean and 95% interval over seeds) per
epsilon and writes the report, with the grid curves, to runs/examples/label_dp_sweep.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from securevfl import api
from securevfl.report.prose import show

ROOT = Path(__file__).resolve().parents[1]
PROTOCOL = ROOT / "protocols" / "demo" / "b3_bc_mpc_label_dp.yaml"
EPSILON = "parties.active.defenses[0].params.epsilon"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--eps", type=float, nargs="+", default=[0.25, 0.5, 1.0, 2.0, 4.0])
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "examples" / "label_dp_sweep")
    args = ap.parse_args()

    sweep = api.compare(
        PROTOCOL,
        seeds=args.seeds,
        grid={EPSILON: list(args.eps)},
        out=args.out,
        progress=False,
        title="label DP sweep (breast_cancer, mpc)",
    )
    print(f"{'label eps':>10} {'label inference AUC':>22} {'test AUC':>18}")
    for g in sweep.summary.groups:
        leak, auc = g.metrics.get("attack:label_direction"), g.metrics.get("test_auc")
        print(f"{g.point[EPSILON]:>10g} {show(leak):>22} {show(auc):>18}")
    print(f"report: {sweep.files['markdown']} (grid curves: {sweep.files.get('grid_curves')})")


if __name__ == "__main__":
    main()
