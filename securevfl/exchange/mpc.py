"""``mpc``: the interactive layer inside CrypTen secret sharing (DESIGN §4).

Every passive party P_i secret-shares its (defended) embedding h'_i from its own
rank; the blocks W_i exist only as shares among the MPC parties (A and every
P_i); z = sum_i h'_i W_i is computed on shares and revealed to A alone; dL/dz is
shared by A; dL/dh'_i = dL/dz W_i^T is revealed to P_i alone; the weight
gradients h'_i^T dL/dz and the SGD-with-momentum update stay in shares.

Who learns what: A learns z (and dL/dz, which it computes); P_i learns
dL/dh'_i; every other message is a share or a Beaver-masked opening, uniformly
random in Z_2^64. Correlated randomness comes from a trusted dealer rank (the
``TTP`` provider, semi-honest and not colluding with any party). CrypTen's
``TFP`` provider lets rank 0 generate every triple in the clear, so rank 0 (A)
could unmask all openings: it is refused unless ``insecure: true``.

Numerics: CrypTen's fixed point with 16 fractional bits (resolution 1.5e-5); with
more than two MPC parties truncation uses the dealer's ``wraps`` protocol.
Initial weights: ``private`` (default) makes each W_i the sum of Gaussian shares
drawn locally by every MPC party, so nobody knows it; ``seeded`` lets A share the
same W_i^0 that ``plain`` builds from the protocol seed, so runs can be compared
step by step with ``plain`` (every party could recompute W_i^0: verification only).
"""

from __future__ import annotations

import secrets
import warnings
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict

from securevfl.config import Protocol
from securevfl.errors import CryptoParameterError
from securevfl.exchange.base import (
    EXCHANGES,
    ActiveExchange,
    ExchangeBackend,
    ExchangeContext,
    HelperExchange,
    PassiveExchange,
)
from securevfl.exchange.crypten_runtime import serve_dealer, start_crypten, stop_crypten
from securevfl.models import build_interactive

INSECURE_WARNING = (
    "mpc provider TFP: rank 0 generates all Beaver triples in the clear and can unmask "
    "every opened value; use only for debugging"
)


class MpcOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
    provider: Literal["TTP", "TFP"] = "TTP"
    insecure: bool = False
    weight_init: Literal["private", "seeded"] = "private"


class _MpcRole:
    """State and steps shared by every MPC party (A and each P_i): all of them run
    the same CrypTen operations in the same order."""

    def __init__(self, ctx: ExchangeContext):
        self.ctx = ctx
        opts: MpcOptions = ctx.options  # type: ignore[assignment]
        self.opts = opts
        lay = ctx.layout
        self.n_mpc = 1 + len(lay.passive)
        self.crypten = start_crypten(
            ctx.channel,
            lay.world_size,
            self.n_mpc,
            provider=opts.provider,
            on_failure=ctx.channel.comm_failure,
        )
        self.rank = ctx.rank
        self.out = ctx.proto.interactive.out
        self.lr = ctx.proto.interactive.lr
        self.momentum = ctx.proto.interactive.momentum
        self.device = ctx.device
        self.passive = [r.rank for r in lay.passive]
        self.w = [self._init_weight(i, d) for i, d in enumerate(ctx.embed_dims)]
        self.v: list[Any] = [None] * len(self.w)
        self._h: list[Any] = []

    def _share(self, value: torch.Tensor | None, shape: tuple[int, ...], src: int) -> Any:
        t = value if self.rank == src and value is not None else torch.zeros(shape)
        return self.crypten.cryptensor(t.to(self.device), src=src, device=self.device)

    def _init_weight(self, i: int, d: int) -> Any:
        shape = (d, self.out)
        role = self.ctx.layout.passive[i]
        if self.opts.weight_init == "seeded":
            w0 = None
            if self.rank == 0:
                blk = build_interactive(d, self.out, seed=self.ctx.proto.training.seed, party=role.party)
                w0 = blk.weight.detach().T.contiguous()
            return self._share(w0, shape, src=0)
        # private: W_i = sum_j R_j, R_j ~ N(0, var / n) drawn from each party's own entropy,
        # var = 1/(3 d) as in torch's default Linear initialisation
        g = torch.Generator().manual_seed(secrets.randbits(63))
        mine = torch.randn(shape, generator=g) * (1.0 / (3.0 * d * self.n_mpc)) ** 0.5
        total = None
        for j in range(self.n_mpc):
            part = self._share(mine, shape, src=j)
            total = part if total is None else total + part
        return total

    def forward_shares(self, h: torch.Tensor | None, batch: int) -> Any:
        """Share every h'_i from its owner; return [z] (shares)."""
        self._h = []
        z = None
        for i, (src, d) in enumerate(zip(self.passive, self.ctx.embed_dims, strict=True)):
            hi = self._share(h, (batch, d), src=src)
            self._h.append(hi)
            zi = hi.matmul(self.w[i])
            z = zi if z is None else z + zi
        return z

    def backward_shares(self, g: torch.Tensor | None, batch: int) -> torch.Tensor | None:
        """Share dL/dz from A; reveal dL/dh'_i to P_i only; update W_i in shares.
        Returns this rank's revealed embedding gradient (passive ranks only).

        dL/dz of a batch-mean loss is O(1/B) per entry, close to the fixed-point
        resolution, so it is shared scaled by the nominal batch size (exact in
        plaintext at A) and the scale is removed after the reveal and in the
        learning rate (constant, so momentum buffers stay consistent)."""
        scale = float(self.ctx.proto.training.batch_size)
        g_enc = self._share(None if g is None else g * scale, (batch, self.out), src=0)
        mine = None
        grads = []
        for i, src in enumerate(self.passive):
            gh = g_enc.matmul(self.w[i].t()).get_plain_text(dst=src)
            if self.rank == src:
                mine = gh / scale
            grads.append(self._h[i].t().matmul(g_enc))
        for i, gw in enumerate(grads):
            self.v[i] = gw if self.v[i] is None else self.v[i] * self.momentum + gw
            self.w[i] = self.w[i] - self.v[i] * (self.lr / scale)
        self._h = []
        return mine

    def finish(self) -> None:
        stop_crypten()


