"""What a party saves to continue a run, and what it keeps of its trained model
(docs/design.md §12 "Checkpoints").

A party's state is a set of named files: tensor files (nested tensors, saved by
``torch.save``, loaded with ``weights_only=True``) and JSON documents, each
validated here by a pydantic model on the way back in. The file format, the
manifest and the atomic write are securevfl.app.checkpoints'; this module says
what is in the files and puts it back into a party. Everything in it is this
party's own: its models, optimizer, share of the interactive layer, defenses,
RNG streams, position in the shared schedule, ledger and fitted preprocessing.

Files of a checkpoint (``kind: checkpoint``):

* ``models.pt``: ``bottom``, ``own`` (A's own block), ``top``, ``bias``,
  ``defense_modules`` (state dicts, as the party's split model writes and reads
  them: :mod:`securevfl.parties.split_model`), ``held_at_start``, ``trace`` (A);
* ``optimizer.pt``: the party optimizer's state dict;
* ``exchange.pt`` / ``exchange.json``: its exchange role object's state;
* ``defenses.pt`` / ``defenses.json``: one entry per defense, in stack order;
* ``rng.pt`` / ``rng.json``: torch's and numpy's global generators;
* ``loop.json``: epochs and steps done, history, metrics so far (:class:`LoopState`);
* ``party.json``: the defenses' private noise seeds, the aligned-ID digest, the
  party's model inputs (:class:`PartyInfo`);
* ``preprocess.json``: the fitted preprocessing (:class:`PreprocessState`);
* ``ledger.json``: the message records so far.

The final model (``kind: model``) holds ``models.pt``, ``exchange.pt``/``.json``,
``defenses.pt``/``.json`` (without their secret streams: no noise key), ``preprocess.json``
and ``model.json`` (:class:`ModelInfo`): what federated prediction needs, nothing of training.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, ValidationError

from securevfl.config_errors import format_loc
from securevfl.data.fitted import from_saved
from securevfl.data.layout import FeatureLayout, feature_layout
from securevfl.errors import CheckpointError
from securevfl.snapshot import ComponentState


class _Doc(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LoopState(_Doc):
    """Where the shared schedule stands: ``epoch`` epochs and ``step`` steps done."""

    epoch: int
    step: int
    history: list[dict[str, Any]]
    metrics: dict[str, Any]
    step_times: list[float]
    training_s: float
    evaluation_s: float


class PartyInfo(_Doc):
    """What must match when the party resumes, and its defenses' private noise keys
    (:meth:`securevfl.csprng.SecretStream.state`; the set-up draws of a resumed run
    then repeat instead of releasing fresh noise on the same records). Secret: the
    party's own checkpoint only."""

    party: str
    side: str
    noise_keys: list[dict[str, Any]]
    aligned_digest: str
    n_train: int
    columns: list[str]


class PreprocessState(_Doc):
    """The party's fitted input transform: a declared ``preprocess`` entry's fitted
    values (``fitted``, securevfl.data.preprocess.Preprocessor.fitted), or the
    z-scoring statistics of its training rows (``mean``/``scale`` per input
    column), or neither (inputs used as they are). ``columns``: the model's input
    columns after any feature selection by a defense."""

    inputs: list[str]
    columns: list[str]
    fitted: dict[str, Any] | None = None
    mean: list[float] | None = None
    scale: list[float] | None = None

    def layout(self, party: str) -> FeatureLayout:
        """What the party's bottom model receives, column by column
        (:class:`~securevfl.data.layout.FeatureLayout`): a function of this saved
        state alone, so training and prediction build the same layout. The
        party's own: built in its rank for its own factory, never sent."""
        fitted = None if self.fitted is None else from_saved(self.fitted, party)
        return feature_layout(party, self.columns, fitted, standardized=self.mean is not None)


class ModelInfo(_Doc):
    """What a saved model is: its party and side, the task's settings at the active
    party (kind, classes, the regression target's scaling), its inputs."""

    party: str
    side: str
    task: dict[str, Any] | None = None
    columns: list[str]
    protocol: dict[str, Any]
    code_dir: str | None = None  # the protocol file's folder, where its own modules were found


class RngState(_Doc):
    numpy: dict[str, Any]


@dataclass
class PartyState:
    """A party's state as named files: ``tensors`` (name -> object for a ``.pt``)
    and ``docs`` (name -> JSON value for a ``.json``), with the schedule position."""

    epoch: int
    step: int
    tensors: dict[str, Any] = field(default_factory=dict)
    docs: dict[str, Any] = field(default_factory=dict)

    def doc(self, name: str, model: type[BaseModel], *, rank: int) -> Any:
        """The JSON document ``name``, validated by ``model``; a missing or
        malformed one is a CheckpointError naming the file and field."""
        if name not in self.docs:
            raise CheckpointError(f"rank {rank}: the state has no {name}.json")
        try:
            return model.model_validate(self.docs[name])
        except ValidationError as exc:
            e = exc.errors()[0]
            raise CheckpointError(
                f"rank {rank}: {name}.json: field '{format_loc(tuple(e['loc']))}': {e['msg']}"
            ) from None

    def tensor(self, name: str, *, rank: int) -> Any:
        if name not in self.tensors:
            raise CheckpointError(f"rank {rank}: the state has no {name}.pt")
        return self.tensors[name]


def aligned_digest(ids: list[str]) -> str:
    """A digest of the aligned ID order (the same at every party of a run)."""
    return hashlib.sha256("\n".join(ids).encode()).hexdigest()[:16]


def split_components(states: list[ComponentState]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    return [s.tensors for s in states], [s.meta for s in states]


def join_components(tensors: list[dict[str, Any]], meta: list[dict[str, Any]]) -> list[ComponentState]:
    if len(tensors) != len(meta):
        raise CheckpointError("defenses.pt and defenses.json hold different numbers of defenses")
    return [ComponentState.from_parts(t, m) for t, m in zip(tensors, meta, strict=True)]


def module_states(modules: dict[str, torch.nn.Module | None]) -> dict[str, Any]:
    """Each present module's state dict, detached copies on the CPU."""
    return {
        k: {n: v.detach().cpu().clone() for n, v in m.state_dict().items()}
        for k, m in modules.items()
        if m is not None
    }


def rng_state() -> tuple[dict[str, Any], dict[str, Any]]:
    """torch's and numpy's global generators (tensor part, JSON part)."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    doc = RngState(
        numpy={
            "kind": kind,
            "keys": [int(k) for k in keys],
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached": float(cached),
        }
    )
    return {"torch": torch.get_rng_state()}, doc.model_dump()


def restore_rng(tensors: dict[str, Any], doc: RngState) -> None:
    torch.set_rng_state(tensors["torch"])
    n = doc.numpy
    np.random.set_state(
        (n["kind"], np.asarray(n["keys"], dtype=np.uint32), n["pos"], n["has_gauss"], n["cached"])
    )
