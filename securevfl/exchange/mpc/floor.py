"""The ``mpc`` backend's op-count floor (docs/crypto-performance.md §7).

Per training step: the Beaver products, openings, communication rounds,
truncations and dealer requests of :func:`.plan.step_ops`; unit costs measured
here, on this machine, now: one round trip between two processes over
torch.distributed's gloo on loopback, and the local arithmetic of each Beaver
product (c + eps b + a delta + eps delta in the ring, computed as rank 0 computes
it: :func:`.ringmatmul.beaver_terms` on the ring kernel this machine uses). The
floor of the online step is rounds x round trip + one party's arithmetic; the
offline phase (the dealer drawing every party's shares and computing c = a b on
the same kernel, each party drawing its own) is measured per step and printed
beside it.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
import statistics
import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from securevfl.csprng import SecretStream
from securevfl.exchange.mpc.crypten.dealer import SecretDealer, dealer_bundle
from securevfl.exchange.mpc.crypten.items import Init, PairStep, Triple, Trunc, Wraps
from securevfl.exchange.mpc.plan import pair_ops, pair_plan, step_ops, step_plan
from securevfl.exchange.mpc.ring import product_share
from securevfl.exchange.mpc.ringmatmul import kernel, ring_matmul
from securevfl.runtime.safepath import safe_children

PING_ROUNDS = 200


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ping(rank: int, port: int, rounds: int, out: Any) -> None:
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    t = torch.zeros(64, dtype=torch.long)
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        if rank == 0:
            dist.send(t, 1)
            dist.recv(t, 1)
        else:
            dist.recv(t, 0)
            dist.send(t, 0)
        times.append(time.perf_counter() - t0)
    if rank == 0:
        out.put(statistics.median(times))
    dist.destroy_process_group()


def round_trip_s(rounds: int = PING_ROUNDS) -> float:
    """Median round trip of a small tensor between two processes (gloo, loopback)."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_ping, args=(r, port, rounds, q)) for r in (0, 1)]
    with safe_children():  # the ping processes start without the working directory on their path
        for p in procs:
            p.start()
    rtt = q.get(timeout=120)
    for p in procs:
        p.join(timeout=60)
    return float(rtt)


LR = (1, 0)  # a plan's sizes and costs do not depend on the learning rate


def _rank0_products(it: Any, g: SecretStream) -> list[tuple[Any, ...]]:
    """Rank 0's :func:`~securevfl.exchange.mpc.ring.product_share` arguments for one
    item's products, on random operands of its shapes: a Beaver triple's one
    product, a PairStep's three (forward h' W; backward dL/dz W^T and h'^T dL/dz),
    with the shares rank 0 holds (none of u, all of g)."""
    if isinstance(it, Triple):
        return [tuple(g.ring(s) for s in (it.size0, it.size1, it.size0, it.size1, it.out))]
    if not isinstance(it, PairStep):
        return []
    b, d, o = it.batch, it.dim, it.width
    eps, delta, phi, v, gm = g.ring((b, d)), g.ring((d, o)), g.ring((b, o)), g.ring((d, o)), g.ring((b, o))
    return [
        (eps, delta, None, v, g.ring((b, o))),
        (phi, delta.t(), gm, v.t(), g.ring((b, d))),
        (eps.t(), phi, None, gm, g.ring((d, o))),
    ]


def beaver_arithmetic_s(plan: Sequence[Any], repeats: int = 5) -> float:
    """One party's local ring arithmetic for the plan's Beaver products (rank 0's
    share: it also adds eps delta; in a PairStep it skips the products with its
    zero shares of the one-sided masks), the best of ``repeats``: CPU time on one
    core."""
    kernel()  # the kernel choice is measured once per process, not in the timing
    g = SecretStream.fresh()
    ops = [args for it in plan for args in _rank0_products(it, g)]
    best = float("inf")
    for _ in range(repeats):
        t0 = time.process_time()
        for eps, delta, a, b, c in ops:
            _ = product_share(eps, delta, a, b, c, True)
        best = min(best, time.process_time() - t0)
    return best


def _party_draws(it: Any) -> list[tuple[int, ...]]:
    """The shapes a party other than rank 0 draws for one item (rank 0 draws fewer:
    it receives the correlated values)."""
    if isinstance(it, Triple):
        return [it.size0, it.size1, it.out]
    if isinstance(it, PairStep):
        return [*it.draws(False), *it.products]
    if isinstance(it, Wraps):
        return [it.size, it.size]
    if isinstance(it, Trunc):
        return [it.size, (4, *it.size)]
    assert isinstance(it, Init)
    return [it.size]


def offline_s(plan: Sequence[Any], n_mpc: int) -> float:
    """CPU time of one step's offline phase: the dealer's bundle plus one party's
    draws of its own shares (a, b, c per triple; r and its four truncation values
    per truncation), from secret streams as the product draws them, on the ring
    kernel the dealer uses."""
    server = SecretDealer([SecretStream.fresh() for _ in range(n_mpc)], matmul=ring_matmul)  # as it serves
    g = SecretStream.fresh()
    kernel()
    t0 = time.process_time()
    dealer_bundle(server, plan)
    for it in plan:
        for s in _party_draws(it):
            g.ring(s)
    return time.process_time() - t0


def report(
    batch: int, dims: Sequence[int], out: int, offline_steps: int = 16, layout: str = "pairwise"
) -> dict[str, Any]:
    """Counts, unit costs and floors for one training step at this shape. In the
    pairwise layout A's arithmetic (its share of every pair's products) is the
    critical path's; in the joint one every party computes a share of all products."""
    torch.set_num_threads(1)
    n_mpc = len(dims) + 1
    if layout == "pairwise":
        plan = pair_plan(batch, dims, out, range(1, n_mpc), train=True, lr=LR)
        ops = pair_ops(batch, dims, out, offline_steps=offline_steps)
    else:
        plan = step_plan(batch, dims, out, n_mpc, train=True, lr=LR)
        ops = step_ops(batch, dims, out, n_mpc, offline_steps=offline_steps)
    rtt = round_trip_s()
    arith = beaver_arithmetic_s(plan)
    return {
        "layout": layout,
        "counts": ops.as_dict(),
        "truncation_items": sum(isinstance(it, Trunc) for it in plan),
        "ring_kernel": kernel(),
        "round_trip_s": rtt,
        "arithmetic_s": arith,
        "floor_s": ops.rounds * rtt + arith,
        "offline_s": offline_s(plan, n_mpc),
    }
