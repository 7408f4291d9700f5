"""Exchange-backend benchmark on the reference workload (docs/design.md §10).

digits, passive parties holding column blocks (2 by default: left/right halves),
MLP bottoms to 64-d embeddings, interactive layer k x 64 -> 64, top 64 -> 10,
batch 256, CPU. Every configuration runs with real processes through the local
launcher; time per step is measured at the active party (median over the run's
training steps: ``--plain-steps`` (16) for ``plain``, the ratio's denominator,
``--mpc-steps`` (16) for ``mpc``, ``--max-steps`` for the HE backends, over as many
epochs as that takes), bytes per
step come from the ledger, and CPU per step is every rank's CPU time in training
(``train_cpu_s``; the dealer's whole serving) over the steps: on a loaded machine the
figure to compare. Ratios are to ``plain`` measured in the same run.

The sweeps (batch 64..1024 at 2 passive parties, 1..4 passive parties at batch 256)
run on synthetic data of the same shapes (64 features, 10 classes) with enough rows
for every measured step to be a full batch: digits has 1,437 training rows, so at
batch 1,024 it gave one full step and one of 413 rows, each with its own offline
bundle under ``mpc`` (the 217 ms of the 18:54 sweep).

Floors (docs/crypto-performance.md §5, for B=256, h=64, o=64):
  plain     B*h*4 per direction per passive party            (fp32 split learning)
  mpc       pairwise layout, per passive party and step: its three secret operands
            opened once each, h'_i (B x h) by P_i alone and dL/dz (B x o) by A alone (their
            masks are one-sided) and W_i (h x o) by both, z and dL/dh'_i revealed to their
            owners, the momentum's exact truncation opened by both (h x o), and the dealer's
            shares of the three products to rank 0 (B*o + B*h + h*o), 8 bytes per element.
            Joint layout: per Beaver matmul [B x h][h x o] all k + 1 holders send
            (Bh + ho) * 8, 3 matmuls per passive party, plus the dealer's |c| = B*o*8 each
  ckks      4 ciphertexts x 230 KB per direction, scaled by B*h/16384 (slot-packed N=8192)
  paillier  restated, protocol-scaled (securevfl.exchange.paillier.profile.bytes_floor): per
            passive party the encrypted h'_i (B x h), h'_i W^A + eps (B x o), dL/dz (B x o,
            counted once although Paillier needs it in two packings), g W^P^T + mu (B x h) and
            h'^T g - R (h x o), each value at its own blob's density 2|n|/8 bytes / L, L the
            slots of the smallest overflow-free width for that blob's operands and masks
            (bounded, re-drawn weight shares, masks over every bit of the slot: 14 slots at
            |n| = 2048), plus the plaintext integer matrices at their widths (z share, masked
            dL/dh, the share re-draw). FATE's 0.26 MiB assumed
            64-bit slots that only add; a slot holding a sum of products cannot be that narrow.

Op-count floors (time, anchors §7): paillier and ckks count their primitive operations;
mpc counts each step's Beaver products and openings, communication rounds, truncations and
dealer requests (securevfl.exchange.mpc.plan) and prices them with a loopback round trip and
one party's ring arithmetic measured in the same run, on the ring kernel the parties use
(securevfl.exchange.mpc.floor, .ringmatmul; docs/mpc-kernels.md): the
online floor is rounds x round trip + arithmetic; the offline phase (dealer and one party
drawing the step's tuples) is printed beside it and is not in the x plain ratio.
An op floor prices the backend's protocol alone, while a step also runs everything a
``plain`` step runs (bottom models, top model, loss, optimizers, the plaintext messages):
the step floor is plain's step measured in the same run plus the op floor, and the table
gives the step against both (for mpc, plain's one round trip of messages is then counted
twice, about 0.2 ms of a step floor of 10-20 ms).

Secure channel (SECURITY.md §4a): every frame travels sealed (AES-256-GCM). The channel
table gives, per backend at each configuration, the payload bytes (the columns above, which
the floors compare), the sealed bytes on the wire (headers and 16-byte tags included), the
sealed frames, and the CPU the seal/open calls took, all ranks together, per training step,
as a share of the step time (the overhead's upper bound: ranks mostly wait on each other).
The sealed bytes, frames and seal/open CPU count every sealed frame of the training phase,
CrypTen's under mpc included (its frames go through the same links).

Channel A/B (``--channel-ab PAIRS``, plain and mpc at the reference point): the channel's
cost in wall time, measured directly. Each pair is two runs of the same configuration, one
sealed (the product) and one unsealed, in alternating order (sealed first in even pairs);
a run's step time is its median step, each arm's the median over its runs, and the cost is
the median of the pairs' differences (sealed - unsealed), as a share of the sealed step.
The unsealed arm is benchmark-only: this script has the launcher start ranks with
``spawn`` (``SECUREVFL_START_METHOD``), so every rank re-imports it as ``__mp_main__``;
when it finds ``SECUREVFL_BENCH_UNSEALED=1`` (set by this script around that arm's
launch, read by nothing else) it replaces the links'
class with :class:`UnsealedLink`, which sends every frame as the tensor's own bytes and
receives it straight into the caller's tensor, as an unsealed gloo transport would: same
frames (the channel's header and payload, CrypTen's frames), same order, same code around
them, no cipher, tag or frame buffer. The handshake still runs, and the ranks' closing
summaries stay sealed (bytes, outside the steps). Each arm's CPU per step (all ranks) is
printed too; an unsealed run that sealed a frame, or a sealed run that sealed none, stops
the benchmark.

Usage:  python benchmarks/exchange.py [--backends plain,mpc,ckks,paillier] [--quick] [--channel-ab PAIRS]
                                     [--device cuda] [--batch N]
        benchmarks/cpu/avx2.sh python benchmarks/exchange.py ...   (as on an AVX2-only CPU)
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import platform
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# The benchmark runs from a checkout without installing: securevfl is importable
# only once ROOT is on the path.
from securevfl.app.launcher import START_METHOD_ENV, launch  # noqa: E402
from securevfl.app.loader import load_checked_dict  # noqa: E402
from securevfl.exchange import EXCHANGES  # noqa: E402
from securevfl.exchange.ckks import CkksOptions  # noqa: E402
from securevfl.exchange.ckks.floor import report as ckks_report  # noqa: E402
from securevfl.exchange.mpc import MpcOptions, share_layout  # noqa: E402
from securevfl.exchange.mpc.floor import report as mpc_report  # noqa: E402
from securevfl.exchange.paillier import PaillierOptions  # noqa: E402
from securevfl.exchange.paillier.profile import FLOOR_OPS, profile_step  # noqa: E402
from securevfl.exchange.paillier.profile import bytes_floor as paillier_bytes_floor  # noqa: E402
from securevfl.report.compare import human_bytes  # noqa: E402
from securevfl.runtime.secure import link as link_module  # noqa: E402

KIB = 1024
UNSEALED_ENV = "SECUREVFL_BENCH_UNSEALED"


class UnsealedLink(link_module.Link):
    """The channel A/B's unsealed arm (benchmark-only, never in the product): a frame
    is the tensor's own bytes, sent from its memory and received into the caller's
    tensor, as an unsealed gloo transport moves it; the sequence counters still count."""

    def seal_tensor(self, t: torch.Tensor) -> torch.Tensor:
        self.sent += 1
        return t.reshape(-1).view(torch.uint8)

    def frame_for(self, out: torch.Tensor) -> torch.Tensor:
        return out.reshape(-1).view(torch.uint8)

    def open_tensor(self, frame: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        if frame.data_ptr() != out.data_ptr() or frame.numel() != out.numel() * out.element_size():
            raise RuntimeError(f"unsealed arm: a frame from {self.who} was not received into its tensor")
        self.received += 1
        return out

    def release(self, frame: torch.Tensor) -> None:
        return None


if os.environ.get(UNSEALED_ENV) == "1":
    # a rank of the A/B's unsealed arm (spawned by this script, which re-imports it):
    # Links.link makes every link of this process through this module global
    link_module.Link = UnsealedLink  # type: ignore[misc]


TEST_FRACTION = 0.2
DIGITS_TRAIN = 1437  # digits' 1797 rows less the 20% test split


def sweep_rows(batch: int, steps: int) -> int:
    """Rows of the sweep's synthetic data set that give ``steps`` full batches in one
    epoch (digits has 1,437 training rows: one full batch of 1,024, so a step time at
    batch 1,024 would be the mean of that batch and a short one of 413 rows, each with
    its own offline bundle under mpc)."""
    return math.ceil(steps * batch / (1 - TEST_FRACTION)) + batch


def workload(
    backend: str,
    batch: int,
    parties: int,
    params: dict[str, Any] | None = None,
    dim: int = 64,
    max_steps: int | None = None,
    rows: int | None = None,
    device: str = "cpu",
) -> dict[str, Any]:
    """The reference workload (digits) or, with ``rows``, the same shapes on a
    synthetic data set of 64 features and 10 classes with that many rows. With
    digits, ``max_steps`` beyond one epoch's batches runs more epochs."""
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
    dataset: dict[str, Any] = {"name": "digits", "test_fraction": TEST_FRACTION}
    epochs = 1
    if rows is not None:
        dataset = {
            "name": "synthetic",
            "test_fraction": TEST_FRACTION,
            "synthetic": {"rows": rows, "features": cols, "classes": 10},
        }
    elif max_steps:
        epochs = math.ceil(max_steps / math.ceil(DIGITS_TRAIN / batch))
    return {
        "name": f"{backend}-b{batch}-k{parties}",
        "dataset": dataset,
        "parties": {"active": {"name": "active"}, "passive": passive},
        "exchange": {"backend": backend, "params": params or {}},
        "interactive": {"out": dim},
        "training": {
            "epochs": epochs,
            "batch_size": batch,
            "lr": 0.003,
            "seed": 0,
            "max_steps": max_steps,
            "eval_every": epochs,
            "device": device,
        },
        "runtime": {"record_views": False},
    }


