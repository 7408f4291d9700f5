"""What the homomorphic backends declare alike (``ckks``, ``paillier``): the
capability ``he``, the check of their ``weight_init``/``insecure`` options, and
what a run's result records about them. A scheme package's face subclasses
:class:`HEBackend` with its name, options, load-time checks and role objects
(:mod:`securevfl.exchange.he.roles`). Like every declaration it imports neither
torch nor a scheme's library (:mod:`securevfl.exchange.spec`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel

from securevfl.config import Protocol
from securevfl.exchange.spec import SEEDED_WARNING, ExchangeBackend, check_weight_init

#: ``exchange.params.weight_init`` of the HE backends (:mod:`securevfl.exchange.he.protocol`, "Start")
HEWeightInit = Literal["private", "seeded"]


class HEBackend(ExchangeBackend):
    """A two-party HE backend's declaration. Its options model must have
    ``weight_init`` (:data:`HEWeightInit`) and ``insecure`` fields; a subclass sets
    ``name``, ``roles``, ``options``, ``description`` and overrides
    :meth:`check_scheme` and :meth:`describe`."""

    capabilities = frozenset({"he"})

    @classmethod
    def check(cls, proto: Protocol, options: BaseModel) -> None:
        cls.check_scheme(proto, options)
        check_weight_init(options)

    @classmethod
    def check_scheme(cls, proto: Protocol, options: BaseModel) -> None:
        """Refuse insecure parameters at load (CryptoParameterError) and sizes the
        scheme cannot carry (ConfigError)."""

    @classmethod
    def describe(cls, options: BaseModel) -> dict[str, Any]:
        """The scheme's security figures for the result record."""
        return {}

    @classmethod
    def result_info(cls, options: BaseModel) -> dict[str, Any]:
        info = super().result_info(options)
        info.update(cls.describe(options))
        info["insecure"] = options.weight_init == "seeded"  # type: ignore[attr-defined]
        if info["insecure"]:
            info["warning"] = SEEDED_WARNING
        return info
