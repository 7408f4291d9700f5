"""A party's trained model, read back for prediction (``securevfl predict``).

Every rank saves its own final model at the end of a run
(:mod:`securevfl.app.checkpoints`, ``OUT/ranks/rank<R>/model/``; what is in it:
:mod:`securevfl.parties.state`). This module loads one rank's, and only one
rank's, verified model folder and puts it back to work: the fitted input
transform, the defense stack in its trained state under fresh noise keys (every
prediction draws new noise: a saved key would repeat it), the task of the active
party, the party's model built and loaded by the class training uses
(:mod:`securevfl.parties.split_model`: the bottom and, at the active party, own
block, bias and top), and the exchange role restored to its trained interactive
layer (A's plain blocks under ``plain``, this party's shares under
``mpc``/``ckks``/``paillier``). Nothing here reads another party's files or
learns anything of theirs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pydantic import ValidationError

from securevfl.app.checkpoints import load_model
from securevfl.app.loader import OWN, load_checked_dict
from securevfl.components import CheckedProtocol, Components
from securevfl.config import PartySpec, Protocol
from securevfl.config_errors import validation_error
from securevfl.data.fitted import apply_fitted, from_saved
from securevfl.data.party_data import PartyData
from securevfl.defenses.base import DefenseStack, build_stack
from securevfl.errors import CheckpointError, DataError
from securevfl.exchange.base import ExchangeBackend, ExchangeContext
from securevfl.parties.predict import ActivePredictor, PassivePredictor
from securevfl.parties.split_model import ActiveModel, PassiveModel, restore_task
from securevfl.parties.state import ModelInfo, PartyState, PreprocessState, join_components
from securevfl.parties.tasks import Task
from securevfl.runtime.layout import Role
from securevfl.snapshot import ComponentState


def _spec(proto: Protocol, role: Role) -> PartySpec:
    return proto.parties.active if role.kind == "active" else proto.parties.passive[role.index]


@dataclass(frozen=True)
class SavedProtocol:
    """The protocol document a local run's active rank saved with its model
    (``doc``), vouched for by the digest in that model's manifest; ``beside``: the
    folder of the protocol file the run was loaded from, where its own modules were
    found (None for a protocol given as data); ``source``: the file that holds it,
    for messages."""

    doc: dict[str, Any]
    beside: Path | None
    source: str


def saved_protocol(run_dir: Path) -> SavedProtocol:
    """The protocol a local run in ``run_dir`` was trained under, as the active rank
    saved it with its model, read against the schema and checked against the digest
    in that model's manifest, with nothing resolved or imported yet: the digest says
    it is the run's protocol, whatever components and modules it names."""
    saved = load_model(Path(run_dir), 0)
    model = saved.docs.get("model", {})
    doc = model.get("protocol")
    if not isinstance(doc, dict):
        raise CheckpointError(f"rank 0: {saved.path}/model.json holds no protocol")
    code_dir = model.get("code_dir")
    source = str(saved.path / "model.json")
    try:
        proto = Protocol.model_validate(doc)
    except ValidationError as exc:
        raise validation_error(exc, source=source) from None
    why_not = proto.digest_mismatch(saved.manifest.protocol_digest)
    if why_not is not None:
        raise CheckpointError(
            f"rank 0: {saved.path}/model.json: field 'protocol' does not match the manifest's "
            f"protocol digest ({why_not})"
        )
    return SavedProtocol(doc, Path(code_dir) if isinstance(code_dir, str) else None, source)


def run_protocol(run_dir: Path) -> CheckedProtocol:
    """The protocol a local run in ``run_dir`` was trained under (:func:`saved_protocol`),
    checked and its components resolved. The local launcher's user holds every rank's
    folder and ran it, so the modules it names are allowed (the local launcher's rule),
    and found beside the protocol file it was loaded from."""
    saved = saved_protocol(run_dir)
    return load_checked_dict(saved.doc, source=saved.source, allow=OWN, beside=saved.beside)


@dataclass
class PartyModel:
    """One party's trained model, loaded from its own model folder: its files
    checked and its defense stack restored; :meth:`split_model` puts its weights
    into the split-model class training runs."""

    proto: Protocol
    components: Components  # the protocol's, resolved at load
    role: Role
    spec: PartySpec
    info: ModelInfo
    preprocess: PreprocessState
    tensors: dict[str, Any]  # models.pt, as ActiveModel / PassiveModel.tensors saved it
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

    def split_model(self, device: torch.device) -> ActiveModel | PassiveModel:
        """This party's model built as training built it (:meth:`ActiveModel.build`,
        :meth:`PassiveModel.build`: a factory is called again, under this process's
        user code policy, in this rank alone, with the input layout of its saved
        preprocessing, the one it was trained with) on its saved input columns,
        holding its saved weights; a ``models.pt`` that does not fit is a CheckpointError."""
        code, pre = self.components.code, self.preprocess
        width = len(pre.columns)
        model: ActiveModel | PassiveModel
        if self.role.kind == "passive":
            model = PassiveModel.build(self.proto, code, self.role, self.stack, width, device, preprocess=pre)
        else:
            assert self.task is not None
            model = ActiveModel.build(
                self.proto, code, self.role, self.task, self.stack, width, device, preprocess=pre
            )
        model.load(self.tensors, exact=False)
        return model

    def predictor(
        self, backend: type[ExchangeBackend], ctx: ExchangeContext, *, keep_sent: bool = False
    ) -> ActivePredictor | PassivePredictor:
        """Build this side's model and exchange role (a collective step with the
        other ranks, as at training set-up), restore their trained state, and return
        the predictor. ``keep_sent``: keep what the wire audits read (the h'_i a
        passive party sends, the z the active party is revealed)."""
        model, batch = self.split_model(ctx.device), self.proto.training.batch_size
        if isinstance(model, PassiveModel):
            exchange = model.open_exchange(backend, ctx, self.exchange_state)
            return PassivePredictor(model, exchange, batch, keep_sent=keep_sent)
        active_role = model.open_exchange(backend, ctx, self.exchange_state)
        return ActivePredictor(model, active_role, batch, keep_z=keep_sent)


def load_party_model(checked: CheckedProtocol, role: Role, run_dir: Path, device: torch.device) -> PartyModel:
    """Rank ``role.rank``'s model from ``run_dir`` (its own folder only), verified
    file by file and checked to be a model of this protocol (digest) and of this
    party; a missing, corrupted or mismatched model is a :class:`CheckpointError`
    naming the rank and the file or field."""
    rank = role.rank
    proto, components = checked.protocol, checked.components
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
    stack = build_stack(
        proto, components, spec.name, role.kind, spec.defenses
    )  # fresh noise keys: this prediction's
    stack.restore_trained(
        join_components(state.tensor("defenses", rank=rank), state.docs.get("defenses", []))
    )
    models = state.tensor("models", rank=rank)
    exchange = ComponentState.from_parts(state.tensor("exchange", rank=rank), state.docs.get("exchange", {}))
    task = restore_task(info, rank) if role.kind == "active" else None
    return PartyModel(proto, components, role, spec, info, pre, models, exchange, stack, task)
