"""A plugin defense's hooks are held to their contract where the party's stack
calls them (securevfl/defenses/contract.py): what one returns of the wrong kind,
or raises, is the user's UserCodeError naming the defense, its hook and its party
and the protocol entry, never an internal error, and never trained on silently
(a one-row gradient would be broadcast over the batch)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from securevfl.app.loader import load_checked_dict
from securevfl.csprng import SecretStream
from securevfl.defenses.base import Defense, DefenseContext, DefenseOptions, DefenseStack
from securevfl.errors import UserCodeError
from tests.support.protocols import small_digits


class Misbehaving(Defense[DefenseOptions]):
    """Returns, per hook, whatever the test sets in ``out`` (or raises)."""

    name = "label_dp"  # the protocol entry it stands for (the stack only reads the name)
    out: dict[str, Any] = {}

    def _give(self, hook: str, default: Any) -> Any:
        value = self.out.get(hook, default)
        if isinstance(value, Exception):
            raise value
        return value(default) if callable(value) else value

    def embed(self, h: torch.Tensor, *, train: bool) -> torch.Tensor:
        return self._give("embed", h)

    def grad(self, g: torch.Tensor) -> torch.Tensor:
        return self._give("grad", g)

    def labels(self, y: torch.Tensor, *, classes: int | None = None) -> torch.Tensor:
        return self._give("labels", y)

    def select_features(self, x: np.ndarray, columns: list[str]) -> tuple[np.ndarray, list[str]]:
        return self._give("select_features", (x, columns))

    def top_loss(self, z: Any, logits: Any, y: Any, embeddings: Any = None) -> torch.Tensor | None:
        return self._give("top_loss", None)


def _stack(out: dict[str, Any]) -> DefenseStack:
    doc = small_digits()
    doc["parties"]["active"]["defenses"] = [{"name": "label_dp", "params": {"epsilon": 2.0}}]
    checked = load_checked_dict(doc)
    party = checked.protocol.parties.active.name
    ctx = DefenseContext(checked.protocol, checked.components, party, "active", 0, SecretStream.fresh())
    d = Misbehaving(DefenseOptions(), ctx)
    d.out = out
    return DefenseStack([d])


H = torch.randn(8, 4)
Y = torch.tensor([0, 1, 2, 3, 4, 5, 6, 7])


@pytest.mark.parametrize(
    ("hook", "out", "call", "said"),
    [
        (
            "grad",
            lambda g: g[:1],
            lambda s: s.grad(H),
            "its grad hook returned shape (1, 4) for an input of shape (8, 4)",
        ),
        ("grad", lambda g: g.T, lambda s: s.grad(H), "its grad hook returned shape (4, 8)"),
        ("embed", lambda h: h.tolist(), lambda s: s.embed(H, train=True), "its embed hook returned a list"),
        (
            "embed",
            lambda h: h.long(),
            lambda s: s.embed(H, train=True),
            "returned torch.int64, not a floating",
        ),
        (
            "embed",
            RuntimeError("row 3 is 0.25"),
            lambda s: s.embed(H, train=True),
            "its embed hook raised RuntimeError",
        ),
        (
            "labels",
            lambda y: y + 10,
            lambda s: s.labels(Y, classes=10),
            "returned a class index outside 0..9",
        ),
        ("labels", lambda y: y - 1, lambda s: s.labels(Y, classes=10), "returned a class index outside 0..9"),
        ("labels", lambda y: y.float(), lambda s: s.labels(Y, classes=10), "not integer class indices"),
        (
            "labels",
            lambda y: y.tolist(),
            lambda s: s.labels(Y, classes=10),
            "its labels hook returned a list",
        ),
        (
            "labels",
            lambda y: y[:3],
            lambda s: s.labels(Y, classes=10),
            "returned shape (3,) for labels of shape (8,)",
        ),
        (
            "top_loss",
            [1.0],
            lambda s: s.top_loss(H, H, Y),
            "its top_loss hook returned a list, not None or a scalar",
        ),
        ("top_loss", lambda _: H, lambda s: s.top_loss(H, H, Y), "returned a tensor of shape (8, 4)"),
        (
            "select_features",
            lambda xc: (xc[0][:, :2], xc[1]),
            lambda s: s.select_features(np.zeros((8, 4)), list("abcd")),
            "column names that do not name its 2 columns",
        ),
    ],
)
def test_a_plugin_defense_breaking_its_contract_is_named(hook, out, call, said) -> None:
    stack = _stack({hook: out})
    with pytest.raises(UserCodeError) as info:
        call(stack)
    msg = str(info.value)
    assert said in msg and "defense 'label_dp' of party 'active'" in msg, msg
    assert info.value.path == "parties.active.defenses[0]"
    assert "0.25" not in msg  # what a hook raised is its owner's alone (detail)
    if "raised" in said:
        assert info.value.detail is not None and "row 3 is 0.25" in info.value.detail


def test_a_plugin_defense_keeping_its_contract_passes() -> None:
    stack = _stack(
        {"embed": lambda h: h * 2, "labels": lambda y: (y + 1) % 10, "top_loss": torch.tensor(0.5)}
    )
    assert torch.equal(stack.embed(H, train=True), H * 2) and torch.equal(stack.grad(H), H)
    assert torch.equal(stack.labels(Y, classes=10), (Y + 1) % 10)
    assert float(stack.top_loss(H, H, Y)) == 0.5  # type: ignore[arg-type]
