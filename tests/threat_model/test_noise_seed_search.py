"""A receiver searches the seed of a defense's DP noise (SECURITY.md, "Randomness and masking").

Threat: under ``plain`` the active party A receives every h'_i = clip(h_i) + noise
from ``embedding_dp``. If the noise came from a seeded generator, A could
enumerate seeds: the right one leaves residual rows h' - noise inside the clip
ball of radius t, a wrong one leaves rows of norm about 2 sigma t sqrt(d). torch's
CPU generator keeps only the low 32 bits of a seed and numpy's legacy one takes 32,
so every such seed, however it was derived, lies in a 2^32 space: a day of one
core, minutes on a GPU; a seed derived from the protocol's public training seed
needs no search at all.

The test plays A with exactly what A receives (the released rows of one batch)
and tries every sampler a seeded defense would plausibly use (:data:`SAMPLERS`:
``torch.randn`` in float64, in torch's default float32, whether under a
``torch.Generator`` or the global generator after ``torch.manual_seed``, which
draw alike; numpy's global generator after ``np.random.seed``, fed to torch) on
two sets of seeds: the public ones (small integers, and the protocol seed with
every ordering of up to three public names, as :func:`securevfl.seeding.derive_seed`
derives), and 2^14 per sampler standing in for the rest of the 2^32 search. To
keep that part fast an oracle centres its windows on the low 32 bits of the seeds
a seeded sampler would take from the party's noise key (its first or last eight
bytes, either byte order); an attacker without it pays 2^18 times more. The
search runs on a real stack as the party builds it: with securevfl's noise,
AES-256-CTR keystream under a fresh 256-bit key, it must find nothing; with the
weakness put back in each of four ways (:data:`tests.threat_model.weak_stream.SEEDINGS`:
a seeded ``torch.Generator``, ``torch.manual_seed``, numpy's seeding feeding
torch, a seed derived from the protocol's training seed) it must find the seed
and every clean row, or it guards nothing.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator

import numpy as np
import pytest
import torch

from securevfl.app.loader import load_checked_dict
from securevfl.csprng import SecretStream
from securevfl.defenses.base import build_stack
from securevfl.seeding import derive_seed
from tests.support.protocols import small_digits
from tests.threat_model.weak_stream import SEEDINGS, plant_seeded_normal, seeded_seed

WINDOW = 1 << 16  # the positive control's window
ORACLE = 1 << 14  # the oracle's seeds, each tried with every sampler
SMALL = 1 << 12  # the public small seeds 0, 1, ..., 4095
B, D = 8, 16  # one batch of released rows (small_digits bottoms output 16 values)
PARTY, DEFENSE = "left", "embedding_dp"


def _protocol():
    doc = small_digits()
    doc["privacy"] = {}  # no pinned noise_seed: a real run's private noise
    for p in doc["parties"]["passive"]:
        params = {"variant": "vanilla", "epsilon": 2.0, "clip": 1.0}
        p["defenses"] = [{"name": "embedding_dp", "params": params}]
    return load_checked_dict(doc)


def _released(stack, h: torch.Tensor) -> torch.Tensor:
    return stack.embed(h, train=True).detach().double()


def search_mt_seed(released: torch.Tensor, scale: float, t: float, seeds: range) -> int | None:
    """The MT seed whose noise leaves every residual row inside the clip ball, if any.
    ``scale`` is the noise's standard deviation (2 sigma t for embedding_dp)."""
    for s in seeds:
        noise = torch.randn(released.shape, generator=torch.Generator().manual_seed(s), dtype=torch.float64)
        residual = released - scale * noise
        if bool((residual.norm(dim=1) <= t * (1 + 1e-9)).all()):
            return s
    return None


def _clean_rows() -> torch.Tensor:
    g = torch.Generator().manual_seed(7)
    h = torch.randn(B, D, generator=g)
    return h / h.norm(dim=1, keepdim=True) * 0.9  # inside the clip ball: clipping leaves them as they are


def test_torch_keeps_32_bits_of_a_seed():
    """The flaw that bounds the search: seeds that differ above bit 32 draw alike."""
    a = torch.randn(4, generator=torch.Generator().manual_seed(5))
    b = torch.randn(4, generator=torch.Generator().manual_seed(5 + 2**40))
    assert torch.equal(a, b)


