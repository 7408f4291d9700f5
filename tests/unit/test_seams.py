"""The extension seams: registries, defense/attack capability checks at load,
and the defense stack folding hooks in protocol order."""

from __future__ import annotations

import pytest
import torch

from securevfl.app.loader import load_checked_dict, load_protocol_dict
from securevfl.attacks import ATTACKS
from securevfl.attacks.base import Attack
from securevfl.csprng import SecretStream
from securevfl.defenses import DEFENSES
from securevfl.defenses.base import Defense, DefenseContext, DefenseOptions, DefenseStack
from securevfl.errors import ConfigError, UnsupportedCombination
from securevfl.registry import Registry
from tests.support.protocols import small_digits


class Shift(Defense):
    """Test double: adds a constant to embeddings; needs A to see them."""

    name = "test_shift"
    sides = frozenset({"passive"})
    requires = frozenset({"active_sees_embeddings"})

    class options(DefenseOptions):
        by: float = 1.0

    def embed(self, h, *, train):
        return h + self.params.by


class Peek(Attack):
    name = "test_peek"
    requires = frozenset({"active_sees_embeddings"})


@pytest.fixture
def registered():
    DEFENSES.add(Shift.name, Shift)
    ATTACKS.add(Peek.name, Peek)
    try:
        yield
    finally:
        DEFENSES.remove(Shift.name)
        ATTACKS.remove(Peek.name)


def _with(backend: str, defenses=None, attacks=None, side="passive"):
    doc = small_digits()
    doc["exchange"] = {"backend": backend}
    if defenses is not None:
        target = doc["parties"]["passive"][0] if side == "passive" else doc["parties"]["active"]
        target["defenses"] = defenses
    if attacks is not None:
        doc["attacks"] = attacks
    return doc


def test_registry_refuses_duplicates_and_names_known():
    reg: Registry[int] = Registry("thing")
    reg.add("a", 1)
    with pytest.raises(ValueError):
        reg.add("a", 2)
    reg.add("a", 3, force=True)
    assert reg.get("a") == 3
    with pytest.raises(ConfigError, match=r"unknown thing 'b' \(known: a\)"):
        reg.get("b")


def test_defense_accepted_where_capability_exists(registered):
    proto = load_protocol_dict(_with("plain", [{"name": "test_shift", "params": {"by": 2.0}}]))
    assert proto.parties.passive[0].defenses[0].name == "test_shift"


def test_defense_rejected_where_backend_hides_embeddings(registered):
    with pytest.raises(UnsupportedCombination) as exc:
        load_protocol_dict(_with("mpc", [{"name": "test_shift"}]))
    msg = str(exc.value)
    assert "parties.passive[0].defenses[0]" in msg and "active_sees_embeddings" in msg and "mpc" in msg


def test_defense_rejected_on_wrong_side_and_bad_params(registered):
    with pytest.raises(UnsupportedCombination, match="passive party, not the active party"):
        load_protocol_dict(_with("plain", [{"name": "test_shift"}], side="active"))
    with pytest.raises(ConfigError, match=r"parties\.passive\[0\]\.defenses\[0\]\.params\.byy"):
        load_protocol_dict(_with("plain", [{"name": "test_shift", "params": {"byy": 1}}]))


def test_attack_capability_checked(registered):
    load_protocol_dict(_with("plain", attacks=[{"name": "test_peek"}]))
    with pytest.raises(UnsupportedCombination, match=r"attacks\[0\]"):
        load_protocol_dict(_with("mpc", attacks=[{"name": "test_peek"}]))


def test_unknown_defense_lists_known(registered):
    with pytest.raises(ConfigError, match=r"unknown defense 'nope' \(known: .*test_shift"):
        load_protocol_dict(_with("plain", [{"name": "nope"}]))


def test_stack_applies_hooks_in_order():
    checked = load_checked_dict(small_digits())
    ctx = DefenseContext(
        checked.protocol, checked.components, "left", "passive", 0, SecretStream.from_seed(0, "test")
    )
    a = Shift(Shift.options(by=1.0), ctx)
    b = Shift(Shift.options(by=10.0), ctx)

    class Double(Defense):
        name = "double"

        def embed(self, h, *, train):
            return h * 2

    stack = DefenseStack([a, Double(DefenseOptions(), ctx), b])
    assert torch.equal(stack.embed(torch.zeros(2), train=True), torch.full((2,), 12.0))
    assert stack.local_loss(torch.zeros(1), torch.zeros(1)) is None
    assert torch.equal(stack.labels(torch.tensor([1, 2])), torch.tensor([1, 2]))


