"""The ``mpc`` interactive layer in the pairwise share layout (the default).

In the joint layout every one of the N = k + 1 MPC parties holds a share of every
one of the 3k products of a step, so a step's total work and bytes grow like
k (k + 1). Here passive party P_i's block W_i, its momentum, and the products
h'_i W_i, dL/dz W_i^T and h'_i^T dL/dz are shared between A and P_i alone: each
pair runs CrypTen's two-party arithmetic (:mod:`.ring`) on Beaver triples the
dealer generates for that pair only (``Triple.pair``, pooled offline by
:mod:`securevfl.exchange.crypten_pool`), and the pairs run side by side in the
same rounds. A step's work is k two-party computations: linear in k.

Per training step (4 rounds whatever k):

1. every pair opens its forward operands eps = h'_i - a, delta = W_i - b (A and P_i
   exchange their masked shares; A with all k at once);
2. z = sum_i h'_i W_i is revealed to A alone: every party adds its share of CrypTen's
   pseudo-random zero sharing (PRZS over all MPC parties) to its share of z, and each
   P_i sends that to A; A adds them up. A learns only the sum: with k >= 2 the k
   values are uniform given it (the zero sharing's seeds between neighbouring
   passive parties are unknown to A);
3. every pair opens its backward operands (dL/dz W_i^T and h'_i^T dL/dz);
4. A sends P_i its share of dL/dh'_i = dL/dz W_i^T (P_i alone opens it); the
   momentum and the weight update are truncated locally in each pair.

Inputs are shared trivially (h'_i: P_i holds it, A holds zero; dL/dz: A holds it):
a Beaver product needs no more, its openings are masked by the dealer's fresh,
uniform a and b (SECURITY.md, ``mpc``: who learns what).
"""

from __future__ import annotations

import secrets
from typing import Any

import torch

from securevfl.errors import CheckpointError, ConfigError
from securevfl.exchange import crypten_pool
from securevfl.exchange.base import ExchangeContext
from securevfl.exchange.crypten_api import ArithmeticSharedTensor as AST
from securevfl.exchange.crypten_api import comm
from securevfl.exchange.crypten_runtime import start_crypten, stop_crypten
from securevfl.exchange.mpc import ring
from securevfl.exchange.mpc.ops import fixed_scalar
from securevfl.exchange.mpc.plan import FRAC_BITS, chunk_steps, pair_plan
from securevfl.exchange.mpc.plan import top_up as plan_top_up
from securevfl.models import build_interactive
from securevfl.snapshot import ComponentState

PROD_BITS = 2 * FRAC_BITS  # an untruncated product of two 16-bit operands


def _flat(ts: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in ts])


def _split(flat: torch.Tensor, like: list[torch.Tensor]) -> list[torch.Tensor]:
    out, at = [], 0
    for t in like:
        out.append(flat[at : at + t.numel()].reshape(t.shape))
        at += t.numel()
    return out


