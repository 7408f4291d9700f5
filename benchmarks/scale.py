"""Scale benchmark: synthetic rows x passive parties, end to end.

Workload (the issue's reference protocol): ``synthetic`` rows with 64 features
split in equal column blocks over k passive parties, MLP bottoms (hidden 64) to
16-d embeddings, batch 1024, one epoch, ``plain``; plus 200k rows x 4 parties on
``mpc``. Every configuration is a real ``securevfl run`` in a subprocess (the
launcher, one OS process per rank, PSI alignment), timed end to end; the CPU
seconds of the whole process tree come from ``getrusage(RUSAGE_CHILDREN)``.

Printed per configuration: wall time end to end, its CPU seconds, each phase's
wall time (the slowest rank: start-up, data, alignment, set-up, training,
evaluation, write-out), time per training step, peak resident memory (the
largest rank), aligned rows and test accuracy. Then a fitted exponent per
phase: the slope of log(time) against log(rows) at each party count, and against
log(parties) at each row count (1.0 = linear).

The alignment floor: DH-PSI with X25519 costs A one hash-and-blind per own ID
plus one blinding per element of each passive party's setup, and each P_i one
hash-and-blind per own ID plus one blinding per A's ID. ``--unit-costs``
measures those unit costs now (and openmined-psi's for the same IDs) and prints
each configuration's floor: total PSI CPU seconds over the cores.

Usage:  python benchmarks/scale.py [--rows 100000,200000,1000000] [--parties 2,4,8]
                                   [--mpc 200000x4 | --no-mpc] [--unit-costs] [--json FILE]
        python benchmarks/scale.py --merge a.json,b.json   (table and exponents of earlier runs)
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

FEATURES = 64
PHASES = ("startup", "data", "alignment", "setup", "training", "evaluation", "write_out")


def protocol(rows: int, parties: int, backend: str = "plain") -> dict[str, Any]:
    """The issue's reference protocol at ``rows`` x ``parties``."""
    bounds = [round(i * FEATURES / parties) for i in range(parties + 1)]
    passive = [
        {
            "name": f"p{i + 1}",
            "columns": {"index": [bounds[i], bounds[i + 1]]},
            "model": {"kind": "mlp", "hidden": [64], "out": 16},
        }
        for i in range(parties)
    ]
    return {
        "name": f"scale-{backend}-{rows}-k{parties}",
        "dataset": {
            "name": "synthetic",
            "test_fraction": 0.2,
            "synthetic": {"rows": rows, "features": FEATURES},
        },
        "parties": {"active": {"name": "active"}, "passive": passive},
        "exchange": {"backend": backend},
        "interactive": {"out": 16},
        "training": {"epochs": 1, "batch_size": 1024, "lr": 0.003, "optimizer": "adam", "seed": 0},
    }


