"""What an exchange backend declares, apart from how it runs (docs/design.md §4).

A backend is one package, ``securevfl/exchange/<name>/``, whose face
(``__init__``) holds its declaration: one :class:`ExchangeBackend` subclass,
registered by name in :data:`EXCHANGES` (by path, in :mod:`securevfl.exchange`).
It declares

* ``capabilities``: what it offers, e.g. ``active_sees_embeddings`` (A receives
  h'_i in the clear), ``cuda``, or ``local_steps`` (FedBCD rounds); defenses and
  attacks state what they require, and a protocol asking for a combination that
  cannot work is rejected at load;
* ``options``: a strict pydantic model of its ``exchange.params``;
* ``helper_names``: extra ranks it needs (a dealer, say);
* ``check``: its load-time checks (security floors, sizes);
* ``roles``: where its role objects live, a ``"package.module:Class"`` path to a
  :class:`Roles` subclass (by convention ``securevfl.exchange.<name>.roles``),
  which builds one role object per rank (``active``, ``passive``, ``helper``).

Neither this module nor a backend's face imports torch or any crypto library:
loading and validating a protocol (``securevfl validate``, the launcher) reads
the declaration alone, and the role objects are imported by the rank that builds
its role (:meth:`ExchangeBackend.role_objects`), so validating an ``mpc``
protocol never loads CrypTen. :data:`EXCHANGES` refuses an entry that is not
such a declaration, or names no role objects, when it is registered (or, for an
entry registered by path, when it is first looked up).
"""

from __future__ import annotations

import threading
import warnings
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, ConfigDict

from securevfl.config import Protocol
from securevfl.errors import CryptoParameterError, SecurityWarning
from securevfl.registry import PATH, Registry, load_path

if TYPE_CHECKING:
    from securevfl.exchange.base import ActiveExchange, ExchangeContext, HelperExchange, PassiveExchange


class NoOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Roles:
    """A backend's role objects, built by the rank that runs the role; the
    declaration names the subclass by path (:attr:`ExchangeBackend.roles`). A
    backend without helper ranks leaves :meth:`helper` as it is."""

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
    """A backend's declaration; its role objects are the :class:`Roles` subclass
    at :attr:`roles`, imported on first use."""

    name: ClassVar[str]
    #: where the role objects live: ``"package.module:Class"``, a :class:`Roles` subclass
    roles: ClassVar[str]
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
    def role_objects(cls) -> type[Roles]:
        """The :class:`Roles` subclass at :attr:`roles`, imported on the first call."""
        return _ROLE_OBJECTS.load(cls)

    @classmethod
    def active(cls, ctx: ExchangeContext) -> ActiveExchange:
        return cls.role_objects().active(ctx)

    @classmethod
    def passive(cls, ctx: ExchangeContext) -> PassiveExchange:
        return cls.role_objects().passive(ctx)

    @classmethod
    def helper(cls, ctx: ExchangeContext) -> HelperExchange:
        return cls.role_objects().helper(ctx)

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


class _RoleObjects:
    """The role objects of each declaration, imported once (several threads may
    build roles at once: :mod:`securevfl.api` runs ranks as threads)."""

    def __init__(self) -> None:
        self._loaded: dict[type[ExchangeBackend], type[Roles]] = {}
        self._lock = threading.Lock()

    def load(self, backend: type[ExchangeBackend]) -> type[Roles]:
        with self._lock:
            if backend not in self._loaded:
                obj = load_path("exchange backend", backend.name, backend.roles, what="role objects")
                if not (isinstance(obj, type) and issubclass(obj, Roles)):
                    raise TypeError(
                        f"exchange backend '{backend.name}': its roles, {backend.roles}, is not a "
                        "subclass of securevfl.exchange.spec.Roles"
                    )
                self._loaded[backend] = obj
            return self._loaded[backend]


_ROLE_OBJECTS = _RoleObjects()


def check_declaration(name: str, obj: object) -> None:
    """What :data:`EXCHANGES` accepts under ``name``: an :class:`ExchangeBackend`
    subclass named ``name`` whose ``roles`` is a ``"package.module:Class"`` path.
    Anything else is a registration bug, a ValueError naming the backend."""
    if not (isinstance(obj, type) and issubclass(obj, ExchangeBackend)):
        raise ValueError(f"exchange backend '{name}': {obj!r} is not an ExchangeBackend subclass")
    own = getattr(obj, "name", None)
    if own != name:
        raise ValueError(f"exchange backend '{name}': its declaration is named {own!r}")
    roles = getattr(obj, "roles", None)
    if not isinstance(roles, str) or not PATH.match(roles):
        raise ValueError(
            f"exchange backend '{name}' names no role objects: set roles = \"package.module:Class\" "
            f"(a securevfl.exchange.spec.Roles subclass; by convention securevfl.exchange.{name}.roles), "
            f"not {roles!r}"
        )


#: every exchange backend, by name: one declaration each (:func:`check_declaration`)
EXCHANGES: Registry[type[ExchangeBackend]] = Registry("exchange backend", check=check_declaration)
