"""One split model per side (securevfl.parties.split_model) serves training and
prediction: both paths get a party's model from its class, and a model saved by
the one loads into the other with the same outputs; a ``models.pt`` that does not
fit is refused naming the rank, party and field; a factory that declares
``layout`` gets the same layout from both."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import sys
import uuid
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import torch

from securevfl.app import model_io
from securevfl.app.loader import load_checked_dict
from securevfl.app.model_io import PartyModel
from securevfl.components import CheckedProtocol
from securevfl.defenses.base import build_stack
from securevfl.errors import CheckpointError
from securevfl.parties import active, passive, predict
from securevfl.parties.split_model import ActiveModel, PassiveModel
from securevfl.parties.state import ModelInfo, PreprocessState
from securevfl.parties.task_kinds import TASKS
from securevfl.runtime.layout import Role
from securevfl.snapshot import ComponentState
from securevfl.usercode import policy_of
from tests.support.protocols import small_digits

ACTIVE = Role(0, "active", "active", 0)
LEFT = Role(1, "passive", "left", 0)
#: what assembling or loading a party's model calls (securevfl.models' builders, the output check)
ASSEMBLY = {"build_bottom", "build_top", "build_interactive", "build_bias", "check_output", "load_state_dict"}


def _calls(module: ModuleType) -> set[str]:
    """Every name called in ``module``: ``f(...)`` as ``f``, ``a.b(...)`` as ``a.b`` and ``b``."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(inspect.getsource(module))):
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Name):
                out.add(f.id)
            elif isinstance(f, ast.Attribute):
                out.add(f.attr)
                if isinstance(f.value, ast.Name):
                    out.add(f"{f.value.id}.{f.attr}")
    return out


def test_training_and_prediction_get_their_model_from_the_one_class():
    """Training (the parties) and prediction (the model loader, the predictors) build
    a party's model only through ActiveModel / PassiveModel.build and never assemble
    or load model pieces themselves: a path that built its own would call a builder."""
    for module in (active, passive, predict, model_io):
        assert not _calls(module) & ASSEMBLY, (module.__name__, _calls(module) & ASSEMBLY)
    assert "ActiveModel.build" in _calls(active) and "PassiveModel.build" in _calls(passive)
    assert {"ActiveModel.build", "PassiveModel.build"} <= _calls(model_io)
    hints = {
        c: inspect.get_annotations(c, eval_str=True)["model"]
        for c in (predict.ActivePredictor, predict.PassivePredictor)
    }
    assert hints == {predict.ActivePredictor: ActiveModel, predict.PassivePredictor: PassiveModel}


def _checked(init: str = "seeded") -> CheckedProtocol:
    doc = small_digits()
    doc["parties"]["active"]["columns"] = {"glob": "px_0_[0-3]"}  # features of its own: f_A and W_A
    doc["parties"]["passive"][0]["columns"] = {"glob": "px_[1-7]_[0-3]"}
    doc["parties"]["active"]["model"] = {"kind": "mlp", "hidden": [8], "out": 16, "init": init}
    doc["parties"]["passive"][0]["model"]["init"] = init
    return load_checked_dict(doc)


def _train(model: ActiveModel | PassiveModel, x: torch.Tensor) -> None:
    """A few SGD steps on made-up targets, so the weights are not those of a fresh build."""
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    for _ in range(3):
        out = (
            model.forward(torch.ones(x.shape[0], 16), x)[1]
            if isinstance(model, ActiveModel)
            else model.forward(x, train=True)[1]
        )
        opt.zero_grad()
        (out**2).mean().backward()
        opt.step()


def _trained(checked: CheckedProtocol, role: Role, x: torch.Tensor) -> ActiveModel | PassiveModel:
    """A party's model built the training way (with the probe check) and trained a little."""
    proto, code = checked.protocol, checked.components.code
    stack = build_stack(proto, checked.components, role.party, role.kind, [])
    cpu = torch.device("cpu")
    model: ActiveModel | PassiveModel
    if role.kind == "active":
        task = TASKS.get("multiclass")(np.arange(10), [str(c) for c in range(10)], "mse")
        model = ActiveModel.build(proto, code, role, task, stack, x.shape[1], cpu, probe=x)
    else:
        model = PassiveModel.build(proto, code, role, stack, x.shape[1], cpu, probe=x)
    _train(model, x)
    return model


def _saved(
    checked: CheckedProtocol,
    role: Role,
    model: ActiveModel | PassiveModel,
    tensors: dict[str, Any],
    pre: PreprocessState | None = None,
) -> PartyModel:
    """A party's saved model as securevfl.app.model_io loads it, holding ``tensors``
    as its models.pt and ``pre`` (default: 8 raw columns) as its preprocess.json."""
    proto = checked.protocol
    spec = proto.parties.active if role.kind == "active" else proto.parties.passive[role.index]
    columns = [f"c{i}" for i in range(8)]
    task = model.task if isinstance(model, ActiveModel) else None
    info = ModelInfo(party=role.party, side=role.kind, task=None, columns=columns, protocol={})
    stack = build_stack(proto, checked.components, role.party, role.kind, [])
    pre = pre if pre is not None else PreprocessState(inputs=columns, columns=columns)
    return PartyModel(
        proto,
        checked.components,
        role,
        spec,
        info,
        pre,
        tensors,
        ComponentState.from_parts({}, {}),
        stack,
        task,
    )


