"""A party's part of the split model, one class per side, the same for training
and prediction (docs/design.md §3, §12).

The split model of docs/design.md §3 is cut between the parties. A passive party
P_i holds its bottom model f_i and its defense stack: it releases
h'_i = defenses(f_i(x_i)). The active party A holds the top model g, the bias b,
the task head (the task kind: output width, loss, scores) and, with features of
its own, its bottom model f_A and its own block W_A of the interactive layer:
z = (what the exchange reveals) + W_A f_A(x_A) + b, outputs g(z). The other
blocks W_i of the interactive layer, in the clear or as this party's shares
under the backend, are the exchange role's (:meth:`open_exchange`).

Training (:mod:`securevfl.parties.active`, :mod:`securevfl.parties.passive`) and
prediction (:mod:`securevfl.app.model_io`, :mod:`securevfl.parties.predict`) get a
party's model from the one :meth:`build` of its side, save and load it through
:meth:`tensors` / :meth:`load` (``models.pt``, :mod:`securevfl.parties.state`) and
run its forward pass, so a saved model is put back exactly as it was trained.
Randomness and user code follow :mod:`securevfl.models`: a factory is called in
this process alone (its owner's rank), under the process's code policy, and one
that declares ``layout`` gets the party's
:class:`~securevfl.data.layout.FeatureLayout`, built here by :meth:`build` from the
party's fitted preprocessing (the same document at training and at prediction,
so the same layout); a
bottom's ``private`` initial weights come from fresh secret randomness (replaced
by the saved ones when a model is loaded), the top model and W_A are seeded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from securevfl.config import PartySpec, Protocol
from securevfl.defenses.base import DefenseStack
from securevfl.errors import CheckpointError, ConfigError
from securevfl.exchange.base import ActiveExchange, ExchangeBackend, ExchangeContext, PassiveExchange
from securevfl.models import (
    PROBE_ROWS,
    bottom_label,
    build_bias,
    build_bottom,
    build_interactive,
    build_top,
    check_output,
)
from securevfl.parties.state import ModelInfo, PreprocessState, module_states
from securevfl.parties.task_kinds import TASKS
from securevfl.parties.tasks import Task
from securevfl.runtime.layout import Role
from securevfl.snapshot import ComponentState
from securevfl.usercode import CodePolicy


def model_path(role: Role) -> str:
    """The protocol path of a party role's ``model`` entry (named in its errors)."""
    return "parties.active.model" if role.kind == "active" else f"parties.passive[{role.index}].model"


def _bottom(
    proto: Protocol,
    spec: PartySpec,
    role: Role,
    width: int,
    code: CodePolicy,
    device: torch.device,
    preprocess: PreprocessState | None,
) -> nn.Module:
    """The party's bottom model on ``width`` input columns, on ``device``: its
    factory or built-in, called here (this rank alone). ``preprocess``: the
    party's fitted preprocessing, whose input layout a factory that declares
    ``layout`` is given (never sent: it names the party's own columns)."""
    assert spec.model is not None
    layout = None if preprocess is None else preprocess.layout(spec.name)
    return build_bottom(
        spec.model,
        width,
        seed=proto.training.seed,
        party=spec.name,
        code=code,
        path=model_path(role),
        layout=layout,
    ).to(device)


def _check_bottom(
    bottom: nn.Module, spec: PartySpec, role: Role, probe: torch.Tensor, device: torch.device
) -> None:
    """Refuse a bottom (on ``device``) whose output on the first training rows is
    not what the exchange needs (:func:`securevfl.models.check_output`)."""
    assert spec.model is not None
    x = probe[:PROBE_ROWS].to(device)
    check_output(bottom, x, spec.model.out, what=bottom_label(spec.model, spec.name), path=model_path(role))


def _load(module: nn.Module, saved: dict[str, Any], name: str, where: str) -> None:
    """Put the state dict ``saved[name]`` into ``module``; one that is missing or
    does not fit is a CheckpointError naming the rank, party and field."""
    try:
        module.load_state_dict(saved[name])
    except (KeyError, RuntimeError) as exc:
        raise CheckpointError(
            f"{where}: models.pt: field '{name}' does not fit the protocol's model ({type(exc).__name__})"
        ) from None


def _load_defense_modules(stack: DefenseStack, saved: dict[str, Any], *, exact: bool, where: str) -> None:
    """The defenses' trainable modules, in stack order. ``exact`` (a checkpoint,
    on resume): one state per module, or a CheckpointError; a saved model
    (prediction) is read as prediction has always read it: the states it holds,
    in order, none if it holds no such field."""
    states = saved.get("defense_modules", None if exact else [])
    if exact and (not isinstance(states, list) or len(states) != len(stack.modules())):
        raise CheckpointError(
            f"{where}: models.pt: field 'defense_modules' does not hold one state per defense module"
        )
    for m, sd in zip(stack.modules(), states or [], strict=False):
        m.load_state_dict(sd)