class MpcActive(ActiveExchange):
    def __init__(self, ctx: ExchangeContext):
        self.role = _MpcRole(ctx)

    def forward(self, batch_size: int, *, train: bool) -> torch.Tensor:
        z = self.role.forward_shares(None, batch_size)
        return z.get_plain_text(dst=0).float()

    def backward(self, grad_z: torch.Tensor) -> None:
        self.role.backward_shares(grad_z.detach().float().cpu(), grad_z.shape[0])

    def close(self) -> None:
        import crypten.communicator as comm

        if self.role.opts.provider == "TTP":
            c = comm.get()
            c.send_obj("terminate", c.get_ttp_rank(), c.ttp_group)
        self.role.finish()


class MpcPassive(PassiveExchange):
    def __init__(self, ctx: ExchangeContext):
        self.role = _MpcRole(ctx)
        self._batch = 0

    def forward(self, h: torch.Tensor, *, train: bool) -> None:
        self._batch = h.shape[0]
        z = self.role.forward_shares(h.detach().float().cpu(), self._batch)
        z.get_plain_text(dst=0)  # collective: A receives the others' shares of z

    def backward(self) -> torch.Tensor:
        g = self.role.backward_shares(None, self._batch)
        assert g is not None
        return g.float().to(self.role.device)

    def close(self) -> None:
        self.role.finish()


class MpcDealer(HelperExchange):
    def __init__(self, ctx: ExchangeContext):
        self.ctx = ctx
        lay = ctx.layout
        start_crypten(
            ctx.channel,
            lay.world_size,
            1 + len(lay.passive),
            provider="TTP",
            on_failure=ctx.channel.comm_failure,
        )
        self.served = 0

    def serve(self) -> None:
        self.served = serve_dealer(self.ctx.channel, self.ctx.channel.comm_failure)
        stop_crypten()


@EXCHANGES.register("mpc")
class Mpc(ExchangeBackend):
    name = "mpc"
    capabilities = frozenset({"cuda", "mpc"})
    options = MpcOptions
    description = "CrypTen secret sharing; z revealed to A only; dealer-provided triples"

    @classmethod
    def helper_names(cls, proto: Protocol) -> list[str]:
        opts = MpcOptions.model_validate(proto.exchange.params)
        return ["dealer"] if opts.provider == "TTP" else []

    @classmethod
    def check(cls, proto: Protocol, options: BaseModel) -> None:
        assert isinstance(options, MpcOptions)
        if options.provider == "TFP" and not options.insecure:
            raise CryptoParameterError(
                "CrypTen's TFP provider is insecure: rank 0 generates every Beaver triple in the "
                "clear and so learns every shared value; use provider: TTP (the default), or set "
                "insecure: true for debugging only",
                path="exchange.params.provider",
            )
        if options.insecure and options.provider == "TFP":
            warnings.warn(INSECURE_WARNING, stacklevel=2)

    @classmethod
    def active(cls, ctx: ExchangeContext) -> ActiveExchange:
        return MpcActive(ctx)

    @classmethod
    def passive(cls, ctx: ExchangeContext) -> PassiveExchange:
        return MpcPassive(ctx)

    @classmethod
    def helper(cls, ctx: ExchangeContext) -> HelperExchange:
        return MpcDealer(ctx)

    @classmethod
    def result_info(cls, options: BaseModel) -> dict[str, Any]:
        info = super().result_info(options)
        assert isinstance(options, MpcOptions)
        info["insecure"] = options.provider == "TFP"
        if info["insecure"]:
            info["warning"] = INSECURE_WARNING
        return info