def floor_bytes(
    backend: str,
    batch: int,
    parties: int,
    params: dict[str, Any] | None = None,
    h: int = 64,
    o: int = 64,
    device: str = "cpu",
) -> float:
    """Bytes per step the anchor note's floors give for this configuration."""
    per_dir = batch * h
    if backend == "plain":
        return 2 * parties * per_dir * 4
    if backend == "mpc":
        if share_layout(MpcOptions.model_validate(params or {}), device) == "pairwise":
            # per pair: h'_i opened once by P_i and dL/dz once by A (one-sided masks),
            # W_i by both, z and dL/dh'_i revealed to their owners, the momentum's
            # truncation opened by both, and the dealer's shares of the step's three
            # products to rank 0
            opened = batch * h + 2 * h * o + batch * o
            revealed = batch * o + batch * h
            return parties * 8 * (opened + revealed + 2 * h * o + (batch * o + batch * h + h * o))
        # joint: every product's operands opened by all k + 1 holders, the dealer's c to rank 0
        return 3 * parties * ((parties + 1) * (batch * h + h * o) * 8 + batch * o * 8)
    if backend == "ckks":
        return 2 * parties * 0.9e6 * per_dir / 16384
    if backend == "paillier":
        options = PaillierOptions(**(params or {}))
        return paillier_bytes_floor(options, batch, [h] * parties, o)
    raise ValueError(backend)