def children_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_one(rows: int, parties: int, backend: str, work: Path) -> dict[str, Any]:
    """One ``securevfl run`` end to end; returns its measurements."""
    name = f"{backend}-{rows}-k{parties}"
    proto = work / f"{name}.yaml"
    proto.write_text(yaml.safe_dump(protocol(rows, parties, backend)))
    out = work / name
    exe = Path(sys.executable).with_name("securevfl")
    cmd = [str(exe), "run", str(proto), "--out", str(out), "--overwrite"]
    cpu0, t0 = children_cpu_s(), time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wall, cpu = time.perf_counter() - t0, children_cpu_s() - cpu0
    if done.returncode != 0:
        raise RuntimeError(f"{name} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    res = json.loads((out / "result.json").read_text())
    phases = {ph: max(float(p.get(ph, 0.0)) for p in res["phase_s"].values()) for ph in PHASES}
    rss = {int(r): v for r, v in res["peak_rss_mib"].items() if v is not None}
    return {
        "backend": backend,
        "rows": rows,
        "parties": parties,
        "wall_s": wall,
        "cpu_s": cpu,
        "phase_s": phases,
        "alignment_by_rank_s": {int(r): p.get("alignment") for r, p in res["phase_s"].items()},
        # CPU seconds of alignment summed over the ranks: what the PSI cost, whatever the load
        "alignment_cpu_s": sum(float(p.get("alignment", 0.0)) for p in res.get("phase_cpu_s", {}).values()),
        "s_per_step": (res.get("step_time_s") or {}).get("median") or res.get("time_per_step_s"),
        "steps": res.get("train_steps"),
        "peak_rss_mib": max(rss.values()) if rss else None,
        "peak_rss_by_rank_mib": rss,
        "aligned": res["rows"]["aligned"],
        "test_accuracy": res.get("test_accuracy"),
    }


def slope(xs: list[float], ys: list[float]) -> float | None:
    """Least-squares slope of log(y) on log(x): the growth exponent."""
    pts = [(math.log(x), math.log(y)) for x, y in zip(xs, ys, strict=True) if x > 0 and y > 0]
    if len(pts) < 2:
        return None
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    den = sum((p[0] - mx) ** 2 for p in pts)
    return sum((p[0] - mx) * (p[1] - my) for p in pts) / den if den else None


def exponents(rows: list[dict[str, Any]]) -> list[str]:
    """Fitted exponent per phase in rows (at each party count) and in parties (at
    each row count), over the plain runs."""
    plain = [r for r in rows if r["backend"] == "plain"]
    keys = [*PHASES, "alignment_cpu_s", "wall_s"]
    lines = []

    def value(r: dict[str, Any], key: str) -> float:
        return r[key] if key in ("wall_s", "alignment_cpu_s") else r["phase_s"][key]

    for axis, fixed in (("rows", "parties"), ("parties", "rows")):
        for f in sorted({r[fixed] for r in plain}):
            grp = sorted((r for r in plain if r[fixed] == f), key=lambda r: r[axis])
            if len(grp) < 2:
                continue
            cells = []
            for k in keys:
                s = slope([g[axis] for g in grp], [value(g, k) for g in grp])
                cells.append(f"{k} {s:.2f}" if s is not None else f"{k} -")
            lines.append(f"  exponent in {axis} ({fixed}={f}): " + ", ".join(cells))
            if axis == "parties":
                steps = [
                    (b["alignment_cpu_s"] - a["alignment_cpu_s"]) / (b["parties"] - a["parties"])
                    for a, b in itertools.pairwise(grp)
                ]
                walls = [
                    (b["phase_s"]["alignment"] - a["phase_s"]["alignment"]) / (b["parties"] - a["parties"])
                    for a, b in itertools.pairwise(grp)
                ]
                lines.append(
                    f"    alignment per added passive party (rows={f}): CPU s "
                    + ", ".join(f"{v:.1f}" for v in steps)
                    + "; wall s "
                    + ", ".join(f"{v:.1f}" for v in walls)
                )
    return lines


def pairwise_share(unit: dict[str, float]) -> float:
    """CPU of one more passive party over the CPU of a whole pairwise alignment,
    from the unit costs: an added P_i costs its own hash-and-blind, its blinding
    of A's request and A's blinding of its setup; a pairwise run also costs A's
    hash-and-blind (shared by every P_i once there are several)."""
    hb = unit["curve25519 hash"] + unit["x25519 multiply"]
    m = unit["x25519 multiply"]
    return (hb + 2 * m) / (2 * hb + 2 * m)


def unit_costs(n: int = 20000) -> dict[str, float]:
    """Per-element CPU microseconds of each PSI operation on ``n`` IDs, measured now."""
    import private_set_intersection.python as psi

    from securevfl.data import dh_psi

    def cpu() -> float:
        return time.process_time()

    ids = [f"r{i:07d}" for i in range(n)]
    out: dict[str, float] = {}
    t = cpu()
    h = dh_psi.hash_to_group(ids)
    out["curve25519 hash"] = (cpu() - t) / n * 1e6
    key = dh_psi.Key.fresh()
    t = cpu()
    dh_psi.multiply(key, h)
    out["x25519 multiply"] = (cpu() - t) / n * 1e6
    server = psi.server.CreateWithNewKey(True)
    client = psi.client.CreateWithNewKey(True)
    t = cpu()
    setup = server.CreateSetupMessage(1e-9, n, ids, psi.DataStructure.RAW)
    out["openmined setup (hash+encrypt)"] = (cpu() - t) / n * 1e6
    t = cpu()
    req = client.CreateRequest(ids)
    out["openmined request (hash+encrypt)"] = (cpu() - t) / n * 1e6
    t = cpu()
    resp = server.ProcessRequest(req)
    out["openmined process (re-encrypt)"] = (cpu() - t) / n * 1e6
    t = cpu()
    client.GetIntersection(setup, resp)
    out["openmined intersection (decrypt)"] = (cpu() - t) / n * 1e6
    return out


def psi_floor_s(rows: int, parties: int, unit: dict[str, float], cores: int) -> tuple[float, float]:
    """(X25519 floor, openmined-psi floor) in seconds for full overlap: total
    PSI CPU over ``cores``."""
    hb = unit["curve25519 hash"] + unit["x25519 multiply"]
    m = unit["x25519 multiply"]
    ours = rows * hb + parties * rows * m + parties * (rows * hb + rows * m)
    om = (
        rows * unit["openmined request (hash+encrypt)"]
        + parties * rows * unit["openmined intersection (decrypt)"]
        + parties * rows * (unit["openmined setup (hash+encrypt)"] + unit["openmined process (re-encrypt)"])
    )
    return ours * 1e-6 / cores, om * 1e-6 / cores


def table(rows: list[dict[str, Any]], floors: dict[tuple[int, int], tuple[float, float]]) -> list[str]:
    """The runs as a markdown table (times in seconds, memory of the largest rank)."""
    cols = [
        "backend",
        "rows",
        "passive",
        "end to end s",
        "CPU s",
        "start-up s",
        "data s",
        "alignment s",
        "alignment CPU s",
        "PSI CPU floor s",
        "training s",
        "ms/step",
        "evaluation s",
        "write-out s",
        "peak RSS MiB/rank",
        "aligned",
        "test acc",
        "load",
    ]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        ph = r["phase_s"]
        fl = floors.get((r["rows"], r["parties"]))
        cells = [
            r["backend"],
            str(r["rows"]),
            str(r["parties"]),
            f"{r['wall_s']:.1f}",
            f"{r['cpu_s']:.0f}",
            f"{ph['startup']:.1f}",
            f"{ph['data']:.1f}",
            f"{ph['alignment']:.1f}",
            f"{r['alignment_cpu_s']:.0f}" if r.get("alignment_cpu_s") else "-",
            f"{fl[0] * r['cores']:.0f}" if fl else "-",
            f"{ph['training']:.1f}",
            f"{(r['s_per_step'] or 0) * 1e3:.1f}",
            f"{ph['evaluation']:.1f}",
            f"{ph['write_out']:.1f}",
            f"{r['peak_rss_mib']:.0f}",
            str(r["aligned"]),
            f"{r['test_accuracy']:.4f}",
            f"{r['load_before']:.1f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="100000,200000,1000000", help="comma-separated row counts")
    ap.add_argument("--parties", default="2,4,8", help="comma-separated passive-party counts")
    ap.add_argument("--mpc", default="200000x4", help="ROWSxPARTIES runs on mpc (comma-separated)")
    ap.add_argument("--no-mpc", action="store_true", help="skip the mpc runs")
    ap.add_argument("--unit-costs", action="store_true", help="measure PSI unit costs and print floors")
    ap.add_argument("--json", help="also write the measurements here")
    ap.add_argument("--work", help="keep the runs here (default: a temporary folder)")
    ap.add_argument(
        "--merge",
        help="comma-separated --json files of earlier runs: print their table and exponents, run nothing",
    )
    args = ap.parse_args()
    if args.merge:
        runs, unit = [], {}
        for f in args.merge.split(","):
            blob = json.loads(Path(f).read_text())
            runs += blob["runs"]
            unit = unit or blob.get("unit_us", {})
        cores = runs[0].get("cores", 2) if runs else 2
        fl = {(r["rows"], r["parties"]): psi_floor_s(r["rows"], r["parties"], unit, cores) for r in runs}
        print("\n".join(table(runs, fl if unit else {})))
        print("\n".join(exponents(runs)))
        if unit:
            share = pairwise_share(unit)
            print(f"an added passive party costs {share:.2f} of a pairwise alignment's PSI CPU")
        return 0
    grid = [
        (int(r), int(k), "plain") for r in args.rows.split(",") if r for k in args.parties.split(",") if k
    ]
    if not args.no_mpc and args.mpc:
        for cell in args.mpc.split(","):
            r, k = cell.lower().split("x")
            grid.append((int(r), int(k), "mpc"))
    cores = len(os.sched_getaffinity(0))
    unit: dict[str, float] = {}
    if args.unit_costs:
        unit = unit_costs()
        print(f"PSI unit costs (CPU us per element, this box, load {os.getloadavg()[0]:.1f}):")
        for k, v in unit.items():
            print(f"  {k:34s} {v:7.1f}")
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="securevfl-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    results, floors = [], {}
    for rows, k, backend in grid:
        load = os.getloadavg()[0]
        print(
            f"  running {backend} rows={rows} passive={k} (load {load:.1f}) ...", file=sys.stderr, flush=True
        )
        r = run_one(rows, k, backend, work)
        r["load_before"] = load
        r["cores"] = cores
        r["load_after"] = os.getloadavg()[0]
        results.append(r)
        if unit:
            floors[(rows, k)] = psi_floor_s(rows, k, unit, cores)
        print(
            f"    {r['wall_s']:.1f} s end to end, CPU {r['cpu_s']:.0f} s, alignment "
            f"{r['phase_s']['alignment']:.1f} s, {(r['s_per_step'] or 0) * 1e3:.1f} ms/step, "
            f"peak {r['peak_rss_mib']:.0f} MiB/rank (by rank: "
            + ", ".join(f"{k}: {v:.0f}" for k, v in sorted(r["peak_rss_by_rank_mib"].items()))
            + f"), aligned {r['aligned']}, acc {r['test_accuracy']:.4f}",
            file=sys.stderr,
            flush=True,
        )
        if args.json:  # after every run, so a long sweep stopped early keeps what it measured
            Path(args.json).write_text(json.dumps({"unit_us": unit, "runs": results}, indent=1))
    print("\n".join(table(results, floors)))
    for line in exponents(results):
        print(line)
    if unit:
        print(f"an added passive party costs {pairwise_share(unit):.2f} of a pairwise alignment's PSI CPU")
        print(f"PSI floors over {cores} cores (X25519 / openmined-psi, full overlap):")
        for (rows, k), (ours, om) in sorted(floors.items()):
            print(f"  rows={rows} passive={k}: {ours:.1f} s / {om:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
