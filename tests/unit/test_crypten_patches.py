"""The parts of CrypTen securevfl replaces (securevfl.exchange.crypten_patches).

Each patch is checked three ways: on a pristine CrypTen (a fresh interpreter) the
place it touches holds what CrypTen 0.4.1 has there, and after :func:`install` every
holder has the replacement; a CrypTen whose internals moved (a test double put in
their place) stops the install with :class:`CryptenChanged` naming the place; and
the replaced part works. CrypTen's source is read for every random draw it makes,
and each must be one :data:`CRYPTEN_DRAWS` accounts for.

CrypTen runs here as one MPC party on a one-rank gloo group in this process
(dropout's mask, the provider table and the communicator slot), and, in the slow
test, as two MPC parties and the dealer in three processes: both parties draw the
same dropout mask, so the shares stay consistent.
"""

from __future__ import annotations

import ast
import fnmatch
import importlib.util
import math
import os
import subprocess
import sys
import types
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist

from securevfl.csprng import SecretStream
from securevfl.errors import ProtocolError
from securevfl.exchange import crypten_patches
from securevfl.exchange.crypten_api import DistributedCommunicator, crypten, gradients, privacy
from securevfl.exchange.crypten_api import comm as crypten_comm
from securevfl.exchange.crypten_api import mpc as crypten_mpc
from securevfl.exchange.crypten_patches import CryptenChanged
from securevfl.exchange.crypten_rng import NotASecretStream
from securevfl.exchange.crypten_runtime import serve_dealer, start_crypten, stop_crypten
from securevfl.runtime.channel import Channel
from securevfl.runtime.ledger import Ledger
from tests.unit.test_randomness_rule import _Scanner

ROOT = Path(__file__).resolve().parents[2]
CRYPTEN_SRC = Path(crypten.__file__).resolve().parent

_SEAM = "through the replaced draw functions, which draw from securevfl's secret streams"
_REFUSED = "from a torch.Generator, which the replaced draw functions refuse by name"

#: Every random draw in CrypTen 0.4.1's source, by (file, function), and what becomes of it.
CRYPTEN_DRAWS: dict[tuple[str, str], str] = {
    ("crypten/__init__.py", "_setup_prng"): "CrypTen's MT19937 generators and 64-bit seeds: securevfl "
    "never calls it (agree_streams fills crypten.generators, and crypten.init returns at once on the "
    "running communicator); were crypten.init_thread to put torch.Generators back, every draw from "
    "them is refused by the replaced draw functions and dropout",
    ("crypten/__init__.py", "_sync_seeds"): "seeds the generators (_setup_prng, crypten.manual_seed in "
    "debug mode): a SecretStream has no manual_seed, so it fails before any draw",
    ("crypten/common/rng.py", "generate_*"): "replaced in every module that holds it (patch 1)",
    ("crypten/communicator/distributed_communicator.py", "*"): "a random rendezvous file name in "
    "CrypTen's own process-group set-up, which securevfl never runs (public)",
    ("crypten/gradients.py", "Autograd*Dropout.forward"): "replaced: the mask from the global secret "
    "stream (patch 2)",
    ("crypten/mpc/primitives/*.py", "*SharedTensor.PRZS"): f"prev/next streams {_SEAM}",
    ("crypten/mpc/provider/ttp_provider.py", "TrustedThirdParty.*"): "CrypTen's TTP provider: SecretTTP "
    f"takes its place for every run (patch 4); its generator is TTPClient's, {_REFUSED}",
    ("crypten/mpc/provider/ttp_provider.py", "TTPClient.*"): "CrypTen's TTP client, which only "
    f"crypten.init starts (securevfl never does); its generators are torch.Generators, {_REFUSED}",
    ("crypten/mpc/provider/ttp_provider.py", "TTPServer.*"): "CrypTen's dealer, never run (securevfl's "
    f"SecretDealer serves); its generators are torch.Generators, {_REFUSED}",
    ("crypten/nn/privacy/dp_split.py", "DPSplitModel._process_targets"): "encrypted targets: "
    "crypten.bernoulli (secret streams); plaintext targets: refused (patch 3)",
    ("crypten/nn/privacy/dp_split.py", "DPSplitModel._generate_noise_from_src"): "refused (patch 3)",
}


