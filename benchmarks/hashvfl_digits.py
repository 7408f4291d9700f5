"""HashVFL on digits (docs/methods/hashvfl.md §8.2 item 13): test accuracy with and without
hashing, and per-bit balance of the codes sent for the final evaluation, over
several seeds, each run through the real launcher (one process per rank).

Arms, on protocols/hashvfl_plain.yaml (the plain.yaml task with d-wide bottoms
and interactive.out 16):

* ``floats``: no defense; each party sends its d float outputs (the paper's
  no-defense baseline at the same width);
* ``hashvfl``: the faithful profile (BN + sign + STE, random class codes,
  consistency loss weight 1);
* ``balanced``: the same with the balanced class codes (docs/methods/hashvfl.md §7 items 5-6);
* ``median``: balanced codes and ``balance: median`` (BN, then Sign at each
  unit's batch median in training and its running median at evaluation; docs/methods/hashvfl.md §7 item 5);
* ``median_batch``: the same with ``balance_eval: batch`` (evaluation codes
  thresholded at each evaluation batch's own median, as in training);
* ``no_bn``: the paper's "Ours w/o BN" ablation (docs/methods/hashvfl.md Table X): no BN,
  sign + STE, CE + consistency loss;
* ``greedyhash``: the paper's GreedyHash ablation (Table X): no BN, sign + STE,
  CE + ||V - H||_3 (``quantization_weight: 1``), no consistency loss;
* ``greedyhash_code``: the official ``bn.py`` "greedy" arm as it actually
  trains: no BN, sign + STE, CE only (its ||V - H||_3 is computed with H from the
  identity-STE sign, so the term has zero gradient);
* ``no_consistency``: BN, sign + STE, CE + ||V - H||_3, no consistency loss (the
  hashed form of Fig. 6's "w/o consistency" arm);
* ``no_consistency_continuous``: the same sending the continuous BN output V
  (``send: continuous``), the official code's Fig. 6 arm. NOT a hashed system.

Usage::

    .venv/bin/python benchmarks/hashvfl_digits.py --seeds 0 1 2 --bits 4 8 --out runs/hashvfl_digits

It prints a markdown table (mean +- std over seeds), a per-seed table (accuracy
with and without hashing, each party's bit farthest from 1/2 as its +1 fraction,
and whether the issue's criteria hold), and writes every result and the tables
to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
ARMS = (
    "floats",
    "hashvfl",
    "balanced",
    "median",
    "median_batch",
    "no_bn",
    "greedyhash",
    "greedyhash_code",
    "no_consistency",
    "no_consistency_continuous",
)
# the ablation arms' hashvfl params (docs/methods/hashvfl.md §8.1, Table X, Fig. 6), and those run without the
# active party's consistency loss
ABLATIONS: dict[str, dict[str, Any]] = {
    "no_bn": {"batchnorm": False},
    "greedyhash": {"batchnorm": False, "quantization_weight": 1.0},
    "greedyhash_code": {"batchnorm": False},
    "no_consistency": {"quantization_weight": 1.0},
    "no_consistency_continuous": {"quantization_weight": 1.0, "send": "continuous"},
}
NO_CONSISTENCY = ("greedyhash", "greedyhash_code", "no_consistency", "no_consistency_continuous")


def protocol(seed: int, bits: int, arm: str) -> dict[str, Any]:
    """hashvfl_plain.yaml at ``seed`` and ``bits``, with ``arm``'s defenses."""
    doc = yaml.safe_load((ROOT / "protocols" / "hashvfl_plain.yaml").read_text())
    doc["name"] = f"hashvfl_digits_{arm}_d{bits}_s{seed}"
    doc["training"]["seed"] = seed
    doc["runtime"] = {"record_views": False}
    for p in doc["parties"]["passive"]:
        p["model"]["out"] = bits
        if arm == "floats":
            p["defenses"] = []
    if arm == "floats" or arm in NO_CONSISTENCY:
        doc["parties"]["active"]["defenses"] = []
    if arm in ABLATIONS:
        for p in doc["parties"]["passive"]:
            p["defenses"] = [{"name": "hashvfl", "params": dict(ABLATIONS[arm])}]
    elif arm != "floats":
        codes = "random" if arm == "hashvfl" else "balanced"
        doc["parties"]["active"]["defenses"][0]["params"]["codes"] = codes
        if arm.startswith("median"):
            params: dict[str, Any] = {"balance": "median"}
            if arm == "median_batch":
                params["balance_eval"] = "batch"
            for p in doc["parties"]["passive"]:
                p["defenses"] = [{"name": "hashvfl", "params": params}]
    return doc


def run_one(doc: dict[str, Any], out: Path, data_dir: Path) -> dict[str, Any]:
    from securevfl.app.launcher import launch
    from securevfl.app.loader import load_checked_dict

    return launch(load_checked_dict(doc), out, data_dir=data_dir, progress=False, overwrite=True)


