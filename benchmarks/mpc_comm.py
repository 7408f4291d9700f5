"""The ``mpc`` step's CrypTen traffic alone: CPU and wall time per step, per rank.

Runs the interactive layer's online protocol (securevfl.exchange.mpc: k forward
Beaver products in one opening, z revealed to rank 0, 2k backward products in
one opening, every dL/dh_i revealed to its owner in one round that also opens the
momentum's exact truncation and the weight step's)
at the reference shape (batch 256, k passive parties with 64-d embeddings,
output 64) between k + 1 MPC processes and the dealer, with the dealer's tuples
pooled before the timed steps (the offline bundle is timed apart). Nothing else
runs in these processes, so the CPU seconds each rank spends per step are the
cost of CrypTen's arithmetic plus its communicator; compare two communicators
(or two checkouts: ``--root``) by CPU per step, which a loaded machine disturbs
far less than wall time.

Usage:  python benchmarks/mpc_comm.py [--parties 2] [--steps 20] [--root CHECKOUT] [--json FILE]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing as mp
import os
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Any

# the checkout under test: this one, or --root (passed to the ranks in the environment)
ROOT = Path(os.environ.get("MPC_COMM_ROOT") or Path(__file__).resolve().parents[1])
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import securevfl.exchange.mpc.crypten.provider as tuple_provider  # noqa: E402
from securevfl.exchange.mpc import ops  # noqa: E402
from securevfl.exchange.mpc.crypten.runtime import serve_dealer, start_crypten, stop_crypten  # noqa: E402
from securevfl.exchange.mpc.plan import step_ops, step_plan  # noqa: E402
from securevfl.runtime.channel import Channel  # noqa: E402
from securevfl.runtime.ledger import Ledger  # noqa: E402

try:  # absent from checkouts before the secure channel (an A/B against one of them runs plain)
    from securevfl.runtime.secure.link import Links
except ImportError:  # pragma: no cover
    Links = None
try:  # absent from checkouts before CrypTen's framed communicator
    from securevfl.exchange.mpc.crypten.communicator import FramedCommunicator
except ImportError:  # pragma: no cover
    FramedCommunicator = None

BATCH, DIM, OUT, FRAC = 256, 64, 64, 16


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


LR = ops.fixed_scalar(0.003 / BATCH, FRAC)


def _step(rank: int, n_mpc: int, w: list[Any], h: torch.Tensor | None, g: torch.Tensor | None) -> list[Any]:
    """One training step of the interactive layer (as exchange.mpc._MpcRole runs it)."""
    from crypten.mpc.primitives import ArithmeticSharedTensor as AST

    passive = list(range(1, n_mpc))
    trunc = step_plan(BATCH, [DIM] * len(w), OUT, n_mpc, train=True, lr=LR)[-1]
    (material,) = tuple_provider.current().take([trunc])
    hs = [AST(h if rank == p else None, size=(BATCH, DIM), src=p) for p in passive]
    prods = ops.beaver_matmuls(list(zip(hs, w, strict=True)))
    z = prods[0]
    for p in prods[1:]:
        z = z + p
    z.get_plain_text(dst=0)
    ge = AST(g if rank == 0 else None, size=(BATCH, OUT), src=0)
    prods = ops.beaver_matmuls([(ge, ops.transpose(wi)) for wi in w] + [(ops.transpose(x), ge) for x in hs])
    _, _, steps = ops.reveal_and_truncate(prods[: len(w)], passive, prods[len(w) :], material, FRAC, LR)
    return [wi - s for wi, s in zip(w, steps, strict=True)]


def _bench_links(rank: int, world: int) -> Any:
    """Sealed links with fixed per-direction keys (a benchmark has no handshake;
    the sealing work per frame is the run's)."""

    def key(src: int, dst: int, stream: str) -> bytes:
        return hashlib.sha256(f"mpc_comm benchmark {src}->{dst} {stream}".encode()).digest()

    peers = [r for r in range(world) if r != rank]
    return Links(rank, peers, lambda p, s: (key(rank, p, s), key(p, rank, s)), lambda p: f"rank {p}")


def _rank(
    rank: int, world: int, port: int, steps: int, sealed: bool, exchange_max: int | None, out: Any
) -> None:
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    if exchange_max is not None:
        FramedCommunicator.EXCHANGE_MAX = exchange_max
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    n_mpc = world - 1
    links = _bench_links(rank, world) if sealed else None
    ch = Channel(
        rank, {r: f"rank{r}" for r in range(world)}, Ledger(rank), **({"links": links} if sealed else {})
    )
    crypten = start_crypten(ch, world, n_mpc, provider="TTP", on_failure=ch.comm_failure)
    if rank == n_mpc:
        c0, t0 = time.process_time(), time.perf_counter()
        served = serve_dealer(ch, ch.comm_failure)
        stop_crypten()
        out.put(
            {
                "rank": rank,
                "served": served,
                "cpu_s": time.process_time() - c0,
                "wall_s": time.perf_counter() - t0,
            }
        )
        dist.destroy_process_group()
        return
    from crypten.mpc.primitives import ArithmeticSharedTensor as AST

    dims = [DIM] * (n_mpc - 1)
    plan = step_plan(BATCH, dims, OUT, n_mpc, train=True, lr=LR)
    gen = torch.Generator().manual_seed(rank)  # benchmark data, not a secret
    w = [
        AST(torch.randn(DIM, OUT, generator=gen) * 0.1 if rank == 0 else None, size=(DIM, OUT), src=0)
        for _ in dims
    ]
    h = torch.randn(BATCH, DIM, generator=gen)
    g = torch.randn(BATCH, OUT, generator=gen) / BATCH
    c0, t0 = time.process_time(), time.perf_counter()
    tuple_provider.current().prefetch(plan * (steps + 1))
    offline = (time.process_time() - c0, time.perf_counter() - t0)
    w = _step(rank, n_mpc, w, h, g)  # warm-up
    ch.ledger.records.clear()
    cpu, wall = [], []
    for _ in range(steps):
        c0, t0 = time.process_time(), time.perf_counter()
        w = _step(rank, n_mpc, w, h, g)
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - t0)
    sent = sum(r.bytes for r in ch.ledger.records if r.direction == "sent") / steps
    if rank == 0:
        c = crypten.communicator.get()
        c.send_obj("terminate", c.get_ttp_rank(), c.ttp_group)
    stop_crypten()
    out.put(
        {
            "rank": rank,
            "cpu_ms": 1e3 * statistics.median(cpu),
            "wall_ms": 1e3 * statistics.median(wall),
            "offline_cpu_ms": 1e3 * offline[0],
            "sent_kib": sent / 1024,
            "seal_open_cpu_ms": 1e3 * _seal_open_s(ch) / (steps + 1),
        }
    )
    dist.destroy_process_group()


