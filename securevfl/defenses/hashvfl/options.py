"""HashVFL's options (docs/methods/hashvfl.md §8.1): the passive-side hash and the active-side
consistency loss with its detector. Plain models, so that an attack can ask what
a party runs (:meth:`securevfl.components.Components.options`) without building
the defense."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from securevfl.defenses.base import DefenseOptions


class HashOptions(DefenseOptions):
    """Options of the passive-side hash (docs/methods/hashvfl.md §8.1)."""

    batchnorm: bool = Field(
        default=True, description="BatchNorm1d(d) before Sign (False: the w/o-BN ablation)"
    )
    balance: Literal["off", "median"] = Field(
        default="off",
        description="off: Sign at 0 (the paper; BN's mean-centring is the only balancing); "
        "median: Sign(u - m) with m the batch median per unit in training and a running average of "
        "those medians at evaluation (the fix of docs/methods/hashvfl.md §7 item 5)",
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
        "(docs/methods/hashvfl.md §8.1 ablations; the paper's HashVFL: 0, GreedyHash: 1)",
    )
    send: Literal["codes", "continuous"] = Field(
        default="codes",
        description="codes: send Sign(V) in {-1, +1}^d (HashVFL); continuous: send V itself, NOT a hashed "
        "system (the official code's 'w/o consistency' arm of docs/methods/hashvfl.md Fig. 6; counted in "
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


class ConsistencyOptions(DefenseOptions):
    """Options of the active-side consistency loss and detector (docs/methods/hashvfl.md §8.1)."""

    codes: Literal["random", "balanced"] = Field(
        default="random",
        description="random: the paper's i.i.d. codes; balanced: every bit +1 for half the classes, "
        "max-min Hamming distance (the fix of docs/methods/hashvfl.md §7 items 5-6)",
    )
    code_seed: int | None = Field(default=None, description="seed of the class codes (default training.seed)")
    weight: float = Field(default=1.0, ge=0, description="lambda on the consistency loss (paper: 1)")
    threshold: float | None = Field(
        default=None, ge=0, description="detector flags Hamming > this (default d/2)"
    )
    window: int = Field(default=20, ge=1, description="detector statistics over the last N training steps")
