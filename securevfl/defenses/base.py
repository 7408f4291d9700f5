"""The defense seam (docs/design.md §5).

A defense is a class registered by name with any of these hooks; the default of
each hook is the identity, so a defense implements only what it changes:

* passive, forward: :meth:`Defense.embed` ``h -> h'``
* passive, local loss: :meth:`Defense.local_loss` ``(x, h, grad) -> tensor``
* passive, returned gradient: :meth:`Defense.grad` ``g -> g'``
* active, labels: :meth:`Defense.labels` ``y -> y'`` (once, before training)
* active, auxiliary loss: :meth:`Defense.top_loss`
* active, evaluation: :meth:`Defense.begin_eval` once per evaluation pass, then
  :meth:`Defense.observe_eval` per test batch (read-only: e.g. a detector's
  statistics on test traffic; nothing it does changes a prediction)
* data, before training: :meth:`Defense.select_features`
* accounting: :meth:`Defense.mechanisms` declares what a DP defense releases
  about one record over a planned run, for the one accountant (docs/design.md §7). It is a
  function of the protocol and the plan, not of the data, so every rank can
  compute a budget's stopping step before training (a look-back
  ``privacy_spent()`` could not).
* reporting, split by who may read it (SECURITY.md §7): :meth:`Defense.report`
  gives the run statistics the party computed from its data (scores,
  rescaling factors, probabilities), written to the party's own
  ``ranks/rank<R>.defense_report.json`` and sent nowhere;
  :meth:`Defense.public_report` declares what may reach rank 0 in the party's
  summary and so ``result.json``. The stack takes the public part when it builds
  the defense, before any hook has seen data, so it can hold only what the
  protocol determines (by default the validated options).
* collective set-up: :meth:`Defense.joins_collective` / :meth:`Defense.collective`,
  a step every party rank (active and passive, with or without the defense)
  enters at the same point, after the exchange is up and before the first
  training step, for a defense that needs a computation across parties (e.g. a
  secure sum). Helper ranks (a dealer) take part only as the backend's helper.
* load-time checks that depend on the options or the rest of the protocol:
  :meth:`Defense.check`, and :meth:`Defense.cross_check` against the other
  components' validated options (what another party runs, the exchange's options)
* FedBCD local steps (``training.local_steps`` > 1): in a local step the passive
  party recomputes its own ``h`` with its current parameters and differentiates
  :meth:`Defense.embed_local`, the noise-free part of :meth:`Defense.embed` (e.g.
  clipping), against the gradient returned for the round. A defense whose
  ``embed`` changes ``h`` other than by release noise overrides ``embed_local``;
  one that cannot work on stale gradients says why in ``local_steps_refusal`` and
  is refused at load.

``sides`` says where it may run; ``requires`` names backend capabilities it needs
(e.g. ``active_sees_embeddings``) so an impossible combination is refused at load.
"""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypeVar

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict

import securevfl.defenses.contract as contract
from securevfl._compat import import_crypten
from securevfl.components import Components
from securevfl.config import ComponentSpec, Protocol
from securevfl.csprng import SecretStream
from securevfl.defenses.names import DEFENSES as DEFENSES
from securevfl.errors import CheckpointError, ProtocolError, SecurityWarning
from securevfl.privacy.accountant import Mechanism, Plan
from securevfl.runtime.layout import Layout
from securevfl.snapshot import ComponentState, capture_attributes, restore_attributes
from securevfl.usercall import is_user_code, user_call


class DefenseOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


OptionsT = TypeVar("OptionsT", bound=BaseModel)


@dataclass(frozen=True)
class DefenseContext:
    """Where a defense runs. ``seed`` is the protocol's shared seed: every party
    knows it, so it may only drive what all parties must agree on (e.g. class
    codes). Noise that protects something draws on :meth:`noise_stream`, a
    secret stream (:mod:`securevfl.csprng`) private to this party: a fresh
    256-bit key per training run and per prediction run (a resumed run goes on
    with its checkpoint's keys) unless the protocol pins ``privacy.noise_seed``
    for a reproducible experiment (which anyone who knows it can use to subtract
    the noise: such a run is marked as not private; SECURITY.md)."""

    proto: Protocol
    components: Components  # every party's resolved defenses (what the others run, and how)
    party: str
    side: str  # "active" | "passive"
    seed: int
    noise: SecretStream
    _streams: dict[str, SecretStream] = field(default_factory=dict, init=False, repr=False, compare=False)

    def noise_stream(self, *labels: object) -> SecretStream:
        """This defense's own secret stream for one purpose (``labels``): a child of
        its noise key, so two purposes never share keystream. Asked again for the
        same purpose it returns the same live stream, which goes on from where it
        stands: a second child of the same key would start at position 0 and
        replay the noise already released."""
        purpose = "|".join(map(str, labels))  # the child's HKDF info: equal strings, equal keys
        stream = self._streams.get(purpose)
        if stream is None:
            stream = self._streams[purpose] = self.noise.child(*labels)
        return stream