class PairRole:
    """One MPC party's state and steps in the pairwise layout: A (rank 0) holds a
    share in every pair, P_i in its own. ``weight_init`` and ``offline_steps`` as
    :class:`securevfl.exchange.mpc.MpcOptions`."""

    def __init__(self, ctx: ExchangeContext, *, weight_init: str, offline_steps: int):
        if ctx.device.type != "cpu":
            raise ConfigError(
                "the mpc backend's pairwise layout runs on CPU; use layout: joint on CUDA",
                path="exchange.params.layout",
            )
        self.ctx = ctx
        lay = ctx.layout
        start_crypten(
            ctx.channel,
            lay.world_size,
            1 + len(lay.passive),
            provider="TTP",
            on_failure=ctx.channel.comm_failure,
        )
        pool = crypten_pool.current()
        assert pool is not None  # installed by start_crypten for the TTP provider
        self.pool = pool
        self.offline_steps = offline_steps
        self.rank = ctx.rank
        self.out = ctx.proto.interactive.out
        self.passive = [r.rank for r in lay.passive]
        self.dims = list(ctx.embed_dims)
        # the pairs this rank is in: A every one, P_i its own (index into passive/dims)
        self.mine = list(range(len(self.passive))) if self.rank == 0 else [self.passive.index(self.rank)]
        self.batch_scale = float(ctx.proto.training.batch_size)
        self.momentum = round(ctx.proto.interactive.momentum * 2**FRAC_BITS)
        self.lr = fixed_scalar(ctx.proto.interactive.lr / self.batch_scale, FRAC_BITS)
        self.w = {i: self._init_weight(i, weight_init) for i in self.mine}
        self.v: dict[int, torch.Tensor | None] = dict.fromkeys(self.mine)
        self._h: dict[int, torch.Tensor] = {}

    @property
    def first(self) -> bool:
        return self.rank == 0  # A adds eps delta in Beaver's product

    def _init_weight(self, i: int, how: str) -> torch.Tensor:
        """This rank's share of W_i (d_i x out) at 16 fractional bits."""
        d = self.dims[i]
        shape = (d, self.out)
        if how == "seeded":  # A holds W_i^0 from the public seed, P_i zero (verification only)
            if self.rank != 0:
                return torch.zeros(shape, dtype=torch.long)
            role = self.ctx.layout.passive[i]
            blk = build_interactive(d, self.out, seed=self.ctx.proto.training.seed, party=role.party)
            return ring.encode(blk.weight.detach().T.contiguous().float(), FRAC_BITS)
        # private: W_i = R_A + R_P, each ~ N(0, var / 2) from its holder's own entropy,
        # var = 1/(3 d) as in torch's default Linear initialisation
        g = torch.Generator().manual_seed(secrets.randbits(63))
        mine = torch.randn(shape, generator=g) * (1.0 / (3.0 * d * 2)) ** 0.5
        return ring.encode(mine, FRAC_BITS)

    # -- the offline phase ---------------------------------------------------------
    def _plan(self, batch: int, train: bool) -> list[Any]:
        return pair_plan(batch, self.dims, self.out, self.passive, train=train)

    def _offline(self, batch: int, train: bool) -> None:
        """Top the pool up to a chunk of steps of this step's plan when it holds less
        than one (the same decision at every party: every party counts every item)."""
        plan = self._plan(batch, train)
        steps = chunk_steps(
            crypten_pool.pooled_bytes(plan),
            self.offline_steps,
            self.ctx.proto.training.max_steps,
            full_batch=batch == self.ctx.proto.training.batch_size,
            train=train,
        )
        bundle = plan_top_up(plan, {it: self.pool.stock(it) for it in plan}, steps)
        if bundle:
            self.pool.prefetch(bundle)

    # -- the online protocol ---------------------------------------------------------
    def _peer(self, i: int) -> int:
        return self.passive[i] if self.rank == 0 else 0

    def _products(
        self, ops: dict[int, list[tuple[torch.Tensor, torch.Tensor]]], triples: dict[int, list[Any]]
    ) -> dict[int, list[torch.Tensor]]:
        """Beaver products of every pair this rank is in, all openings in one round:
        ``ops[i]`` lists pair i's (x share, y share), ``triples[i]`` its (a, b, c)."""
        mine = {}
        for i, pairs in ops.items():
            masked = []
            for (x, y), (a, b, _) in zip(pairs, triples[i], strict=True):
                masked += [ring.masked(x, a), ring.masked(y, b)]
            mine[i] = masked
        order = list(ops)
        sends = [(self._peer(i), _flat(mine[i])) for i in order]
        recvs = [(d, torch.empty_like(f)) for d, f in sends]
        got = comm.get().p2p_round(sends, recvs, "open")
        out = {}
        for i, theirs in zip(order, got, strict=True):
            opened = [m + t for m, t in zip(mine[i], _split(theirs, mine[i]), strict=True)]
            out[i] = [
                ring.beaver_share(opened[2 * j], opened[2 * j + 1], a, b, c, self.first)
                for j, (a, b, c) in enumerate(triples[i])
            ]
        return out

    def _triples(self, plan: list[Any]) -> dict[int, list[Any]]:
        """Pop the step's triples (every party pops every item); keep this rank's
        pairs', by pair index, in plan order."""
        entries = self.pool.take(plan)
        out: dict[int, list[Any]] = {i: [] for i in self.mine}
        for it, e in zip(plan, entries, strict=True):
            if e is not None:
                out[self.passive.index(it.pair)].append(e)
        return out

    def forward(self, h: torch.Tensor | None, batch: int, train: bool) -> torch.Tensor | None:
        """One forward: A gets z (float64, B x out); P_i gets None."""
        self._offline(batch, train)
        plan = self._plan(batch, train)[: len(self.dims)]
        triples = self._triples(plan)
        xs = {}
        for i in self.mine:
            # A (h is None) holds the zero share of every P_i's embedding
            xs[i] = (
                torch.zeros((batch, self.dims[i]), dtype=torch.long)
                if h is None
                else ring.encode(h, FRAC_BITS)
            )
        prods = self._products({i: [(xs[i], self.w[i])] for i in self.mine}, triples)
        self._h = xs if train else {}
        # z to A alone: shares of z plus a pseudo-random zero sharing over all MPC parties
        mask = AST.PRZS(torch.Size((batch, self.out))).share
        share = mask + sum(p[0] for p in prods.values())
        if self.rank == 0:
            got = comm.get().p2p_round([], [(r, torch.empty_like(share)) for r in self.passive], "reveal")
            return ring.decode(share + sum(got), PROD_BITS)
        comm.get().p2p_round([(0, share)], [], "reveal")
        return None

    def backward(self, g: torch.Tensor | None, batch: int) -> torch.Tensor | None:
        """dL/dz from A (scaled by the nominal batch size, as in the joint layout);
        returns dL/dh'_i at P_i, None at A. SGD with momentum in each pair's shares."""
        k = len(self.dims)
        plan = self._plan(batch, True)[k:]
        triples = self._triples(plan)  # per pair: [g W^T, h^T g]
        scale = self.batch_scale
        gs = (
            ring.encode(g * scale, FRAC_BITS)
            if g is not None
            else torch.zeros((batch, self.out), dtype=torch.long)
        )
        ops = {i: [(gs, self.w[i].t()), (self._h[i].t(), gs)] for i in self.mine}
        prods = self._products(ops, triples)
        # dL/dh'_i to P_i alone: A sends its share
        mine = None
        if self.rank == 0:
            comm.get().p2p_round([(self.passive[i], prods[i][0]) for i in self.mine], [], "reveal")
        else:
            (i,) = self.mine
            (theirs,) = comm.get().p2p_round([], [(0, torch.empty_like(prods[i][0]))], "reveal")
            mine = ring.decode(prods[i][0] + theirs, PROD_BITS) / scale
        lr, lr_bits = self.lr
        for i in self.mine:
            hg = prods[i][1]
            v = self.v[i]
            raw = hg if v is None else self.momentum * v + hg  # 32 fractional bits
            self.v[i] = v = ring.truncate(raw, FRAC_BITS)
            self.w[i] = self.w[i] - ring.truncate(lr * v, lr_bits)
        self._h = {}
        return None if mine is None else mine.float()

    # -- checkpoints (issue #18 §3) ----------------------------------------------------
    def checkpoint_state(self) -> ComponentState:
        """This rank's ring shares of W_i and of its momentum for the pairs it is in
        (A: every pair; P_i: its own). A share alone is uniformly random; the
        dealer's pool is not saved (every rank restarts with an empty one)."""
        return ComponentState(
            {
                "w": [self.w[i].clone() for i in self.mine],
                "v": [None if (v := self.v[i]) is None else v.clone() for i in self.mine],
            },
            {"pairs": list(self.mine), "frac_bits": FRAC_BITS},
        )

    def restore(self, state: ComponentState) -> None:
        pairs, bits = state.meta.get("pairs"), state.meta.get("frac_bits")
        if pairs != self.mine or bits != FRAC_BITS:
            raise CheckpointError(
                f"rank {self.rank}: the mpc checkpoint holds pairs {pairs} at {bits} fractional bits, "
                f"this run needs pairs {self.mine} at {FRAC_BITS} (field 'exchange')"
            )
        for i, w, v in zip(self.mine, state.tensors["w"], state.tensors["v"], strict=True):
            if tuple(w.shape) != tuple(self.w[i].shape) or w.dtype != torch.long:
                raise CheckpointError(
                    f"rank {self.rank}: the mpc checkpoint's share of W_{i + 1} has shape {tuple(w.shape)}, "
                    f"expected {tuple(self.w[i].shape)} (field 'exchange')"
                )
            self.w[i] = w.clone()
            self.v[i] = None if v is None else v.clone()

    def finish(self) -> None:
        stop_crypten()