@pytest.mark.parametrize("role", [ACTIVE, LEFT], ids=["active", "passive"])
@pytest.mark.parametrize("init", ["seeded", "private"])
def test_a_model_saved_by_training_loads_for_prediction_with_the_same_outputs(role: Role, init: str):
    """The model a training party saves (``tensors``) is rebuilt by the prediction
    loader into the same class and gives bit-identical outputs, with ``private``
    initial weights too (the rebuild's fresh secret weights are all replaced by
    the saved ones)."""
    checked = _checked(init)
    x = torch.randn(5, 8, generator=torch.Generator().manual_seed(1))
    trained = _trained(checked, role, x)
    loaded = _saved(checked, role, trained, trained.tensors()).split_model(torch.device("cpu"))
    assert type(loaded) is type(trained)
    with torch.no_grad():
        if isinstance(trained, ActiveModel):
            assert isinstance(loaded, ActiveModel)
            z = torch.randn(5, 16, generator=torch.Generator().manual_seed(2))
            want, got = trained.forward(z, x)[1], loaded.forward(z, x)[1]
        else:
            assert isinstance(loaded, PassiveModel)
            want, got = trained.forward(x, train=False)[1], loaded.forward(x, train=False)[1]
    assert torch.equal(want, got)
    assert trained.state().keys() == loaded.state().keys()
    assert all(torch.equal(v, loaded.state()[k]) for k, v in trained.state().items())


def test_a_models_file_that_does_not_fit_is_refused_naming_rank_party_and_field():
    checked = _checked()
    x = torch.zeros(4, 8)
    model = _trained(checked, ACTIVE, x)
    good = model.tensors()
    bad_bottom = {**good, "bottom": {k: v[:3] for k, v in good["bottom"].items()}}
    with pytest.raises(CheckpointError, match=r"rank 0 \(active\): models.pt: field 'bottom' does not fit"):
        model.load(bad_bottom)  # a checkpoint, on resume
    with pytest.raises(CheckpointError, match=r"rank 0 \(active\): models.pt: field 'bottom' does not fit"):
        _saved(checked, ACTIVE, model, bad_bottom).split_model(torch.device("cpu"))  # a saved model
    with pytest.raises(CheckpointError, match=r"rank 0 \(active\): models.pt: field 'bias' does not fit"):
        model.load({**good, "bias": torch.zeros(3)})
    without = {k: v for k, v in good.items() if k != "defense_modules"}
    with pytest.raises(CheckpointError, match=r"rank 0 \(active\): models.pt: field 'defense_modules'"):
        model.load(without)  # a checkpoint holds one state per defense module
    model.load(without, exact=False)  # a saved model of a stack without modules may not hold them


LAYOUT_FACTORY = """
from torch import nn

SEEN = []

def bottom(in_features, out, *, layout):
    SEEN.append(layout)
    return nn.Linear(in_features, out)
"""


def test_training_and_prediction_give_a_layout_factory_the_same_layout(tmp_path: Path):
    """PassiveModel.build hands a bottom factory that declares ``layout`` the
    layout of the party's fitted preprocessing: at training (the party's state)
    and at prediction (split_model, from the saved preprocess.json) alike."""
    name = f"svfl_split_layout_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(LAYOUT_FACTORY)
    finders = list(sys.meta_path)
    try:
        doc = small_digits()
        doc["parties"]["passive"][0]["model"] = {"factory": f"{name}:bottom", "out": 16}
        loaded = load_checked_dict(doc)  # the factory is not imported: no policy allows it
        code = policy_of([str(tmp_path / f"{name}.py")], str(tmp_path))
        checked = CheckedProtocol(loaded.protocol, dataclasses.replace(loaded.components, code=code))
        columns = [f"c{i}" for i in range(8)]
        pre = PreprocessState(inputs=columns, columns=columns, mean=[0.0] * 8, scale=[1.0] * 8)
        stack = build_stack(checked.protocol, checked.components, LEFT.party, LEFT.kind, [])
        x, cpu = torch.zeros(4, 8), torch.device("cpu")
        trained = PassiveModel.build(checked.protocol, code, LEFT, stack, 8, cpu, preprocess=pre, probe=x)
        _saved(checked, LEFT, trained, trained.tensors(), pre).split_model(cpu)
        seen = sys.modules[name].SEEN
    finally:
        sys.modules.pop(name, None)
        sys.meta_path[:] = finders
    want = pre.layout(LEFT.party)
    assert want.width == 8 and seen == [want, want]
