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
  sent this party alone, :mod:`securevfl.exchange.crypten_rng`), never
  ``torch.Generator``; the dealer's side is :class:`securevfl.exchange.crypten_dealer.SecretDealer`;
* **an offline phase**: :meth:`SecretTTP.prefetch` takes a *plan* (the items the
  next steps will consume), rank 0 sends it to the dealer as one validated
  ``bundle`` request, every party draws its shares for the whole plan in plan
  order (the dealer draws in the same order, so the streams stay aligned) and
  rank 0 receives all its shares in one broadcast. A request the pool cannot serve
  goes to the dealer on demand, CrypTen's way (rank 0 asks, the dealer answers
  with the size and a broadcast), drawing from the same streams in program order.

Items a plan may hold besides CrypTen's Beaver triples and wraps pairs (the
``mpc`` backend's own, :mod:`securevfl.exchange.mpc`): *pair* triples shared by
rank 0 and one other rank alone (the pairwise layout's evaluation products),
:class:`PairStep`, the correlated tuples of one training step of such a pair (three
products from three masks, each opening reused), :class:`Trunc` material for
an exact truncation (:mod:`securevfl.exchange.truncation`) and
:class:`Init`, a weight's initial value W^0 ~ N(0, 1/(3 d)) drawn by the dealer
and given to its holders as uniformly random shares.

What anyone learns: each party holds only stream-drawn shares and, at rank 0,
shares the dealer computed, each uniformly random on its own (it is the
correlated value minus the other holders' uniform shares); the dealer sees no
value of the computation (it draws W^0 itself, a value independent of the data,
within the trusted-dealer model: semi-honest, colluding with no party).
CrypTen has no function to register a provider: :func:`install` puts a
:class:`SecretTTP` in ``crypten.mpc``'s provider table under ``TTP`` for the run
through :func:`securevfl.exchange.crypten_patches.use_provider`, and the function
it returns puts CrypTen's back.
"""

from __future__ import annotations

import functools
import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from securevfl.csprng import SecretStream
from securevfl.errors import ProtocolError
from securevfl.exchange.crypten_api import ArithmeticSharedTensor as AST
from securevfl.exchange.crypten_api import BinarySharedTensor as BST
from securevfl.exchange.crypten_api import TupleProvider, comm
from securevfl.exchange.crypten_patches import provider as crypten_provider
from securevfl.exchange.crypten_patches import use_provider

RingProduct = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # an exact product in Z_2^64

MAX_BUNDLE_ITEMS = 4096
MAX_PAIR = 1024  # the highest MPC rank a pair item may name (the dealer checks its own world)
MAX_BUNDLE_ELEMENTS = 1 << 26  # 512 MiB of ring elements: far above any plan securevfl makes
MAX_SCALE = 1 << 31  # |scale| of a truncation's second result (truncation.mul_shift's exact range)


def _broadcast(s0: tuple[int, ...], s1: tuple[int, ...]) -> tuple[int, ...]:
    n = max(len(s0), len(s1))
    a, b = (1,) * (n - len(s0)) + s0, (1,) * (n - len(s1)) + s1
    if any(x != y and 1 not in (x, y) for x, y in zip(a, b, strict=True)):
        raise ValueError(f"shapes {s0} and {s1} do not broadcast")
    return tuple(y if x == 1 else x for x, y in zip(a, b, strict=True))


@functools.lru_cache(maxsize=1024)
def product_shape(size0: tuple[int, ...], size1: tuple[int, ...], op: str) -> tuple[int, ...]:
    """The shape of ``op(a, b)`` for a of ``size0`` and b of ``size1`` with torch's
    rules (``mul``: broadcasting; ``matmul``: torch.matmul's, 1-d operands and
    batch broadcasting included), ValueError where torch would refuse. Shape
    arithmetic only: every party and the dealer ask it for every item of every
    plan, and a product of meta tensors costs 50 us of Python each time."""
    if op != "matmul":
        return _broadcast(size0, size1)
    if not size0 or not size1:
        raise ValueError("matmul of a 0-d operand")
    x = (1, *size0) if len(size0) == 1 else size0
    y = (*size1, 1) if len(size1) == 1 else size1
    if x[-1] != y[-2]:
        raise ValueError(f"matmul of {size0} and {size1}: inner dimensions differ")
    out = (*_broadcast(x[:-2], y[:-2]), x[-2], y[-1])
    if len(size1) == 1:
        out = out[:-1]
    if len(size0) == 1:
        out = out[:-2] + out[-1:] if len(size1) > 1 else out[:-1]
    return out


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
        """The shape of c (ValueError if a and b do not multiply)."""
        return product_shape(self.size0, self.size1, self.op)

    @property
    def received(self) -> int:
        """Ring elements rank 0 receives for this item (c_0)."""
        return math.prod(self.out)

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

    @property
    def received(self) -> int:
        return math.prod(self.size)

    def holders(self, n_mpc: int) -> tuple[int, ...]:
        return tuple(range(n_mpc))

    def to_wire(self) -> list[Any]:
        return ["wraps", torch.Size(self.size)]


class TruncShares(NamedTuple):
    """One party's material for an exact truncation: its share of the mask r and of
    Q_0, Q_1, S_0, S_1 (:func:`securevfl.exchange.truncation.material`)."""

    r: torch.Tensor
    q0: torch.Tensor
    q1: torch.Tensor
    s0: torch.Tensor
    s1: torch.Tensor

    @property
    def material(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.q0, self.q1, self.s0, self.s1


@dataclass(frozen=True)
class Trunc:
    """Material for one exact truncation of ``size`` elements by 2^frac, and of the
    result times ``scale`` by 2^shift (:mod:`securevfl.exchange.truncation`): a mask
    r every holder draws, and four correlated values per element. ``pair`` as
    :class:`Triple`'s."""

    size: tuple[int, ...]
    frac: int
    scale: int
    shift: int
    pair: int = 0

    @property
    def received(self) -> int:
        return 4 * math.prod(self.size)

    def holders(self, n_mpc: int) -> tuple[int, ...]:
        return (0, self.pair) if self.pair else tuple(range(n_mpc))

    def to_wire(self) -> list[Any]:
        return ["trunc", self.pair, torch.Size(self.size), self.frac, self.scale, self.shift]


@dataclass(frozen=True)
class Init:
    """A weight block's initial value, W^0 ~ N(0, 1/(3 d)) for ``size`` = (d, out)
    (the variance of torch's default Linear initialisation), encoded at ``frac``
    fractional bits: drawn by the dealer and shared among the holders (``pair`` as
    :class:`Triple`'s) as uniformly random ring shares."""

    size: tuple[int, ...]
    frac: int
    pair: int = 0

    @property
    def received(self) -> int:
        return math.prod(self.size)

    @property
    def std(self) -> float:
        return (1.0 / (3.0 * self.size[0])) ** 0.5

    def holders(self, n_mpc: int) -> tuple[int, ...]:
        return (0, self.pair) if self.pair else tuple(range(n_mpc))

    def to_wire(self) -> list[Any]:
        return ["init", self.pair, torch.Size(self.size), self.frac]


class StepShares(NamedTuple):
    """One holder's part of a :class:`PairStep`: its share of v and of the products
    c = u v, e = g v^T, f = u^T g, and the one-sided masks it holds whole: u at
    rank i (None at rank 0), g at rank 0 (None at rank i)."""

    u: torch.Tensor | None
    v: torch.Tensor
    g: torch.Tensor | None
    c: torch.Tensor
    e: torch.Tensor
    f: torch.Tensor


@dataclass(frozen=True)
class PairStep:
    """The correlated tuples of one training step of a pair's product h' W
    (h' of ``batch`` x ``dim``, W of ``dim`` x ``width``) between rank 0 (A) and rank
    ``pair`` (P_i) alone: masks u for h', v for W and g for dL/dz, and the three
    products the step needs, c = u v (forward, h' W), e = g v^T (dL/dz W^T) and
    f = u^T g (h'^T dL/dz), additively shared between the two.

    Each value the step multiplies is masked once and its opening serves every
    product it enters (SecureML's matrix triples reused across forward and
    backward: Mohassel and Zhang 2017, section 4.2): h' - u and W - v are opened
    in the forward pass and reused in the backward one, and dL/dz - g is the
    backward pass's only opening.

    Masks are one-sided where the value is: h' is P_i's own, so P_i holds u whole
    (drawn from its stream) and sends h' - u to A alone; dL/dz is A's, so A holds
    g whole and sends dL/dz - g to P_i alone. The receiver of each such opening
    knows nothing of its mask, and the sender learns nothing from it (its own
    value); W is nobody's, so v is shared and W - v opened both ways. A party's
    share of a one-sided mask is then zero, which drops a third of the parties'
    Beaver products and halves those openings' bytes."""

    batch: int
    dim: int
    width: int
    pair: int

    @property
    def masks(self) -> tuple[tuple[int, int], ...]:
        """Shapes of u, v, g."""
        return (self.batch, self.dim), (self.dim, self.width), (self.batch, self.width)

    def draws(self, rank0: bool) -> tuple[tuple[int, int], ...]:
        """The masks a holder draws from its dealer stream, in order: rank 0 its share
        of v, then g whole; rank i u whole, then its share of v."""
        u, v, g = self.masks
        return (v, g) if rank0 else (u, v)

    @property
    def products(self) -> tuple[tuple[int, int], ...]:
        """Shapes of c, e, f."""
        return (self.batch, self.width), (self.batch, self.dim), (self.dim, self.width)

    @property
    def received(self) -> int:
        return sum(math.prod(s) for s in self.products)

    def holders(self, n_mpc: int) -> tuple[int, ...]:
        return (0, self.pair)

    def to_wire(self) -> list[Any]:
        return ["step", self.pair, self.batch, self.dim, self.width]


Item = Triple | Wraps | Trunc | Init | PairStep


def plan_elements(plan: Sequence[Item]) -> int:
    """Ring elements rank 0 receives for ``plan`` (its shares of every correlated value)."""
    return sum(it.received for it in plan)


def pooled_bytes(plan: Sequence[Item]) -> int:
    """Bytes one party holds for ``plan`` once pooled (a, b, c; r, theta; r and the
    four truncation values; a weight share)."""
    n = 0
    for it in plan:
        if isinstance(it, Triple):
            n += math.prod(it.size0) + math.prod(it.size1) + math.prod(it.out)
        elif isinstance(it, Wraps):
            n += 2 * math.prod(it.size)
        elif isinstance(it, Trunc):
            n += 5 * math.prod(it.size)
        elif isinstance(it, PairStep):
            n += sum(math.prod(s) for s in (*it.draws(False), *it.products))
        else:
            n += math.prod(it.size)
    return 8 * n


def _int(x: Any, lo: int, hi: int, what: str) -> int:
    if type(x) is not int or not lo <= x <= hi:
        raise ValueError(f"bundle {what}")
    return x


def _checked(item: Item) -> Item:
    if isinstance(item, Triple):
        try:
            _ = item.out
        except ValueError:
            raise ValueError("bundle item shapes") from None
    return item


def parse_bundle(args: Any, max_elements: int = MAX_BUNDLE_ELEMENTS) -> list[Item]:
    """Validate a bundle request's item list (from rank 0, at the dealer): additive
    triples for ``mul``/``matmul``, pair triples, wraps pairs, truncation material
    and weight initialisations, bounded sizes, parameters and count. Raises
    ValueError, which the dealer turns into a ProtocolError."""
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
        elif a[0] == "pair" and len(a) == 4 and len(sizes) == 2:
            item = Triple(tuple(a[2]), tuple(a[3]), "matmul", _int(a[1], 1, MAX_PAIR, "pair rank"))
        elif a[0] == "wraps" and len(a) == 2 and len(sizes) == 1:
            item = Wraps(tuple(a[1]))
        elif a[0] == "trunc" and len(a) == 6 and len(sizes) == 1 and isinstance(a[2], torch.Size):
            item = Trunc(
                tuple(a[2]),
                _int(a[3], 1, 62, "truncation bits"),
                _int(a[4], -MAX_SCALE + 1, MAX_SCALE - 1, "truncation scale"),
                _int(a[5], 0, 63, "truncation shift"),
                _int(a[1], 0, MAX_PAIR, "pair rank"),
            )
        elif a[0] == "step" and len(a) == 5:
            b, d, o = (_int(x, 1, MAX_BUNDLE_ELEMENTS, "step shape") for x in a[2:])
            item = PairStep(b, d, o, _int(a[1], 1, MAX_PAIR, "pair rank"))
        elif a[0] == "init" and len(a) == 4 and len(sizes) == 1 and isinstance(a[2], torch.Size):
            if len(a[2]) != 2 or a[2][0] < 1:
                raise ValueError("bundle init shape")
            item = Init(tuple(a[2]), _int(a[3], 0, 32, "init bits"), _int(a[1], 0, MAX_PAIR, "pair rank"))
        else:
            raise ValueError("bundle item kind")
        items.append(_checked(item))
    if plan_elements(items) > max_elements:
        raise ValueError("bundle too large")
    return items


# -- the dealer's side -----------------------------------------------------------------


def dealer_bundle(server: Any, plan: Sequence[Item]) -> torch.Tensor:
    """Rank 0's shares for ``plan`` (c_0 of each triple, theta_0 of each wraps pair,
    its truncation material and weight shares), flattened into one ring tensor.
    ``server`` is a :class:`securevfl.exchange.crypten_dealer.SecretDealer` whose
    per-party streams are aligned with the parties': it draws, per party, exactly
    what the party draws (see module doc)."""
    out = []
    for it in plan:
        if isinstance(it, Triple) and it.pair:
            out.append(pair_c0(server.streams, it, server.matmul).reshape(-1))
        elif isinstance(it, PairStep):
            out.append(pair_step_c0(server.streams, it, server.matmul))
        elif isinstance(it, Triple):
            out.append(server.additive(torch.Size(it.size0), torch.Size(it.size1), it.op).reshape(-1))
        elif isinstance(it, Wraps):
            out.append(server.wraps(torch.Size(it.size)).reshape(-1))
        elif isinstance(it, Trunc):
            out.append(server.trunc(it).reshape(-1))
        else:
            out.append(server.init(it).reshape(-1))
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.long)


def pair_c0(streams: Sequence[SecretStream], it: Triple, matmul: RingProduct = torch.matmul) -> torch.Tensor:
    """Rank 0's share c_0 = a b - c_i of a pair triple between ranks 0 and i = it.pair:
    a = a_0 + a_i and b = b_0 + b_i drawn from those two parties' streams in the
    order they draw them (a, b; then c_i at rank i), as CrypTen's ``TTPServer.additive``
    does for all parties. A pair naming a rank the dealer has no stream for is a
    protocol violation by rank 0."""
    if not 0 < it.pair < len(streams):
        raise ProtocolError(f"rank 0 asked the dealer for a triple with rank {it.pair}, not an MPC party")
    g0, gi = streams[0], streams[it.pair]
    s0, s1 = torch.Size(it.size0), torch.Size(it.size1)
    a = g0.ring(s0) + gi.ring(s0)
    b = g0.ring(s1) + gi.ring(s1)
    c = matmul(a, b)
    return c - gi.ring(c.size())


def pair_step_c0(
    streams: Sequence[SecretStream], it: PairStep, matmul: RingProduct = torch.matmul
) -> torch.Tensor:
    """Rank 0's shares of c, e and f of a :class:`PairStep` (flattened, in that
    order), from the two holders' draws in their order (:meth:`PairStep.draws`):
    u is rank i's alone, g rank 0's alone, v the sum of both; rank i then draws
    its shares of c, e, f."""
    if not 0 < it.pair < len(streams):
        raise ProtocolError(
            f"rank 0 asked the dealer for a step's tuples with rank {it.pair}, not an MPC party"
        )
    g0, gi = streams[0], streams[it.pair]
    (v0, g), (u, vi) = (g0.ring(s) for s in it.draws(True)), (gi.ring(s) for s in it.draws(False))
    v = v0 + vi
    values = (matmul(u, v), matmul(g, v.t()), matmul(u.t(), g))
    return torch.cat([(x - gi.ring(x.shape)).reshape(-1) for x in values])


# -- the parties' side -----------------------------------------------------------------


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
        (:class:`securevfl.exchange.crypten_dealer.SecretDealer`), and rank 0's
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
