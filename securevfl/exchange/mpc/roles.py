"""The role objects of ``mpc`` (the mechanism and what each party learns:
:mod:`securevfl.exchange.mpc`): the joint layout's roles here (``_MpcRole``), the
pairwise one's in :mod:`.pairwise`, the dealer rank's in :class:`MpcDealer`."""

from __future__ import annotations

from typing import Any

import torch

import securevfl.exchange.mpc.crypten.provider as tuple_provider
from securevfl.csprng import SecretStream
from securevfl.exchange.base import (
    ActiveExchange,
    ExchangeContext,
    HelperExchange,
    PassiveExchange,
    Roles,
    RunPlan,
)
from securevfl.exchange.mpc import MpcOptions, ops, share_layout
from securevfl.exchange.mpc.crypten.api import ArithmeticSharedTensor, comm
from securevfl.exchange.mpc.crypten.items import Init, Trunc, TruncShares, pooled_bytes
from securevfl.exchange.mpc.crypten.runtime import serve_dealer, start_crypten, stop_crypten
from securevfl.exchange.mpc.pairwise import PairRole
from securevfl.exchange.mpc.plan import FRAC_BITS, Lookahead, chunk_steps, step_plan, top_up
from securevfl.exchange.mpc.ringmatmul import ring_matmul
from securevfl.models import build_interactive
from securevfl.snapshot import ComponentState


