"""DRAVL dCor-weight sweep on the plain.yaml task (docs/methods/dravl.md §3.3).

Each configuration runs protocols/plain.yaml (digits halves on two passive parties,
CNN bottoms to 64-d embeddings) through the real launcher, with the ``dravl``
defense at both passive parties using only the dCor module (``alpha_d``, log form,
the paper's eq. 3); ``alpha_d = 0`` is vanilla. Optional ``--noise`` adds rows for
the ``gaussian_noise`` baseline.

Leakage metric: each passive party's defense reports, from its last evaluation
pass, the V-statistic dCor between its own test-row inputs (the fixed, z-scored
pixel columns its bottom model reads) and the embeddings it sent, in batches of up
to 512 rows, next to the permuted-row baseline and the bias-corrected dCor^2
(its own ``ranks/rank<R>.defense_report.json``). The passive party computes these
locally; they are a measurement, nothing is sent. Rows average the two passive parties,
then the seeds (mean and sample std over seeds).

Usage:  python benchmarks/dravl_sweep.py [--weights 0,0.01,0.1,0.3,1] [--seeds 0,1,2]
                                         [--epochs 10] [--noise 0.5,2] [--json out.json]
                                         [--reuse earlier.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def protocol(defense: dict[str, Any] | None, seed: int, epochs: int) -> dict[str, Any]:
    """protocols/plain.yaml with ``defense`` at both passive parties."""
    doc = yaml.safe_load((ROOT / "protocols" / "plain.yaml").read_text())
    doc["name"] = "dravl-sweep"
    doc["training"].update({"seed": seed, "epochs": epochs})
    doc["runtime"] = {"record_views": False}
    for p in doc["parties"]["passive"]:
        p["defenses"] = [defense] if defense else []
    return doc


def run_one(doc: dict[str, Any]) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """The run's result and every party's own defense report (a local run's folder holds all)."""
    from securevfl.app.launcher import launch
    from securevfl.app.loader import load_checked_dict
    from securevfl.report.result import read_own_reports

    with tempfile.TemporaryDirectory() as tmp:
        result = launch(load_checked_dict(doc), Path(tmp), progress=False)
        return result, {p: r.defenses for p, r in read_own_reports(Path(tmp)).items()}


def leakage(own: dict[str, dict[str, Any]], name: str) -> dict[str, float]:
    """The passive parties' eval metrics of the sent embeddings, averaged."""
    mine = [r[name] for r in own.values() if name in r]
    reps = [r["eval"] for r in mine]
    keys = ("v_dcor", "v_dcor_permuted", "u_dcor2")
    out = {k: statistics.fmean(r["sent"][k] for r in reps) for k in keys}
    if name == "dravl":
        out["collapsed"] = sum(r.get("collapsed_batches", 0) for r in mine)
    return out


def summarise(rows: list[dict[str, Any]]) -> dict[str, tuple[float, float]]:
    keys = ("acc", "v_dcor", "v_dcor_permuted", "u_dcor2")
    out = {}
    for k in keys:
        vals = [r[k] for r in rows]
        out[k] = (statistics.fmean(vals), statistics.stdev(vals) if len(vals) > 1 else 0.0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--weights", default="0,0.01,0.1,0.3,1", help="alpha_d values (0 = vanilla)")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--noise", default="", help="gaussian_noise std values to add as baseline rows")
    ap.add_argument("--json", default=None, help="also write every run's numbers here")
    ap.add_argument(
        "--reuse",
        default=None,
        help="a --json file of an earlier sweep: its (config, seed) runs are not rerun (same --epochs)",
    )
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    configs: list[tuple[str, dict[str, Any]]] = []
    for w in (float(v) for v in args.weights.split(",")):
        configs.append((f"dcor alpha_d={w:g}", {"name": "dravl", "params": {"alpha_d": w}}))
    for s in (float(v) for v in args.noise.split(",") if v):
        configs.append((f"noise s={s:g}", {"name": "gaussian_noise", "params": {"std": s}}))

    earlier = json.loads(Path(args.reuse).read_text()) if args.reuse and Path(args.reuse).is_file() else {}
    runs: dict[str, list[dict[str, Any]]] = {}
    started = time.time()
    for label, defense in configs:
        for seed in seeds:
            old = [r for r in earlier.get(label, []) if r["seed"] == seed]
            if old:
                runs.setdefault(label, []).append(old[0])
                continue
            t0 = time.time()
            result, own = run_one(protocol(defense, seed, args.epochs))
            row = {"seed": seed, "acc": result["test_accuracy"], **leakage(own, defense["name"])}
            runs.setdefault(label, []).append(row)
            print(f"{label} seed={seed}: {json.dumps(row)} ({time.time() - t0:.0f} s)", file=sys.stderr)

    base = summarise(runs[configs[0][0]])
    print(f"\nplain.yaml task, {args.epochs} epochs, seeds {args.seeds}; mean (sd) over seeds")
    print("| config | test acc | Δacc | V-dCor (test, sent) | permuted baseline | bias-corr. dCor² |")
    print("|---|---|---|---|---|---|")
    for label, _ in configs:
        s = summarise(runs[label])
        print(
            f"| {label} | {s['acc'][0]:.4f} ({s['acc'][1]:.4f}) | {s['acc'][0] - base['acc'][0]:+.4f} "
            f"| {s['v_dcor'][0]:.3f} ({s['v_dcor'][1]:.3f}) | {s['v_dcor_permuted'][0]:.3f} "
            f"| {s['u_dcor2'][0]:.3f} ({s['u_dcor2'][1]:.3f}) |"
        )
    print("\nper seed: test acc / V-dCor (test, sent); Δ against alpha_d = 0 at the same seed")
    print("| config | " + " | ".join(f"seed {s}" for s in seeds) + " |")
    print("|---|" + "---|" * len(seeds))
    van = {r["seed"]: r for r in runs[configs[0][0]]}
    for label, _ in configs:
        cells = []
        for r in sorted(runs[label], key=lambda r: r["seed"]):
            b = van.get(r["seed"])
            delta = (
                ""
                if b is None
                else f" (Δacc {r['acc'] - b['acc']:+.4f}, ΔdCor {r['v_dcor'] - b['v_dcor']:+.3f})"
            )
            cells.append(f"{r['acc']:.4f} / {r['v_dcor']:.3f}{delta}")
        print(f"| {label} | " + " | ".join(cells) + " |")
    print(f"\nwall time {time.time() - started:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(runs, indent=1))


if __name__ == "__main__":
    main()
