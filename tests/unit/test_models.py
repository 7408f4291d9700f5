"""Models (securevfl.models): the built-in mlp and cnn as registry entries behind
the factory interface, factories by import path under a user code policy, the
private and seeded initialisations, and the set-up check of a model's output."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import pytest
import torch
from torch import nn

from securevfl.config import ModelSpec, TopSpec
from securevfl.errors import ConfigError, UserCodeError
from securevfl.models import MODELS, CNNBottom, Top, build_bottom, build_top, check_output, mlp
from securevfl.seeding import seeded
from securevfl.usercode import CodePolicy, policy_of

FACTORIES = """
import torch
from torch import nn

def good(in_features, out, *, hidden=8):
    return nn.Sequential(nn.Linear(in_features, hidden), nn.ReLU(), nn.Linear(hidden, out))

def raising(in_features, out):
    raise ValueError("the secret row 42")

def not_a_module(in_features, out):
    return [1, 2, 3]

def wide(in_features, out):
    return nn.Linear(in_features, out + 3)

def doubles(in_features, out):
    return Forward(in_features, out, "double")

class Forward(nn.Module):
    def __init__(self, in_features, out, what):
        super().__init__()
        self.lin = nn.Linear(in_features, out)
        self.what = what
    def forward(self, x):
        y = self.lin(x)
        if self.what == "nan":
            return y * float("nan")
        if self.what == "tuple":
            return (y,)
        if self.what == "double":
            return y.double()
        return y[:, 0]

def nan(in_features, out):
    return Forward(in_features, out, "nan")

def tuple_out(in_features, out):
    return Forward(in_features, out, "tuple")

def flat(in_features, out):
    return Forward(in_features, out, "flat")

def on_meta(in_features, out):
    return nn.Linear(in_features, out, device="meta")

class Fixed(nn.Module):
    def __init__(self, in_features, out):
        super().__init__()
        self.register_buffer("w", torch.ones(in_features, out))
    def forward(self, x):
        return x @ self.w

def no_parameters(in_features, out):
    return Fixed(in_features, out)

def frozen(in_features, out):
    return nn.Linear(in_features, out).requires_grad_(False)

def top(in_features, classes, *, hidden=4):
    return nn.Sequential(nn.Linear(in_features, hidden), nn.Tanh(), nn.Linear(hidden, classes))

