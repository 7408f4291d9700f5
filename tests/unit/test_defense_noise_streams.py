"""A defense's secret noise streams: one live stream per purpose, resumed exactly from a
checkpoint, fresh at every prediction (SECURITY.md §6a, "Every secret draw"; "Prediction")."""

from __future__ import annotations

import json
from typing import Any

import pytest

from securevfl.app.loader import load_checked
from securevfl.csprng import SecretStream
from securevfl.defenses.base import DefenseContext, DefenseStack, build_stack
from securevfl.snapshot import SECRET_STREAM
from tests.support.protocols import PROTOCOLS

#: shipped protocols whose defenses keep secret streams (every such defense among them)
SHIPPED = ["vfl_afe_plain", "gaussian_noise_plain", "crdp_plain", "hashvfl_plain", "dravl_plain"]
NOISY = {"embedding_dp", "gaussian_noise", "crdp", "hashvfl", "dravl"}


def _ctx() -> DefenseContext:
    checked = load_checked(PROTOCOLS / "plain.yaml")
    return DefenseContext(
        checked.protocol, checked.components, "left", "passive", 0, SecretStream(bytes(range(32)))
    )


def test_asking_twice_for_one_purpose_gives_the_same_live_stream():
    """A second child of the same key would start at position 0 and replay the
    keystream already drawn; the context hands back the stream where it stands."""
    ctx = _ctx()
    first = ctx.noise_stream("embedding_dp", "noise")
    drawn = first.bytes(64)
    again = ctx.noise_stream("embedding_dp", "noise")
    assert again is first and again.position == 64
    assert again.bytes(64) != drawn
    whole = ctx.noise.child("embedding_dp", "noise").bytes(128)  # the one stream, from its start
    assert whole[:64] == drawn
    # labels that make the same HKDF info are the same purpose (the same key)
    assert ctx.noise_stream("embedding_dp|noise") is first
    other = ctx.noise_stream("embedding_dp", "other")
    assert other is not first and other.bytes(64) != drawn


def _stacks(name: str) -> list[tuple[Any, str, str]]:
    checked = load_checked(PROTOCOLS / f"{name}.yaml")
    proto = checked.protocol
    parties = [(proto.parties.active.name, "active"), *((p.name, "passive") for p in proto.parties.passive)]
    return [(checked, party, side) for party, side in parties]


def _streams(stack: DefenseStack) -> dict[tuple[int, str], SecretStream]:
    return {
        (i, attr): v
        for i, d in enumerate(stack.defenses)
        for attr, v in vars(d).items()
        if isinstance(v, SecretStream)
    }


def _trained(checked: Any, party: str, side: str) -> DefenseStack:
    """A stack whose streams have drawn, as in training."""
    stack = build_stack(checked.protocol, checked.components, party, side)
    for k, s in enumerate(_streams(stack).values()):
        s.bytes(40 + 8 * k)
    return stack


@pytest.mark.parametrize("name", SHIPPED)
def test_resume_rewinds_every_stream_and_prediction_draws_fresh_keys(name: str):
    for checked, party, side in _stacks(name):
        stack = _trained(checked, party, side)
        saved = {k: s.state() for k, s in _streams(stack).items()}

        resumed = build_stack(
            checked.protocol, checked.components, party, side, noise_keys=stack.noise_keys()
        )
        resumed.restore(stack.checkpoint_state())
        assert {k: s.state() for k, s in _streams(resumed).items()} == saved

        predicting = build_stack(
            checked.protocol, checked.components, party, side
        )  # as securevfl.app.model_io builds it
        predicting.restore_trained(stack.checkpoint_state())
        now = _streams(predicting)
        assert set(now) == set(saved)
        for k, s in now.items():
            assert s.state()["key"] != saved[k]["key"] and s.position == 0, (name, party, k)


def test_every_noisy_defense_keeps_a_stream_in_the_protocols_above():
    """So the two tests around this one cover each of them."""
    with_streams = {
        stack.defenses[i].name
        for n in SHIPPED
        for checked, party, side in _stacks(n)
        for stack in [build_stack(checked.protocol, checked.components, party, side)]
        for i, _ in _streams(stack)
    }
    assert with_streams == NOISY


@pytest.mark.parametrize("name", SHIPPED)
def test_a_saved_model_holds_no_noise_key(name: str):
    for checked, party, side in _stacks(name):
        stack = _trained(checked, party, side)
        keys = [s.state()["key"] for s in _streams(stack).values()] + [k["key"] for k in stack.noise_keys()]
        states = stack.model_state()
        text = json.dumps([s.meta for s in states])
        assert not any(m.startswith(SECRET_STREAM) for s in states for m in s.meta), (name, party)
        assert not any(k in text for k in keys), (name, party)
        # the rest of the state is kept: the checkpoint's, less the streams
        full = stack.checkpoint_state()
        for kept, whole in zip(states, full, strict=True):
            assert set(kept.tensors) == set(whole.tensors)
            assert set(whole.meta) - set(kept.meta) == {m for m in whole.meta if m.startswith(SECRET_STREAM)}
