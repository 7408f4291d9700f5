"""A party's trained model, read back for prediction (``securevfl predict``).

Every rank saves its own final model at the end of a run
(:mod:`securevfl.app.checkpoints`, ``OUT/ranks/rank<R>/model/``; what is in it:
:mod:`securevfl.parties.state`). This module loads one rank's, and only one
rank's, verified model folder and puts it back to work: the fitted input
transform, the bottom (and, at the active party, own block, bias and top)
models, the defense stack in its trained state under fresh noise keys (every
prediction draws new noise: a saved key would repeat it), the task of the active party,
and the exchange role restored to its trained interactive layer (A's plain
blocks under ``plain``, this party's shares under ``mpc``/``ckks``/``paillier``).
Nothing here reads another party's files or learns anything of theirs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from securevfl.app.checkpoints import load_model
from securevfl.app.loader import OWN, load_protocol_dict
from securevfl.components import components_of
from securevfl.config import ModelSpec, PartySpec, Protocol
from securevfl.data.fitted import apply_fitted, from_saved
from securevfl.data.party_data import PartyData
from securevfl.defenses.base import DefenseStack, build_stack
from securevfl.errors import CheckpointError, ConfigError, DataError
from securevfl.exchange.base import ExchangeBackend, ExchangeContext
from securevfl.models import build_bias, build_bottom, build_interactive, build_top
from securevfl.parties.predict import ActivePredictor, PassivePredictor
from securevfl.parties.state import ModelInfo, PartyState, PreprocessState, join_components
from securevfl.parties.task_kinds import TASKS
from securevfl.parties.tasks import Task
from securevfl.runtime.layout import Role
from securevfl.snapshot import ComponentState


def _spec(proto: Protocol, role: Role) -> PartySpec:
    return proto.parties.active if role.kind == "active" else proto.parties.passive[role.index]


def run_protocol(run_dir: Path) -> Protocol:
    """The protocol a local run in ``run_dir`` was trained under, as the active
    rank saved it with its model (the local launcher's user holds every rank's
    folder); checked against the digest in that model's manifest. Its user
    ran it, so the modules it names are allowed (the local launcher's rule), and
    found beside the protocol file it was loaded from."""
    saved = load_model(Path(run_dir), 0)
    model = saved.docs.get("model", {})
    doc = model.get("protocol")
    if not isinstance(doc, dict):
        raise CheckpointError(f"rank 0: {saved.path}/model.json holds no protocol")
    code_dir = model.get("code_dir")
    beside = Path(code_dir) if isinstance(code_dir, str) else None
    proto = load_protocol_dict(doc, source=str(saved.path / "model.json"), allow=OWN, beside=beside)
    why_not = proto.digest_mismatch(saved.manifest.protocol_digest)
    if why_not is not None:
        raise CheckpointError(
            f"rank 0: {saved.path}/model.json: field 'protocol' does not match the manifest's "
            f"protocol digest ({why_not})"
        )
    return proto


@dataclass
class PartyModel:
    """One party's trained model, loaded from its own model folder."""

    proto: Protocol
    role: Role
    spec: PartySpec
    info: ModelInfo
    preprocess: PreprocessState
    tensors: dict[str, Any]  # models.pt: state dicts of bottom / own / top, the bias
    exchange_state: ComponentState
    stack: DefenseStack
    task: Task | None  # the active party's

    @property
    def inputs(self) -> list[str]:
        """The raw columns of the party's file its model was trained on."""
        return list(self.preprocess.inputs)

    def features(self, data: PartyData) -> np.ndarray:
        """New records as the model's inputs, row by row: the saved preprocessing,
        or the training rows' z-scoring, then the defenses' feature selection
        (passive side), as in training (:func:`securevfl.parties.common.split_features`).
        Every transform is per row, so the rows can be taken before or after alignment."""
        pre = self.preprocess
        party = self.spec.name
        if pre.fitted is not None:
            assert data.frame is not None
            x = apply_fitted(from_saved(pre.fitted, party), party, data.frame)
            columns = from_saved(pre.fitted, party).outputs
        elif pre.mean is not None and pre.scale is not None:
            mu = np.asarray(pre.mean, dtype=np.float32)[None, :]
            sd = np.asarray(pre.scale, dtype=np.float32)[None, :]
            x = ((data.x - mu) / sd).astype(np.float32)
            columns = list(data.columns)
        else:
            x, columns = data.x, list(data.columns)
        if self.role.kind == "passive":
            x, columns = self.stack.select_features(x, columns)
        if list(columns) != list(self.preprocess.columns):
            raise DataError(
                f"party '{party}': its new records give the model inputs {list(columns)[:5]}..., "
                f"not the {len(self.preprocess.columns)} columns it was trained on"
            )
        return np.asarray(x, dtype=np.float32)

    def _module(self, name: str, module: torch.nn.Module, device: torch.device) -> torch.nn.Module:
        try:
            module.load_state_dict(self.tensors[name])
        except (KeyError, RuntimeError) as exc:
            raise CheckpointError(
                f"rank {self.role.rank} ({self.spec.name}): models.pt: field '{name}' does not fit "
                f"the protocol's model ({type(exc).__name__})"
            ) from None
        return module.to(device)

    def _bottom(self, spec: ModelSpec, width: int, path: str) -> torch.nn.Module:
        """This party's bottom model rebuilt for its saved weights: a factory is
        called again, under this process's user code policy, in this rank alone,
        with the input layout of its saved preprocessing (the one it was trained with)."""
        return build_bottom(
            spec,
            width,
            seed=self.proto.training.seed,
            party=self.spec.name,
            code=components_of(self.proto).code,
            path=f"{path}.model",
            layout=self.preprocess.layout(self.spec.name),
        )

    def predictor(
        self, backend: type[ExchangeBackend], ctx: ExchangeContext, *, keep_sent: bool = False
    ) -> ActivePredictor | PassivePredictor:
        """Build this side's exchange role (a collective step with the other ranks,
        as at training set-up), restore its trained state, and return the predictor.
        ``keep_sent``: keep what the wire audits read (the h'_i a passive party sends,
        the z the active party is revealed)."""
        if self.role.kind == "passive":
            return self._passive(backend, ctx, keep_sent)
        return self._active(backend, ctx, keep_sent)

    def _passive(self, backend: type[ExchangeBackend], ctx: ExchangeContext, keep: bool) -> PassivePredictor:
        spec, dev = self.spec, ctx.device
        assert spec.model is not None
        width = len(self.preprocess.columns)
        bottom = self._module(
            "bottom", self._bottom(spec.model, width, f"parties.passive[{self.role.index}]"), dev
        )
        exchange = backend.passive(ctx)
        exchange.restore(self.exchange_state)
        return PassivePredictor(
            exchange, bottom, self.stack, dev, self.proto.training.batch_size, keep_sent=keep
        )

    def _active(self, backend: type[ExchangeBackend], ctx: ExchangeContext, keep: bool) -> ActivePredictor:
        proto, spec, dev, seed = self.proto, self.spec, ctx.device, self.proto.training.seed
        assert self.task is not None
        out = proto.interactive.out
        width = len(self.preprocess.columns)
        bottom: torch.nn.Module | None = None
        own: torch.nn.Module | None = None
        if spec.model is not None and width:
            bottom = self._module("bottom", self._bottom(spec.model, width, "parties.active"), dev)
            own = self._module("own", build_interactive(spec.model.out, out, seed=seed, party=spec.name), dev)
        code = components_of(proto).code
        top = build_top(proto.top, out, self.task.outputs, seed=seed, code=code, party=spec.name)
        top = self._module("top", top, dev)
        saved_bias = self.tensors.get("bias")
        if not isinstance(saved_bias, torch.Tensor) or saved_bias.shape != build_bias(out).shape:
            raise CheckpointError(
                f"rank {self.role.rank} ({spec.name}): models.pt: field 'bias' does not fit "
                "the protocol's model"
            )
        exchange = backend.active(ctx)
        exchange.restore(self.exchange_state)
        return ActivePredictor(
            self.task,
            exchange,
            top,
            saved_bias.to(dev),
            bottom,
            own,
            dev,
            proto.training.batch_size,
            keep_z=keep,
        )


def _task(info: ModelInfo, rank: int) -> Task:
    t = info.task or {}
    try:
        cls = TASKS.get(str(t.get("kind")))
        return cls.restore(t.get("classes"), str(t.get("loss_name", "mse")), t)
    except (KeyError, TypeError, ValueError, ConfigError) as exc:
        raise CheckpointError(f"rank {rank}: model.json: field 'task' is malformed ({exc})") from None


def load_party_model(proto: Protocol, role: Role, run_dir: Path, device: torch.device) -> PartyModel:
    """Rank ``role.rank``'s model from ``run_dir`` (its own folder only), verified
    file by file and checked to be a model of this protocol (digest) and of this
    party; a missing, corrupted or mismatched model is a :class:`CheckpointError`
    naming the rank and the file or field."""
    rank = role.rank
    saved = load_model(Path(run_dir), rank, protocol_digest=proto.digest_mismatch)
    spec = _spec(proto, role)
    state = PartyState(saved.manifest.epoch, saved.manifest.step, saved.tensors, saved.docs)
    info: ModelInfo = state.doc("model", ModelInfo, rank=rank)
    if (info.party, info.side) != (spec.name, role.kind):
        raise CheckpointError(
            f"rank {rank}: model.json: field 'party' is {info.side} '{info.party}', "
            f"but this rank is {role.kind} '{spec.name}'"
        )
    pre: PreprocessState = state.doc("preprocess", PreprocessState, rank=rank)
    stack = build_stack(proto, spec.name, role.kind, spec.defenses)  # fresh noise keys: this prediction's
    stack.restore_trained(
        join_components(state.tensor("defenses", rank=rank), state.docs.get("defenses", []))
    )
    models = state.tensor("models", rank=rank)
    for m, sd in zip(stack.modules(), models.get("defense_modules", []), strict=False):
        m.load_state_dict(sd)
    exchange = ComponentState.from_parts(state.tensor("exchange", rank=rank), state.docs.get("exchange", {}))
    task = _task(info, rank) if role.kind == "active" else None
    return PartyModel(proto, role, spec, info, pre, models, exchange, stack, task)