NOT_CALLABLE = 3
"""


@pytest.fixture
def factories(tmp_path: Path):
    """A module of factories beside a (would-be) protocol file, and a policy that
    allows it; the module is forgotten afterwards."""
    name = f"svfl_factories_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(FACTORIES)
    finders = list(sys.meta_path)
    yield name, policy_of([str(tmp_path / f"{name}.py")], str(tmp_path))
    sys.modules.pop(name, None)
    sys.meta_path[:] = finders


def _spec(name: str, fn: str, **kw) -> ModelSpec:
    return ModelSpec(factory=f"{name}:{fn}", out=4, **kw)


def test_the_builtins_are_registry_entries_with_their_old_weights():
    assert {"mlp", "cnn"} <= set(MODELS.names())
    spec = ModelSpec(kind="mlp", hidden=[8], out=4, init="seeded")
    got = build_bottom(spec, 6, seed=3, party="p1")
    with seeded(3, "bottom", "p1"):
        old = mlp([6, 8, 4])
    assert all(
        torch.equal(a, b) for a, b in zip(got.state_dict().values(), old.state_dict().values(), strict=True)
    )
    cnn = ModelSpec(kind="cnn", input_shape=[1, 2, 3], channels=2, out=4, init="seeded")
    got = build_bottom(cnn, 6, seed=3, party="p1")
    with seeded(3, "bottom", "p1"):
        old = CNNBottom([1, 2, 3], 2, 4)
    assert all(
        torch.equal(a, b) for a, b in zip(got.state_dict().values(), old.state_dict().values(), strict=True)
    )
    with pytest.raises(ConfigError, match="holds 6 values but the party has 7"):
        build_bottom(cnn, 7, seed=3, party="p1")


def test_private_is_the_default_and_differs_per_build_seeded_repeats():
    spec = ModelSpec(kind="mlp", hidden=[8], out=4)
    assert spec.init == "private"
    a, b = (build_bottom(spec, 6, seed=0, party="p1").state_dict() for _ in range(2))
    assert not torch.equal(a["0.weight"], b["0.weight"])
    seeded_spec = ModelSpec(kind="mlp", hidden=[8], out=4, init="seeded")
    c, d = (build_bottom(seeded_spec, 6, seed=0, party="p1").state_dict() for _ in range(2))
    assert torch.equal(c["0.weight"], d["0.weight"]) and not torch.equal(a["0.weight"], c["0.weight"])


def test_a_factory_builds_under_the_policy_and_the_same_initialisations(factories):
    name, policy = factories
    spec = _spec(name, "good", params={"hidden": 5}, init="seeded")
    m = build_bottom(spec, 6, seed=0, party="p1", code=policy, path="parties.passive[0].model")
    assert isinstance(m, nn.Sequential) and m[0].out_features == 5
    again = build_bottom(spec, 6, seed=0, party="p1", code=policy)
    assert torch.equal(m[0].weight, again[0].weight)
    private = build_bottom(_spec(name, "good"), 6, seed=0, party="p1", code=policy)
    assert not torch.equal(
        private[0].weight, build_bottom(_spec(name, "good"), 6, seed=0, party="p1", code=policy)[0].weight
    )
    check_output(m, torch.zeros(8, 6), 4, what="w", path="p")


def test_a_factory_is_refused_without_the_policy_allowing_it(factories):
    name, _ = factories
    for code in (None, CodePolicy(frozenset({"something_else"}))):
        with pytest.raises(UserCodeError, match="not allowed") as err:
            build_bottom(
                _spec(name, "good"), 6, seed=0, party="p1", code=code, path="parties.passive[0].model"
            )
        assert f"{name}:good" in str(err.value) and err.value.path == "parties.passive[0].model.factory"
    assert name not in sys.modules


@pytest.mark.parametrize(
    ("fn", "message"),
    [
        ("raising", "factory '{name}:raising' raised ValueError"),
        ("not_a_module", "returned a list, not a torch.nn.Module"),
        ("NOT_CALLABLE", "is not callable"),
        ("missing", "module '{name}' has no 'missing'"),
        ("on_meta", "built 'weight' on meta: build the module on the CPU"),
        ("no_parameters", "factory '{name}:no_parameters' returned a module with no trainable parameter"),
        ("frozen", "factory '{name}:frozen' returned a module with no trainable parameter"),
    ],
)
def test_a_factory_that_cannot_build_is_named_with_its_party(factories, fn, message):
    name, policy = factories
    with pytest.raises(UserCodeError) as err:
        build_bottom(_spec(name, fn), 6, seed=0, party="p1", code=policy, path="parties.passive[0].model")
    text = str(err.value)
    assert message.format(name=name) in text and "party 'p1'" in text
    assert "secret row 42" not in text  # the exception's text stays with its owner
    if fn == "raising":
        assert err.value.detail is not None and "the secret row 42" in err.value.detail


@pytest.mark.parametrize(
    ("fn", "message"),
    [
        ("wide", "to shape (8, 7); the exchange needs (8, 4)"),
        ("flat", "to shape (8,); the exchange needs (8, 4)"),
        ("doubles", "outputs torch.float64; the exchange needs torch.float32"),
        ("nan", "outputs non-finite values"),
        ("tuple_out", "returned a tuple, not a tensor"),
    ],
)
def test_the_output_check_refuses_a_wrong_module(factories, fn, message):
    name, policy = factories
    m = build_bottom(_spec(name, fn), 6, seed=0, party="p1", code=policy)
    with pytest.raises(UserCodeError, match="bottom model of party 'p1'") as err:
        check_output(
            m, torch.zeros(8, 6), 4, what="bottom model of party 'p1'", path="parties.passive[0].model"
        )
    assert message in str(err.value) and err.value.path == "parties.passive[0].model"


def test_the_output_check_leaves_the_module_as_it_was():
    m = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    m.train()
    before = {k: v.clone() for k, v in m.state_dict().items()}
    check_output(m, torch.randn(8, 3), 4, what="w", path="p")
    assert m.training and all(torch.equal(before[k], v) for k, v in m.state_dict().items())
    with pytest.raises(UserCodeError, match=r"raised RuntimeError on a probe batch of shape \(8, 5\)"):
        check_output(m, torch.randn(8, 5), 4, what="w", path="p")
    assert m.training


def test_the_top_model_builtin_or_by_factory(factories):
    name, policy = factories
    builtin = build_top(TopSpec(hidden=[3]), 4, 2, seed=0)
    assert isinstance(builtin, Top)
    spec = TopSpec(factory=f"{name}:top", params={"hidden": 6})
    a = build_top(spec, 4, 2, seed=0, code=policy)
    b = build_top(spec, 4, 2, seed=0, code=policy)
    assert a[0].out_features == 6 and torch.equal(a[0].weight, b[0].weight)  # seeded
    check_output(a, torch.zeros(8, 4), 2, what="top", path="top")
    with pytest.raises(UserCodeError, match=f"top model of party 'active': factory '{name}:top'"):
        build_top(spec, 4, 2, seed=0)


def test_an_attack_rebuilding_a_partys_factory_model_imports_it_under_the_harness_policy(factories, tmp_path):
    """The attack harness runs in the local launcher, whose policy allows the
    file's own modules: an attack that rebuilds a party's own model (model
    completion's ``own_embedding``) imports the party's factory under it, and
    loads the party's trained weights into it."""
    import yaml

    from securevfl.app.loader import OWN, load_checked
    from securevfl.attacks.base import View
    from securevfl.attacks.label_inference import own_embedding
    from tests.support.protocols import load_yaml

    name, _ = factories
    doc = load_yaml("plain.yaml")
    doc["parties"]["passive"][0]["model"] = {"factory": f"{name}:good", "params": {"hidden": 5}, "out": 16}
    f = tmp_path / "p.yaml"
    f.write_text(yaml.safe_dump(doc))
    trained = build_bottom(
        ModelSpec(factory=f"{name}:good", params={"hidden": 5}, out=16),
        32,
        seed=0,
        party="left",
        code=policy_of([str(tmp_path / f"{name}.py")], str(tmp_path)),
    )
    own = {"x_train": torch.zeros(4, 32), "bottom": trained.state_dict(), "defense_modules": []}
    view = View(1, "left", {}, own)
    x = torch.randn(4, 32)
    mine = load_checked(f, allow=OWN)
    embed = own_embedding(view, mine.protocol, mine.components, sent=False)
    with torch.no_grad():
        assert torch.equal(embed(x), trained(x))
    with pytest.raises(UserCodeError, match="not allowed"):
        nothing = load_checked(f)  # a policy that allows nothing
        own_embedding(view, nothing.protocol, nothing.components, sent=False)


def test_a_factory_built_model_is_held_to_the_per_party_limits(factories, monkeypatch):
    """A factory's module is counted in its owner's rank against the limits the
    built-in models are held to at load (securevfl.model_limits): beyond the stated
    parameter count, or a training state beyond the machine's memory, it is refused
    naming the party, the factory and the field."""
    from securevfl import model_limits

    name, policy = factories
    built = build_bottom(_spec(name, "good"), 6, seed=0, party="p1", code=policy)
    n = sum(p.numel() for p in built.parameters())  # 6*8+8 + 8*4+4 = 92
    monkeypatch.setattr(model_limits, "MAX_PARAMETERS", n - 1)
    with pytest.raises(UserCodeError) as err:
        build_bottom(_spec(name, "good"), 6, seed=0, party="p1", code=policy, path="parties.passive[0].model")
    text = str(err.value)
    assert (
        f"factory '{name}:good' built a module of {n:,} trainable parameters" in text and "party 'p1'" in text
    )
    assert (
        f"a party trains at most {n - 1:,} parameters" in text
        and err.value.path == "parties.passive[0].model"
    )
    monkeypatch.setattr(model_limits, "MAX_PARAMETERS", n)
    monkeypatch.setattr("securevfl.models.physical_memory", lambda: n * model_limits.BYTES_PER_PARAMETER - 1)
    with pytest.raises(UserCodeError, match=r"this machine has 0\.0 GiB of memory"):
        build_bottom(_spec(name, "good"), 6, seed=0, party="p1", code=policy)
    monkeypatch.setattr("securevfl.models.physical_memory", lambda: n * model_limits.BYTES_PER_PARAMETER)
    assert (
        sum(
            p.numel()
            for p in build_bottom(_spec(name, "good"), 6, seed=0, party="p1", code=policy).parameters()
        )
        == n
    )