def run(doc: dict[str, Any], data_dir: Path, *, unsealed: bool = False) -> dict[str, Any]:
    """One launch of ``doc``; ``unsealed``: the channel A/B's unsealed arm (its ranks
    inherit :data:`UNSEALED_ENV`, set for this launch only)."""
    if unsealed:
        os.environ[UNSEALED_ENV] = "1"
    try:
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            res = launch(load_checked_dict(copy.deepcopy(doc)), Path(tmp), data_dir=data_dir, progress=False)
            res["_wall"] = time.perf_counter() - t0
    finally:
        os.environ.pop(UNSEALED_ENV, None)
    frames = res["ledger"].get("channel_frames_per_step", 0.0)
    if unsealed == bool(frames):  # the arm is not what it claims to be
        raise RuntimeError(f"{'unsealed' if unsealed else 'sealed'} run sealed {frames} frames per step")
    return res


def cpu_per_step(res: dict[str, Any]) -> tuple[float, float]:
    """CPU seconds per training step of the parties together and of the helper ranks
    (``train_cpu_s``: each party's CPU while training, evaluation excluded; a helper's
    whole serving, so the dealer's few evaluation tuples are in): on a shared machine
    the load moves wall time, CPU time much less, and on two cores total CPU is what a
    step costs."""
    helpers = {str(r) for r, v in res["ranks"].items() if v["role"] == "helper"}
    steps = max(1, int(res["train_steps"]))
    cpu = res["train_cpu_s"]
    parties = sum(v for r, v in cpu.items() if r not in helpers)
    return parties / steps, sum(v for r, v in cpu.items() if r in helpers) / steps


