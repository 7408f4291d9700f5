"""The role objects of ``plain`` (what it is and reveals: :mod:`securevfl.exchange.plain`):
P_i sends h'_i; A holds every W_i, computes z and sends each P_i dL/dh'_i."""

from __future__ import annotations

import torch

from securevfl.exchange.base import (
    ActiveExchange,
    ExchangeContext,
    PassiveExchange,
    Roles,
)
from securevfl.models import build_interactive, interactive_optimizer
from securevfl.privacy.hashing import pack_codes, unpack_codes
from securevfl.runtime.messages import EMB_GRAD, EMBEDDING
from securevfl.snapshot import ComponentState

# Embeddings that are +-1 by construction (ExchangeContext.sends_codes, e.g. HashVFL
# codes) travel as packed bits: ceil(d/8) bytes per row instead of 4 d. Both ends
# derive the form from the protocol; a peer that sends the other form is refused
# by the channel's dtype check.


def _encode(h: torch.Tensor, codes: bool) -> torch.Tensor:
    return torch.from_numpy(pack_codes(h)) if codes else h.float()


def _recv_embedding(ctx: ExchangeContext, peer: int, rows: int, d: int, codes: bool) -> torch.Tensor:
    if codes:
        return ctx.channel.recv(
            peer,
            EMBEDDING,
            shape=(rows, (d + 7) // 8),
            dtype=torch.uint8,
            decode=lambda t: unpack_codes(t.numpy(), d),
        )
    return ctx.channel.recv(peer, EMBEDDING, shape=(rows, d), dtype=torch.float32)


class PlainActive(ActiveExchange):
    def __init__(self, ctx: ExchangeContext):
        self.ctx = ctx
        proto = ctx.proto
        out = proto.interactive.out
        self.peers = [r.rank for r in ctx.layout.passive]
        self.linears: list[torch.nn.Linear] = [
            build_interactive(d, out, seed=proto.training.seed, party=r.party).to(ctx.device)
            for d, r in zip(ctx.embed_dims, ctx.layout.passive, strict=True)
        ]
        self.blocks = torch.nn.ModuleList(self.linears)
        self.opt = interactive_optimizer(self.blocks.parameters(), proto.interactive)
        self._h: list[torch.Tensor] = []
        self._z: torch.Tensor | None = None
        # a FedBCD round: per peer, its embeddings of each batch; the gradients to send
        self._round: list[list[torch.Tensor]] = []
        self._round_grads: list[list[torch.Tensor]] = []
        self._record_grad = False

    def _combine(self, hs: list[torch.Tensor], train: bool) -> torch.Tensor:
        with torch.set_grad_enabled(train):
            z = hs[0] @ self.linears[0].weight.T
            for h, blk in zip(hs[1:], self.linears[1:], strict=True):
                z = z + h @ blk.weight.T
        self._h, self._z = hs, z
        return z.detach()

    def _codes(self) -> list[bool]:
        return self.ctx.sends_codes or [False] * len(self.peers)

    def forward(self, batch_size: int, *, train: bool) -> torch.Tensor:
        hs = []
        for peer, d, codes in zip(self.peers, self.ctx.embed_dims, self._codes(), strict=True):
            h = _recv_embedding(self.ctx, peer, batch_size, d, codes)
            hs.append(h.to(self.ctx.device).requires_grad_(train))
        return self._combine(hs, train)

    def receive_round(self, sizes: list[int]) -> None:
        self._round = []
        for peer, d, codes in zip(self.peers, self.ctx.embed_dims, self._codes(), strict=True):
            h = _recv_embedding(self.ctx, peer, sum(sizes), d, codes)
            self._round.append(list(torch.split(h.to(self.ctx.device), sizes)))
        self._round_grads = [[] for _ in self.peers]

    def forward_local(self, r: int, *, record_grad: bool) -> torch.Tensor:
        if not self._round:
            raise RuntimeError("forward_local outside a round (receive_round first)")
        self._record_grad = record_grad
        # fresh leaves: the stale h'_i of batch r (docs/methods/crdp-fl.md §2.2: peers' parts from the round)
        return self._combine([parts[r].detach().clone().requires_grad_(True) for parts in self._round], True)

    def backward_local(self, grad_z: torch.Tensor) -> None:
        assert self._z is not None, "backward_local without forward_local"
        if self._record_grad:  # dL/dh'_i at the round's W_i; W_i untouched
            through_z = torch.autograd.grad(self._z, self._h, grad_z)
            for k, (h, gz) in enumerate(zip(self._h, through_z, strict=True)):
                direct = h.grad  # an active-side loss on the embeddings themselves
                self._round_grads[k].append(gz if direct is None else gz + direct)
        else:
            self.opt.zero_grad(set_to_none=True)
            self._z.backward(grad_z)
            self.opt.step()
        self._h, self._z = [], None

    def send_round_grads(self) -> None:
        for peer, grads in zip(self.peers, self._round_grads, strict=True):
            self.ctx.channel.send(peer, EMB_GRAD, torch.cat(grads))
        self._round_grads = []  # the round's embeddings stay for its local steps

    def embeddings(self) -> list[torch.Tensor] | None:
        return self._h

    def backward(self, grad_z: torch.Tensor) -> None:
        assert self._z is not None, "backward without a training forward"
        self.opt.zero_grad(set_to_none=True)
        self._z.backward(grad_z)
        for peer, h in zip(self.peers, self._h, strict=True):
            assert h.grad is not None
            self.ctx.channel.send(peer, EMB_GRAD, h.grad)
        self.opt.step()
        self._h, self._z = [], None

    def state(self) -> dict[str, torch.Tensor]:
        return {
            f"interactive.{r.party}": blk.weight.detach().cpu()
            for r, blk in zip(self.ctx.layout.passive, self.linears, strict=True)
        }

    def checkpoint_state(self) -> ComponentState:
        """A holds every W_i in the clear, with its optimizer's momentum."""
        blocks = {k: v.detach().cpu().clone() for k, v in self.blocks.state_dict().items()}
        return ComponentState({"blocks": blocks, "optimizer": self.opt.state_dict()})

    def restore(self, state: ComponentState) -> None:
        self.blocks.load_state_dict(state.tensors["blocks"])
        self.opt.load_state_dict(state.tensors["optimizer"])


class PlainPassive(PassiveExchange):
    def __init__(self, ctx: ExchangeContext):
        self.ctx = ctx
        self.active = ctx.layout.active.rank
        index = ctx.layout.role(ctx.rank).index
        self.dim = ctx.embed_dims[index]
        self.codes = bool(ctx.sends_codes) and ctx.sends_codes[index]
        self._batch = 0

    def forward(self, h: torch.Tensor, *, train: bool) -> None:
        self._batch = h.shape[0]
        self.ctx.channel.send(self.active, EMBEDDING, _encode(h, self.codes))

    def backward(self) -> torch.Tensor:
        g = self.ctx.channel.recv(self.active, EMB_GRAD, shape=(self._batch, self.dim), dtype=torch.float32)
        return g.to(self.ctx.device)

    def send_round(self, hs: list[torch.Tensor]) -> None:
        self.ctx.channel.send(self.active, EMBEDDING, _encode(torch.cat(hs), self.codes))

    def receive_round_grads(self, sizes: list[int]) -> list[torch.Tensor]:
        g = self.ctx.channel.recv(self.active, EMB_GRAD, shape=(sum(sizes), self.dim), dtype=torch.float32)
        return list(torch.split(g.to(self.ctx.device), sizes))


class PlainRoles(Roles):
    """The role objects of ``plain`` (its declaration: :class:`~securevfl.exchange.plain.Plain`)."""

    @classmethod
    def active(cls, ctx: ExchangeContext) -> ActiveExchange:
        return PlainActive(ctx)

    @classmethod
    def passive(cls, ctx: ExchangeContext) -> PassiveExchange:
        return PlainPassive(ctx)
