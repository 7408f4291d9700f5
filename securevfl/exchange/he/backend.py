"""An exchange backend from a homomorphic scheme: the two-party protocol
(:mod:`securevfl.exchange.he.protocol`) with the scheme's keys, options and checks."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from securevfl.config import Protocol
from securevfl.exchange.base import (
    SEEDED_WARNING,
    ActiveExchange,
    ExchangeBackend,
    ExchangeContext,
    PassiveExchange,
    check_weight_init,
)
from securevfl.exchange.he.protocol import HEActive, HEPassive
from securevfl.exchange.he.scheme import HEScheme


def he_backend(name: str, scheme_cls: type[HEScheme], description: str) -> type[ExchangeBackend]:
    """An exchange backend running the two-party protocol with a scheme (its
    package registers it in EXCHANGES by path, :mod:`securevfl.exchange`).
    The scheme's options model must have ``weight_init`` (:data:`HEWeightInit`) and
    ``insecure`` fields."""

    class _Backend(ExchangeBackend):
        capabilities = frozenset({"he"})
        options = scheme_cls.options
        scheme = scheme_cls

        @classmethod
        def check(cls, proto: Protocol, options: BaseModel) -> None:
            scheme_cls.check(proto, options)
            check_weight_init(options)

        @classmethod
        def active(cls, ctx: ExchangeContext) -> ActiveExchange:
            return HEActive(ctx, scheme_cls.for_run(ctx), ctx.options.weight_init)  # type: ignore[attr-defined]

        @classmethod
        def passive(cls, ctx: ExchangeContext) -> PassiveExchange:
            return HEPassive(ctx, scheme_cls.for_run(ctx), ctx.options.weight_init)  # type: ignore[attr-defined]

        @classmethod
        def result_info(cls, options: BaseModel) -> dict[str, Any]:
            info = super().result_info(options)
            info.update(scheme_cls.describe(options))
            info["insecure"] = options.weight_init == "seeded"  # type: ignore[attr-defined]
            if info["insecure"]:
                info["warning"] = SEEDED_WARNING
            return info

    _Backend.name = name
    _Backend.description = description
    _Backend.__name__ = _Backend.__qualname__ = f"{name.capitalize()}Backend"
    return _Backend
