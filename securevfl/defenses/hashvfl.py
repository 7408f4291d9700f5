"""HashVFL (spec 004; Qiu et al., arXiv:2212.00325): passive parties send only
+-1 hash codes of their bottom-model output, and the active party pulls every
party's code toward a pre-defined code of the sample's class.

Two registered defenses, because the two halves need different things from the
exchange backend:

* ``hashvfl`` (passive): BatchNorm1d(d) -> Sign with a straight-through gradient
  (spec 004 §2.2-2.4), plus the optional DP add-on (§2.10). ``balance: median``
  (our fix for §7 item 5, not in the paper) thresholds each unit at its median
  instead of at 0, so that every bit is balanced whatever the unit's
  distribution. It only changes what the passive party computes and sends, so it
  runs under every backend. The ablations of spec 004 §8.1 are options of it too:
  ``batchnorm: false`` (w/o BN), ``quantization_weight`` (GreedyHash's
  ||V - Sign(V)||_3 as the party's local loss) and ``send: continuous`` (the
  official code's w/o-consistency arm, which sends V: not a hashed system).
* ``hashvfl_consistency`` (active): the consistency loss to the class codes
  (§2.5-2.6) and the abnormal-input detector (§2.9). Both read the codes h'_i,
  so it requires ``active_sees_embeddings`` (``plain``); under ``mpc``/``ckks``/
  ``paillier`` it is refused at load (the loss and the detector would have to be
  computed inside the secure computation, which no backend offers yet).

Threat model (spec 004 §1.2): honest-but-curious parties; the hash limits what
the active party (the paper's server, co-located with the label owner) learns
about a passive party's continuous features to d bits per sample per pass. It
does not protect the returned gradient, which carries -o_y/(N B d), a label
signal (§7 item 2), and the codes themselves encode the class (§7 item 3).

Mapping onto securevfl's split model: the paper's server top model is
Linear(N d, 16) -> ReLU -> Linear(16, C) over the concatenated codes. In
securevfl A computes z = sum_i h'_i W_i + b, which is exactly
concat(h'_1..h'_N) @ [W_1; ...; W_N] + b, i.e. the first Linear with
``interactive.out: 16``; the top model (``top.hidden: []``) is ReLU -> Linear(16, C).
The code length d is each passive party's ``model.out``.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Literal

import torch
from pydantic import Field, model_validator

from securevfl.config import Protocol
from securevfl.defenses.base import DEFENSES, Defense, DefenseContext, DefenseOptions
from securevfl.errors import ConfigError, ProtocolError, UnsupportedCombination
from securevfl.privacy import hashing
from securevfl.privacy.accountant import LaplaceRelease, Mechanism, Plan, RandomizedResponseRelease, epsilon
from securevfl.seeding import generator


def _passive_index(ctx: DefenseContext) -> int:
    for i, p in enumerate(ctx.proto.parties.passive):
        if p.name == ctx.party:
            return i
    raise ConfigError(f"party '{ctx.party}' is not a passive party", path="parties.passive")


class HashOptions(DefenseOptions):
    """Options of the passive-side hash (spec 004 §8.1)."""

    batchnorm: bool = Field(
        default=True, description="BatchNorm1d(d) before Sign (False: the w/o-BN ablation)"
    )
    balance: Literal["off", "median"] = Field(
        default="off",
        description="off: Sign at 0 (the paper; BN's mean-centring is the only balancing); "
        "median: Sign(u - m) with m the batch median per unit in training and a running average of "
        "those medians at evaluation (the fix of spec 004 §7 item 5)",
    )
    balance_eval: Literal["running", "batch"] = Field(
        default="running",
        description="with balance: median, the evaluation threshold: running (the running median; a code "
        "depends on its own row only) or batch (each evaluation batch's own median, as in training; every "
        "bit of a batch of distinct values is exactly balanced, and a code depends on its batch)",
    )
    balance_momentum: float = Field(
        default=0.1, gt=0, le=1, description="momentum of the running median (as BatchNorm's running mean)"
    )
    ste: Literal["identity", "clipped"] = Field(
        default="identity", description="identity: the paper's STE; clipped: zero gradient where |v| > 1"
    )
    dp: Literal["off", "paper", "code", "rr"] = Field(
        default="off",
        description="paper: Sign(Sign(v)+Lap(2/eps)); code: Sign(v)+Lap(2/eps) (continuous, official code); "
        "rr: per-bit randomized response at eps (the honest-DP fix)",
    )
    epsilon: float | None = Field(default=None, gt=0, description="the DP add-on's eps (required with dp)")
    dp_at_inference: bool = Field(default=True, description="also perturb the codes sent for evaluation")
    quantization_weight: float = Field(
        default=0.0,
        ge=0,
        description="weight of GreedyHash's quantization penalty ||V - Sign(V)||_3 over the batch matrix, "
        "V the pre-sign value (the BN output, or the bottom output without BN), divided by the number of "
        "passive parties (bn.py averages it over parties) and added to the party's local loss in training "
        "(spec 004 §8.1 ablations; the paper's HashVFL: 0, GreedyHash: 1)",
    )
    send: Literal["codes", "continuous"] = Field(
        default="codes",
        description="codes: send Sign(V) in {-1, +1}^d (HashVFL); continuous: send V itself, NOT a hashed "
        "system (the official code's 'w/o consistency' arm of spec 004 Fig. 6; counted in "
        "non_binary_values_sent)",
    )

    @model_validator(mode="after")
    def _eps(self) -> HashOptions:
        if self.dp != "off" and self.epsilon is None:
            raise ValueError(f"dp '{self.dp}' needs 'epsilon'")
        if self.dp == "off" and self.epsilon is not None:
            raise ValueError("'epsilon' is set but dp is 'off'")
        for key in ("balance_momentum", "balance_eval"):
            if self.balance == "off" and key in self.model_fields_set:
                raise ValueError(f"'{key}' is set but balance is 'off'")
        if self.send == "continuous":
            # each of these only shapes the +-1 code, which is not what is sent
            if self.dp != "off":
                raise ValueError("dp perturbs +-1 codes; send: continuous sends no codes")
            if self.balance != "off":
                raise ValueError("balance sets the sign's threshold; send: continuous sends no codes")
            if "ste" in self.model_fields_set:
                raise ValueError("ste is the sign's gradient; send: continuous sends no codes")
        return self


class _BalanceCounter:
    """+1 counts per bit over a stretch of batches."""

    def __init__(self) -> None:
        self.ones: torch.Tensor | None = None
        self.rows = 0

    def add(self, codes: torch.Tensor) -> None:
        ones = (codes > 0).sum(0).double().cpu()
        self.ones = ones if self.ones is None else self.ones + ones
        self.rows += codes.shape[0]

    def summary(self) -> dict[str, Any]:
        if self.ones is None or not self.rows:
            return {}
        frac = (self.ones / self.rows).float()
        return {
            "rows": self.rows,
            "plus_fraction": [round(float(f), 4) for f in frac],
            "entropy_bits_mean": float(hashing.bit_entropy(frac).mean()),
            "mean_abs_deviation": float((frac - 0.5).abs().mean()),
        }


class MedianThreshold(torch.nn.Module):
    """Running per-unit median of the bottom model's output v (before BN), for
    the ``balance: median`` hash (spec 004 §7 item 5). It has no trainable
    parameters; the running median is a buffer, so it travels with the party's
    defense modules like BN's running statistics.

    It is kept before BN, not after, so that evaluation compares like with like:
    BN is a per-unit monotone affine map, so Sign(BN(v) - BN(m)) = Sign(gamma)
    Sign(v - m) whichever statistics BN uses, and the test codes do not depend on
    how far BN's running statistics differ from the training batches' (which, on
    skewed units, shifts a threshold kept after BN)."""

    def __init__(self, bits: int, momentum: float):
        super().__init__()
        self.momentum = momentum
        self.register_buffer("running", torch.zeros(bits))
        self.register_buffer("batches", torch.zeros((), dtype=torch.long))

    @torch.no_grad()
    def observe(self, v: torch.Tensor) -> None:
        """Fold a training batch's median into the running one (the first batch's
        median starts it, rather than an average with 0)."""
        m = hashing.column_median(v)
        first = int(self.batches) == 0
        self.running.copy_(m if first else hashing.running_update(self.running, m, self.momentum))
        self.batches += 1


@DEFENSES.register("hashvfl")
class HashVFL(Defense):
    """Passive side of HashVFL (spec 004 §2.2-2.4, §2.10): the party sends
    Sign(BN(f_i(x))) in {-1, +1}^d and trains through the sign with a
    straight-through gradient. The BatchNorm is a trainable module of the party.

    ``balance: median`` (spec 004 §7 item 5): the party sends Sign(BN(v) - BN(m))
    instead, m the per-unit batch median of v in training and a running average
    of those medians at evaluation. BN centres the mean, which balances a bit
    only for a distribution symmetric about it; the median balances it for any
    distribution, exactly on every training batch. Same straight-through
    gradient, the threshold held constant.

    DP add-on (spec 004 §2.10, §7 item 1), threat model: the receiver of the codes
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
        self.noise = generator(ctx.noise_seed, "hashvfl", "dp")  # private, never the shared seed
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
        (spec 004 §8.1 GreedyHash / w/o-consistency ablations).

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
        """Sound accounting of the DP add-on over the training rows (spec 004 §7 item 1).

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

    def report(self) -> dict[str, Any]:
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


class ConsistencyOptions(DefenseOptions):
    """Options of the active-side consistency loss and detector (spec 004 §8.1)."""

    codes: Literal["random", "balanced"] = Field(
        default="random",
        description="random: the paper's i.i.d. codes; balanced: every bit +1 for half the classes, "
        "max-min Hamming distance (the fix of spec 004 §7 items 5-6)",
    )
    code_seed: int | None = Field(default=None, description="seed of the class codes (default training.seed)")
    weight: float = Field(default=1.0, ge=0, description="lambda on the consistency loss (paper: 1)")
    threshold: float | None = Field(
        default=None, ge=0, description="detector flags Hamming > this (default d/2)"
    )
    window: int = Field(default=20, ge=1, description="detector statistics over the last N training steps")


@DEFENSES.register("hashvfl_consistency")
class HashVFLConsistency(Defense):
    """Active side of HashVFL (spec 004 §2.5, §2.6, §2.9): adds
    weight * (1/N) sum_i mean_u (1 - <h_i, o_y>/d) to the loss, whose gradient
    -o_y/(N B d) reaches each passive party through the returned dL/dh'_i, and
    runs the detector (pairwise and against o_{y_hat}) on every training batch.

    Threat model: it needs the codes in the clear at A, so it requires
    ``active_sees_embeddings``; the codes o are generated from a seed every rank
    knows and are written to the result.
    """

    name = "hashvfl_consistency"
    sides = frozenset({"active"})
    needs_classes = "its loss pulls each embedding towards its label's class code"
    requires = frozenset({"active_sees_embeddings"})
    options = ConsistencyOptions
    local_steps_refusal = "it trains with the passive party's hashvfl, which refuses local steps"

    def __init__(self, params: ConsistencyOptions, ctx: DefenseContext):
        super().__init__(params, ctx)
        j = [d.name for d in ctx.proto.parties.active.defenses].index(self.name)
        self.check(ctx.proto, params, backend=None, path=f"parties.active.defenses[{j}]")
        self.bits = next(p.model.out for p in ctx.proto.parties.passive if p.model is not None)
        self.codes: torch.Tensor | None = None
        self._window: deque[dict[str, float]] = deque(maxlen=params.window)
        self._totals = {"samples": 0, "pair_flagged": 0, "to_pred_flagged": 0}
        self._eval: list[dict[str, float]] = []  # the latest evaluation pass, per batch
        self._eval_passes = 0

    @classmethod
    def check(
        cls, proto: Protocol, params: Any, *, backend: Any, path: str, source: str | None = None
    ) -> None:
        """At load: every passive party runs ``hashvfl`` with one code length (the
        loss compares each party's code with one class code). 2^d >= C is checked
        when the rank knows C, before training."""
        passive = proto.parties.passive
        widths = {p.model.out for p in passive if p.model is not None}
        if len(widths) != 1:
            raise ConfigError(
                f"HashVFL compares every party's code with one class code, so every passive party needs the "
                f"same model.out; got {sorted(widths)}",
                path=path,
                source=source,
            )
        missing = [p.name for p in passive if "hashvfl" not in {d.name for d in p.defenses}]
        if missing:
            raise ConfigError(
                f"the consistency loss compares +-1 codes; passive parties {missing} do not run 'hashvfl'",
                path=path,
                source=source,
            )
        continuous = [
            p.name
            for p in passive
            for d in p.defenses
            if d.name == "hashvfl" and d.params.get("send", "codes") == "continuous"
        ]
        if continuous:
            raise ConfigError(
                f"the consistency loss and the detector compare +-1 codes; passive parties {continuous} "
                "run hashvfl with send: continuous",
                path=path,
                source=source,
            )

    @property
    def threshold(self) -> float:
        return self.params.threshold if self.params.threshold is not None else self.bits / 2

    def _class_codes(self, classes: int, device: torch.device) -> torch.Tensor:
        if self.codes is None:
            seed = self.params.code_seed if self.params.code_seed is not None else self.ctx.seed
            self.codes = hashing.class_codes(
                classes, self.bits, self.params.codes, generator(seed, "hashvfl", "codes")
            )
        return self.codes.to(device)

    def top_loss(
        self,
        z: torch.Tensor,
        logits: torch.Tensor,
        y: torch.Tensor,
        embeddings: list[torch.Tensor] | None = None,
    ) -> torch.Tensor | None:
        if embeddings is None:
            raise UnsupportedCombination(
                "hashvfl_consistency needs the passive parties' codes at the active party "
                "(backend capability 'active_sees_embeddings')"
            )
        codes = self._class_codes(logits.shape[1], logits.device)
        loss = hashing.consistency_loss(embeddings, codes[y])
        with torch.no_grad():
            row = self._detect([h.detach() for h in embeddings], codes, logits.detach(), y)
        self._window.append(row)
        for k in self._totals:
            self._totals[k] += int(row[k])
        return self.params.weight * loss

    def begin_eval(self) -> None:
        self._eval = []
        self._eval_passes += 1

    def observe_eval(
        self, logits: torch.Tensor, y: torch.Tensor, embeddings: list[torch.Tensor] | None
    ) -> None:
        """The detector on test traffic (spec 004 §2.9 runs it at inference)."""
        if embeddings is None:  # refused at load; kept for a backend that stops showing them
            return
        with torch.no_grad():
            codes = self._class_codes(logits.shape[1], logits.device)
            self._eval.append(self._detect([h.detach() for h in embeddings], codes, logits.detach(), y))

    def _detect(
        self, hs: list[torch.Tensor], codes: torch.Tensor, logits: torch.Tensor, y: torch.Tensor
    ) -> dict[str, float]:
        """Detector statistics of one batch: flags (pairwise, against o_{y_hat}),
        pairwise Hamming sums for correct and wrong predictions, exact matches."""
        pred = logits.argmax(1)
        det = hashing.detect(hs, codes[pred], self.threshold)
        correct = (pred == y).cpu()
        exact = torch.stack([(hashing.hamming(h, codes[y]) == 0).float().cpu() for h in hs]).mean()
        row = {
            "samples": float(len(y)),
            "pair_flagged": float(det["pair_flag"].float().sum()),
            "to_pred_flagged": float(det["to_pred_flag"].float().sum()),
            "pair_ham_correct_sum": float(det["pair_max"][correct].sum()),
            "correct": float(correct.sum()),
            "pair_ham_wrong_sum": float(det["pair_max"][~correct].sum()),
            "wrong": float((~correct).sum()),
            "match_class_code": float(exact) * len(y),
        }
        return row

    def report(self) -> dict[str, Any]:
        if self.codes is None:
            return {}
        dmin, at_min, imbalance = hashing.code_quality(self.codes)
        out = {
            "code_kind": self.params.codes,
            "class_codes": self.codes.int().tolist(),
            "code_min_hamming": dmin,
            "code_pairs_at_min": at_min,
            "code_bit_imbalance": imbalance,
            "threshold": self.threshold,
            "detector_last_steps": {"steps": len(self._window), **_detector_rates(list(self._window))},
            "detector_totals": dict(self._totals),
        }
        if self._eval:
            out["detector_eval"] = {"passes": self._eval_passes, **_detector_rates(self._eval)}
        return out


def _detector_rates(rows: list[dict[str, float]]) -> dict[str, float | None]:
    """Flag rates, mean pairwise Hamming for correct and wrong predictions (the
    Table VI statistic) and the exact-match rate over batches' detector rows."""
    w = {k: sum(r[k] for r in rows) for k in rows[0]} if rows else {}
    n = w.get("samples", 0.0)

    def ratio(a: float, b: float) -> float | None:
        return a / b if b else None

    return {
        "samples": int(n),
        "pair_flag_rate": ratio(w.get("pair_flagged", 0.0), n),
        "to_pred_flag_rate": ratio(w.get("to_pred_flagged", 0.0), n),
        "pair_hamming_correct": ratio(w.get("pair_ham_correct_sum", 0.0), w.get("correct", 0.0)),
        "pair_hamming_wrong": ratio(w.get("pair_ham_wrong_sum", 0.0), w.get("wrong", 0.0)),
        "match_class_code_rate": ratio(w.get("match_class_code", 0.0), n),
    }
