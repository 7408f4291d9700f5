"""``hashvfl``, the passive side of HashVFL (docs/methods/hashvfl.md §2.2-2.4, §2.10, §8.1):
BatchNorm, Sign with a straight-through gradient, the optional median
threshold, the DP add-on and GreedyHash's quantization penalty. It only changes
what the passive party computes and sends, so it runs under every backend."""

from __future__ import annotations

from typing import Any

import torch

from securevfl.defenses.base import Defense, DefenseContext
from securevfl.defenses.hashvfl.balance import MedianThreshold, _BalanceCounter
from securevfl.defenses.hashvfl.options import HashOptions
from securevfl.errors import ConfigError, ProtocolError
from securevfl.privacy import hashing
from securevfl.privacy.accountant import LaplaceRelease, Mechanism, Plan, RandomizedResponseRelease, epsilon
from securevfl.privacy.correlated import UnboundedRelease


def _passive_index(ctx: DefenseContext) -> int:
    for i, p in enumerate(ctx.proto.parties.passive):
        if p.name == ctx.party:
            return i
    raise ConfigError(f"party '{ctx.party}' is not a passive party", path="parties.passive")


class HashVFL(Defense[HashOptions]):
    """Passive side of HashVFL (docs/methods/hashvfl.md §2.2-2.4, §2.10): the party sends
    Sign(BN(f_i(x))) in {-1, +1}^d and trains through the sign with a
    straight-through gradient. The BatchNorm is a trainable module of the party.

    ``balance: median`` (docs/methods/hashvfl.md §7 item 5): the party sends Sign(BN(v) - BN(m))
    instead, m the per-unit batch median of v in training and a running average
    of those medians at evaluation. BN centres the mean, which balances a bit
    only for a distribution symmetric about it; the median balances it for any
    distribution, exactly on every training batch. Same straight-through
    gradient, the threshold held constant.

    DP add-on (docs/methods/hashvfl.md §2.10, §7 item 1), threat model: the receiver of the codes
    (A) learns at most what the randomized bits reveal. ``paper`` and ``rr`` keep
    the codes +-1; ``code`` sends continuous values. The sound figure is
    per-bit randomized response composed over every bit a record can change
    (see :meth:`mechanisms`); the paper's (eps, 1 - e^(-eps/2)) is reported as its
    claim.
    """

    name = "hashvfl"
    sides = frozenset({"passive"})
    options = HashOptions
    local_steps_refusal = (
        "a code is Sign(BN(h)) of one batch: recomputing it in a local step would move the BatchNorm "
        "and median statistics without a release, and the consistency loss at A needs the codes of "
        "the step it trains on"
    )

    @classmethod
    def emits_codes(cls, params: HashOptions) -> bool | None:  # type: ignore[override]
        """+-1 unless it sends V (``send: continuous``) or Laplace-noised codes (``dp: code``)."""
        return params.send == "codes" and params.dp != "code"

    def __init__(self, params: HashOptions, ctx: DefenseContext):
        super().__init__(params, ctx)
        spec = ctx.proto.parties.passive[_passive_index(ctx)]
        assert spec.model is not None
        self.bits = spec.model.out
        self.bn = torch.nn.BatchNorm1d(self.bits, eps=1e-5, momentum=0.1) if params.batchnorm else None
        self.median = (
            MedianThreshold(self.bits, params.balance_momentum) if params.balance == "median" else None
        )
        self.noise = ctx.noise_stream("hashvfl", "dp")  # private, never the shared seed
        self._train_stats = _BalanceCounter()
        self._eval_stats = _BalanceCounter()
        self._last_train: bool | None = None
        self._non_binary_sent = 0
        self._sent = 0
        # (bottom output h, pre-sign V) of the latest training embed, for local_loss
        self._pre_sign: tuple[torch.Tensor, torch.Tensor] | None = None
        self._quantization_last: float | None = None

    def _normalize(self, h: torch.Tensor, train: bool) -> torch.Tensor:
        if self.bn is None:
            return h
        # a training batch of one row has no batch variance: use the running statistics
        self.bn.train(train and h.shape[0] > 1)
        return self.bn(h)

    @torch.no_grad()
    def _threshold(self, h: torch.Tensor, u: torch.Tensor, train: bool) -> torch.Tensor:
        """The ``balance: median`` threshold in the space of u = BN(h): in
        training (and at evaluation with ``balance_eval: batch``) the batch median
        of u, which is BN(median of h) since BN is monotone per unit; otherwise
        BN, in evaluation mode, of the running median of h. Training batches also
        update the running median. A batch of one row uses the running median."""
        assert self.median is not None
        if h.shape[0] > 1 and (train or self.params.balance_eval == "batch"):
            if train:
                self.median.observe(h)
            return hashing.column_median(u)
        m = self.median.running[None].to(u.dtype)
        if self.bn is not None:
            self.bn.eval()  # _normalize sets the mode again on every call
            m = self.bn(m)
        return m[0]

    def embed(self, h: torch.Tensor, *, train: bool) -> torch.Tensor:
        if h.shape[1] != self.bits:
            raise ConfigError(
                f"hashvfl expected {self.bits}-wide bottom outputs, got {h.shape[1]}",
                path=f"parties.passive[{_passive_index(self.ctx)}].model.out",
            )
        u = self._normalize(h, train)
        p = self.params
        # V: the value that is signed (u, or u minus the constant median threshold)
        v = u - self._threshold(h, u, train).detach() if self.median is not None else u
        if train and p.quantization_weight > 0:
            self._pre_sign = (h, v)
        if p.send == "continuous":
            self._observe(v.detach(), train)
            return v
        clean = hashing.sign_ste(v, clipped=p.ste == "clipped")
        out = clean
        if p.dp != "off" and (train or p.dp_at_inference):
            assert p.epsilon is not None
            noisy = hashing.dp_noise(clean.detach(), p.dp, p.epsilon, self.noise)
            out = hashing.straight_through(clean, noisy)
        self._observe(out.detach(), train)
        return out

    def local_loss(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor | None:
        """quantization_weight * ||V - Sign(V)||_3 on the V of this training step
        (docs/methods/hashvfl.md §8.1 GreedyHash / w/o-consistency ablations).

        V is the very tensor :meth:`embed` signed (kept from it, not recomputed,
        so BN's running statistics move once per step), so the penalty's gradient
        reaches BN's gamma and beta and the bottom model through the same graph
        as the returned dL/dH; Sign(V) is a constant (see
        :func:`~securevfl.privacy.hashing.quantization_norm`). Each party
        penalises its own codes, so the joint objective is
        CE + weight * (1/N) sum_i ||V_i - H_i||_3 over the N passive parties,
        the official ``bn.py`` normalisation (its norm term is averaged over the
        parties).

        Unlike ``bn.py``, the penalty here has a gradient: there H is the output
        of the identity-STE sign, so d(V - H)/dV = 0 and the term only changes the
        logged loss (its "greedy" arm trains as no BN + CE only)."""
        if self.params.quantization_weight == 0:
            return None
        if self._pre_sign is None or self._pre_sign[0] is not h:
            raise ProtocolError(
                "hashvfl's quantization penalty needs the pre-sign value of the same step's training embed"
            )
        _, v = self._pre_sign
        self._pre_sign = None
        loss = hashing.quantization_norm(v)
        self._quantization_last = float(loss.detach())
        return self.params.quantization_weight * loss / len(self.ctx.proto.parties.passive)

    def _observe(self, codes: torch.Tensor, train: bool) -> None:
        """Bit balance of the latest training stretch and the latest evaluation
        pass (reset whenever the mode changes), and a count of sent values that
        are not +-1 (non-zero only with ``dp: code``)."""
        if self._last_train is not train:
            if train:
                self._train_stats = _BalanceCounter()
            else:
                self._eval_stats = _BalanceCounter()
        self._last_train = train
        (self._train_stats if train else self._eval_stats).add(codes)
        self._sent += codes.numel()
        self._non_binary_sent += int((codes.abs() != 1).sum())

    def modules(self) -> list[torch.nn.Module]:
        return [m for m in (self.bn, self.median) if m is not None]

    @property
    def _batch_coupled(self) -> bool:
        """True when a training code depends on the other rows of its batch
        (BN's batch statistics or the batch median)."""
        return self.bn is not None or self.median is not None

    @property
    def _eval_batch_coupled(self) -> bool:
        """True when an evaluation code depends on the other rows of its batch."""
        return self.median is not None and self.params.balance_eval == "batch"

    def _release(self, count: int) -> RandomizedResponseRelease | LaplaceRelease:
        p = self.params
        assert p.epsilon is not None
        if p.dp == "paper":
            return RandomizedResponseRelease(count=count, epsilon=hashing.paper_bit_epsilon(p.epsilon))
        if p.dp == "rr":
            return RandomizedResponseRelease(count=count, epsilon=p.epsilon)
        # code: Laplace of scale 2/eps on a bit whose sensitivity is 2
        return LaplaceRelease(count=count, scale=1.0 / p.epsilon)

    def _bits_per_step(self, batch_size: int) -> int:
        """Bits of one training step's release that one record can change: its
        own d bits without BN or median; with BN in training mode the batch mean
        and variance, and with ``balance: median`` the batch median, couple every
        code of the batch to every record in it."""
        return self.bits * (batch_size if self._batch_coupled else 1)

    def mechanisms(self, plan: Plan) -> list[Mechanism]:
        """Sound accounting of the DP add-on over the training rows (docs/methods/hashvfl.md §7 item 1).

        Each bit is randomized response (``paper``: eps' = ln(2 e^(eps/2) - 1);
        ``rr``: eps) or Laplace (``code``); a record's replacement can change
        ``_bits_per_step`` bits per step it appears in, all composed by the
        accountant. Not covered (as for every embedding-noise defense): the
        dependence of other records' codes on the bottom model trained with it,
        and the unprotected returned gradient.
        """
        p = self.params
        if p.dp == "off":
            return []
        assert p.epsilon is not None
        per_step = self._bits_per_step(plan.batch_size)
        notes = [
            f"{per_step} bits per training step a record appears in "
            + (
                "(batch_size x d: BatchNorm or the batch median in training mode couples every code of a "
                "batch to every record)"
                if self._batch_coupled
                else "(its own d bits; no BatchNorm, no median threshold)"
            ),
            "the returned gradient and the bottom model's dependence on the record are not covered",
        ]
        if p.dp_at_inference and plan.evaluations:
            # an evaluation batch's median couples its codes as the training batch's does
            per_eval = self.bits * (plan.batch_size if self._eval_batch_coupled else 1)
            test = epsilon([self._release(per_eval * plan.evaluations)], self.ctx.proto.privacy.delta)
            notes.append(
                f"test rows (not training rows) get {plan.evaluations} evaluation releases of {per_eval} "
                f"bits each: eps={test:.4g} at delta={self.ctx.proto.privacy.delta:g}"
            )
        claim: dict[str, Any] = {"source": "HashVFL Sec. V-E, per code release, no composition"}
        if p.dp == "paper":
            claim.update({"epsilon": p.epsilon, "delta": hashing.paper_claimed_delta(p.epsilon)})
        return [
            Mechanism(
                name=f"hashvfl_{p.dp}",
                releases=(self._release(per_step * plan.record_releases),),
                claim=claim,
                notes=tuple(notes),
            )
        ]

    def prediction_mechanisms(self) -> list[Mechanism]:
        """One prediction releases each predicted record's code once, as an evaluation does: its
        own d bits, or every code of its evaluation batch under ``balance_eval: batch`` (the batch
        median couples them), through the DP add-on under ``dp_at_inference`` and without noise
        otherwise (no finite figure). Nothing when the add-on is off (no DP claim to spend)."""
        p = self.params
        if p.dp == "off":
            return []
        per_eval = self.bits * (self.ctx.proto.training.batch_size if self._eval_batch_coupled else 1)
        release: RandomizedResponseRelease | LaplaceRelease | UnboundedRelease = (
            self._release(per_eval)
            if p.dp_at_inference
            else UnboundedRelease(
                count=1, reason="dp_at_inference off: predicted codes are released without noise"
            )
        )
        notes = (f"{per_eval} bits of each predicted record's release per prediction",)
        return [Mechanism(name=f"hashvfl_{p.dp}", releases=(release,), notes=notes)]

    def public_report(self) -> dict[str, Any]:
        """The options and the code length the protocol gives (the bottom model's output)."""
        return {**super().public_report(), "code_bits": self.bits}

    def report(self) -> dict[str, Any]:
        """The party's own statistics of its codes (bit balance, the running median,
        the last quantization norm): computed from its data, sent nowhere."""
        out: dict[str, Any] = {
            "code_bits": self.bits,
            "batchnorm": self.bn is not None,
            "balance": self.params.balance,
            "balance_eval": self.params.balance_eval if self.median is not None else None,
            "send": self.params.send,
            "quantization_weight": self.params.quantization_weight,
            "quantization_norm_last": self._quantization_last,
            "values_sent": self._sent,
            "non_binary_values_sent": self._non_binary_sent,
            "train_bits": self._train_stats.summary(),
            "test_bits": self._eval_stats.summary(),
        }
        if self.median is not None:
            out["running_median"] = [round(float(m), 4) for m in self.median.running]
        p = self.params
        if p.dp != "off":
            assert p.epsilon is not None
            flip = {
                "paper": hashing.paper_flip_probability(p.epsilon),
                "rr": hashing.rr_flip_probability(p.epsilon),
                "code": None,
            }[p.dp]
            out["dp"] = {"mode": p.dp, "epsilon": p.epsilon, "flip_probability": flip}
        return out