class _MpcRole:
    """State and steps shared by every MPC party (A and each P_i): all of them run
    the same CrypTen operations in the same order.

    Shares are CrypTen ``ArithmeticSharedTensor``s driven through the batched
    operations of :mod:`.ops`; weights and momentum live at CrypTen's 16
    fractional bits, products are kept untruncated (32 bits) until they are
    revealed or folded into an update (module docstring of :mod:`.plan`)."""

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
        self.device = ctx.device
        self.passive = [r.rank for r in lay.passive]
        self.dims = list(ctx.embed_dims)
        # the optimizer's constants as public fixed-point integers
        self.batch_scale = float(ctx.proto.training.batch_size)
        # momentum at CrypTen's 16 bits, so m v (16 + 16 bits) adds to h^T dL/dz (16 + 16)
        self.momentum = round(ctx.proto.interactive.momentum * 2**FRAC_BITS)
        self.lr = ops.fixed_scalar(ctx.proto.interactive.lr / self.batch_scale, FRAC_BITS)
        self.provider = tuple_provider.current()  # None under TFP (no dealer)
        self.lookahead = Lookahead()  # the run's steps ahead, once the training loop says (expect)
        self.pool = self.provider if self.device.type == "cpu" else None
        self.w = [self._init_weight(i, d) for i, d in enumerate(self.dims)]
        self.v: list[Any] = [None] * len(self.w)
        self._h: list[Any] = []

    def _share(self, value: torch.Tensor | None, shape: tuple[int, ...], src: int) -> Any:
        t = value.to(self.device) if self.rank == src and value is not None else None
        return ArithmeticSharedTensor(t, size=shape, src=src, device=self.device)

    def _init_weight(self, i: int, d: int) -> Any:
        shape = (d, self.out)
        role = self.ctx.layout.passive[i]
        if self.opts.weight_init == "seeded":
            w0 = None
            if self.rank == 0:
                blk = build_interactive(d, self.out, seed=self.ctx.proto.training.seed, party=role.party)
                w0 = blk.weight.detach().T.contiguous()
            return self._share(w0, shape, src=0)
        # private: W_i^0 ~ N(0, 1/(3 d)), the variance of torch's default Linear
        # initialisation, drawn by the dealer and shared (module docstring)
        item = Init(shape, FRAC_BITS)
        if self.provider is not None:
            (share,) = self.provider.fetch([item])
            return ops.from_shares(share.to(self.device), FRAC_BITS)
        w0 = SecretStream.fresh().normal(shape) * item.std if self.rank == 0 else None  # TFP: rank 0 deals
        return self._share(None if w0 is None else w0.float(), shape, src=0)

    def _offline(self, batch: int, train: bool) -> None:
        """Top the dealer's pool up to ``offline_steps`` steps of this step's plan
        when it holds less than one (collective; the same decision at every party)."""
        if self.pool is None:
            return
        plan = step_plan(batch, self.dims, self.out, self.n_mpc, train=train, lr=self.lr)
        steps = chunk_steps(
            pooled_bytes(plan),
            self.opts.offline_steps,
            self.ctx.proto.training.max_steps,
            full_batch=batch == self.ctx.proto.training.batch_size,
            train=train,
            ahead=self.lookahead.ahead(batch, train),
        )
        stock = {it: self.pool.stock(it) for it in plan}
        bundle = top_up(plan, stock, steps)
        if bundle:
            self.pool.prefetch(bundle)
        self.lookahead.took(batch, train)

    def forward_shares(self, h: torch.Tensor | None, batch: int, train: bool) -> Any:
        """Share every h'_i from its owner; return [z] at 32 fractional bits (the
        products' exact sum: revealed to A without a truncation in shares)."""
        self._offline(batch, train)
        hs = [self._share(h, (batch, d), src=src) for src, d in zip(self.passive, self.dims, strict=True)]
        prods = ops.beaver_matmuls([(hi, wi) for hi, wi in zip(hs, self.w, strict=True)])
        z = prods[0]
        for p in prods[1:]:
            z = z + p
        self._h = hs if train else []
        return z

    def backward_shares(self, g: torch.Tensor | None, batch: int) -> torch.Tensor | None:
        """Share dL/dz from A; reveal dL/dh'_i to P_i only; update W_i in shares.
        Returns this rank's revealed embedding gradient (passive ranks only).

        dL/dz of a batch-mean loss is O(1/B) per entry, close to the fixed-point
        resolution, so it is shared scaled by the nominal batch size (exact in
        plaintext at A) and the scale is removed after the reveal and in the
        learning rate (constant, so momentum buffers stay consistent).
        SGD with momentum as torch's: v <- m v + dW, W <- W - lr v."""
        scale = self.batch_scale
        g_enc = self._share(None if g is None else g * scale, (batch, self.out), src=0)
        k = len(self.w)
        material = self._trunc_material(batch)
        prods = ops.beaver_matmuls(
            [(g_enc, ops.transpose(w)) for w in self.w] + [(ops.transpose(h), g_enc) for h in self._h]
        )
        m = self.momentum
        raw_v = [
            gw if v is None else ops.scaled(v, m, FRAC_BITS) + gw
            for v, gw in zip(self.v, prods[k:], strict=True)
        ]
        # m v and h^T dL/dz are at 32 fractional bits: back to 16 (the momentum) and,
        # scaled by the learning rate, the weight step, both from one opening that
        # travels with the reveal of every dL/dh'_i
        mine, self.v, steps = ops.reveal_and_truncate(
            prods[:k], self.passive, raw_v, material, FRAC_BITS, self.lr
        )
        self.w = [w - s for w, s in zip(self.w, steps, strict=True)]
        self._h = []
        return None if mine is None else (mine / scale).float()

    def _trunc_material(self, batch: int) -> TruncShares:
        """This step's truncation material: from the pool (CPU), from the dealer on
        demand (CUDA), or dealt by rank 0 under TFP."""
        item = step_plan(batch, self.dims, self.out, self.n_mpc, train=True, lr=self.lr)[-1]
        assert isinstance(item, Trunc)
        if self.pool is not None:
            (shares,) = self.pool.take([item])
        elif self.provider is not None:
            (shares,) = self.provider.fetch([item])
        else:
            shares = ops.trusted_first_party_material(item)
        assert isinstance(shares, TruncShares)
        return shares

    def forward(self, h: torch.Tensor | None, batch: int, train: bool) -> torch.Tensor | None:
        """z at A (revealed by one reduce), None at the passive parties."""
        z = self.forward_shares(h, batch, train).get_plain_text(dst=0)
        return z if self.rank == 0 else None

    def backward(self, g: torch.Tensor | None, batch: int) -> torch.Tensor | None:
        return self.backward_shares(g, batch)

    def checkpoint_state(self) -> ComponentState:
        """This rank's CrypTen shares of every W_i and of its momentum, with their
        fixed-point precision: a share alone is uniformly random (docs/design.md §12)."""

        def saved(x: Any) -> dict[str, Any]:
            return {"share": ops.shares(x).cpu().clone(), "precision": ops.precision(x)}

        return ComponentState(
            {"w": [saved(w) for w in self.w], "v": [None if v is None else saved(v) for v in self.v]}
        )

    def restore(self, state: ComponentState) -> None:
        def load(x: dict[str, Any]) -> Any:
            return ops.from_shares(x["share"].to(self.device), int(x["precision"]))

        self.w = [load(w) for w in state.tensors["w"]]
        self.v = [None if v is None else load(v) for v in state.tensors["v"]]

    def finish(self) -> None:
        stop_crypten()