def test_positive_control_the_search_recovers_mt_noise():
    """Noise drawn as a seeded defense drew it: the search finds the seed and
    the clean rows come back exactly."""
    checked = _protocol()
    stack = build_stack(checked.protocol, checked.components, "left", "passive")
    d = stack.defenses[0]
    h = _clean_rows()
    secret = derive_seed(123456789, "embedding_dp", "noise")  # a 63-bit seed: torch keeps 32 bits
    effective = secret & 0xFFFFFFFF
    scale = 2.0 * d.sigma * d.t
    noise = torch.randn(h.shape, generator=torch.Generator().manual_seed(secret), dtype=torch.float64)
    released = h.double() + scale * noise
    lo = max(0, effective - WINDOW // 2)
    found = search_mt_seed(released, scale, d.t, range(lo, lo + WINDOW))
    assert found == effective
    again = torch.randn(h.shape, generator=torch.Generator().manual_seed(found), dtype=torch.float64)
    assert torch.allclose(released - scale * again, h.double(), atol=1e-12)


def oracle_windows(stream: SecretStream) -> list[range]:
    """Seed windows centred on the low 32 bits of the seeds a seeded sampler would
    take from ``stream``'s key (first or last eight bytes, big- or little-endian),
    2^14 seeds in all."""
    key = bytes.fromhex(stream.state()["key"])
    width = ORACLE // 4
    out = []
    for raw in (key[:8], key[-8:]):
        for order in ("big", "little"):
            centre = (int.from_bytes(raw, order) & (2**63 - 1)) & 0xFFFFFFFF
            lo = max(0, centre - width // 2)
            out.append(range(lo, lo + width))
    return out


def _torch64(seed: int, shape: tuple[int, ...]) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _torch32(seed: int, shape: tuple[int, ...]) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).double()


_NUMPY = np.random.RandomState(0)  # the attacker's own, seeded per candidate


def _numpy(seed: int, shape: tuple[int, ...]) -> torch.Tensor:
    _NUMPY.seed(seed & 0xFFFFFFFF)
    return torch.from_numpy(_NUMPY.standard_normal(shape))


#: what a seeded defense draws its Gaussians with, as the attacker reproduces it
SAMPLERS: dict[str, Callable[[int, tuple[int, ...]], torch.Tensor]] = {
    "torch.float64": _torch64,
    "torch.float32": _torch32,
    "numpy": _numpy,
}


def public_seeds(protocol_seed: int, names: tuple[object, ...]) -> Iterator[int]:
    """Seeds anyone holding the protocol can list: small integers, and the protocol
    seed with every ordering of up to three public names (party, defense, purpose,
    rank), derived as :func:`securevfl.seeding.derive_seed` derives."""
    yield from range(SMALL)
    for k in range(4):
        for labels in itertools.permutations(names, k):
            yield derive_seed(protocol_seed, *labels)


def search(
    released: torch.Tensor, scale: float, t: float, seeds: list[range | list[int]]
) -> tuple[str, int] | None:
    """The (sampler, seed) whose noise leaves every residual row inside the clip ball, if any."""
    shape = tuple(released.shape)
    for group in seeds:
        for s in group:
            for name, draw in SAMPLERS.items():
                residual = released - scale * draw(s, shape)
                if bool((residual.norm(dim=1) <= t * (1 + 1e-9)).all()):
                    return name, s
    return None


def test_the_global_generator_draws_as_a_seeded_one():
    """Why one sampler covers ``torch.manual_seed`` and ``torch.Generator().manual_seed``."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(99)
        a = torch.randn(4, 4)
    assert torch.equal(a.double(), _torch32(99, (4, 4)))


#: the sampler and seed each planted seeding uses, as the search must name them
def _expected(way: str, stream: SecretStream, protocol_seed: int) -> tuple[str, int]:
    key_seed = seeded_seed(stream) & 0xFFFFFFFF
    return {
        "generator": ("torch.float64", key_seed),
        "global": ("torch.float32", key_seed),
        "numpy": ("numpy", key_seed),
        "protocol": ("torch.float64", derive_seed(protocol_seed, PARTY, DEFENSE)),
    }[way]


@pytest.mark.parametrize("planted", [None, *SEEDINGS], ids=["real", *SEEDINGS])
def test_the_receiver_finds_no_noise_seed_of_a_real_stack(
    planted: str | None, monkeypatch: pytest.MonkeyPatch
):
    checked = _protocol()
    proto = checked.protocol
    if planted:  # the weakness put back: the search must then find the seed
        monkeypatch.setattr(SecretStream, "normal", SecretStream.normal)  # undone after the test
        plant_seeded_normal(planted, protocol_seed=proto.training.seed, labels=(PARTY, DEFENSE))
    stack = build_stack(
        proto, checked.components, PARTY, "passive"
    )  # as the party builds it: fresh private noise
    d = stack.defenses[0]
    h = _clean_rows()
    released = _released(stack, h)
    scale = 2.0 * d.sigma * d.t
    # the released rows do carry noise: none lies inside the clip ball as it is
    assert bool((released.norm(dim=1) > d.t).all())
    names = (PARTY, DEFENSE, "noise", f"{DEFENSE}/noise", 1)
    public = list(public_seeds(proto.training.seed, names))
    found = search(released, scale, d.t, [public, *oracle_windows(d.gen)])  # the defense's own stream
    if planted is None:
        assert found is None, f"A found the noise seed {found} of a real stack"
        return
    want = _expected(planted, d.gen, proto.training.seed)
    assert found is not None and found[0] == want[0] and found[1] & 0xFFFFFFFF == want[1] & 0xFFFFFFFF, (
        found,
        want,
    )
    again = SAMPLERS[found[0]](found[1], tuple(h.shape))
    assert torch.allclose(released - scale * again, h.double(), atol=1e-4)  # every clean row, back