def _seal_open_s(ch: Channel) -> float:
    """CPU seconds this rank spent sealing and opening (0 without links)."""
    if getattr(ch, "links", None) is None:
        return 0.0
    return sum(row["seal_cpu_s"] + row["open_cpu_s"] for row in ch.links.meter.by_phase.values())


def measure(parties: int, steps: int, sealed: bool, exchange_max: int | None = None) -> list[dict[str, Any]]:
    world = parties + 2
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = _free_port()
    procs = [
        ctx.Process(target=_rank, args=(r, world, port, steps, sealed, exchange_max, q)) for r in range(world)
    ]
    for p in procs:
        p.start()
    rows = [q.get(timeout=600) for _ in range(world)]
    for p in procs:
        p.join(timeout=60)
    return sorted(rows, key=lambda r: r["rank"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parties", type=int, default=2, help="passive parties k (k + 1 MPC ranks and a dealer)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--root", help="run another checkout's securevfl (e.g. main) for an A/B")
    ap.add_argument("--sealed", action="store_true", help="frames sealed on per-peer links (secure channel)")
    ap.add_argument(
        "--exchange-max",
        type=int,
        help="MPC parties up to which an all-reduce is one all-to-all round (FramedCommunicator's)",
    )
    ap.add_argument("--json", help="also write the rows here")
    args = ap.parse_args()
    if args.root:
        os.environ["MPC_COMM_ROOT"] = str(Path(args.root).resolve())
    if args.sealed and Links is None:
        ap.error("this checkout has no sealed links")
    ops_ = step_ops(BATCH, [DIM] * args.parties, OUT, args.parties + 1)
    rows = measure(args.parties, args.steps, args.sealed, args.exchange_max)
    how = "sealed frames" if args.sealed else "plain frames (or the checkout's own communicator)"
    if args.exchange_max is not None:
        how += f", all-to-all openings up to {args.exchange_max} parties"
    print(f"checkout {os.environ.get('MPC_COMM_ROOT') or ROOT}, {how}; load {os.getloadavg()[0]:.2f}")
    print(f"k={args.parties}: {ops_.rounds} rounds/step, {ops_.matmuls} Beaver products; per MPC rank:")
    for r in rows:
        if "cpu_ms" in r:
            print(
                f"  rank {r['rank']}: CPU {r['cpu_ms']:.1f} ms/step, wall {r['wall_ms']:.1f} ms/step, "
                f"sent {r['sent_kib']:.0f} KiB/step, seal+open CPU {r['seal_open_cpu_ms']:.1f} ms/step, "
                f"offline bundle CPU {r['offline_cpu_ms']:.0f} ms"
            )
        else:
            print(f"  dealer (rank {r['rank']}): CPU {r['cpu_s']:.2f} s over its {r['wall_s']:.1f} s loop")
    if args.json:
        Path(args.json).write_text(json.dumps({"parties": args.parties, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