def _role(ctx: ExchangeContext) -> _MpcRole | PairRole:
    opts: MpcOptions = ctx.options  # type: ignore[assignment]
    if share_layout(opts, ctx.device.type) == "pairwise":
        return PairRole(ctx, weight_init=opts.weight_init, offline_steps=opts.offline_steps)
    return _MpcRole(ctx)


class MpcActive(ActiveExchange):
    def __init__(self, ctx: ExchangeContext):
        self.role = _role(ctx)
        self.provider = ctx.options.provider  # type: ignore[attr-defined]

    def forward(self, batch_size: int, *, train: bool) -> torch.Tensor:
        z = self.role.forward(None, batch_size, train)
        assert z is not None
        return z.float()

    def expect(self, plan: RunPlan) -> None:
        self.role.lookahead.expect(plan)

    def backward(self, grad_z: torch.Tensor) -> None:
        self.role.backward(grad_z.detach().float().cpu(), grad_z.shape[0])

    def checkpoint_state(self) -> ComponentState:
        return self.role.checkpoint_state()

    def restore(self, state: ComponentState) -> None:
        self.role.restore(state)

    def close(self) -> None:
        if self.provider == "TTP":
            c = comm.get()
            c.send_obj("terminate", c.get_ttp_rank(), c.ttp_group)
        self.role.finish()


class MpcPassive(PassiveExchange):
    def __init__(self, ctx: ExchangeContext):
        self.role = _role(ctx)
        self.device = ctx.device
        self._batch = 0

    def forward(self, h: torch.Tensor, *, train: bool) -> None:
        self._batch = h.shape[0]
        self.role.forward(h.detach().float().cpu(), self._batch, train)

    def expect(self, plan: RunPlan) -> None:
        self.role.lookahead.expect(plan)

    def backward(self) -> torch.Tensor:
        g = self.role.backward(None, self._batch)
        assert g is not None
        return g.float().to(self.device)

    def checkpoint_state(self) -> ComponentState:
        return self.role.checkpoint_state()

    def restore(self, state: ComponentState) -> None:
        self.role.restore(state)

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
        # every ring product the dealer computes (c = a b) on the CPU ring kernel
        self.served = serve_dealer(self.ctx.channel, self.ctx.channel.comm_failure, ring_matmul)
        stop_crypten()


class MpcRoles(Roles):
    """The role objects of ``mpc`` (its declaration: :class:`~securevfl.exchange.mpc.Mpc`)."""

    @classmethod
    def active(cls, ctx: ExchangeContext) -> ActiveExchange:
        return MpcActive(ctx)

    @classmethod
    def passive(cls, ctx: ExchangeContext) -> PassiveExchange:
        return MpcPassive(ctx)

    @classmethod
    def helper(cls, ctx: ExchangeContext) -> HelperExchange:
        return MpcDealer(ctx)
