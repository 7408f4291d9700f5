"""Correlated randomness in bulk: an offline phase for CrypTen's trusted dealer.

CrypTen's ``TTP`` provider asks the dealer for every Beaver triple and every
truncation pair at the moment an operation needs it: rank 0 sends a request,
waits for a reply carrying the size, then for a broadcast of its share of c.
One training step of the interactive layer made about 16 such requests, each
three sequential messages on the critical path.

:class:`PooledTTP` keeps CrypTen's TTP scheme exactly (the dealer shares a PRG
seed with every MPC party; party i draws its shares of a, b (and of c for
i != 0) from it; the dealer draws every party's shares, computes c = a op b and
sends rank 0 only c_0 = c - sum_{i != 0} c_i) but serves the requests from a
pool filled ahead of time: :meth:`PooledTTP.prefetch` takes a *plan* (the list
of triples and truncation pairs the next steps will consume), rank 0 sends it
to the dealer as one validated ``bundle`` request, every party draws its shares
for the whole plan in plan order (the dealer draws in the same order, so the
PRG streams stay aligned), and rank 0 receives all its c_0 values in a single
broadcast. Requests the pool cannot serve fall through to CrypTen's on-demand
TTP path, which draws from the same streams in the same program order.

What anyone learns is unchanged: each party still holds only PRG-derived
shares, the dealer still never sees a value of the computation, and rank 0
still receives only c_0, uniformly random on its own.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from securevfl.errors import ProtocolError
from securevfl.exchange.crypten_api import ArithmeticSharedTensor as AST
from securevfl.exchange.crypten_api import TTPClient, comm, generate_random_ring_element, mpc

MAX_BUNDLE_ITEMS = 4096
MAX_PAIR = 1024  # the highest MPC rank a pair triple may name (the dealer checks its own world)
MAX_BUNDLE_ELEMENTS = 1 << 26  # 512 MiB of ring elements: far above any plan securevfl makes


@dataclass(frozen=True)
class Triple:
    """A Beaver triple for ``op`` (``mul`` or ``matmul``) of shapes a: size0, b: size1.

    ``pair`` 0 (CrypTen's triples): shared among all MPC parties. ``pair`` i > 0: a
    ``matmul`` triple shared between rank 0 and rank i alone (the ``mpc`` backend's
    pairwise layout, :mod:`securevfl.exchange.mpc.pairwise`): only those two draw
    their shares, and the dealer computes c from their two streams."""

    size0: tuple[int, ...]
    size1: tuple[int, ...]
    op: str = "matmul"
    pair: int = 0

    @property
    def out(self) -> tuple[int, ...]:
        if self.op == "matmul":
            a, b = torch.empty(self.size0, device="meta"), torch.empty(self.size1, device="meta")
            return tuple(a.matmul(b).shape)
        return tuple(torch.broadcast_shapes(self.size0, self.size1))

    def holders(self, n_mpc: int) -> tuple[int, ...]:
        """The MPC ranks that hold a share of this triple."""
        return (0, self.pair) if self.pair else tuple(range(n_mpc))

    def to_wire(self) -> list[Any]:
        if self.pair:
            return ["pair", self.pair, torch.Size(self.size0), torch.Size(self.size1)]
        return ["additive", torch.Size(self.size0), torch.Size(self.size1), self.op]


@dataclass(frozen=True)
class Wraps:
    """A truncation pair of CrypTen's wraps protocol: [r] and [theta_r] of one shape."""

    size: tuple[int, ...]

    @property
    def out(self) -> tuple[int, ...]:
        return self.size

    def to_wire(self) -> list[Any]:
        return ["wraps", torch.Size(self.size)]


Item = Triple | Wraps


def plan_elements(plan: Sequence[Item]) -> int:
    """Ring elements rank 0 receives for ``plan`` (one c_0 or theta_0 per item)."""
    return sum(math.prod(it.out) for it in plan)


def pooled_bytes(plan: Sequence[Item]) -> int:
    """Bytes one party holds for ``plan`` once pooled (a, b, c; r, theta)."""
    n = 0
    for it in plan:
        sizes = [it.size0, it.size1, it.out] if isinstance(it, Triple) else [it.size, it.size]
        n += sum(math.prod(s) for s in sizes)
    return 8 * n


def parse_bundle(args: Any, max_elements: int = MAX_BUNDLE_ELEMENTS) -> list[Item]:
    """Validate a bundle request's item list (from rank 0, at the dealer): only
    additive triples for ``mul``/``matmul`` and wraps pairs, bounded sizes and
    count. Raises ValueError, which the dealer turns into a ProtocolError."""
    if not isinstance(args, list) or not 0 < len(args) <= MAX_BUNDLE_ITEMS:
        raise ValueError("bundle size")
    items: list[Item] = []
    for a in args:
        if not isinstance(a, list) or not a:
            raise ValueError("bundle item")
        sizes = [s for s in a[1:] if isinstance(s, torch.Size)]
        if any(len(s) > 8 or any(x < 0 for x in s) for s in sizes):
            raise ValueError("bundle item size")
        if a[0] == "additive" and len(a) == 4 and len(sizes) == 2 and a[3] in ("mul", "matmul"):
            item: Item = Triple(tuple(a[1]), tuple(a[2]), a[3])
            try:
                _ = item.out
            except RuntimeError:
                raise ValueError("bundle item shapes") from None
        elif a[0] == "pair" and len(a) == 4 and len(sizes) == 2 and type(a[1]) is int:
            if not 0 < a[1] <= MAX_PAIR:
                raise ValueError("bundle pair rank")
            item = Triple(tuple(a[2]), tuple(a[3]), "matmul", a[1])
            try:
                _ = item.out
            except RuntimeError:
                raise ValueError("bundle item shapes") from None
        elif a[0] == "wraps" and len(a) == 2 and len(sizes) == 1:
            item = Wraps(tuple(a[1]))
        else:
            raise ValueError("bundle item kind")
        items.append(item)
    if plan_elements(items) > max_elements:
        raise ValueError("bundle too large")
    return items


# -- the dealer's side -----------------------------------------------------------------


def dealer_bundle(server: Any, plan: Sequence[Item]) -> torch.Tensor:
    """Rank 0's shares (c_0 of each triple, theta_0 of each wraps pair) for ``plan``,
    flattened into one ring tensor. ``server`` is a CrypTen ``TTPServer`` whose
    per-party generators are aligned with the parties': its ``additive`` and
    ``wraps`` draw, per party, exactly what the party draws (see module doc)."""
    out = []
    for it in plan:
        if isinstance(it, Triple) and it.pair:
            out.append(pair_c0(server.generators, it).reshape(-1))
        elif isinstance(it, Triple):
            out.append(server.additive(torch.Size(it.size0), torch.Size(it.size1), it.op).reshape(-1))
        else:
            out.append(server.wraps(torch.Size(it.size)).reshape(-1))
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.long)