def step_time(res: dict[str, Any]) -> float:
    st = res.get("step_time_s") or {}
    return st.get("median") or res["time_per_step_s"]


def ratio_text(row: dict[str, Any]) -> str:
    """A row's x plain, or "-" where plain did not run at its configuration
    (``--no-plain-sweep``)."""
    r = row["ratio_to_plain"]
    return "-" if math.isnan(r) else f"{r:.1f}"


def median(xs: list[float]) -> float:
    ys = sorted(xs)
    n = len(ys)
    return ys[n // 2] if n % 2 else (ys[n // 2 - 1] + ys[n // 2]) / 2


def channel_ab(backend: str, doc: dict[str, Any], data_dir: Path, pairs: int) -> dict[str, Any]:
    """The channel's wall-time cost for one configuration: ``pairs`` pairs of runs,
    sealed and unsealed in alternating order (module docstring, "Channel A/B")."""
    arms: dict[bool, list[dict[str, Any]]] = {True: [], False: []}
    for i in range(pairs):
        for sealed in (True, False) if i % 2 == 0 else (False, True):
            print(
                f"  channel A/B {backend}: pair {i + 1}/{pairs}, {'sealed' if sealed else 'unsealed'} ...",
                file=sys.stderr,
                flush=True,
            )
            arms[sealed].append(run(doc, data_dir, unsealed=not sealed))
    steps = {k: [step_time(r) for r in v] for k, v in arms.items()}
    cpu = {k: [sum(cpu_per_step(r)) for r in v] for k, v in arms.items()}
    diffs = [a - b for a, b in zip(steps[True], steps[False], strict=True)]
    meter = [r["ledger"]["channel_cpu_s_per_step"] for r in arms[True]]
    return {
        "backend": backend,
        "pairs": pairs,
        "steps_per_run": int(arms[True][0]["train_steps"]),
        "sealed_s": median(steps[True]),
        "unsealed_s": median(steps[False]),
        "cost_s": median(diffs),
        "cost_min_s": min(diffs),
        "cost_max_s": max(diffs),
        "cpu_sealed_s": median(cpu[True]),
        "cpu_unsealed_s": median(cpu[False]),
        "meter_cpu_s": median(meter),
    }


def print_channel_ab(rows: list[dict[str, Any]]) -> None:
    print(
        "\nchannel A/B (wall: median step of each run, median over runs; cost: median of the pairs' "
        "sealed - unsealed, [min, max]; CPU: all ranks per training step)"
    )
    print(
        "| backend | pairs x steps | sealed step | unsealed step | channel cost | of sealed step "
        "| CPU sealed | CPU unsealed | seal+open CPU (meter) | of sealed step |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        ms = {k: v * 1000 for k, v in r.items() if k.endswith("_s")}
        print(
            f"| {r['backend']} | {r['pairs']} x {r['steps_per_run']} | {ms['sealed_s']:.2f} ms | "
            f"{ms['unsealed_s']:.2f} ms | {ms['cost_s']:+.2f} ms [{ms['cost_min_s']:+.2f}, "
            f"{ms['cost_max_s']:+.2f}] | {100 * r['cost_s'] / r['sealed_s']:.1f}% | "
            f"{ms['cpu_sealed_s']:.2f} ms | {ms['cpu_unsealed_s']:.2f} ms | {ms['meter_cpu_s']:.2f} ms | "
            f"{100 * r['meter_cpu_s'] / r['sealed_s']:.1f}% |"
        )


def paillier_floor(params: dict[str, Any], batch: int, dims: list[int], out: int) -> tuple[str, float]:
    """paillier's operation counts for one step, unit costs measured now, and their
    product: the one-core floor (securevfl.exchange.paillier.profile)."""

    prof = profile_step(PaillierOptions(**params), batch, dims, out)
    c = prof.counts.as_dict()
    cells = ", ".join(f"{op} {c[op]} x {prof.unit_s[op] * 1e6:.0f} us" for op in FLOOR_OPS)
    rest = ", ".join(f"{k} {v}" for k, v in c.items() if k not in FLOOR_OPS)
    text = (
        f"    paillier ops/step: {cells}; {rest}\n"
        f"    floor (one core) {prof.floor_s():.2f} s/step; in-process replay {prof.replay_s:.2f} s"
    )
    return text, prof.floor_s()


def ckks_floor(params: dict[str, Any], batch: int, dims: list[int], out: int) -> tuple[str, float]:
    """ckks's operation counts per party, unit costs measured now, and the critical
    path's floor: A's work plus one passive party's (securevfl.exchange.ckks.floor)."""
    ops = ckks_report(CkksOptions.model_validate(params), batch, dims, out)
    lines = []
    for who, counts in ops["counts"].items():
        lines.append(f"      {who:8s} " + "  ".join(f"{op} {n}" for op, n in counts.items() if n))
    lines.append("      unit ms  " + "  ".join(f"{op} {v * 1e3:.3f}" for op, v in ops["unit_s"].items()))
    lines.append(
        f"      floor: A {ops['floor_active_s'] * 1e3:.0f} ms + one P {ops['floor_passive_s'] * 1e3:.0f} ms "
        f"= {ops['floor_critical_s'] * 1e3:.0f} ms (all parties' work {ops['floor_total_s'] * 1e3:.0f} ms)"
    )
    return "\n".join(lines), ops["floor_critical_s"]


def mpc_floor(params: dict[str, Any], batch: int, dims: list[int], out: int) -> tuple[str, float]:
    """mpc's online counts per step (Beaver products and openings, rounds, truncations,
    dealer requests), unit costs measured now (loopback round trip, one party's ring
    arithmetic) and the online floor; the offline phase per step beside it
    (securevfl.exchange.mpc.floor)."""
    opts = MpcOptions.model_validate(params)
    layout = share_layout(opts, "cpu")
    rep = mpc_report(batch, dims, out, offline_steps=opts.offline_steps, layout=layout)
    c = rep["counts"]
    text = (
        f"      {layout} layout; online/step: {c['matmuls']} Beaver products "
        f"({c['openings']} openings in 2 rounds), "
        f"{c['rounds']} rounds, {c['truncations']} truncations, "
        f"{c['dealer_requests']:.3g} dealer requests (one bundle per offline chunk of up to "
        f"{opts.offline_steps} steps)\n"
        f"      unit: round trip {rep['round_trip_s'] * 1e3:.3f} ms, Beaver arithmetic (one party, all "
        f"products, {rep['ring_kernel']} ring kernel) {rep['arithmetic_s'] * 1e3:.2f} ms\n"
        f"      online floor {rep['floor_s'] * 1e3:.1f} ms/step; offline (dealer + one party, CPU) "
        f"{rep['offline_s'] * 1e3:.1f} ms/step, {c['offline_bytes'] / 1024:.0f} KiB/step dealer -> rank 0"
    )
    return text, rep["floor_s"]


def steps_for(backend: str, args: argparse.Namespace) -> int:
    """Training steps to take the median of: many for the cheap backends, whose
    medians of a few steps move between runs, ``--max-steps`` for the HE ones."""
    return {"plain": args.plain_steps, "mpc": args.mpc_steps}.get(backend, args.max_steps)


# backend -> (params, batch, embedding dims, out) -> (printable counts and unit costs, floor s/step)
OP_FLOORS = {"paillier": paillier_floor, "ckks": ckks_floor, "mpc": mpc_floor}


def main() -> int:
    # every rank a fresh interpreter that re-imports this script: the channel A/B's
    # unsealed arm is chosen there (a fork server's ranks would not re-read the variable)
    os.environ.setdefault(START_METHOD_ENV, "spawn")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backends", default="plain,mpc,ckks,paillier")
    ap.add_argument("--quick", action="store_true", help="reference point only, no scaling sweeps")
    ap.add_argument(
        "--sweep-backends",
        default="plain,mpc,ckks",
        help="backends included in the batch and party sweeps (paillier takes minutes a step "
        "at batch 1024, so it is measured at the reference point unless named here)",
    )
    ap.add_argument("--max-steps", type=int, default=4, help="training steps of ckks and paillier")
    ap.add_argument(
        "--plain-steps",
        type=int,
        default=16,
        help="training steps of plain, the ratio's denominator (a few ms a step: a median of 3 "
        "moved by 2x between runs)",
    )
    ap.add_argument(
        "--mpc-steps",
        type=int,
        default=16,
        help="training steps of mpc (tens of ms a step: a median of 3 moved by half between runs)",
    )
    ap.add_argument(
        "--sweep",
        choices=("both", "batch", "parties"),
        default="both",
        help="which sweep to run without --quick (both: batch 64..1024, passive parties 1..4)",
    )
    ap.add_argument(
        "--no-plain-sweep",
        action="store_true",
        help="run plain at the reference point only (the sweeps' absolute times and CPU, not "
        "their x plain, show how a backend scales)",
    )
    ap.add_argument("--json", help="also write the rows and the channel A/B here")
    ap.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="training.device of every run (cuda: mpc runs its joint layout, CrypTen's CUDA kernels)",
    )
    ap.add_argument(
        "--batch",
        type=int,
        default=256,
        help="the reference point's batch size; other than 256 it runs on synthetic data of digits' "
        "shapes with enough rows for full batches only (as the sweeps do)",
    )
    ap.add_argument("--params", default="{}", help='JSON: per-backend params, e.g. {"paillier": {...}}')
    ap.add_argument("--no-op-counts", action="store_true", help="skip the operation counts and floors")
    ap.add_argument(
        "--channel-ab",
        type=int,
        default=3,
        metavar="PAIRS",
        help="pairs of sealed/unsealed runs of plain and mpc (those of --backends) at the reference "
        "point for the channel's wall-time cost (0: none)",
    )
    args = ap.parse_args()

    backends = [b for b in args.backends.split(",") if b]
    unknown = [b for b in backends if b not in EXCHANGES]
    if unknown:
        print(f"unknown backends {unknown}; known: {EXCHANGES.names()}", file=sys.stderr)
        return 2
    extra = json.loads(args.params)
    data_dir = Path(tempfile.mkdtemp(prefix="securevfl-bench-"))
    # (batch, passive parties, data set): the reference point on digits; the sweeps on
    # synthetic data of the same shapes with enough rows for full batches only
    configs: list[tuple[int, int, str]] = [(args.batch, 2, "digits" if args.batch == 256 else "synthetic")]
    if not args.quick and args.sweep in ("both", "batch"):
        configs += [(b, 2, "synthetic") for b in (64, 128, 256, 512, 1024)]
    if not args.quick and args.sweep in ("both", "parties"):
        configs += [(256, k, "synthetic") for k in (1, 2, 3, 4) if (256, k, "synthetic") not in configs]
    configs = list(dict.fromkeys(configs))  # --batch may name a sweep point
    rows = []
    sweep = set(args.sweep_backends.split(","))
    for batch, k, data in configs:
        base = None
        for backend in ["plain"] + [b for b in backends if b != "plain"]:
            in_sweep = backend in sweep if backend != "plain" else not args.no_plain_sweep
            if (batch, k, data) != configs[0] and not in_sweep:
                continue
            print(f"  running {backend} batch={batch} passive={k} on {data} ...", file=sys.stderr, flush=True)
            steps = steps_for(backend, args)
            n_rows = sweep_rows(batch, steps) if data == "synthetic" else None
            doc = workload(
                backend, batch, k, extra.get(backend), max_steps=steps, rows=n_rows, device=args.device
            )
            res = run(doc, data_dir)
            t = step_time(res)
            base = t if backend == "plain" else base
            fl = floor_bytes(backend, batch, k, extra.get(backend), device=args.device)
            rows.append(
                {
                    "backend": backend,
                    "device": args.device,
                    "batch": batch,
                    "passive": k,
                    "data": data,
                    "s_per_step": t,
                    "ratio_to_plain": t / base if base else float("nan"),
                    "bytes_per_step": res["bytes_per_step"],
                    "floor_bytes": fl,
                    "bytes_over_floor": res["bytes_per_step"] / fl,
                    "test_accuracy": res["test_accuracy"],
                    "steps": res["train_steps"],
                    "sealed_bytes_per_step": res["ledger"].get("sealed_bytes_per_step", 0.0),
                    "channel_frames_per_step": res["ledger"].get("channel_frames_per_step", 0.0),
                    "channel_cpu_s_per_step": res["ledger"].get("channel_cpu_s_per_step", 0.0),
                }
            )
            r = rows[-1]
            r["cpu_parties_s"], r["cpu_helpers_s"] = cpu_per_step(res)
            r["cpu_s_per_step"] = r["cpu_parties_s"] + r["cpu_helpers_s"]
            cpu_txt = (
                f"  CPU {r['cpu_s_per_step'] * 1000:.1f} ms/step (parties {r['cpu_parties_s'] * 1000:.1f}, "
                f"dealer {r['cpu_helpers_s'] * 1000:.1f})"
            )
            print(
                f"    {t * 1000:9.1f} ms/step  x{ratio_text(r)} plain  "
                f"{human_bytes(r['bytes_per_step'])}/step ({r['bytes_over_floor']:.2f}x floor){cpu_txt}; "
                "channel "
                f"{r['channel_cpu_s_per_step'] * 1000:.2f} ms CPU/step "
                f"({100 * r['channel_cpu_s_per_step'] / t:.1f}% of the step), "
                f"{human_bytes(r['sealed_bytes_per_step'])} sealed/step",
                file=sys.stderr,
                flush=True,
            )
            # the op floors price CPU primitives: not the figure for a CUDA run
            cpu_floor = args.device == "cpu" and not args.no_op_counts
            if backend in OP_FLOORS and cpu_floor and (batch, k, data) == configs[0]:
                # primitive counts x unit costs measured now (docs/crypto-performance.md §7)
                r["ops"], r["floor_s"] = OP_FLOORS[backend](extra.get(backend) or {}, batch, [64] * k, 64)
                if base:  # the step also does plain's work (module docstring)
                    r["step_floor_s"] = base + r["floor_s"]
                print(r["ops"], file=sys.stderr, flush=True)
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    machine = f"{platform.processor() or platform.machine()}, {platform.python_version()}"
    print(
        f"\nexchange benchmark, {stamp}, {machine}, device {args.device}; MLP bottoms to 64-d, "
        "interactive k x 64 -> 64; "
        f"median step of {args.max_steps} (plain: {args.plain_steps}, mpc: {args.mpc_steps})"
    )
    print(
        "| backend | data | batch | passive | time/step | x plain | op floor | measured/op floor "
        "| step floor | measured/step floor | bytes/step | floor | bytes/floor | CPU/step, all ranks |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        fl, sfl = r.get("floor_s"), r.get("step_floor_s")
        floor_cells = f"{fl * 1000:.1f} ms | {r['s_per_step'] / fl:.2f}" if fl else "- | -"
        floor_cells += f" | {sfl * 1000:.1f} ms | {r['s_per_step'] / sfl:.2f}" if sfl else " | - | -"
        cpu = f"{r['cpu_s_per_step'] * 1000:.1f} ms ({r['cpu_helpers_s'] * 1000:.1f} dealer)"
        print(
            f"| {r['backend']} | {r['data']} | {r['batch']} | {r['passive']} | "
            f"{r['s_per_step'] * 1000:.1f} ms | {ratio_text(r)} | {floor_cells} | "
            f"{human_bytes(r['bytes_per_step'])} | "
            f"{human_bytes(r['floor_bytes'])} | {r['bytes_over_floor']:.2f} | {cpu} |"
        )
    print("\nsecure channel (seal + open CPU, all ranks, per training step; sealed bytes on the wire)")
    print(
        "| backend | batch | passive | payload/step | sealed/step | frames/step | seal+open CPU | of step |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['backend']} | {r['batch']} | {r['passive']} | {human_bytes(r['bytes_per_step'])} | "
            f"{human_bytes(r['sealed_bytes_per_step'])} | {r['channel_frames_per_step']:.0f} | "
            f"{r['channel_cpu_s_per_step'] * 1000:.2f} ms | "
            f"{100 * r['channel_cpu_s_per_step'] / r['s_per_step']:.1f}% |"
        )
    for r in rows:
        if "ops" in r:
            print(f"\n{r['backend']}, measured {r['s_per_step']:.2f} s/step:\n{r['ops']}")
    ab = []
    if args.channel_ab > 0:
        batch, k, data = configs[0]
        for backend in [b for b in ("plain", "mpc") if b in ["plain", *backends]]:
            steps = steps_for(backend, args)
            n_rows = sweep_rows(batch, steps) if data == "synthetic" else None
            doc = workload(
                backend, batch, k, extra.get(backend), max_steps=steps, rows=n_rows, device=args.device
            )
            ab.append(channel_ab(backend, doc, data_dir, args.channel_ab))
        print_channel_ab(ab)
    if args.json:
        Path(args.json).write_text(
            json.dumps({"device": args.device, "machine": machine, "rows": rows, "channel_ab": ab}, indent=2)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