class _DrawScanner(_Scanner):
    """The randomness rule's scanner, plus what only CrypTen does: reading
    ``generators[...]``, passing ``generator=``, and ``.bernoulli()``/``.manual_seed()``
    on a tensor or generator."""

    def visit_Subscript(self, node: ast.Subscript) -> None:
        v = node.value
        if (isinstance(v, ast.Attribute) and v.attr == "generators") or (
            isinstance(v, ast.Name) and v.id == "generators"
        ):
            self._add(node, "generators[...]")
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        if any(k.arg == "generator" for k in node.keywords):
            self._add(node, "generator=")
        if isinstance(node.func, ast.Attribute) and node.func.attr in ("bernoulli", "manual_seed"):
            self._add(node, f".{node.func.attr}()")
        super().visit_Call(node)


def _crypten_draws() -> list[Any]:
    out = []
    for path in sorted(CRYPTEN_SRC.rglob("*.py")):
        scanner = _DrawScanner(path.relative_to(CRYPTEN_SRC.parent).as_posix())
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SyntaxWarning)  # CrypTen's own escape sequences
            warnings.simplefilter("ignore", DeprecationWarning)
            scanner.visit(ast.parse(path.read_text()))
        out += scanner.found
    return out


def _entry(d: Any) -> tuple[str, str] | None:
    for mod, fn in CRYPTEN_DRAWS:
        if fnmatch.fnmatch(d.module, mod) and fnmatch.fnmatch(d.function, fn):
            return (mod, fn)
    return None


def test_every_random_draw_in_crypten_is_accounted_for():
    """A CrypTen that draws somewhere new (or no longer where listed) fails here."""
    assert crypten.__version__ == "0.4.1"
    draws = _crypten_draws()
    unlisted = [d.where() for d in draws if _entry(d) is None]
    assert not unlisted, "CrypTen draws where securevfl does not know:\n" + "\n".join(unlisted)
    stale = set(CRYPTEN_DRAWS) - {_entry(d) for d in draws}
    assert not stale, f"listed draws CrypTen no longer makes: {sorted(stale)}"


# -- a pristine CrypTen, then installed (a fresh interpreter) ----------------------------------

_PRISTINE = """
import inspect, sys
from securevfl.exchange import crypten_patches as P
from securevfl.exchange.crypten_api import crypten, gradients, privacy, mpc, DistributedCommunicator

def draws_held():
    return {(n, k): v.__qualname__ for n, m in list(sys.modules.items())
            if m is not None and (n == "crypten" or n.startswith("crypten."))
            for k, v in list(vars(m).items()) if k in P.DRAWS or v in P.DRAWS.values()}

# CrypTen 0.4.1's objects, where securevfl replaces them
for name, attrs in P.IMPORTERS.items():
    for a in attrs:
        f = getattr(sys.modules[name], a)
        assert f.__module__ == "crypten.common.rng" and f.__qualname__ == a, (name, a)
        assert tuple(inspect.signature(f).parameters) == P.DRAW_PARAMETERS[a], (name, a)
assert set(draws_held()) == {(n, a) for n, attrs in P.IMPORTERS.items() for a in attrs}, draws_held()
for name, cls in (
    ("dropout", gradients.AutogradDropout),
    ("_feature_dropout", gradients.AutogradFeatureDropout),
):
    assert gradients.get_grad_fn(name) is cls
    assert tuple(inspect.signature(cls.forward).parameters) == P.DROPOUT_PARAMETERS
    assert cls.forward.__module__ == "crypten.gradients"
for m in ("_generate_noise_from_src", "_process_targets"):
    assert getattr(privacy.DPSplitModel, m).__module__ == "crypten.nn.privacy.dp_split"
table = vars(mpc)["__SUPPORTED_PROVIDERS"]
assert type(table["TTP"]).__name__ == "TrustedThirdParty" and mpc.get_default_provider() is table["TFP"]
assert "instance" in vars(DistributedCommunicator) and DistributedCommunicator.instance is None

P.install()
P.install()  # idempotent
# every holder of a draw function holds securevfl's, and nothing holds CrypTen's
held = draws_held()
assert all(q in ("ring_element", "kbit_tensor") for q in held.values()), held
for name, attrs in P.IMPORTERS.items():
    for a in attrs:
        assert getattr(sys.modules[name], a) is P.DRAWS[a], (name, a)
assert gradients.AutogradDropout.forward is P.dropout_forward
assert gradients.AutogradFeatureDropout.forward is P.feature_dropout_forward
assert privacy.DPSplitModel._generate_noise_from_src is P.refuse_noise_from_src
assert privacy.DPSplitModel._process_targets.__wrapped__.__module__ == "crypten.nn.privacy.dp_split"
print("pristine and installed")
"""