def _defense_states(stack: DefenseStack) -> list[dict[str, Any]]:
    return [module_states({"m": m})["m"] for m in stack.modules()]


@dataclass(eq=False)
class PassiveModel:
    """P_i's part: its bottom model f_i and its defense stack."""

    bottom: nn.Module
    stack: DefenseStack
    device: torch.device
    where: str  # "rank R (party)": how its load errors name it

    @classmethod
    def build(
        cls,
        proto: Protocol,
        code: CodePolicy,
        role: Role,
        stack: DefenseStack,
        width: int,
        device: torch.device,
        *,
        preprocess: PreprocessState | None = None,
        probe: torch.Tensor | None = None,
    ) -> PassiveModel:
        """The model of passive ``role`` on ``width`` input columns (after its
        defenses' feature selection). ``preprocess``: the party's fitted
        preprocessing (training's, or the saved one at prediction), from which its
        bottom's factory gets its input layout. ``probe``: training rows to check
        the bottom's output on (training set-up; a loaded model was checked when it
        was trained)."""
        spec = proto.parties.passive[role.index]
        assert spec.model is not None
        bottom = _bottom(proto, spec, role, width, code, device, preprocess)
        if probe is not None:
            _check_bottom(bottom, spec, role, probe, device)
        for m in stack.modules():
            m.to(device)
        return cls(bottom, stack, device, f"rank {role.rank} ({spec.name})")

    def parameters(self) -> list[nn.Parameter]:
        """What the party's optimizer trains, in a fixed order (a checkpoint's optimizer state follows it)."""
        return [p for m in (self.bottom, *self.stack.modules()) for p in m.parameters()]

    def forward(self, x: torch.Tensor, *, train: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """f_i(x) and what the party releases of it, h'_i (its defenses' ``embed``)."""
        h = self.bottom(x.to(self.device))
        return h, self.stack.embed(h, train=train)

    def open_exchange(
        self, backend: type[ExchangeBackend], ctx: ExchangeContext, saved: ComponentState | None = None
    ) -> PassiveExchange:
        """The backend's passive role (a collective step with the other ranks),
        restored to ``saved`` (its trained share of the interactive layer) if given."""
        exchange = backend.passive(ctx)
        if saved is not None:
            exchange.restore(saved)
        return exchange

    def tensors(self) -> dict[str, Any]:
        """``models.pt``: the bottom's and the defense modules' state dicts."""
        out: dict[str, Any] = module_states({"bottom": self.bottom})
        out["defense_modules"] = _defense_states(self.stack)
        return out

    def load(self, saved: dict[str, Any], *, exact: bool = True) -> None:
        """Put a ``models.pt`` back (``exact``: a checkpoint's, see :func:`_load_defense_modules`)."""
        _load(self.bottom, saved, "bottom", self.where)
        _load_defense_modules(self.stack, saved, exact=exact, where=self.where)

    def state(self) -> dict[str, torch.Tensor]:
        """The bottom's weights by name (``bottom.<param>``), for the run's result."""
        return {f"bottom.{k}": v.detach().cpu() for k, v in self.bottom.state_dict().items()}


@dataclass(eq=False)
class ActiveModel:
    """A's part: the task head, the top model g, the bias b and, for an active
    party with features, its bottom model f_A and own block W_A; its defense stack."""

    task: Task
    top: nn.Module
    bias: nn.Parameter
    bottom: nn.Module | None
    own: nn.Linear | None
    stack: DefenseStack
    device: torch.device
    where: str
    name: str  # the party's

    @classmethod
    def build(
        cls,
        proto: Protocol,
        code: CodePolicy,
        role: Role,
        task: Task,
        stack: DefenseStack,
        width: int,
        device: torch.device,
        *,
        preprocess: PreprocessState | None = None,
        probe: torch.Tensor | None = None,
    ) -> ActiveModel:
        """The active party's model on ``width`` own input columns (none: a
        label-only party, no bottom) for ``task``. ``preprocess``: as for
        :meth:`PassiveModel.build`, the bottom's input layout. ``probe``: training
        rows to check the bottom's and the top's outputs on (training set-up only)."""
        spec, seed, out = proto.parties.active, proto.training.seed, proto.interactive.out
        bottom = own = None
        if spec.model is not None and width:
            bottom = _bottom(proto, spec, role, width, code, device, preprocess)
            own = build_interactive(spec.model.out, out, seed=seed, party=spec.name).to(device)
            if probe is not None:
                _check_bottom(bottom, spec, role, probe, device)
        bias = build_bias(out)
        bias.data = bias.data.to(device)
        top = build_top(proto.top, out, task.outputs, seed=seed, code=code, party=spec.name).to(device)
        if probe is not None:
            zeros = torch.zeros(PROBE_ROWS, out, device=device)
            check_output(top, zeros, task.outputs, what=f"top model of party '{spec.name}'", path="top")
        for m in stack.modules():
            m.to(device)
        return cls(task, top, bias, bottom, own, stack, device, f"rank {role.rank} ({spec.name})", spec.name)

    def parameters(self) -> list[nn.Parameter]:
        """What the party's optimizer trains, in a fixed order (a checkpoint's optimizer state follows it)."""
        modules = [m for m in (self.bottom, self.own) if m is not None] + [self.top, *self.stack.modules()]
        return [p for m in modules for p in m.parameters()] + [self.bias]

    def own_z(self, x: torch.Tensor) -> torch.Tensor | None:
        """A's own part W_A f_A(x) of z (None for a label-only party)."""
        if self.bottom is None or self.own is None:
            return None
        return self.own(self.bottom(x.to(self.device)))

    def forward(self, revealed: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """z and the top model's outputs g(z), from what the exchange revealed of the
        other parties' part of z and A's own inputs ``x`` for the same rows."""
        z = revealed
        own = self.own_z(x)
        if own is not None:
            z = z + own
        z = z + self.bias
        return z, self.top(z)

    def open_exchange(
        self, backend: type[ExchangeBackend], ctx: ExchangeContext, saved: ComponentState | None = None
    ) -> ActiveExchange:
        """The backend's active role (a collective step with the other ranks),
        restored to ``saved`` (its trained blocks or shares) if given."""
        exchange = backend.active(ctx)
        if saved is not None:
            exchange.restore(saved)
        return exchange

    def tensors(self) -> dict[str, Any]:
        """``models.pt``: the state dicts of bottom, own block and top, the bias, the defense modules'."""
        out = module_states({"bottom": self.bottom, "own": self.own, "top": self.top})
        out["bias"] = self.bias.detach().cpu().clone()
        out["defense_modules"] = _defense_states(self.stack)
        return out

    def load(self, saved: dict[str, Any], *, exact: bool = True) -> None:
        """Put a ``models.pt`` back (``exact``: a checkpoint's, see :func:`_load_defense_modules`)."""
        for name, module in (("bottom", self.bottom), ("own", self.own), ("top", self.top)):
            if module is not None:
                _load(module, saved, name, self.where)
        bias = saved.get("bias")
        if not isinstance(bias, torch.Tensor) or bias.shape != self.bias.shape:
            raise CheckpointError(f"{self.where}: models.pt: field 'bias' does not fit the protocol's model")
        with torch.no_grad():
            self.bias.copy_(bias.to(self.device))
        _load_defense_modules(self.stack, saved, exact=exact, where=self.where)

    def state(self) -> dict[str, torch.Tensor]:
        """Top, bias and, with features, bottom and own block (``interactive.<party>``):
        the run's result."""
        out = {f"top.{k}": v.detach().cpu() for k, v in self.top.state_dict().items()}
        out["bias"] = self.bias.detach().cpu()
        if self.bottom is not None and self.own is not None:
            out.update({f"bottom.{k}": v.detach().cpu() for k, v in self.bottom.state_dict().items()})
            out[f"interactive.{self.name}"] = self.own.weight.detach().cpu()
        return out

    def task_info(self) -> dict[str, Any]:
        """The task head as ``model.json`` keeps it: its kind, classes and, for
        regression, the target's scaling (what :func:`restore_task` reads back)."""
        info: dict[str, Any] = {"kind": self.task.name, "classes": self.task.classes}
        for key in ("mean", "scale", "loss_name"):
            if hasattr(self.task, key):
                info[key] = getattr(self.task, key)
        return info


def restore_task(info: ModelInfo, rank: int) -> Task:
    """The task head of a saved model, from its ``model.json`` (:meth:`ActiveModel.task_info`)."""
    t = info.task or {}
    try:
        cls = TASKS.get(str(t.get("kind")))
        return cls.restore(t.get("classes"), str(t.get("loss_name", "mse")), t)
    except (KeyError, TypeError, ValueError, ConfigError) as exc:
        raise CheckpointError(f"rank {rank}: model.json: field 'task' is malformed ({exc})") from None


SplitModel = ActiveModel | PassiveModel
