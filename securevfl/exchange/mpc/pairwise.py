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

1. every pair opens its forward operands, A with all k at once: P_i sends
   eps = h'_i - u to A (u, the step's :class:`~securevfl.exchange.crypten_pool.PairStep`
   mask for h'_i, is P_i's alone), and A and P_i exchange their shares of
   delta = W_i - v (v shared); a forward pass alone (evaluation, prediction) opens
   a Beaver triple's h'_i - a and W_i - b both ways instead;
2. z = sum_i h'_i W_i is revealed to A alone: every party adds its share of CrypTen's
   pseudo-random zero sharing (PRZS over all MPC parties) to its share of z, and each
   P_i sends that to A; A adds them up. A learns only the sum: with k >= 2 the k
   values are uniform given it (the zero sharing's keys between neighbouring
   passive parties are unknown to A);
3. A sends each P_i dL/dz - g, the one backward operand (g is A's alone): with eps
   and delta from step 1 it gives both backward products, dL/dz W_i^T and
   h'_i^T dL/dz, from the PairStep's e = g v^T and f = u^T g (SecureML's reuse of a
   masked matrix across the passes: each value is opened once per step, under a
   mask used for it alone and unknown to the opening's receiver);
4. A sends P_i its share of dL/dh'_i = dL/dz W_i^T (P_i alone opens it) and, in the
   same frames, each pair opens its momentum m v_i + h'_i^T dL/dz masked by the
   dealer's truncation mask: both updates, v_i <- (m v_i + h'_i^T dL/dz) / 2^16 and
   W_i <- W_i - lr v_i, are then exact truncations in shares
   (:mod:`securevfl.exchange.truncation`; never the local truncation, which wraps).

In training each party's own input is masked by a mask it alone holds (u for
h'_i at P_i, g for dL/dz at A, each drawn from that party's dealer stream), so
the opening goes one way and carries the value itself, never raw stream output;
the receiver holds no part of the mask, so what it sees is uniform. A party's
share of such a mask is zero, which drops a third of each party's Beaver products
(:func:`securevfl.exchange.mpc.ring.product_share`). A forward pass alone
re-shares h'_i from a stream A and P_i alone share (a key A draws and sends P_i
over the sealed channel: P_i holds enc(h'_i) - s, A holds s) and opens a Beaver
triple both ways. A's opening of x - a is s - a_A, and P_i holds s: it reads A's
share a_A of the triple's mask, raw output of A's dealer stream, which tells it the
mask of its own h'_i and nothing else (AES-CTR: no other draw of that stream
follows from it; SECURITY.md, ``mpc``).
The initial W_i is the dealer's W_i^0 ~ N(0, 1/(3 d_i)) shared between A and
P_i (:class:`securevfl.exchange.crypten_pool.Init`): each share alone is
uniform in the ring and independent of W_i^0 (SECURITY.md, ``mpc``: who learns
what).
"""

from __future__ import annotations

import math
from typing import Any

import torch

import securevfl.exchange.crypten_pool as crypten_pool
import securevfl.exchange.crypten_rng as crypten_rng
import securevfl.exchange.mpc.ring as ring
import securevfl.exchange.truncation as truncation
from securevfl.errors import CheckpointError, ConfigError
from securevfl.exchange.base import ExchangeContext
from securevfl.exchange.crypten_api import ArithmeticSharedTensor as AST
from securevfl.exchange.crypten_api import comm
from securevfl.exchange.crypten_pool import Init
from securevfl.exchange.crypten_runtime import start_crypten, stop_crypten
from securevfl.exchange.mpc.ops import fixed_scalar
from securevfl.exchange.mpc.plan import FRAC_BITS, Lookahead, chunk_steps, pair_plan
from securevfl.exchange.mpc.plan import top_up as plan_top_up
from securevfl.models import build_interactive
from securevfl.snapshot import ComponentState

PROD_BITS = 2 * FRAC_BITS  # an untruncated product of two 16-bit operands


def _flat(ts: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in ts])


def _split(flat: torch.Tensor, shapes: list[torch.Size]) -> list[torch.Tensor]:
    out, at = [], 0
    for shape in shapes:
        n = math.prod(shape)
        out.append(flat[at : at + n].reshape(shape))
        at += n
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
        self.lookahead = Lookahead()  # the run's steps ahead, once the training loop says (expect)
        self.rank = ctx.rank
        self.out = ctx.proto.interactive.out
        self.passive = [r.rank for r in lay.passive]
        self.dims = list(ctx.embed_dims)
        # the pairs this rank is in: A every one, P_i its own (index into passive/dims)
        self.mine = list(range(len(self.passive))) if self.rank == 0 else [self.passive.index(self.rank)]
        self.batch_scale = float(ctx.proto.training.batch_size)
        self.momentum = round(ctx.proto.interactive.momentum * 2**FRAC_BITS)
        self.lr = fixed_scalar(ctx.proto.interactive.lr / self.batch_scale, FRAC_BITS)
        # the streams A shares with each P_i alone (input re-sharing), by pair index
        c = comm.get()
        peers = [self._peer(i) for i in self.mine]
        got = crypten_rng.pair_keys(c, peers, send=self.rank == 0)
        self.pair_streams = {i: got[p] for i, p in zip(self.mine, peers, strict=True)}
        self.w = self._init_weights(weight_init)
        self.v: dict[int, torch.Tensor | None] = dict.fromkeys(self.mine)
        # a training forward's PairStep shares and openings (eps, delta), per pair, for its backward
        self._fwd: dict[int, tuple[Any, torch.Tensor, torch.Tensor]] = {}

    @property
    def first(self) -> bool:
        return self.rank == 0  # A adds eps delta in Beaver's product

    def _init_weights(self, how: str) -> dict[int, torch.Tensor]:
        """This rank's share of each W_i it holds (d_i x out) at 16 fractional bits.

        ``private``: W_i^0 ~ N(0, 1/(3 d_i)) (torch's default Linear initialisation's
        variance), drawn by the dealer and shared between A and P_i, so each share
        alone is uniform and independent of W_i^0 (the dealer knows W_i^0, a value
        independent of the data). ``seeded``: A holds W_i^0 from the public seed and
        P_i zero (verification only)."""
        if how == "seeded":
            out = {}
            for i in self.mine:
                shape = (self.dims[i], self.out)
                if self.rank != 0:
                    out[i] = torch.zeros(shape, dtype=torch.long)
                    continue
                role = self.ctx.layout.passive[i]
                blk = build_interactive(
                    shape[0], self.out, seed=self.ctx.proto.training.seed, party=role.party
                )
                out[i] = ring.encode(blk.weight.detach().T.contiguous().float(), FRAC_BITS)
            return out
        plan = [Init((d, self.out), FRAC_BITS, r) for d, r in zip(self.dims, self.passive, strict=True)]
        shares = self.pool.fetch(plan)
        return {i: shares[i] for i in self.mine}

    # -- the offline phase ---------------------------------------------------------
    def _plan(self, batch: int, train: bool) -> list[Any]:
        return pair_plan(batch, self.dims, self.out, self.passive, train=train, lr=self.lr)

    def _offline(self, batch: int, train: bool) -> None:
        """Top the pool up to a chunk of steps of this step's plan when it holds less
        than one (the same decision at every party: every party counts every item
        and the same steps ahead)."""
        plan = self._plan(batch, train)
        steps = chunk_steps(
            crypten_pool.pooled_bytes(plan),
            self.offline_steps,
            self.ctx.proto.training.max_steps,
            full_batch=batch == self.ctx.proto.training.batch_size,
            train=train,
            ahead=self.lookahead.ahead(batch, train),
        )
        bundle = plan_top_up(plan, {it: self.pool.stock(it) for it in plan}, steps)
        if bundle:
            self.pool.prefetch(bundle)
        self.lookahead.took(batch, train)

    # -- the online protocol ---------------------------------------------------------
    def _peer(self, i: int) -> int:
        return self.passive[i] if self.rank == 0 else 0

    def _swap(
        self, send: dict[int, list[torch.Tensor]], shapes: dict[int, list[torch.Size]]
    ) -> dict[int, list[torch.Tensor]]:
        """One round of openings: this rank sends each pair's ``send[i]`` to its peer
        in pair i and receives from it tensors of ``shapes[i]`` (either may be empty:
        a one-sided mask's opening goes one way), all pairs at once."""
        sends = [(self._peer(i), _flat(send[i])) for i in self.mine if send[i]]
        recvs = [
            (self._peer(i), torch.empty(sum(math.prod(x) for x in shapes[i]), dtype=torch.long))
            for i in self.mine
            if shapes[i]
        ]
        got = iter(comm.get().p2p_round(sends, recvs, "open"))
        out: dict[int, list[torch.Tensor]] = {}
        for i in self.mine:
            flat = next(got) if shapes[i] else torch.zeros(0, dtype=torch.long)
            out[i] = _split(flat, shapes[i])
        return out

    def _open(self, masked: dict[int, list[torch.Tensor]]) -> dict[int, list[torch.Tensor]]:
        """Open every pair's masked values both ways in one round: ``masked[i]`` lists
        this rank's shares of pair i's x - a; returns the opened x - a, same layout."""
        got = self._swap(masked, {i: [m.shape for m in masked[i]] for i in self.mine})
        return {i: [m + t for m, t in zip(masked[i], got[i], strict=True)] for i in self.mine}

    def _items(self, plan: list[Any]) -> dict[int, list[Any]]:
        """Pop the step's items (every party pops every item); keep this rank's
        pairs', by pair index, in plan order."""
        entries = self.pool.take(plan)
        out: dict[int, list[Any]] = {i: [] for i in self.mine}
        for it, e in zip(plan, entries, strict=True):
            if e is not None:
                out[self.passive.index(it.pair)].append(e)
        return out

    def forward(self, h: torch.Tensor | None, batch: int, train: bool) -> torch.Tensor | None:
        """One forward: A gets z (float64, B x out); P_i gets None. In training the
        pair's :class:`~securevfl.exchange.crypten_pool.PairStep` masks h'_i (with u,
        P_i's alone: P_i sends h'_i - u to A) and W_i (with v, shared: W_i - v opened
        both ways), and the openings are kept for the backward products; a forward
        pass alone takes a Beaver triple (:meth:`_forward_only`)."""
        self._offline(batch, train)
        plan = self._plan(batch, train)[: len(self.dims)]
        items = self._items(plan)
        if not train:
            return self._reveal_z(self._forward_only(h, batch, items), batch)
        send: dict[int, list[torch.Tensor]] = {}
        shapes: dict[int, list[torch.Size]] = {}
        for i in self.mine:
            (e,) = items[i]
            w_masked = ring.masked(self.w[i], e.v)
            if self.first:  # W_A - v_A to P_i; from P_i h'_i - u and W_i - v_i
                send[i], shapes[i] = [w_masked], [torch.Size((batch, self.dims[i])), self.w[i].shape]
            else:
                assert h is not None and e.u is not None
                send[i], shapes[i] = (
                    [ring.masked(ring.encode(h, FRAC_BITS), e.u), w_masked],
                    [self.w[i].shape],
                )
        got = self._swap(send, shapes)
        prods = {}
        for i in self.mine:
            (e,) = items[i]
            if self.first:
                eps, delta = got[i][0], send[i][0] + got[i][1]
            else:
                eps, delta = send[i][0], send[i][1] + got[i][0]
            prods[i] = ring.product_share(eps, delta, e.u, e.v, e.c, self.first)
            self._fwd[i] = (e, eps, delta)
        return self._reveal_z(prods, batch)

    def _forward_only(
        self, h: torch.Tensor | None, batch: int, items: dict[int, list[Any]]
    ) -> dict[int, torch.Tensor]:
        """This rank's shares of every pair's h'_i W_i from a Beaver triple each, h'_i
        re-shared from the pair's stream (A holds s, P_i enc(h'_i) - s)."""
        xs, tuples = {}, {}
        for i in self.mine:
            s = self.pair_streams[i].ring((batch, self.dims[i]))
            xs[i] = s if h is None else ring.encode(h, FRAC_BITS) - s
            ((a, b, c),) = items[i]
            tuples[i] = (a, b, c)
        opened = self._open(
            {i: [ring.masked(xs[i], a), ring.masked(self.w[i], b)] for i, (a, b, _) in tuples.items()}
        )
        return {
            i: ring.beaver_share(opened[i][0], opened[i][1], a, b, c, self.first)
            for i, (a, b, c) in tuples.items()
        }

    def _reveal_z(self, prods: dict[int, torch.Tensor], batch: int) -> torch.Tensor | None:
        """z to A alone: every rank's shares of z plus its share of a pseudo-random
        zero sharing over all MPC parties; P_i sends, A adds them up."""
        mask = AST.PRZS(torch.Size((batch, self.out))).share
        share = mask + sum(prods.values())
        if self.rank == 0:
            got = comm.get().p2p_round([], [(r, torch.empty_like(share)) for r in self.passive], "reveal")
            return ring.decode(share + sum(got), PROD_BITS)
        comm.get().p2p_round([(0, share)], [], "reveal")
        return None

    def backward(self, g: torch.Tensor | None, batch: int) -> torch.Tensor | None:
        """dL/dz from A (scaled by the nominal batch size, as in the joint layout);
        returns dL/dh'_i at P_i, None at A. dL/dz - g (g A's alone) is the step's one
        backward opening, A to P_i; with the forward pass's eps = h'_i - u and
        delta = W_i - v it gives both products, dL/dz W_i^T (from g, v^T and e) and
        h'_i^T dL/dz (from u^T, g and f). SGD with momentum in each pair's shares:
        v_i <- (m v_i + h'_i^T dL/dz) / 2^16 and W_i <- W_i - lr v_i, both exact
        truncations of one opening that travels with the reveal of dL/dh'_i."""
        k = len(self.dims)
        plan = self._plan(batch, True)[k:]
        truncs = self._items(plan)  # per pair: [truncation material]
        scale = self.batch_scale
        send: dict[int, list[torch.Tensor]] = {i: [] for i in self.mine}
        if self.first:  # dL/dz - g to every P_i, each pair's g its own
            assert g is not None
            g_enc = ring.encode(g * scale, FRAC_BITS)
            send = {i: [ring.masked(g_enc, self._fwd[i][0].g)] for i in self.mine}
        got = self._swap(send, {i: [] if self.first else [torch.Size((batch, self.out))] for i in self.mine})
        prods = {}
        for i in self.mine:
            e, eps, delta = self._fwd[i]
            (phi,) = send[i] if self.first else got[i]
            ut = None if e.u is None else e.u.t()
            prods[i] = (
                ring.product_share(phi, delta.t(), e.g, e.v.t(), e.e, self.first),  # dL/dz W_i^T
                ring.product_share(eps.t(), phi, ut, e.g, e.f, self.first),  # h'_i^T dL/dz
            )
        # the momentum before truncation (32 fractional bits), masked for its opening
        lr, lr_bits = self.lr
        raw, masked = {}, {}
        for i in self.mine:
            hg, v = prods[i][1], self.v[i]
            raw[i] = hg if v is None else self.momentum * v + hg
            masked[i] = truncation.masked(raw[i].reshape(-1), truncs[i][0].r, self.first)
        # one round: dL/dh'_i to P_i alone (A sends its share) and the masked momenta both ways
        c = comm.get()
        mine = None
        if self.rank == 0:
            got = c.p2p_parts(
                [(self.passive[i], [("reveal", prods[i][0]), ("open", masked[i])]) for i in self.mine],
                [(self.passive[i], [("open", masked[i])]) for i in self.mine],
            )
            theirs = {i: parts[0] for i, parts in zip(self.mine, got, strict=True)}
        else:
            (i,) = self.mine
            ((revealed, opened_m),) = c.p2p_parts(
                [(0, [("open", masked[i])])], [(0, [("reveal", prods[i][0]), ("open", masked[i])])]
            )
            theirs = {i: opened_m}
            mine = ring.decode(prods[i][0] + revealed, PROD_BITS) / scale
        for i in self.mine:
            opened_c = masked[i] + theirs[i]
            v, step = truncation.finish(opened_c, truncs[i][0].material, FRAC_BITS, lr, lr_bits, self.first)
            self.v[i] = v.reshape(raw[i].shape)
            self.w[i] = self.w[i] - step.reshape(raw[i].shape)
        self._fwd = {}
        return None if mine is None else mine.float()

    # -- checkpoints (docs/design.md §12) ----------------------------------------------------
    def checkpoint_state(self) -> ComponentState:
        """This rank's ring shares of W_i and of its momentum for the pairs it is in
        (A: every pair; P_i: its own). A share alone is uniformly random (the dealer
        shared W_i^0; every update adds shares of an opened value's truncation, whose
        material is uniform); the dealer's pool and the streams are not saved (every
        rank restarts with an empty pool and fresh keys)."""
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
