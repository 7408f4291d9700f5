"""``mpc``: the interactive layer inside CrypTen secret sharing (docs/design.md §4).

Every passive party P_i secret-shares its (defended) embedding h'_i from its own
rank; the blocks W_i exist only as shares; z = sum_i h'_i W_i is computed on
shares and revealed to A alone; dL/dz is shared by A; dL/dh'_i = dL/dz W_i^T is
revealed to P_i alone; the weight gradients h'_i^T dL/dz and the
SGD-with-momentum update stay in shares.

Two share layouts (``layout``): ``pairwise`` (:mod:`.pairwise`; what ``auto``
picks with the TTP dealer on CPU) shares W_i and P_i's products between A and
P_i alone, so a step is k two-party computations and its cost grows linearly in
k; ``joint`` (:mod:`.roles`) shares every product among all k + 1
MPC parties with CrypTen's own protocols (TFP, CUDA). What follows describes the
joint layout; the pairwise one is described in :mod:`.pairwise`.

Who learns what: A learns z (and dL/dz, which it computes); P_i learns
dL/dh'_i; every other message is a share or a Beaver-masked opening, uniformly
random in Z_2^64. Correlated randomness comes from a trusted dealer rank (the
``TTP`` provider, semi-honest and not colluding with any party). CrypTen's
``TFP`` provider lets rank 0 generate every triple in the clear, so rank 0 (A)
could unmask all openings: it is refused unless ``insecure: true``.

Rounds (docs/crypto-performance.md §7; counts in :mod:`.plan`): the dealer's
tuples for up to ``offline_steps`` steps come in one offline bundle
(:mod:`securevfl.exchange.mpc.crypten.provider`); online, a training step opens all its
forward products in one round and all its backward products in another
(:mod:`.ops`), reveals z to A in one reduce, and reveals every dL/dh'_i to its
owner in one round that also opens the truncation of the momentum and the weight
update for all parties: 4 rounds whatever the number of passive parties.

Numerics: CrypTen's fixed point with 16 fractional bits (resolution 1.5e-5) for
shared inputs, weights and momentum. Products are not truncated in shares when
they need not be: z and dL/dh'_i are opened at 32 fractional bits and divided in
plaintext by their receiver (the same values at a finer resolution), and
h'_i^T dL/dz enters the momentum update untruncated; the momentum and the weight
step are two exact truncations of one opening (:mod:`securevfl.exchange.mpc.truncation`,
the dealer's material; each rounds its last unit stochastically, never wraps).
The learning rate over the batch-size scale is a public integer with 16
significant bits (CrypTen's 2^-16 encoding truncates the default 0.05 / 256 to 12 / 2^16, 6% low).
Initial weights: ``private`` (default) has the dealer draw W_i^0 ~ N(0, 1/(3 d_i))
and share it among the MPC parties (:class:`~securevfl.exchange.mpc.crypten.items.Init`):
every share alone is uniform in the ring and independent of W_i^0, which the
dealer alone knows (a value independent of the data, within the trusted-dealer
model); ``seeded`` lets A share the same W_i^0 that ``plain`` builds from the
protocol seed, so runs can be compared step by step with ``plain`` (every party
could recompute W_i^0: verification only, refused without ``insecure: true``).
Under the insecure TFP provider rank 0 plays the dealer's part, in the clear.

This face is the declaration alone (:mod:`securevfl.exchange.spec`): the options,
the load-time checks and the helper rank; the role objects, with torch and
CrypTen, are :mod:`.roles`, imported by the rank that builds its role.
"""

from __future__ import annotations

import os
import warnings
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from securevfl.config import Protocol
from securevfl.errors import ConfigError, CryptoParameterError
from securevfl.exchange.spec import SEEDED_WARNING, ExchangeBackend, check_weight_init

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
    """The interactive layer in CrypTen secret sharing (:mod:`.roles`)."""

    name = "mpc"
    roles = "securevfl.exchange.mpc.roles:MpcRoles"
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