def pair_c0(generators: Sequence[torch.Generator], it: Triple) -> torch.Tensor:
    """Rank 0's share c_0 = a b - c_i of a pair triple between ranks 0 and i = it.pair:
    a = a_0 + a_i and b = b_0 + b_i drawn from those two parties' streams in the
    order they draw them (a, b; then c_i at rank i), as CrypTen's ``TTPServer.additive``
    does for all parties. A pair naming a rank the dealer has no stream for is a
    protocol violation by rank 0."""
    if not 0 < it.pair < len(generators):
        raise ProtocolError(f"rank 0 asked the dealer for a triple with rank {it.pair}, not an MPC party")
    g0, gi = generators[0], generators[it.pair]
    s0, s1 = torch.Size(it.size0), torch.Size(it.size1)
    a = generate_random_ring_element(s0, generator=g0) + generate_random_ring_element(s0, generator=gi)
    b = generate_random_ring_element(s1, generator=g0) + generate_random_ring_element(s1, generator=gi)
    c = a.matmul(b)
    return c - generate_random_ring_element(c.size(), generator=gi)


# -- the parties' side -----------------------------------------------------------------


class PooledTTP:
    """CrypTen tuple provider for the MPC parties: CrypTen's ``TrustedThirdParty``
    with an offline phase. Installed in CrypTen's provider table under ``TTP``
    (:func:`install`), so every CrypTen operation that asks the default provider
    for a triple or a truncation pair is served from the pool when it can be."""

    NAME = "TTP"

    def __init__(self, fallback: Any):
        self.fallback = fallback  # CrypTen's own TrustedThirdParty
        self.pool: dict[Item, deque[tuple[Any, ...] | None]] = {}
        self.offline_s = 0.0  # wall time spent in prefetch (this rank)
        self.bundles = 0
        self.served = 0
        self.on_demand = 0

    # CrypTen's provider interface -----------------------------------------------------
    def generate_additive_triple(
        self, size0: Any, size1: Any, op: str, device: Any = None, *args: Any, **kw: Any
    ) -> Any:
        key = Triple(tuple(size0), tuple(size1), op)
        if not args and not kw and self.pool.get(key):
            self.served += 1
            return self.pool[key].popleft()
        self.on_demand += 1
        return self.fallback.generate_additive_triple(size0, size1, op, device, *args, **kw)

    def wrap_rng(self, size: Any, device: Any = None):
        key = Wraps(tuple(size))
        if self.pool.get(key):
            self.served += 1
            return self.pool[key].popleft()
        self.on_demand += 1
        return self.fallback.wrap_rng(size, device=device)

    def square(self, size: Any, device: Any = None):
        return self.fallback.square(size, device=device)

    def generate_binary_triple(self, size0: Any, size1: Any, device: Any = None):
        return self.fallback.generate_binary_triple(size0, size1, device=device)

    def B2A_rng(self, size: Any, device: Any = None):
        return self.fallback.B2A_rng(size, device=device)

    # the offline phase ----------------------------------------------------------------
    def stock(self, item: Item) -> int:
        return len(self.pool.get(item, ()))

    def take(self, plan: Sequence[Item]) -> list[tuple[Any, ...] | None]:
        """Pop one entry per item of ``plan``, in order: every party pops every item
        (None for a pair triple it does not hold), so all parties' stocks stay equal
        and :func:`securevfl.exchange.mpc.plan.top_up` decides the same everywhere."""
        out = []
        for it in plan:
            q = self.pool.get(it)
            if not q:
                raise ProtocolError(f"the offline pool holds no {it} (the plan and the pool disagree)")
            out.append(q.popleft())
        self.served += len(plan)
        return out

    def prefetch(self, plan: Sequence[Item]) -> None:
        """Collective over the MPC parties: fill the pool with ``plan``'s tuples.
        Every party must call it at the same point with the same plan."""
        if not plan:
            return
        t0 = time.perf_counter()
        c = comm.get()
        rank = c.get_rank()
        gen = TTPClient.get().get_generator(device="cpu")
        theirs = None
        if rank == 0:
            c.send_obj(
                {"function": "bundle", "device": None, "args": [[it.to_wire() for it in plan]], "kwargs": {}},
                c.get_ttp_rank(),
                c.ttp_group,
            )
            theirs = torch.empty(plan_elements(plan), dtype=torch.long)
            c.broadcast(theirs, c.get_ttp_rank(), c.ttp_comm_group)
        at = 0
        for it in plan:
            n = math.prod(it.out)
            if isinstance(it, Triple) and it.pair and rank not in (0, it.pair):
                entry: tuple[Any, ...] | None = None  # another pair's: counted, not held
            elif isinstance(it, Triple) and it.pair:
                a = generate_random_ring_element(torch.Size(it.size0), generator=gen)
                b = generate_random_ring_element(torch.Size(it.size1), generator=gen)
                if rank == 0:
                    assert theirs is not None
                    cc = theirs[at : at + n].reshape(it.out)
                else:
                    cc = generate_random_ring_element(torch.Size(it.out), generator=gen)
                entry = (a, b, cc)  # raw ring shares: the pairwise layout does its own arithmetic
            elif isinstance(it, Triple):
                a = generate_random_ring_element(torch.Size(it.size0), generator=gen)
                b = generate_random_ring_element(torch.Size(it.size1), generator=gen)
                if rank == 0:
                    assert theirs is not None
                    cc = theirs[at : at + n].reshape(it.out)
                else:
                    cc = generate_random_ring_element(torch.Size(it.out), generator=gen)
                entry = (
                    AST.from_shares(a, precision=0),
                    AST.from_shares(b, precision=0),
                    AST.from_shares(cc, precision=0),
                )
            else:
                r = generate_random_ring_element(torch.Size(it.size), generator=gen)
                if rank == 0:
                    assert theirs is not None
                    th = theirs[at : at + n].reshape(it.out)
                else:
                    th = generate_random_ring_element(torch.Size(it.size), generator=gen)
                entry = (AST.from_shares(r, precision=0), AST.from_shares(th, precision=0))
            at += n
            self.pool.setdefault(it, deque()).append(entry)
        self.bundles += 1
        self.offline_s += time.perf_counter() - t0


def install() -> PooledTTP:
    """Register a fresh :class:`PooledTTP` as CrypTen's ``TTP`` provider (on an MPC
    party, after the TTP client is initialised); :func:`uninstall` restores CrypTen's."""
    table = vars(mpc)["__SUPPORTED_PROVIDERS"]
    current = table["TTP"]
    fallback = current.fallback if isinstance(current, PooledTTP) else current
    pooled = PooledTTP(fallback)
    table["TTP"] = pooled
    return pooled


def uninstall() -> None:
    table = vars(mpc)["__SUPPORTED_PROVIDERS"]
    if isinstance(table["TTP"], PooledTTP):
        table["TTP"] = table["TTP"].fallback


def current() -> PooledTTP | None:
    """The installed pooled provider, if any."""
    p = vars(mpc)["__SUPPORTED_PROVIDERS"]["TTP"]
    return p if isinstance(p, PooledTTP) else None
