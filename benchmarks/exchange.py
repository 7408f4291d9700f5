"""Exchange-backend benchmark on the reference workload (DESIGN §10).

digits, passive parties holding column blocks (2 by default: left/right halves),
MLP bottoms to 64-d embeddings, interactive layer k x 64 -> 64, top 64 -> 10,
batch 256, CPU. Every configuration runs with real processes through the local
launcher; time per step is measured at the active party (median over the training
steps of one epoch) and bytes per step come from the ledger. Ratios are to
``plain`` measured in the same run.

Floors (specs/anchors-crypto-performance.md §5, for B=256, h=64, o=64):
  plain     B*h*4 per direction per passive party            (fp32 split learning)
  mpc       per Beaver matmul [B x h][h x o] each party sends (Bh + ho) * 8,
            times the matmuls the protocol needs (3 per passive party per step),
            plus the dealer's |c| = B*o*8 to rank 0 per matmul
  ckks      4 ciphertexts x 230 KB per direction, scaled by B*h/16384 (slot-packed N=8192)
  paillier  FATE-style packing: 0.26 MiB per direction, scaled by B*h/16384

Usage:  python benchmarks/exchange.py [--backends plain,mpc,ckks,paillier] [--quick]
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

KIB = 1024


def workload(
    backend: str,
    batch: int,
    parties: int,
    params: dict[str, Any] | None = None,
    dim: int = 64,
    max_steps: int | None = None,
) -> dict[str, Any]:
    cols = 64
    bounds = [round(i * cols / parties) for i in range(parties + 1)]
    passive = [
        {
            "name": f"p{i + 1}",
            "columns": {"index": [bounds[i], bounds[i + 1]]},
            "model": {"kind": "mlp", "hidden": [64], "out": dim},
        }
        for i in range(parties)
    ]
    return {
        "name": f"{backend}-b{batch}-k{parties}",
        "dataset": {"name": "digits", "test_fraction": 0.2},
        "parties": {"active": {"name": "active"}, "passive": passive},
        "exchange": {"backend": backend, "params": params or {}},
        "interactive": {"out": dim},
        "training": {"epochs": 1, "batch_size": batch, "lr": 0.003, "seed": 0, "max_steps": max_steps},
        "runtime": {"record_views": False},
    }


def floor_bytes(backend: str, batch: int, parties: int, h: int = 64, o: int = 64) -> float:
    """Bytes per step the anchor note's floors give for this configuration."""
    per_dir = batch * h
    if backend == "plain":
        return 2 * parties * per_dir * 4
    if backend == "mpc":
        n = parties + 1  # MPC parties: A and every P_i
        matmuls = 3 * parties
        return matmuls * (n * (batch * h + h * o) * 8 + batch * o * 8)
    if backend == "ckks":
        return 2 * parties * 0.9e6 * per_dir / 16384
    if backend == "paillier":
        return 2 * parties * 0.26 * 2**20 * per_dir / 16384
    raise ValueError(backend)


def run(doc: dict[str, Any], data_dir: Path) -> dict[str, Any]:
    from securevfl.app.launcher import launch
    from securevfl.app.loader import load_protocol_dict

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        res = launch(load_protocol_dict(copy.deepcopy(doc)), Path(tmp), data_dir=data_dir, progress=False)
        res["_wall"] = time.perf_counter() - t0
        return res


def step_time(res: dict[str, Any]) -> float:
    st = res.get("step_time_s") or {}
    return st.get("median") or res["time_per_step_s"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backends", default="plain,mpc,ckks,paillier")
    ap.add_argument("--quick", action="store_true", help="reference point only, no scaling sweeps")
    ap.add_argument(
        "--sweep-backends",
        default="plain,mpc,ckks",
        help="backends included in the batch and party sweeps (paillier takes minutes a step "
        "at batch 1024, so it is measured at the reference point unless named here)",
    )
    ap.add_argument("--max-steps", type=int, default=4, help="training steps per configuration")
    ap.add_argument("--json", help="also write the rows here")
    ap.add_argument("--params", default="{}", help='JSON: per-backend params, e.g. {"paillier": {...}}')
    args = ap.parse_args()
    from securevfl.exchange import EXCHANGES
    from securevfl.report.compare import human_bytes

    backends = [b for b in args.backends.split(",") if b]
    unknown = [b for b in backends if b not in EXCHANGES]
    if unknown:
        print(f"unknown backends {unknown}; known: {EXCHANGES.names()}", file=sys.stderr)
        return 2
    extra = json.loads(args.params)
    data_dir = Path(tempfile.mkdtemp(prefix="securevfl-bench-"))
    configs = [(256, 2)]
    if not args.quick:
        configs += [(b, 2) for b in (64, 128, 512, 1024)] + [(256, k) for k in (1, 3, 4)]
    rows = []
    sweep = set(args.sweep_backends.split(","))
    for batch, k in configs:
        base = None
        for backend in ["plain"] + [b for b in backends if b != "plain"]:
            if (batch, k) != configs[0] and backend not in sweep and backend != "plain":
                continue
            print(f"  running {backend} batch={batch} passive={k} ...", file=sys.stderr, flush=True)
            res = run(workload(backend, batch, k, extra.get(backend), max_steps=args.max_steps), data_dir)
            t = step_time(res)
            base = t if backend == "plain" else base
            fl = floor_bytes(backend, batch, k)
            rows.append(
                {
                    "backend": backend,
                    "batch": batch,
                    "passive": k,
                    "s_per_step": t,
                    "ratio_to_plain": t / base if base else None,
                    "bytes_per_step": res["bytes_per_step"],
                    "floor_bytes": fl,
                    "bytes_over_floor": res["bytes_per_step"] / fl,
                    "test_accuracy": res["test_accuracy"],
                    "steps": res["train_steps"],
                }
            )
            r = rows[-1]
            print(
                f"    {t * 1000:9.1f} ms/step  x{r['ratio_to_plain']:.1f} plain  "
                f"{human_bytes(r['bytes_per_step'])}/step ({r['bytes_over_floor']:.2f}x floor)",
                file=sys.stderr,
                flush=True,
            )
    stamp = datetime.now(UTC).strftime("%Y-%m-%d")
    machine = f"{platform.processor() or platform.machine()}, {platform.python_version()}"
    print(f"\nexchange benchmark, {stamp}, {machine}; digits, MLP bottoms to 64-d, interactive k x 64 -> 64")
    print("| backend | batch | passive | time/step | x plain | bytes/step | floor | bytes/floor |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['backend']} | {r['batch']} | {r['passive']} | {r['s_per_step'] * 1000:.1f} ms | "
            f"{r['ratio_to_plain']:.1f} | {human_bytes(r['bytes_per_step'])} | "
            f"{human_bytes(r['floor_bytes'])} | {r['bytes_over_floor']:.2f} |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
