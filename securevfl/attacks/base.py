"""The attack seam (docs/design.md §6).

An attack runs after training on a :class:`View`: the tensors the adversary's
rank received (from its ledger), its own data and models (``own``), and the prior
knowledge the attack explicitly declares (``prior``, built by
:meth:`Attack.knowledge`). It never sees anything another rank kept to itself, so
what it learns is what that party could learn. Scoring is separate: the harness
(:mod:`securevfl.app.harness`) holds every party's view as ground truth
(:class:`World`) and passes it to :meth:`Attack.knowledge` (to cut out the
declared prior) and :meth:`Attack.score` (to grade the guess), never to
:meth:`Attack.run`. ``requires`` names the backend capabilities under which the
attack's view exists, checked at load like a defense's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator

from securevfl.attacks.names import ATTACKS as ATTACKS
from securevfl.components import Components
from securevfl.config import Protocol
from securevfl.errors import ConfigError
from securevfl.records import OwnView
from securevfl.runtime.layout import Layout

#: the longest attack label (it names a file: ``attacks/<label>.npz`` stays far below
#: a file system's name limit)
MAX_LABEL = 100
_PLAIN_LABEL = re.compile(r"[\w#-][\w .#-]*")


def plain_label(label: str) -> bool:
    """Whether ``label`` is a plain name: one file name, no folder, no link to
    anything outside ``OUT/attacks`` (no '/', no '..', no leading '.'), short."""
    return len(label) <= MAX_LABEL and _PLAIN_LABEL.fullmatch(label) is not None


class AttackOptions(BaseModel):
    """Options every attack takes. An attack option that names a passive party
    is called ``target`` (the victim) or ``party`` (the attacker); the protocol
    check refuses an unknown name at load."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    label: str | None = Field(
        default=None,
        description="key of this attack's entry in result.json['attacks'] (default: its name); a plain "
        f"name (letters, digits, spaces, '_', '-', '.', '#', up to {MAX_LABEL} characters): it also "
        "names the attack's file attacks/<label>.npz",
    )
    seed: int = Field(default=0, description="seed of the attack's own randomness (aux rows, models)")

    @field_validator("label")
    @classmethod
    def _plain_name(cls, label: str | None) -> str | None:
        if label is not None and not plain_label(label):
            raise ValueError(
                f"{label!r} is not a plain name: a label names the file attacks/<label>.npz inside the "
                f"output folder, so it may hold letters, digits, spaces, '_', '-', '.' and '#' only, up to "
                f"{MAX_LABEL} characters, and may not start with '.'"
            )
        return label


@dataclass
class View:
    """What one rank saw: received tensors by tag (in arrival order, with their
    round), plus the rank's own data and plaintext state (a typed
    :class:`~securevfl.records.OwnView`; a plain mapping given here is wrapped)."""

    rank: int
    party: str
    received: dict[str, list[tuple[int, torch.Tensor]]]
    own: OwnView = field(default_factory=OwnView)
    prior: dict[str, Any] = field(default_factory=dict)  # declared prior knowledge of the attack

    def __post_init__(self) -> None:
        if not isinstance(self.own, OwnView):
            self.own = OwnView(self.own)

    def tensors(self, tag: str) -> list[torch.Tensor]:
        return [t for _, t in self.received.get(tag, [])]


@dataclass
class World:
    """Ground truth for the harness: every party's own view after a run. Used to
    build an attack's declared prior knowledge and to score its guess; an attack's
    :meth:`Attack.run` never receives it."""

    proto: Protocol
    components: Components  # the protocol's resolved components (what each party ran, and how)
    layout: Layout
    views: dict[str, View]  # party name -> that party's view
    out_dir: Path

    @property
    def active(self) -> View:
        return self.views[self.layout.active.party]

    def passive(self, name: str | None) -> View:
        """A passive party's view by name (default: the first passive party)."""
        names = [r.party for r in self.layout.passive]
        name = names[0] if name is None else name
        if name not in names:
            raise ConfigError(f"'{name}' is not a passive party (passive: {names})", path="attacks")
        return self.views[name]

    def locate(self, name: str | None) -> tuple[int, str]:
        """A passive party's position among the passive parties (the order of
        the exchange's peers and interactive blocks) and its name (default: the
        first)."""
        party = self.passive(name).party
        return [r.party for r in self.layout.passive].index(party), party


OptionsT = TypeVar("OptionsT", bound=BaseModel)


class Attack(Generic[OptionsT]):
    """An attack with options model ``OptionsT`` (``options`` is that model's
    class; the instance gets the options validated at load)."""

    name: ClassVar[str]
    adversary: ClassVar[str] = "active"  # "active" | "passive"
    requires: ClassVar[frozenset[str]] = frozenset()
    options: ClassVar[type[BaseModel]] = AttackOptions
    needs_classes: ClassVar[str | None] = None  # why a task without classes (regression) cannot work

    def __init__(self, params: OptionsT, key: str | None = None):
        self.params = params
        self.key = key or self.name  # its entry in result.json["attacks"] (and file names)

    @classmethod
    def check(
        cls, proto: Protocol, params: BaseModel, *, backend: Any, path: str, source: str | None = None
    ) -> None:
        """Load-time checks that depend on the options or on the rest of the
        protocol, as a defense's (``backend`` is the exchange backend class); raise
        a ConfigError or UnsupportedCombination naming ``path``. Refusing here, not
        after training, keeps a run from training for an attack that cannot run."""

    @classmethod
    def cross_check(
        cls,
        proto: Protocol,
        components: Components,
        params: BaseModel,
        *,
        path: str,
        source: str | None = None,
    ) -> None:
        """Load-time checks against the protocol's other components (what each party
        runs, with its validated options), run after :meth:`check`; raise as it does."""

    def adversary_party(self, world: World) -> str:
        """The party whose view the attack runs on (default: the active party)."""
        return world.layout.active.party

    def knowledge(self, world: World) -> dict[str, Any]:
        """The prior knowledge the adversary is given besides its view (default:
        none). :meth:`run` reports how much of it it used under ``used``."""
        return {}

    def run(self, view: View) -> dict[str, Any]:
        """The attack itself, on the adversary's view (with ``view.prior``): returns
        its guess, plus ``used``, a JSON-able note of the tensors it read."""
        raise NotImplementedError

    def score(self, guess: dict[str, Any], world: World) -> dict[str, Any]:
        """Grade the guess against the ground truth: metric name -> value."""
        raise NotImplementedError