def summarize(result: dict[str, Any], out: Path) -> dict[str, Any]:
    """Accuracy, and over both passive parties' final-evaluation codes (from each
    party's own defense report in the run folder ``out``): the worst bit's
    |fraction of +1 - 1/2|, the mean entropy per bit, and the fraction of bits
    within [0.4, 0.6]."""
    from securevfl.report.result import read_own_reports

    row: dict[str, Any] = {"acc": result["test_accuracy"]}
    fracs: list[float] = []
    ents: list[float] = []
    for party, own in read_own_reports(out).items():
        rep = own.defenses
        bits = rep.get("hashvfl", {}).get("test_bits")
        if bits:
            fracs += bits["plus_fraction"]
            ents.append(bits["entropy_bits_mean"])
            # the party's bit farthest from 1/2, as its +1 fraction
            row[f"worst_{party}"] = max(bits["plus_fraction"], key=lambda f: abs(f - 0.5))
    if fracs:
        row["worst_dev"] = max(abs(f - 0.5) for f in fracs)
        row["in_04_06"] = sum(0.4 <= f <= 0.6 for f in fracs) / len(fracs)
        row["entropy"] = statistics.mean(ents)
    return row


def fmt(values: list[float], pct: bool = False) -> str:
    k = 100 if pct else 1
    if not values:
        return "-"
    if len(values) == 1:
        return f"{k * values[0]:.2f}" if pct else f"{values[0]:.3f}"
    m, s = statistics.mean(values) * k, statistics.stdev(values) * k
    return f"{m:.2f} ± {s:.2f}" if pct else f"{m:.3f} ± {s:.3f}"


def table(rows: dict[tuple[int, str], list[dict[str, Any]]]) -> str:
    lines = [
        "| d | arm | test acc (%) | gap to floats (points) | worst bit \\|p(+1) - 0.5\\| "
        "| bits in [0.4, 0.6] | entropy/bit |",
        "|---|---|---|---|---|---|---|",
    ]
    for (bits, arm), runs in sorted(rows.items(), key=lambda kv: (kv[0][0], ARMS.index(kv[0][1]))):
        base = rows.get((bits, "floats"), [])
        gaps = [r["acc"] - b["acc"] for r, b in zip(runs, base, strict=False)] if arm != "floats" else []
        lines.append(
            f"| {bits} | {arm} | {fmt([r['acc'] for r in runs], pct=True)} | {fmt(gaps, pct=True)} "
            f"| {fmt([r['worst_dev'] for r in runs if 'worst_dev' in r])} "
            f"| {fmt([r['in_04_06'] for r in runs if 'in_04_06' in r])} "
            f"| {fmt([r['entropy'] for r in runs if 'entropy' in r])} |"
        )
    return "\n".join(lines)


def per_seed(rows: dict[tuple[int, str], list[dict[str, Any]]]) -> str:
    """One line per hashed run: accuracy with and without hashing, the gap, each
    party's worst bit (its +1 fraction on the final evaluation's codes), and the
    issue's criteria: gap within 3 points and every bit's +1 fraction in [0.4, 0.6]."""
    lines = [
        "| d | arm | seed | acc floats (%) | acc hashed (%) | gap (points) | worst bit left "
        "| worst bit right | gap ok | bits ok |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (bits, arm), runs in sorted(rows.items(), key=lambda kv: (kv[0][0], ARMS.index(kv[0][1]))):
        if arm == "floats":
            continue
        base = {r["seed"]: r["acc"] for r in rows.get((bits, "floats"), [])}
        for r in runs:
            b = base.get(r["seed"])
            gap = None if b is None else 100 * (r["acc"] - b)
            worst = [r.get("worst_left"), r.get("worst_right")]
            ok_bits = r.get("worst_dev") is not None and r["worst_dev"] <= 0.1 + 1e-9
            lines.append(
                f"| {bits} | {arm} | {r['seed']} | {'-' if b is None else f'{100 * b:.2f}'} "
                f"| {100 * r['acc']:.2f} | {'-' if gap is None else f'{gap:+.2f}'} "
                + " ".join(f"| {'-' if w is None else f'{w:.3f}'}" for w in worst)
                + f" | {'-' if gap is None else ('yes' if gap >= -3 else 'no')}"
                + f" | {'yes' if ok_bits else 'no'} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--bits", type=int, nargs="+", default=[4])
    ap.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS))
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "hashvfl_digits")
    ap.add_argument(
        "--reuse",
        action="store_true",
        help="read a run's result.json already under --out instead of rerunning it",
    )
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    rows: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for bits in args.bits:
        for arm in args.arms:
            for seed in args.seeds:
                doc = protocol(seed, bits, arm)
                done = args.out / doc["name"] / "result.json"
                if args.reuse and done.is_file():
                    result = json.loads(done.read_text())
                else:
                    result = run_one(doc, args.out / doc["name"], args.out / "data")
                row = {"seed": seed, **summarize(result, args.out / doc["name"])}
                rows.setdefault((bits, arm), []).append(row)
                print(json.dumps({"bits": bits, "arm": arm, **row}), flush=True)
    text = table(rows) + "\n\n" + per_seed(rows)
    (args.out / "table.md").write_text(text + "\n")
    (args.out / "rows.json").write_text(json.dumps({f"{b}|{a}": r for (b, a), r in rows.items()}, indent=1))
    print(text)


if __name__ == "__main__":
    main()
