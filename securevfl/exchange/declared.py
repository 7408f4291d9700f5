"""The declarations of the ``plain`` and ``mpc`` backends: their capabilities,
options and load-time checks, without their role objects (:mod:`.spec`).

Loading or validating a protocol reads these alone; the role objects
(:mod:`securevfl.exchange.plain`, :mod:`securevfl.exchange.mpc`, with torch and
CrypTen) are imported by the rank that builds its role. The mechanisms are
described in those modules.
"""

from __future__ import annotations

import os
import warnings
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from securevfl.config import Protocol
from securevfl.errors import ConfigError, CryptoParameterError
from securevfl.exchange.spec import SEEDED_WARNING, ExchangeBackend, check_weight_init


class Plain(ExchangeBackend):
    """No protection: P_i sends h'_i, A holds every W_i (:mod:`securevfl.exchange.plain`)."""

    name = "plain"
    capabilities = frozenset({"active_sees_embeddings", "cuda", "local_steps"})
    description = "no protection: h'_i sent in the clear (baseline)"


INSECURE_WARNING = (
    "mpc provider TFP: rank 0 generates all Beaver triples in the clear and can unmask "
    "every opened value; use only for debugging"
)

#: the environment variable that forces the ring-product kernel of ``mpc``, and its values
KERNEL_ENV = "SECUREVFL_RING_KERNEL"
KERNELS = ("int64", "limbs")


def forced_kernel() -> str | None:
    """The kernel ``SECUREVFL_RING_KERNEL`` names, None when it is unset; any other
    value is a :class:`ConfigError` (checked when an ``mpc`` protocol is loaded)."""
    forced = os.environ.get(KERNEL_ENV, "").strip().lower()
    if forced and forced not in KERNELS:
        raise ConfigError(f"{KERNEL_ENV}={forced!r}: the ring kernel is one of {', '.join(KERNELS)}")
    return forced or None


class MpcOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
    provider: Literal["TTP", "TFP"] = "TTP"
    insecure: bool = False
    weight_init: Literal["private", "seeded"] = "private"
    # offline phase: the dealer pre-generates this many steps' tuples per request (TTP only)
    offline_steps: int = Field(default=16, ge=1, le=1024)
    # pairwise: P_i's products shared by A and P_i alone (linear in k; needs TTP and CPU);
    # joint: every product shared by all k + 1 MPC parties (CrypTen's own protocols);
    # auto: pairwise where it can run, else joint
    layout: Literal["auto", "pairwise", "joint"] = "auto"


def share_layout(options: MpcOptions, device: str) -> str:
    """The share layout a run uses: ``auto`` is ``pairwise`` with the TTP dealer on
    CPU, ``joint`` otherwise (CrypTen's TFP provider, CUDA shares)."""
    if options.layout != "auto":
        return options.layout
    return "pairwise" if options.provider == "TTP" and device == "cpu" else "joint"


class Mpc(ExchangeBackend):
    """The interactive layer in CrypTen secret sharing (:mod:`securevfl.exchange.mpc`)."""

    name = "mpc"
    capabilities = frozenset({"cuda", "mpc"})
    options = MpcOptions
    description = "CrypTen secret sharing; z revealed to A only; dealer-provided triples"

    @classmethod
    def helper_names(cls, options: BaseModel) -> list[str]:
        return ["dealer"] if isinstance(options, MpcOptions) and options.provider == "TTP" else []

    @classmethod
    def check(cls, proto: Protocol, options: BaseModel) -> None:
        assert isinstance(options, MpcOptions)
        forced_kernel()  # a misspelt SECUREVFL_RING_KERNEL stops the run before any rank starts
        if options.provider == "TFP" and not options.insecure:
            raise CryptoParameterError(
                "CrypTen's TFP provider is insecure: rank 0 generates every Beaver triple in the "
                "clear and so learns every shared value; use provider: TTP (the default), or set "
                "insecure: true for debugging only",
                path="exchange.params.provider",
            )
        if options.insecure and options.provider == "TFP":
            warnings.warn(INSECURE_WARNING, stacklevel=2)
        check_weight_init(options)
        if options.layout == "pairwise" and (options.provider != "TTP" or proto.training.device != "cpu"):
            raise ConfigError(
                "the pairwise share layout needs the TTP dealer (its triples are generated per pair) "
                "and runs on CPU; use layout: joint (or auto)",
                path="exchange.params.layout",
            )

    @classmethod
    def result_info(cls, options: BaseModel) -> dict[str, Any]:
        info = super().result_info(options)
        assert isinstance(options, MpcOptions)
        flags = {INSECURE_WARNING: options.provider == "TFP", SEEDED_WARNING: options.weight_init == "seeded"}
        warned = [w for w, on in flags.items() if on]
        info["insecure"] = bool(warned)
        if warned:
            info["warning"] = "; ".join(warned)
        return info
