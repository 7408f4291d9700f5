"""What an exchange backend declares, apart from how it runs (docs/design.md §4).

A backend is one class registered by name in :data:`EXCHANGES`. It declares

* ``capabilities``: what it offers, e.g. ``active_sees_embeddings`` (A receives
  h'_i in the clear), ``cuda``, or ``local_steps`` (FedBCD rounds); defenses and
  attacks state what they require, and a protocol asking for a combination that
  cannot work is rejected at load;
* ``options``: a strict pydantic model of its ``exchange.params``;
* ``helper_names``: extra ranks it needs (a dealer, say);
* ``check``: its load-time checks (security floors, sizes);

and builds one role object per rank (:meth:`ExchangeBackend.active`,
``passive``, ``helper``). This module imports neither torch nor any crypto
library: loading and validating a protocol (``securevfl validate``, the launcher)
reads the declaration alone. A backend whose declaration lives apart from its
role objects registers them by path in :data:`ROLES` under its name; they are
imported when a rank builds its role, so validating an ``mpc`` protocol never
loads CrypTen. A backend may instead define ``active``/``passive``/``helper``
itself.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, ConfigDict

from securevfl.config import Protocol
from securevfl.errors import CryptoParameterError, SecurityWarning
from securevfl.registry import Registry

if TYPE_CHECKING:
    from securevfl.exchange.base import ActiveExchange, ExchangeContext, HelperExchange, PassiveExchange


class NoOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Roles:
    """The role objects of a backend whose declaration is light: built by the rank
    that runs the role (registered by path in :data:`ROLES`)."""

    @classmethod
    def active(cls, ctx: ExchangeContext) -> ActiveExchange:
        raise NotImplementedError(f"{cls.__name__} has no active role")

    @classmethod
    def passive(cls, ctx: ExchangeContext) -> PassiveExchange:
        raise NotImplementedError(f"{cls.__name__} has no passive role")

    @classmethod
    def helper(cls, ctx: ExchangeContext) -> HelperExchange:
        raise NotImplementedError(f"{cls.__name__} has no helper ranks")


class ExchangeBackend:
    """A backend's declaration; its role objects come from :data:`ROLES` unless
    the subclass builds them itself."""

    name: ClassVar[str]
    capabilities: ClassVar[frozenset[str]] = frozenset()
    options: ClassVar[type[BaseModel]] = NoOptions
    description: ClassVar[str] = ""

    @classmethod
    def helper_names(cls, options: BaseModel) -> list[str]:
        """The helper ranks (a dealer, say) the backend needs with these validated options."""
        return []

    @classmethod
    def check(cls, proto: Protocol, options: BaseModel) -> None:
        """Extra load-time checks (security floors, sizes); raise ConfigError."""

    @classmethod
    def active(cls, ctx: ExchangeContext) -> ActiveExchange:
        return ROLES.get(cls.name).active(ctx)

    @classmethod
    def passive(cls, ctx: ExchangeContext) -> PassiveExchange:
        return ROLES.get(cls.name).passive(ctx)

    @classmethod
    def helper(cls, ctx: ExchangeContext) -> HelperExchange:
        if cls.name not in ROLES:
            raise NotImplementedError(f"backend {cls.name} has no helper ranks")
        return ROLES.get(cls.name).helper(ctx)

    @classmethod
    def result_info(cls, options: BaseModel) -> dict[str, Any]:
        """What the result record should say about this backend's settings."""
        return {"backend": cls.name, "params": options.model_dump(mode="json")}


#: what a run with ``weight_init: seeded`` (and ``insecure: true``) is told, and records
SEEDED_WARNING = (
    "weight_init: seeded: the active party starts from the interactive layer's W_i^0 of the public "
    "seed and so knows it exactly (it can read h'_i off z_i at the first steps); for step-by-step "
    "comparisons with plain only, not private"
)


def check_weight_init(options: BaseModel) -> None:
    """Refuse ``weight_init: seeded`` unless the options also say ``insecure: true``
    (a CryptoParameterError naming the field), and warn when they do. Under
    ``seeded`` A holds W_i^0, which every party can compute from the protocol seed,
    so z_i = h'_i W_i hands A the embedding at the first steps: a verification
    setting (runs compared step by step with ``plain``), like CrypTen's TFP provider.
    For the options of a backend with ``weight_init`` and ``insecure`` fields."""
    if getattr(options, "weight_init", None) != "seeded":
        return
    if not getattr(options, "insecure", False):
        raise CryptoParameterError(
            "weight_init: seeded gives the active party the initial interactive weights W_i^0 "
            "exactly (they follow from the public seed), so z_i reveals the embeddings h'_i at the "
            "first steps; it is for step-by-step comparisons with plain only: set insecure: true "
            "beside it to allow that, or leave weight_init at its default",
            path="exchange.params.weight_init",
        )
    warnings.warn(SecurityWarning(SEEDED_WARNING), stacklevel=3)


EXCHANGES: Registry[type[ExchangeBackend]] = Registry("exchange backend")
ROLES: Registry[type[Roles]] = Registry("exchange roles")