def test_on_a_pristine_crypten_each_place_holds_crypten_041s_object_then_the_replacement():
    proc = subprocess.run(
        [sys.executable, "-c", _PRISTINE],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=240,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "pristine and installed"


# -- a CrypTen whose internals moved ----------------------------------------------------------


def _crypten_rng_copy() -> types.ModuleType:
    """A fresh copy of CrypTen's ``crypten/common/rng.py``: its functions are CrypTen's
    own (module ``crypten.common.rng``), as they were before securevfl replaced them."""
    spec = importlib.util.spec_from_file_location("crypten.common.rng", CRYPTEN_SRC / "common" / "rng.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def installed():
    crypten_patches.install()


def test_install_replaces_crypten_draws_and_refuses_one_it_would_miss(installed, monkeypatch):
    rng = _crypten_rng_copy()
    # a CrypTen module holding CrypTen's own draw again (as before install): replaced
    monkeypatch.setattr(
        "crypten.mpc.primitives.arithmetic.generate_random_ring_element", rng.generate_random_ring_element
    )
    crypten_patches.install()
    assert (
        sys.modules["crypten.mpc.primitives.arithmetic"].generate_random_ring_element
        is (crypten_patches.DRAWS["generate_random_ring_element"])
    )
    # a module that imports the draw under a name securevfl does not know: refused
    stray = types.ModuleType("crypten.stray_importer")
    stray.rand_ring = rng.generate_random_ring_element  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "crypten.stray_importer", stray)
    with pytest.raises(CryptenChanged, match=r"crypten\.stray_importer\.rand_ring holds crypten\.common"):
        crypten_patches.install()


def test_install_refuses_a_draw_function_that_moved_or_changed(installed, monkeypatch):
    monkeypatch.delattr("crypten.mpc.primitives.binary.generate_kbit_random_tensor")
    with pytest.raises(CryptenChanged, match=r"primitives\.binary has no generate_kbit_random_tensor"):
        crypten_patches.install()
    monkeypatch.undo()

    def generate_random_ring_element(size, generator=None, device=None):  # another signature
        raise AssertionError("never called")

    generate_random_ring_element.__module__ = "crypten.common.rng"
    generate_random_ring_element.__qualname__ = "generate_random_ring_element"
    monkeypatch.setattr("crypten.common.rng.generate_random_ring_element", generate_random_ring_element)
    with pytest.raises(CryptenChanged, match=r"generate_random_ring_element takes \('size', 'generator'"):
        crypten_patches.install()
    assert "differs from the CrypTen 0.4.1" in str(CryptenChanged("x"))


def test_install_refuses_a_dropout_that_changed(installed, monkeypatch):
    class Other(gradients.AutogradFunction):
        @staticmethod
        def forward(ctx, input, p=0.5, training=True, inplace=False):
            return input  # draws nothing: not the dropout securevfl replaces

    monkeypatch.setitem(gradients.FUNCTION_REGISTRY, "dropout", Other)
    with pytest.raises(CryptenChanged, match=r"Other\.forward no longer draws torch\.rand"):
        crypten_patches.install()
    monkeypatch.delitem(gradients.FUNCTION_REGISTRY, "dropout")
    with pytest.raises(CryptenChanged, match="no autograd function is registered as 'dropout'"):
        crypten_patches.install()


def test_install_refuses_a_dp_split_model_that_changed(installed, monkeypatch):
    monkeypatch.setattr(privacy.DPSplitModel, "_generate_noise_from_src", lambda self, size, src: None)
    with pytest.raises(CryptenChanged, match=r"_generate_noise_from_src takes \('self', 'size', 'src'\)"):
        crypten_patches.install()


def test_the_provider_table_is_where_get_default_provider_reads_it(monkeypatch):
    ours = object()
    restore = crypten_patches.use_provider("TTP", ours)
    try:
        with crypten.cfg.temp_override({"mpc.provider": "TTP"}):
            assert crypten_mpc.get_default_provider() is ours
        assert crypten_patches.provider("TTP") is ours
    finally:
        restore()
    assert type(crypten_patches.provider("TTP")).__name__ == "TrustedThirdParty"
    with pytest.raises(CryptenChanged, match="no provider 'XYZ'"):
        crypten_patches.use_provider("XYZ", ours)
    monkeypatch.setattr(crypten_mpc, "get_default_provider", lambda: None)
    with pytest.raises(CryptenChanged, match="get_default_provider no longer reads __SUPPORTED_PROVIDERS"):
        crypten_patches.provider("TTP")
    monkeypatch.undo()
    monkeypatch.delattr(crypten_mpc, "__SUPPORTED_PROVIDERS")
    with pytest.raises(CryptenChanged, match="no provider table __SUPPORTED_PROVIDERS"):
        crypten_patches.provider("TTP")


def test_the_communicator_slot_is_refused_without_a_process_group():
    if dist.is_initialized():
        pytest.skip("a process group is up in this interpreter")
    with pytest.raises(ProtocolError, match="CrypTen does not use securevfl's communicator"):
        crypten_patches.use_communicator(object())  # type: ignore[arg-type]
    assert DistributedCommunicator.instance is None


# -- one MPC party in this process ------------------------------------------------------------


@pytest.fixture(scope="module")
def process_group(tmp_path_factory: pytest.TempPathFactory):
    rdv = tmp_path_factory.mktemp("rdv") / "file"
    dist.init_process_group("gloo", init_method=f"file://{rdv}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.fixture
def alone(process_group):
    """CrypTen on one MPC party (TFP: no dealer), with securevfl's streams."""
    ch = Channel(0, {0: "r0"}, Ledger(0))
    yield start_crypten(ch, 1, 1, provider="TFP", on_failure=ch.comm_failure)
    stop_crypten()


def _global() -> SecretStream:
    return crypten.generators["global"][torch.device("cpu")]


def test_start_and_stop_use_crypten_config_and_slots_for_one_run(process_group):
    with crypten.cfg.temp_override({"mpc.provider": "HE"}):
        ch = Channel(0, {0: "r0"}, Ledger(0))
        start_crypten(ch, 1, 1, provider="TFP", on_failure=ch.comm_failure)
        try:
            assert crypten.cfg.mpc.provider == "TFP"
            assert crypten_comm.get() is DistributedCommunicator.instance
            assert isinstance(_global(), SecretStream)
        finally:
            stop_crypten()
        assert crypten.cfg.mpc.provider == "HE"  # put back, not left at the run's value
        assert DistributedCommunicator.instance is None
        assert all(not crypten.generators[n] for n in ("prev", "next", "local", "global"))
        stop_crypten()  # nothing running: nothing to do


P = 0.3
N = 4000
CPU = torch.device("cpu")


def _kept_about(mask: torch.Tensor) -> None:
    """A dropout mask keeps each value with probability 1 - p (5 sigma: a mask that
    ignores p, or is constant, fails)."""
    kept = float(mask.float().mean())
    assert abs(kept - (1 - P)) < 5 * math.sqrt(P * (1 - P) / mask.numel())


def test_autograd_dropout_draws_its_mask_from_the_global_stream(alone):
    """CrypTen's AutogradDropout (a tensor that requires a gradient): the result is
    x m / (1 - p) with m the mask the global stream gives, and so is the gradient
    (m / (1 - p)); one 64-bit word of the stream per element."""
    x_plain = torch.linspace(1.0, 2.0, N)
    x = crypten.cryptensor(x_plain, requires_grad=True)
    start = _global().state()
    y = x.dropout(P)
    assert _global().position - start["position"] == 8 * N
    mask = (SecretStream.from_state(start).uniform((N,)) > P).float()
    _kept_about(mask)
    assert y.requires_grad
    assert torch.allclose(y.get_plain_text(), x_plain * mask / (1 - P), atol=1e-3)
    y.sum().backward()
    assert torch.allclose(x.grad.get_plain_text(), mask / (1 - P), atol=1e-3)
    # evaluation mode: the identity, nothing drawn
    at = _global().position
    assert torch.allclose(x.dropout(P, training=False).get_plain_text(), x_plain, atol=1e-4)
    assert _global().position == at


def test_dropout_layers_draw_their_masks_from_the_global_stream(alone):
    """crypten.nn.Dropout on a tensor that requires a gradient and crypten.nn.Dropout2d
    (CrypTen's _feature_dropout: one mask value per sample and channel, whatever the
    tensor) after ``encrypt()``, in training mode."""
    drop = crypten.nn.Dropout(P).encrypt()
    drop.train()
    x_plain = torch.linspace(-1.0, 1.0, N)
    start = _global().state()
    y = drop(crypten.cryptensor(x_plain, requires_grad=True)).get_plain_text()
    mask = (SecretStream.from_state(start).uniform((N,)) > P).float()
    assert torch.allclose(y, x_plain * mask / (1 - P), atol=1e-3)

    drop2d = crypten.nn.Dropout2d(P).encrypt()
    drop2d.train()
    start = _global().state()
    z = drop2d(crypten.cryptensor(torch.ones(200, 20, 2, 3))).get_plain_text()
    mask = (SecretStream.from_state(start).uniform((200, 20)) > P).float()
    _kept_about(mask)
    want = (mask / (1 - P))[:, :, None, None].expand(200, 20, 2, 3)
    assert torch.allclose(z, want, atol=1e-3)


def test_dropout_without_a_gradient_draws_a_secret_mask(alone):
    """CrypTensor.dropout on a tensor that requires no gradient is CrypTen's MPC
    dropout: its mask is secret-shared (crypten.rand, from the local stream), and
    the global stream is not touched."""
    x_plain = torch.linspace(1.0, 2.0, N)
    g, local = _global().position, crypten.generators["local"][CPU].position
    y = crypten.cryptensor(x_plain).dropout(P).get_plain_text()
    assert _global().position == g and crypten.generators["local"][CPU].position > local
    mask = (y / (x_plain / (1 - P))).round()
    assert set(mask.unique().tolist()) <= {0.0, 1.0}
    assert torch.allclose(y, x_plain * mask / (1 - P), atol=1e-3)
    _kept_about(mask)


def test_a_dropout_mask_from_anything_but_a_secret_stream_is_refused(alone, monkeypatch):
    x = crypten.cryptensor(torch.ones(8), requires_grad=True)
    monkeypatch.setitem(crypten.generators["global"], CPU, torch.Generator().manual_seed(1))
    with pytest.raises(NotASecretStream, match=r"dropout asked for its mask from a torch\S*Generator"):
        x.dropout(P)
    monkeypatch.delitem(crypten.generators["global"], CPU)
    with pytest.raises(NotASecretStream, match="before securevfl agreed its secret streams"):
        x.dropout(P)


def test_dp_split_model_torch_draws_are_refused_and_its_mpc_draws_work(alone):
    model = privacy.DPSplitModel(
        torch.nn.Linear(3, 1),
        feature_src=0,
        label_src=0,
        noise_magnitude=0.1,
        noise_src=0,
        randomized_response_prob=0.2,
    )
    with pytest.raises(NotASecretStream, match=r"draws its noise at noise_src with torch\.randn"):
        model._generate_noise_from_src((4,))
    with pytest.raises(NotASecretStream, match=r"flips plaintext targets with Tensor\.bernoulli"):
        model._process_targets(torch.zeros(5))
    local = crypten.generators["local"][CPU]
    at = local.position
    flipped = model._process_targets(crypten.cryptensor(torch.zeros(5)))
    assert crypten.is_encrypted_tensor(flipped) and local.position > at
    at = local.position
    noise = model._generate_noise_no_src((400,)).get_plain_text()
    assert local.position > at and 0.05 < float(noise.std()) < 0.15


# -- two MPC parties and the dealer, three processes -----------------------------------------


def _dropout_worker(rank: int, world: int, rdv: str, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{rdv}", rank=rank, world_size=world)
    n_mpc = world - 1
    ch = Channel(rank, {r: f"rank{r}" for r in range(world)}, Ledger(rank))
    start_crypten(ch, world, n_mpc, provider="TTP", on_failure=ch.comm_failure)
    if rank == n_mpc:
        serve_dealer(ch, ch.comm_failure)
        stop_crypten()
        dist.destroy_process_group()
        return
    x = crypten.cryptensor(torch.linspace(1.0, 2.0, N), src=0, requires_grad=True)
    start = _global().state()
    y = x.dropout(P)
    y.sum().backward()
    mask = (SecretStream.from_state(start).uniform((N,)) > P).float()
    drop2d = crypten.nn.Dropout2d(P).encrypt()
    drop2d.train()
    z = drop2d(crypten.cryptensor(torch.ones(50, 8, 2, 2), src=1)).get_plain_text()
    out = {"y": y.get_plain_text(), "grad": x.grad.get_plain_text(), "mask": mask, "z": z}
    if rank == 0:
        c = crypten_comm.get()
        c.send_obj("terminate", c.get_ttp_rank(), c.ttp_group)
    stop_crypten()
    np.savez(os.path.join(out_dir, f"rank{rank}.npz"), **{k: v.numpy() for k, v in out.items()})
    dist.destroy_process_group()


@pytest.mark.slow  # three fresh interpreters importing CrypTen
@pytest.mark.timeout(300)
def test_two_parties_draw_the_same_dropout_mask(tmp_path: Path):
    """Both MPC parties draw the mask from the global stream they share, so each
    multiplies its share by the same public mask and the opened result is x m / (1 - p);
    were the masks to differ, the opened values would be sums of unrelated ring shares."""
    import torch.multiprocessing as mp

    mp.spawn(_dropout_worker, args=(3, str(tmp_path / "rdv"), str(tmp_path)), nprocs=3, join=True)
    r0, r1 = (np.load(tmp_path / f"rank{r}.npz") for r in range(2))
    assert np.array_equal(r0["mask"], r1["mask"])
    mask = torch.from_numpy(r0["mask"])
    _kept_about(mask)
    x = torch.linspace(1.0, 2.0, N)
    for r in (r0, r1):
        assert torch.allclose(torch.from_numpy(r["y"]), x * mask / (1 - P), atol=1e-3)
        assert torch.allclose(torch.from_numpy(r["grad"]), mask / (1 - P), atol=1e-3)
    z = torch.from_numpy(r0["z"])
    assert np.array_equal(r0["z"], r1["z"])
    per_channel = z[:, :, :1, :1].expand_as(z)
    assert torch.equal(z, per_channel)  # one value per sample and channel
    assert set((z * (1 - P)).round().unique().tolist()) <= {0.0, 1.0}
