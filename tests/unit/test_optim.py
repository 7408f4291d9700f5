"""securevfl.optim against torch.optim: the same numbers bit for bit on CPU, state
dicts that load either way, clear refusals, and no torch._dynamo import."""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import torch

from securevfl import optim

CASES = [
    ("sgd", {"lr": 0.1}),
    ("sgd", {"lr": 0.05, "momentum": 0.9}),
    ("sgd", {"lr": 0.05, "momentum": 0.9, "dampening": 0.1, "weight_decay": 1e-3}),
    ("sgd", {"lr": 0.05, "momentum": 0.8, "nesterov": True}),
    ("adam", {"lr": 1e-2}),
    ("adam", {"lr": 3e-3, "weight_decay": 1e-5, "betas": (0.8, 0.99), "eps": 1e-6}),
    ("adam", {"lr": 1e-2, "amsgrad": True}),
]


def make(kind: str, lib: str, params, **kw):
    cls = {"sgd": "SGD", "adam": "Adam"}[kind]
    return getattr(torch.optim if lib == "torch" else optim, cls)(params, **kw)


def model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3))


def train(net: torch.nn.Module, opt, steps: int, seed: int = 1) -> None:
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(16, 5, generator=g)
        y = torch.randint(0, 3, (16,), generator=g)
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(net(x), y).backward()
        opt.step()


@pytest.mark.parametrize(("kind", "kw"), CASES)
def test_steps_match_torch_bit_for_bit(kind, kw):
    a, b = model(), model()
    train(a, make(kind, "torch", a.parameters(), **kw), steps=12)
    train(b, make(kind, "ours", b.parameters(), **kw), steps=12)
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb)
    assert not torch.equal(next(model().parameters()), next(b.parameters()))  # it did train


@pytest.mark.parametrize(("kind", "kw"), CASES)
@pytest.mark.parametrize("direction", ["torch->ours", "ours->torch"])
def test_state_dicts_load_either_way_and_resume_identically(kind, kw, direction):
    src_lib, dst_lib = direction.split("->")
    ref = model()
    ref_opt = make(kind, src_lib, ref.parameters(), **kw)
    train(ref, ref_opt, steps=5)
    net = model()
    net.load_state_dict(ref.state_dict())
    opt = make(kind, dst_lib, net.parameters(), **kw)
    opt.load_state_dict(copy.deepcopy(ref_opt.state_dict()))  # torch's load keeps the tensors it is given
    train(ref, ref_opt, steps=4, seed=7)
    train(net, opt, steps=4, seed=7)
    for pa, pb in zip(ref.parameters(), net.parameters(), strict=True):
        assert torch.equal(pa, pb)


def test_state_dict_layout_is_torchs():
    net = model()
    ours, theirs = optim.Adam(net.parameters(), lr=1e-2), torch.optim.Adam(model().parameters(), lr=1e-2)
    train(net, ours, steps=2)
    sd = ours.state_dict()
    assert sd["param_groups"][0].keys() == theirs.state_dict()["param_groups"][0].keys()
    assert sorted(sd["state"]) == [0, 1, 2, 3]
    assert set(sd["state"][0]) == {"step", "exp_avg", "exp_avg_sq"}
    assert sd["state"][0]["step"].item() == 2.0


def test_loaded_state_is_a_copy():
    net = model()
    opt = optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    train(net, opt, steps=2)
    saved = opt.state_dict()
    before = saved["state"][0]["momentum_buffer"].clone()
    other = optim.SGD(model().parameters(), lr=0.1, momentum=0.9)
    other.load_state_dict(saved)
    train(model(), other, steps=1)
    assert torch.equal(saved["state"][0]["momentum_buffer"], before)


def test_mismatched_state_dicts_are_refused_and_change_nothing():
    net = model()
    opt = optim.Adam(net.parameters(), lr=1e-2)
    train(net, opt, steps=1)
    other = optim.Adam(list(model().parameters())[:2], lr=1e-2)
    with pytest.raises(ValueError, match="has 4 parameters, this one 2"):
        other.load_state_dict(opt.state_dict())
    sd = opt.state_dict()
    sd["state"][0] = {**sd["state"][0], "exp_avg": torch.zeros(2, 2)}
    fresh = optim.Adam(model().parameters(), lr=0.5)
    with pytest.raises(ValueError, match="'exp_avg' of parameter 0 has shape"):
        fresh.load_state_dict(sd)
    assert fresh.state == {} and fresh.param_groups[0]["lr"] == 0.5
    with pytest.raises(ValueError, match="'state' and 'param_groups'"):
        fresh.load_state_dict({"state": {}})


def test_bad_arguments_are_refused():
    p = [torch.zeros(2, requires_grad=True)]
    with pytest.raises(ValueError, match="empty parameter list"):
        optim.SGD([], lr=0.1)
    with pytest.raises(ValueError, match=">= 0"):
        optim.SGD(p, lr=-1.0)
    with pytest.raises(ValueError, match="Nesterov"):
        optim.SGD(p, lr=0.1, nesterov=True)
    with pytest.raises(ValueError, match="betas"):
        optim.Adam(p, betas=(1.0, 0.9))
    with pytest.raises(ValueError, match="more than one parameter group"):
        optim.SGD([{"params": p}, {"params": p}], lr=0.1)


def test_zero_grad_sets_to_none_or_zero():
    net = model()
    opt = optim.SGD(net.parameters(), lr=0.1)
    train(net, opt, steps=1)
    opt.zero_grad(set_to_none=False)
    assert all(p.grad is not None and not p.grad.any() for p in net.parameters())
    opt.zero_grad()
    assert all(p.grad is None for p in net.parameters())


def test_parameter_groups_keep_their_own_hyperparameters():
    a, b = torch.nn.Linear(3, 1), torch.nn.Linear(3, 1)
    opt = optim.SGD([{"params": a.parameters()}, {"params": b.parameters(), "lr": 0.0}], lr=0.5)
    before = b.weight.detach().clone()
    (a(torch.ones(1, 3)) + b(torch.ones(1, 3))).sum().backward()
    opt.step()
    assert torch.equal(b.weight, before) and not torch.equal(a.weight.grad, torch.zeros_like(a.weight))


def test_using_the_optimizers_imports_no_torch_dynamo():
    code = (
        "import sys, torch\n"
        "from securevfl import optim\n"
        "net = torch.nn.Linear(3, 2)\n"
        "for opt in (optim.SGD(net.parameters(), lr=0.1, momentum=0.9), optim.Adam(net.parameters())):\n"
        "    opt.zero_grad(); net(torch.ones(1, 3)).sum().backward(); opt.step()\n"
        "    opt.load_state_dict(opt.state_dict())\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "False"
