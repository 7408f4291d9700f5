"""A protocol's components with their options validated once, and the typed
query "what does party X run" (docs/design.md §5, §8).

The schema (:mod:`securevfl.config`) keeps each component's ``params`` as the
mapping written in the protocol file: it sits below the registries and cannot
know a component's options model. The checked loader
(:mod:`securevfl.app.loader`) looks every component up once, validates its
params with that component's own options model and returns both together, a
:class:`CheckedProtocol`. That value is passed down: the launcher, the rank
pipeline, the parties, the defenses (their contexts carry the
:class:`Components`), the attack harness and prediction take it, or the
:class:`Components`, or the one typed option they need, as a parameter; nothing
reads it back from the protocol object. Nothing validates a component's params a
second time (not per defense stack, not per step of the budget's search), and no
defense or attack reads another party's raw defense mapping by name; it asks
:meth:`Components.options` for the options model it understands.

A rank started by the local launcher receives the protocol as JSON and resolves
it there, once (:func:`securevfl.app.loader.resolve_protocol`); a rank started by
``securevfl party`` loads the file itself. Either way every component's options
are validated exactly once per process.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from pydantic import BaseModel

from securevfl.config import Protocol
from securevfl.errors import ConfigError
from securevfl.usercode import CodePolicy

OptionsT = TypeVar("OptionsT", bound=BaseModel)


@dataclass(frozen=True)
class Resolved:
    """One component entry of the protocol: its registered name and class, its
    validated options and the YAML path of the entry (for error messages)."""

    name: str
    cls: Any  # the registered class (an exchange backend, a defense, an attack)
    options: BaseModel
    path: str


@dataclass(frozen=True)
class PartyComponents:
    """What one party runs: its defenses in protocol-file order. ``index`` is the
    party's position among the passive parties (None for the active party)."""

    name: str
    side: str  # "active" | "passive"
    index: int | None
    defenses: tuple[Resolved, ...]

    def names(self) -> list[str]:
        return [d.name for d in self.defenses]

    @property
    def sends_codes(self) -> bool:
        """Whether everything this (passive) party sends forward is +-1 by
        construction: its last defense that changes the embedding emits codes
        (e.g. ``hashvfl``). Each defense class says so for its options
        (``emits_codes``: True, False, or None for one that leaves the embedding's
        form as it is). Every rank derives it from the protocol alone, so sender and
        receiver agree on a compact wire form without a message; the exchange reads
        it here (:attr:`~securevfl.exchange.base.ExchangeContext.sends_codes`)."""
        codes = False  # a bottom model's output
        for d in self.defenses:
            says = d.cls.emits_codes(d.options)
            codes = codes if says is None else says
        return codes


@dataclass(frozen=True)
class Components:
    """Every component of one protocol, resolved: the exchange backend, each
    party's defenses (active party first, then the passive parties in order) and
    the attacks; and ``code``, the user code this process may import for the
    protocol (:mod:`securevfl.usercode`: the plugins it has imported, the model
    factories of the parties it runs), which the loader sets from the process's
    invocation (nothing, unless it says otherwise)."""

    exchange: Resolved
    parties: tuple[PartyComponents, ...]
    attacks: tuple[Resolved, ...]
    code: CodePolicy = field(default_factory=CodePolicy)

    @property
    def active(self) -> PartyComponents:
        return self.parties[0]

    @property
    def passive(self) -> tuple[PartyComponents, ...]:
        return self.parties[1:]

    def party(self, name: str) -> PartyComponents:
        """One party's components by name."""
        for p in self.parties:
            if p.name == name:
                return p
        raise ConfigError(f"no party '{name}' (parties: {[p.name for p in self.parties]})", path="parties")

    def runs(self, party: str, defense: str) -> bool:
        """Whether ``party`` runs the defense registered as ``defense``."""
        return defense in self.party(party).names()

    def options(self, party: str, kind: type[OptionsT]) -> OptionsT | None:
        """The options of ``party``'s first defense whose options model is ``kind``
        (None when it runs none): the typed answer to "does this party run that
        defense, and how"."""
        for d in self.party(party).defenses:
            if isinstance(d.options, kind):
                return d.options
        return None

    def running(self, kind: type[OptionsT]) -> list[tuple[int, str, OptionsT]]:
        """``(passive index, name, options)`` of every passive party whose defenses
        include one with options model ``kind`` (its first such entry), in
        protocol order."""
        out = []
        for p in self.passive:
            opts = self.options(p.name, kind)
            if opts is not None:
                assert p.index is not None
                out.append((p.index, p.name, opts))
        return out

    def exchange_options(self, kind: type[OptionsT]) -> OptionsT | None:
        """The exchange backend's options when they are of model ``kind``."""
        opts = self.exchange.options
        return opts if isinstance(opts, kind) else None


@dataclass(frozen=True)
class CheckedProtocol:
    """A protocol that went through the checked loader
    (:mod:`securevfl.app.loader`): the schema-valid :class:`~securevfl.config.Protocol`
    and its :class:`Components` (every component's validated options and the
    process's user code policy). Whatever needs more than the schema takes one of
    these, or its ``components``, as a parameter: a bare ``Protocol`` cannot be
    mistaken for a checked one."""

    protocol: Protocol
    components: Components

    @property
    def code(self) -> CodePolicy:
        """The user code this process may import for the protocol."""
        return self.components.code

    def with_code(self, code: CodePolicy) -> CheckedProtocol:
        """The same protocol under another user code policy (``securevfl party``
        narrows the launcher's to what ``--allow-plugin`` allows)."""
        return CheckedProtocol(self.protocol, replace(self.components, code=code))