# -- FedBCD local steps (training.local_steps) ------------------------------------------


@pytest.mark.parametrize("backend", ["mpc", "ckks", "paillier"])
def test_local_steps_are_refused_where_a_cannot_recompute_z_alone(backend: str):
    doc = _with(backend)
    doc["training"]["local_steps"] = 2
    with pytest.raises(UnsupportedCombination) as exc:
        load_protocol_dict(doc)
    assert exc.value.path == "training.local_steps"
    assert f"backend '{backend}'" in str(exc.value) and "plain" in str(exc.value)


@pytest.mark.parametrize(
    "name,params", [("embedding_dp", {"variant": "vanilla", "epsilon": 2.0}), ("hashvfl", {})]
)
def test_defenses_that_need_fresh_gradients_refuse_local_steps(name: str, params: dict):
    doc = _with("plain", defenses=[{"name": name, "params": params}])
    load_protocol_dict(doc)  # valid with R = 1
    doc["training"]["local_steps"] = 3
    with pytest.raises(UnsupportedCombination) as exc:
        load_protocol_dict(doc)
    assert exc.value.path == "parties.passive[0].defenses[0]"
    assert f"'{name}'" in str(exc.value) and "local_steps" in str(exc.value)


@pytest.mark.parametrize(
    "defenses,side",
    [
        ([{"name": "crdp", "params": {"variant": "fixed"}}], "passive"),
        ([{"name": "gaussian_noise", "params": {"std": 0.5}}], "passive"),
        ([{"name": "dravl", "params": {"alpha_d": 0.1}}], "passive"),
        ([{"name": "label_dp", "params": {"epsilon": 1.0}}], "active"),
    ],
)
def test_defenses_with_a_local_step_form_accept_local_steps(defenses, side):
    doc = _with("plain", defenses=defenses, side=side)
    doc["training"]["local_steps"] = 3
    assert load_protocol_dict(doc).training.local_steps == 3


def test_every_defense_that_changes_h_says_what_a_local_step_differentiates():
    """A defense overriding ``embed`` must state its noise-free form (``embed_local``)
    or why local steps cannot work; otherwise a local step would silently
    differentiate the bare h (e.g. skip a clip)."""
    for name in DEFENSES.names():
        cls = DEFENSES.get(name)
        if cls.embed is not Defense.embed:
            assert cls.local_steps_refusal or cls.embed_local is not Defense.embed_local, name


def test_crdp_local_step_form_clips_and_never_adds_noise():
    from securevfl.defenses.crdp import Crdp, CrdpOptions

    d = Crdp.__new__(Crdp)  # only the options matter for embed_local
    d.p = CrdpOptions(variant="fixed", clip=0.5)
    h = torch.tensor([[-2.0, 0.1, 3.0]])
    assert torch.equal(d.embed_local(h), torch.tensor([[-0.5, 0.1, 0.5]]))
    d.p = CrdpOptions()  # faithful: unit sensitivity, no clip
    assert torch.equal(d.embed_local(h), h)


@pytest.mark.parametrize(
    ("defenses", "codes"),
    [
        ([], False),
        ([{"name": "hashvfl"}], True),
        ([{"name": "hashvfl", "params": {"dp": "paper", "epsilon": 2.0}}], True),
        ([{"name": "hashvfl", "params": {"dp": "code", "epsilon": 2.0}}], False),
        ([{"name": "hashvfl", "params": {"send": "continuous"}}], False),
        ([{"name": "hashvfl"}, {"name": "gaussian_noise", "params": {"std": 1.0}}], False),
        ([{"name": "gaussian_noise", "params": {"std": 1.0}}, {"name": "hashvfl"}], True),
    ],
)
def test_a_party_sends_codes_only_when_its_last_embedding_change_emits_them(defenses, codes):
    """The plain exchange packs a party's embeddings into bits exactly when every
    value it sends is +-1 by construction (both ends derive this from the protocol)."""
    doc = small_digits()
    doc["parties"]["passive"][0]["defenses"] = defenses
    comps = load_checked_dict(doc).components
    assert comps.party("left").sends_codes is codes
    assert comps.party("right").sends_codes is False