@dataclass(frozen=True)
class CollectiveContext:
    """What a defense's collective set-up step may use on one party rank.

    ``capabilities`` are the exchange backend's; under a backend offering
    ``mpc`` the backend has brought CrypTen's communicator up on the MPC party
    ranks (the active party and every passive party, ranks ``0..n``, each its
    layout rank) before this step, and its dealer keeps serving until the end of
    the run, so a collective may run CrypTen operations (see :meth:`crypten`)."""

    proto: Protocol
    components: Components
    layout: Layout
    rank: int
    party: str
    side: str  # "active" | "passive"
    n_train: int  # aligned training rows; the same at every party rank
    capabilities: frozenset[str]

    def crypten(self) -> Any:
        """The running CrypTen module (backends with capability ``mpc`` only)."""
        if "mpc" not in self.capabilities:
            raise ProtocolError("a collective step asked for CrypTen under a backend without 'mpc'")
        return import_crypten()


def private_noise_key(proto: Protocol, party: str, index: int) -> SecretStream:
    """The noise stream of ``party``'s defense number ``index``: a fresh 256-bit key
    from the OS, or one derived from a pinned ``privacy.noise_seed`` (experiments
    and tests only; the stream is then marked ``pinned``: not private)."""
    pinned = proto.privacy.noise_seed
    if pinned is None:
        return SecretStream.fresh()
    return SecretStream.from_seed(pinned, "noise", party, index)


