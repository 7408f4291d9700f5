"""``hashvfl_consistency``, the active side of HashVFL (docs/methods/hashvfl.md §2.5, §2.6,
§2.9): the consistency loss pulling every passive party's code toward its class
code, and the abnormal-input detector (:mod:`.detector`) on the same codes."""

from __future__ import annotations

from typing import Any

import torch

from securevfl.components import Components
from securevfl.config import Protocol
from securevfl.defenses.base import Defense, DefenseContext
from securevfl.defenses.hashvfl.detector import Detector
from securevfl.defenses.hashvfl.options import ConsistencyOptions, HashOptions
from securevfl.errors import ConfigError, UnsupportedCombination
from securevfl.privacy import hashing
from securevfl.seeding import generator


class HashVFLConsistency(Defense[ConsistencyOptions]):
    """Active side of HashVFL (docs/methods/hashvfl.md §2.5, §2.6, §2.9): adds
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
        self.cross_check(ctx.proto, ctx.components, params, path=f"parties.active.defenses[{j}]")
        self.bits = next(p.model.out for p in ctx.proto.parties.passive if p.model is not None)
        self.codes: torch.Tensor | None = None
        self.detector = Detector(self.threshold, params.window)

    @classmethod
    def check(
        cls, proto: Protocol, params: Any, *, backend: Any, path: str, source: str | None = None
    ) -> None:
        """At load: every passive party's code has one length (the loss compares
        each party's code with one class code). 2^d >= C is checked when the rank
        knows C, before training."""
        passive = proto.parties.passive
        widths = {p.model.out for p in passive if p.model is not None}
        if len(widths) != 1:
            raise ConfigError(
                f"HashVFL compares every party's code with one class code, so every passive party needs the "
                f"same model.out; got {sorted(widths)}",
                path=path,
                source=source,
            )

    @classmethod
    def cross_check(
        cls, proto: Protocol, components: Components, params: Any, *, path: str, source: str | None = None
    ) -> None:
        """At load: every passive party runs ``hashvfl`` and sends its +-1 codes."""
        comps = components
        missing = [p.name for p in comps.passive if comps.options(p.name, HashOptions) is None]
        if missing:
            raise ConfigError(
                f"the consistency loss compares +-1 codes; passive parties {missing} do not run 'hashvfl'",
                path=path,
                source=source,
            )
        continuous = [
            p.name
            for p in comps.passive
            for d in p.defenses
            if isinstance(d.options, HashOptions) and d.options.send == "continuous"
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
        self.detector.observe_train(embeddings, codes, logits, y)
        return self.params.weight * loss

    def begin_eval(self) -> None:
        self.detector.begin_eval()

    def observe_eval(
        self, logits: torch.Tensor, y: torch.Tensor, embeddings: list[torch.Tensor] | None
    ) -> None:
        """The detector on test traffic (docs/methods/hashvfl.md §2.9 runs it at inference)."""
        if embeddings is None:  # refused at load; kept for a backend that stops showing them
            return
        with torch.no_grad():
            codes = self._class_codes(logits.shape[1], logits.device)
        self.detector.observe_eval(embeddings, codes, logits, y)

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
            **self.detector.report(),
        }
        return out
