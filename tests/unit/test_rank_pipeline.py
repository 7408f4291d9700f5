"""The one rank pipeline's parts (securevfl.app.rank) without starting a rank: the
phases the local launcher sends to its ranks, the resume offer, and the exchange
context built from the protocol alone (the wire form of each passive party's
embedding read from the components, not from the defenses)."""

from __future__ import annotations

import pickle
from typing import Any, cast

import pytest
import torch

from securevfl.app.loader import load_checked_dict
from securevfl.app.predict import Predict
from securevfl.app.rank import exchange_context
from securevfl.app.rank_layout import layout_of
from securevfl.app.training import Train
from securevfl.errors import ConfigError
from securevfl.runtime.channel import Channel
from securevfl.runtime.session import ResumeOffer
from tests.support.protocols import small_digits


def _proto(**changes: Any) -> Any:
    doc = small_digits()
    doc["parties"]["passive"][0]["defenses"] = [{"name": "hashvfl"}]
    doc.update(changes)
    return load_checked_dict(doc)


def test_each_phase_names_its_purpose_and_files(tmp_path):
    """A rank's hello carries the phase's purpose (a training rank cannot join a
    prediction) and its files do not overwrite the training run's."""
    train = Train(tmp_path, tmp_path / "data")
    predict = Predict(tmp_path / "run", tmp_path, tmp_path / "data")
    assert (train.purpose, train.files) == ("train", "")
    assert (predict.purpose, predict.files) == ("predict", "predict_")


def test_phases_travel_to_a_rank_as_start_arguments(tmp_path):
    """The local launcher pickles each rank's phase into its start arguments; a
    prediction's model is loaded in the rank, never sent."""
    train = Train(tmp_path, tmp_path / "data", progress=False, resume=True)
    assert pickle.loads(pickle.dumps(train)) == train
    predict = Predict(tmp_path / "run", tmp_path, tmp_path / "data", data=tmp_path / "new.csv")
    again = pickle.loads(pickle.dumps(predict))
    assert (again.run_dir, again.out_dir, again.data_dir, again.data, again.model) == (
        tmp_path / "run",
        tmp_path,
        tmp_path / "data",
        tmp_path / "new.csv",
        None,
    )


def test_only_a_resume_offers_checkpoints(tmp_path):
    checked = _proto()
    proto = checked.protocol
    layout = layout_of(checked)
    assert Train(tmp_path, tmp_path).offer(proto, layout.role(1)) is None
    assert Predict(tmp_path, tmp_path, tmp_path).offer(proto, layout.role(1)) is None
    offer = Train(tmp_path, tmp_path, resume=True).offer(proto, layout.role(1))
    assert isinstance(offer, ResumeOffer) and offer.checkpoints == {} and offer.error is None


def test_the_exchange_context_takes_the_wire_form_from_the_components():
    """Both ends of the plain exchange decide from the protocol alone whether a
    party's embeddings are codes: the context lists it per passive party."""
    checked = _proto()
    proto, comps = checked.protocol, checked.components
    layout = layout_of(checked)
    ctx = exchange_context(checked, layout, 0, cast(Channel, None))
    assert ctx.sends_codes == [True, False] == [p.sends_codes for p in comps.passive]
    assert ctx.embed_dims == [p.model.out for p in proto.parties.passive if p.model]
    assert ctx.options is comps.exchange.options
    assert ctx.device == torch.device("cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_the_exchange_context_refuses_a_missing_cuda_device():
    doc = small_digits()
    doc["training"]["device"] = "cuda"
    checked = load_checked_dict(doc)
    with pytest.raises(ConfigError, match="no CUDA device") as err:
        exchange_context(checked, layout_of(checked), 0, cast(Channel, None))
    assert err.value.path == "training.device"