class Defense(Generic[OptionsT]):
    """A defense with options model ``OptionsT`` (``options`` is that model's class; the
    instance gets the options validated at load, :mod:`securevfl.components`)."""

    name: ClassVar[str]
    sides: ClassVar[frozenset[str]] = frozenset({"active", "passive"})
    requires: ClassVar[frozenset[str]] = frozenset()
    options: ClassVar[type[BaseModel]] = DefenseOptions
    local_steps_refusal: ClassVar[str | None] = None  # why training.local_steps > 1 cannot work
    needs_classes: ClassVar[str | None] = None  # why a task without classes (regression) cannot work

    def __init__(self, params: OptionsT, ctx: DefenseContext):
        self.params = params
        self.ctx = ctx

    # hooks: identity by default
    def select_features(self, x: np.ndarray, columns: list[str]) -> tuple[np.ndarray, list[str]]:
        return x, columns

    def labels(self, y: torch.Tensor, *, classes: int | None = None) -> torch.Tensor:
        """Training labels (class indices; ``classes`` = K from the dataset)."""
        return y

    def embed(self, h: torch.Tensor, *, train: bool) -> torch.Tensor:
        return h

    def embed_local(self, h: torch.Tensor) -> torch.Tensor:
        """The differentiable, noise-free part of :meth:`embed`, applied to the own
        ``h`` a party recomputes in a FedBCD local step (nothing is released, no
        state changes); the identity by default."""
        return h

    def grad(self, g: torch.Tensor) -> torch.Tensor:
        return g

    def local_loss(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor | None:
        return None

    def top_loss(
        self,
        z: torch.Tensor,
        logits: torch.Tensor,
        y: torch.Tensor,
        embeddings: list[torch.Tensor] | None = None,
    ) -> torch.Tensor | None:
        """Active-side auxiliary loss. ``embeddings`` are the h'_i A received
        (only under backends with ``active_sees_embeddings``; None otherwise)."""
        return None

    def begin_eval(self) -> None:
        """An evaluation pass starts (active side)."""

    def observe_eval(
        self, logits: torch.Tensor, y: torch.Tensor, embeddings: list[torch.Tensor] | None
    ) -> None:
        """One test batch of the pass: A's logits, the true labels A holds, and the
        h'_i it received (under ``active_sees_embeddings``; None otherwise)."""

    def mechanisms(self, plan: Plan) -> list[Mechanism]:
        """What this defense releases about one record over ``plan`` (DP defenses)."""
        return []

    def prediction_mechanisms(self) -> list[Mechanism]:
        """What one ``securevfl predict`` of a saved model releases about each
        predicted record through this defense (docs/privacy.md, "Predictions spend
        privacy"): its evaluation-time releases, once per prediction. A function of
        the protocol alone, so every rank can price every party's prediction before
        anything is released. Default: nothing (a defense that adds no noise at
        evaluation, or whose releases are of training data only, such as labels)."""
        return []

    def report(self) -> dict[str, Any]:
        """Run statistics for the party's own file (e.g. rescaling factors, selection
        scores): computed from its data, so they stay with the party
        (``ranks/rank<R>.defense_report.json``) and are never sent."""
        return {}

    def public_report(self) -> dict[str, Any]:
        """What this defense declares to rank 0 (its party's summary, ``result.json``):
        a function of the options and the protocol alone, which every party holds.
        Called once, when the stack is built and before any hook has seen data
        (:class:`DefenseStack`), so no statistic of the data can enter it. By
        default the validated options (defaults filled in); a defense may add
        constants derived from them (e.g. a noise multiplier)."""
        return {"params": self.params.model_dump()}

    def modules(self) -> list[torch.nn.Module]:
        """Trainable parts (their parameters join the party's optimizer)."""
        return []

    def checkpoint_state(self) -> ComponentState:
        """What this defense needs to go on exactly from a checkpoint: by default
        its random generators (their positions in the noise stream), counters,
        tensors and JSON-valued attributes; its modules are saved with the
        party's models. A defense with other state overrides this pair, and keeps
        each secret stream under a :data:`~securevfl.snapshot.SECRET_STREAM` key
        (as :func:`capture_attributes` does): a saved model and a prediction leave
        those out (:meth:`DefenseStack.restore_trained`)."""
        return capture_attributes(self)

    def restore(self, state: ComponentState) -> None:
        restore_attributes(self, state, owner=f"defense '{self.name}' of party '{self.ctx.party}'")

    # collective set-up and load-time checks: class-level, since ranks without the
    # defense take part too
    @classmethod
    def joins_collective(cls, proto: Protocol, components: Components) -> bool:
        """Whether every party rank must enter :meth:`collective` for this protocol
        (``components``: what every party runs, with its validated options)."""
        return False

    @classmethod
    def collective(cls, comm: CollectiveContext, mine: list[Defense[Any]]) -> None:
        """The set-up step run at every party rank, in the same order everywhere,
        when :meth:`joins_collective` says so; ``mine`` holds this rank's instances of
        the defense (empty where the party does not run it)."""

    @classmethod
    def emits_codes(cls, params: BaseModel) -> bool | None:
        """Whether :meth:`embed` returns exactly +-1 values with these options (a
        backend may then send them as bits). None: ``embed`` is the identity, so
        what it passes on keeps the upstream property; a defense that changes the
        embedding otherwise says False (the default)."""
        return None if cls.embed is Defense.embed else False

    @classmethod
    def check(
        cls, proto: Protocol, params: BaseModel, *, backend: Any, path: str, source: str | None = None
    ) -> None:
        """Load-time checks that depend on the options or on the rest of the
        protocol (``backend`` is the exchange backend class); raise a ConfigError or
        UnsupportedCombination naming ``path``."""

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
        """Load-time checks against the protocol's other components, run after
        :meth:`check` with every component resolved (``components``: the exchange's
        and every party's validated options, :class:`~securevfl.components.Components`);
        raise as :meth:`check` does."""


class DefenseStack:
    """A party's defenses in protocol-file order; each hook is folded over them.

    Reports come in two parts (SECURITY.md §7): :meth:`public_report`, taken here,
    at construction, before any defense has seen data, is what the party may send
    rank 0; :meth:`report` is the party's own, for its own folder only."""

    def __init__(self, defenses: list[Defense[Any]]):
        self.defenses = defenses
        self._public = {d.name: d.public_report() for d in defenses}
        # a plugin's defense is user code: its hooks run under the rank's marker (securevfl.usercall)
        self._own = {
            id(d): f"defense '{d.name}' of party '{d.ctx.party}'" for d in defenses if is_user_code(d)
        }
        #: each defense whose built-in name user code took with ``force=True``: where that code lives
        self.replaced = {d.name: r for d in defenses if (r := DEFENSES.replaced(d.name)) is not None}

    def _in(self, d: Defense[Any], hook: str) -> contextlib.AbstractContextManager[None]:
        """Where the rank is while ``d``'s ``hook`` runs: a plugin defense's call is
        marked as user code, a built-in one's is securevfl's own."""
        what = self._own.get(id(d))
        return contextlib.nullcontext() if what is None else user_call(f"{what}, hook '{hook}'")

    def select_features(self, x: np.ndarray, columns: list[str]) -> tuple[np.ndarray, list[str]]:
        for d in self.defenses:
            with self._in(d, "select_features"):
                x, columns = contract.features_like(
                    d, contract.call(d, "select_features", d.select_features, x, columns), x
                )
        return x, columns

    def labels(self, y: torch.Tensor, *, classes: int | None = None) -> torch.Tensor:
        for d in self.defenses:
            with self._in(d, "labels"):
                y = contract.labels_like(
                    d, contract.call(d, "labels", d.labels, y, classes=classes), y, classes
                )
        return y

    def embed(self, h: torch.Tensor, *, train: bool) -> torch.Tensor:
        for d in self.defenses:
            with self._in(d, "embed"):
                h = contract.tensor_like(d, "embed", contract.call(d, "embed", d.embed, h, train=train), h)
        return h

    def embed_local(self, h: torch.Tensor) -> torch.Tensor:
        for d in self.defenses:
            with self._in(d, "embed_local"):
                h = contract.tensor_like(
                    d, "embed_local", contract.call(d, "embed_local", d.embed_local, h), h
                )
        return h

    def grad(self, g: torch.Tensor) -> torch.Tensor:
        for d in self.defenses:
            with self._in(d, "grad"):
                g = contract.tensor_like(d, "grad", contract.call(d, "grad", d.grad, g), g)
        return g

    def _sum(self, parts: list[torch.Tensor | None]) -> torch.Tensor | None:
        real = [p for p in parts if p is not None]
        return sum(real[1:], real[0]) if real else None

    def local_loss(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor | None:
        parts = []
        for d in self.defenses:
            with self._in(d, "local_loss"):
                parts.append(
                    contract.loss_like(d, "local_loss", contract.call(d, "local_loss", d.local_loss, x, h))
                )
        return self._sum(parts)

    def top_loss(
        self,
        z: torch.Tensor,
        logits: torch.Tensor,
        y: torch.Tensor,
        embeddings: list[torch.Tensor] | None = None,
    ) -> torch.Tensor | None:
        parts = []
        for d in self.defenses:
            with self._in(d, "top_loss"):
                parts.append(
                    contract.loss_like(
                        d, "top_loss", contract.call(d, "top_loss", d.top_loss, z, logits, y, embeddings)
                    )
                )
        return self._sum(parts)

    def begin_eval(self) -> None:
        for d in self.defenses:
            with self._in(d, "begin_eval"):
                d.begin_eval()

    def observe_eval(
        self, logits: torch.Tensor, y: torch.Tensor, embeddings: list[torch.Tensor] | None
    ) -> None:
        for d in self.defenses:
            with self._in(d, "observe_eval"):
                d.observe_eval(logits, y, embeddings)

    def modules(self) -> list[torch.nn.Module]:
        return [m for d in self.defenses for m in d.modules()]

    def mechanisms(self, plan: Plan) -> list[Mechanism]:
        return [m for d in self.defenses for m in d.mechanisms(plan)]

    def prediction_mechanisms(self) -> list[Mechanism]:
        return [m for d in self.defenses for m in d.prediction_mechanisms()]

    def report(self) -> dict[str, Any]:
        """Every defense's own run statistics: the party's alone, never sent."""
        return {d.name: r for d in self.defenses if (r := d.report())}

    def public_report(self) -> dict[str, Any]:
        """What every defense declared when the stack was built (no statistic of
        the data): the part of the report that may go to rank 0."""
        return {name: dict(r) for name, r in self._public.items() if r}

    def noise_keys(self) -> list[dict[str, Any]]:
        """Each defense's private noise key (:meth:`SecretStream.state` of its root
        stream), in stack order. The party's own checkpoint keeps them so a resumed
        run rebuilds the same stack: set-up draws repeat instead of releasing fresh
        noise on the same data. Secret: they never leave the party."""
        return [d.ctx.noise.state() for d in self.defenses]

    def checkpoint_state(self) -> list[ComponentState]:
        return [d.checkpoint_state() for d in self.defenses]

    def model_state(self) -> list[ComponentState]:
        """What a saved model keeps of each defense: its checkpoint state less its
        secret streams (a prediction draws fresh noise keys, :meth:`restore_trained`),
        so a model folder holds no noise key."""
        return [s.without_secret_streams() for s in self.checkpoint_state()]

    def restore(self, states: list[ComponentState]) -> None:
        """Resume from a checkpoint exactly: every secret stream back at its saved
        key and position (with the noise keys this stack was built from), so the
        resumed run draws the noise the interrupted one would have drawn."""
        self._check_count(states)
        for d, st in zip(self.defenses, states, strict=True):
            d.restore(st)

    def restore_trained(self, states: list[ComponentState]) -> None:
        """Put a saved model's defense state back for prediction: everything but the
        secret streams, which keep the fresh keys this stack was built with. Rewinding
        them to a saved key and position would add, at every prediction from that
        model, the same noise to the same records, so that two predictions, or one
        with a record left out, subtract to noise-free differences of embeddings
        (tests/threat_model/test_prediction_noise_replay.py)."""
        self._check_count(states)
        for d, st in zip(self.defenses, states, strict=True):
            d.restore(st.without_secret_streams())

    def _check_count(self, states: list[ComponentState]) -> None:
        if len(states) != len(self.defenses):
            raise CheckpointError(
                f"the checkpoint holds {len(states)} defense states, this party runs {len(self.defenses)}"
            )


def collective_defenses(proto: Protocol, components: Components) -> list[type[Defense[Any]]]:
    """The defense classes whose collective step this protocol needs, in one order
    every rank derives alike (sorted by name over every party's defenses)."""
    classes = {d.name: d.cls for p in components.parties for d in p.defenses}
    return [classes[n] for n in sorted(classes) if classes[n].joins_collective(proto, components)]


def run_collectives(stack: DefenseStack, comm: CollectiveContext) -> None:
    """Enter every needed collective step, on this rank's side of it."""
    for cls in collective_defenses(comm.proto, comm.components):
        cls.collective(comm, [d for d in stack.defenses if type(d) is cls])


def build_stack(
    proto: Protocol,
    components: Components,
    party: str,
    side: str,
    specs: list[ComponentSpec] | None = None,
    *,
    noise_keys: list[dict[str, Any]] | None = None,
) -> DefenseStack:
    """``party``'s defense stack, from the options validated at load (nothing is
    validated here: the budget's search builds stacks many times). ``specs``, when
    given, must be the party's own entries (callers that hold them pass them as a
    check). ``noise_keys``: the private noise keys of a checkpoint's stack
    (:meth:`DefenseStack.noise_keys`), when a run resumes; without them every
    defense gets a fresh key (:func:`private_noise_key`), as a new run and every
    prediction run must."""
    resolved = components.party(party).defenses
    if specs is not None and [s.name for s in specs] != [d.name for d in resolved]:
        raise ProtocolError(f"build_stack: the defenses given are not party '{party}'s own")
    if noise_keys is not None and len(noise_keys) != len(resolved):
        raise CheckpointError(
            f"party '{party}': the checkpoint holds {len(noise_keys)} defense noise keys, "
            f"the protocol gives it {len(resolved)} defenses"
        )
    out = []
    for i, d in enumerate(resolved):
        if noise_keys is None:
            noise = private_noise_key(proto, party, i)
        else:
            try:
                noise = SecretStream.from_state(noise_keys[i])
            except ValueError as exc:
                raise CheckpointError(
                    f"party '{party}': defense {i}'s noise key in the checkpoint: {exc}"
                ) from None
        ctx = DefenseContext(proto, components, party, side, proto.training.seed, noise)
        out.append(d.cls(d.options, ctx))
    stack = DefenseStack(out)
    for name, origin in stack.replaced.items():
        warnings.warn(SecurityWarning(replaced_warning(party, "defense", name, origin)), stacklevel=2)
    return stack


def replaced_warning(party: str | None, kind: str, name: str, origin: str) -> str:
    """The warning for a run that uses user code registered with ``force=True``
    under the name of one of securevfl's own components."""
    who = f"party '{party}': " if party else ""
    return (
        f"{who}{kind} '{name}' is not securevfl's built-in: {origin} was registered in its place "
        f"(force=True), so what securevfl documents and tests of '{name}' does not hold for this run"
    )
