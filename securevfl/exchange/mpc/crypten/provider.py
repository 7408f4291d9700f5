"""CrypTen's trusted-dealer tuple provider on secret streams, with an offline phase.

CrypTen's ``TTP`` provider (``TrustedThirdParty``) lets every MPC party draw its
shares of each tuple from a generator it shares with the dealer, and the dealer
draws every party's shares from the same generators, computes the tuple's
correlated value (c = a b of a Beaver triple, say) and sends rank 0 alone its
share of it (c_0 = c - sum_{i != 0} c_i). :class:`SecretTTP` is that provider,
written as CrypTen writes its providers (a ``TupleProvider`` with
``generate_additive_triple``, ``square``, ``generate_binary_triple``, ``wrap_rng``
and ``B2A_rng``), with two changes:

* **its streams are secret streams** (AES-256-CTR under a 256-bit key the dealer
  sent this party alone, :mod:`securevfl.exchange.mpc.crypten.rng`), never
  ``torch.Generator``; the dealer's side is :class:`securevfl.exchange.mpc.crypten.dealer.SecretDealer`;
* **an offline phase**: :meth:`SecretTTP.prefetch` takes a *plan* (the items the
  next steps will consume), rank 0 sends it to the dealer as one validated
  ``bundle`` request, every party draws its shares for the whole plan in plan
  order (the dealer draws in the same order, so the streams stay aligned) and
  rank 0 receives all its shares in one broadcast. A request the pool cannot serve
  goes to the dealer on demand, CrypTen's way (rank 0 asks, the dealer answers
  with the size and a broadcast), drawing from the same streams in program order.

The items a plan holds are :mod:`.items`.

What anyone learns: each party holds only stream-drawn shares and, at rank 0,
shares the dealer computed, each uniformly random on its own (it is the
correlated value minus the other holders' uniform shares); the dealer sees no
value of the computation (it draws W^0 itself, a value independent of the data,
within the trusted-dealer model: semi-honest, colluding with no party).
CrypTen has no function to register a provider: :func:`install` puts a
:class:`SecretTTP` in ``crypten.mpc``'s provider table under ``TTP`` for the run
through :func:`securevfl.exchange.mpc.crypten.patches.use_provider`, and the function
it returns puts CrypTen's back.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import torch

from securevfl.csprng import SecretStream
from securevfl.errors import ProtocolError
from securevfl.exchange.mpc.crypten.api import ArithmeticSharedTensor as AST
from securevfl.exchange.mpc.crypten.api import BinarySharedTensor as BST
from securevfl.exchange.mpc.crypten.api import TupleProvider, comm
from securevfl.exchange.mpc.crypten.items import (
    Item,
    PairStep,
    StepShares,
    Triple,
    Trunc,
    TruncShares,
    Wraps,
    plan_elements,
)
from securevfl.exchange.mpc.crypten.patches import provider as crypten_provider
from securevfl.exchange.mpc.crypten.patches import use_provider


def _cpu(device: Any) -> bool:
    return device is None or torch.device(device).type == "cpu"


class SecretTTP(TupleProvider):
    """CrypTen's trusted-dealer tuple provider for the MPC parties, drawing from the
    stream this party shares with the dealer (module docstring). Installed in
    CrypTen's provider table under ``TTP`` (:func:`install`), so every CrypTen
    operation that asks the default provider for a tuple is served here: from the
    pool when it holds the tuple (CPU), else on demand."""

    NAME = "TTP"

    def __init__(self, stream: SecretStream):
        super().__init__()
        self.stream = stream
        self.pool: dict[Item, deque[Any]] = {}
        self.offline_s = 0.0  # wall time spent in prefetch (this rank)
        self.bundles = 0
        self.served = 0
        self.on_demand = 0

    # -- drawing -----------------------------------------------------------------------
    @property
    def rank(self) -> int:
        return int(comm.get().get_rank())

    def _ring(self, size: Any) -> torch.Tensor:
        return self.stream.ring(tuple(size))

    def _request(self, fn: str, device: Any, *args: Any) -> torch.Tensor:
        """Rank 0's share of one tuple, on demand (CrypTen's ``ttp_request``): the
        request, the dealer's reply with its size, then its broadcast."""
        c = comm.get()
        ttp = c.get_ttp_rank()
        c.send_obj(
            {"function": fn, "device": None if device is None else str(device), "args": args, "kwargs": {}},
            ttp,
            c.ttp_group,
        )
        size = c.recv_obj(ttp, c.ttp_group)
        result = torch.empty(size, dtype=torch.long)
        c.broadcast(result, ttp, c.ttp_comm_group)
        self.on_demand += 1
        return result

    def _correlated(self, fn: str, size: Any, device: Any, *args: Any) -> torch.Tensor:
        """This party's share of a tuple's correlated value: rank 0 asks the dealer,
        the others draw theirs."""
        return self._request(fn, device, *args) if self.rank == 0 else self._ring(size)

    # -- CrypTen's provider interface --------------------------------------------------
    def generate_additive_triple(
        self, size0: Any, size1: Any, op: str, device: Any = None, *args: Any, **kwargs: Any
    ) -> Any:
        """Shares of a, b and c = op(a, b) (``mul`` or ``matmul``)."""
        if args or kwargs or op not in ("mul", "matmul"):
            raise ProtocolError(f"securevfl's dealer serves mul and matmul triples only, not {op}")
        key = Triple(tuple(size0), tuple(size1), op)
        if _cpu(device) and self.pool.get(key):
            self.served += 1
            return self.pool[key].popleft()
        a, b = self._ring(size0), self._ring(size1)
        c = self._correlated("additive", key.out, device, torch.Size(size0), torch.Size(size1), op)
        return tuple(AST.from_shares(t, precision=0, device=device) for t in (a, b, c))

    def square(self, size: Any, device: Any = None) -> Any:
        """Shares of r and r^2."""
        r = self._ring(size)
        r2 = self._correlated("square", size, device, torch.Size(size))
        return tuple(AST.from_shares(t, precision=0, device=device) for t in (r, r2))

    def generate_binary_triple(self, size0: Any, size1: Any, device: Any = None) -> Any:
        """XOR shares of a, b and c = a & b."""
        a, b = self._ring(size0), self._ring(size1)
        out = torch.broadcast_shapes(tuple(size0), tuple(size1))
        c = self._correlated("binary", out, device, torch.Size(size0), torch.Size(size1))
        return tuple(BST.from_shares(t, device=device) for t in (a, b, c))

    def wrap_rng(self, size: Any, device: Any = None) -> Any:
        """Shares of r and of theta_r, the number of times r's shares wrap."""
        key = Wraps(tuple(size))
        if _cpu(device) and self.pool.get(key):
            self.served += 1
            return self.pool[key].popleft()
        r = self._ring(size)
        theta = self._correlated("wraps", size, device, torch.Size(size))
        return tuple(AST.from_shares(t, precision=0, device=device) for t in (r, theta))

    def B2A_rng(self, size: Any, device: Any = None) -> Any:
        """A random bit as arithmetic shares (rA) and XOR shares (rB)."""
        rb = self.stream.kbits(tuple(size), 1)
        ra = self._correlated("B2A", size, device, torch.Size(size))
        return AST.from_shares(ra, precision=0, device=device), BST.from_shares(rb, device=device)

    # -- the offline phase -------------------------------------------------------------
    def stock(self, item: Item) -> int:
        return len(self.pool.get(item, ()))

    def take(self, plan: Sequence[Item]) -> list[Any]:
        """Pop one entry per item of ``plan``, in order: every party pops every item
        (None for a pair item it does not hold), so all parties' stocks stay equal
        and :func:`securevfl.exchange.mpc.plan.top_up` decides the same everywhere."""
        out = []
        for it in plan:
            q = self.pool.get(it)
            if not q:
                raise ProtocolError(f"the offline pool holds no {it} (the plan and the pool disagree)")
            out.append(q.popleft())
        self.served += len(plan)
        return out

    def _entry(self, it: Item, rank: int, theirs: torch.Tensor | None) -> Any:
        """This party's draws for one item, in the order the dealer draws them
        (:class:`securevfl.exchange.mpc.crypten.dealer.SecretDealer`), and rank 0's
        received shares (``theirs``) in place of the correlated draws."""

        def correlated(shape: tuple[int, ...]) -> torch.Tensor:
            if rank == 0:
                assert theirs is not None
                return theirs.reshape(shape)
            return self._ring(shape)

        if isinstance(it, Triple):
            a, b = self._ring(it.size0), self._ring(it.size1)
            cc = correlated(it.out)
            if it.pair:
                return a, b, cc  # raw ring shares: the pairwise layout does its own arithmetic
            return tuple(AST.from_shares(t, precision=0) for t in (a, b, cc))
        if isinstance(it, PairStep):
            if rank == 0:
                assert theirs is not None
                v, g = (self._ring(s) for s in it.draws(True))
                sizes = [math.prod(s) for s in it.products]
                c, e, f = (t.reshape(s) for t, s in zip(theirs.split(sizes), it.products, strict=True))
                return StepShares(None, v, g, c, e, f)
            u, v = (self._ring(s) for s in it.draws(False))
            c, e, f = (self._ring(s) for s in it.products)
            return StepShares(u, v, None, c, e, f)
        if isinstance(it, Wraps):
            r = self._ring(it.size)
            return AST.from_shares(r, precision=0), AST.from_shares(correlated(it.size), precision=0)
        if isinstance(it, Trunc):
            r = self._ring(it.size)
            q0, q1, s0, s1 = correlated((4, *it.size)).unbind(0)
            return TruncShares(r, q0, q1, s0, s1)
        return correlated(it.size)  # Init: this party's ring share of W^0

    def prefetch(self, plan: Sequence[Item]) -> None:
        """Collective over the MPC parties: fill the pool with ``plan``'s tuples.
        Every party must call it at the same point with the same plan."""
        if not plan:
            return
        t0 = time.perf_counter()
        c = comm.get()
        rank = c.get_rank()
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
        n_mpc = c.get_world_size()
        for it in plan:
            n = it.received
            if rank in it.holders(n_mpc):
                part = None if theirs is None else theirs[at : at + n]
                entry = self._entry(it, rank, part)
            else:
                entry = None  # another pair's: counted, not held
            at += n
            self.pool.setdefault(it, deque()).append(entry)
        self.bundles += 1
        self.offline_s += time.perf_counter() - t0

    def fetch(self, plan: Sequence[Item]) -> list[Any]:
        """:meth:`prefetch` then :meth:`take` of the same plan (one bundle)."""
        self.prefetch(plan)
        return self.take(plan)


def install(stream: SecretStream) -> tuple[SecretTTP, Callable[[], None]]:
    """Serve a fresh :class:`SecretTTP` drawing from ``stream`` (the one this party
    shares with the dealer) as CrypTen's ``TTP`` provider; returns it and the
    function that puts CrypTen's back."""
    ttp = SecretTTP(stream)
    return ttp, use_provider("TTP", ttp)


def current() -> SecretTTP | None:
    """The installed provider, if any."""
    p = crypten_provider("TTP")
    return p if isinstance(p, SecretTTP) else None
