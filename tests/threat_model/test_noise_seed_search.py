"""A receiver searches the seed of a defense's DP noise (SECURITY.md, "Randomness and masking").

Threat: under ``plain`` the active party A receives every h'_i = clip(h_i) + noise
from ``embedding_dp``. If the noise came from a seeded Mersenne Twister, A could
enumerate seeds: the right one leaves residual rows h' - noise inside the clip
ball of radius t, a wrong one leaves rows of norm about 2 sigma t sqrt(d). torch's
CPU generator keeps only the low 32 bits of a seed, so every seed, however it was
derived, lies in a 2^32 space: a day of one core, minutes on a GPU.

The test plays A with exactly what A receives (the released rows of one batch)
and searches 2^16 Mersenne Twister seeds. To keep it fast an oracle stands in for
the rest of the 2^32 search: it centres windows on the low 32 bits of the seeds a
seeded sampler would take from the party's noise key (its first or last eight
bytes, either byte order); an attacker without it pays 2^16 times more. The
search runs twice on a real stack as the party builds it: with securevfl's
noise, AES-256-CTR keystream under a fresh 256-bit key, it must find nothing;
with the weakness put back (Gaussians from ``torch.randn`` under a generator
seeded from that key, :func:`tests.threat_model.weak_stream.plant_seeded_normal`)
it must find the seed and every clean row, or it guards nothing. The positive
control shows the search itself working on noise drawn as a seeded defense drew it.
"""

from __future__ import annotations

import pytest
import torch

from securevfl.app.loader import load_protocol_dict
from securevfl.csprng import SecretStream
from securevfl.defenses.base import build_stack
from securevfl.seeding import derive_seed
from tests.support.protocols import small_digits
from tests.threat_model.weak_stream import plant_seeded_normal, seeded_seed

WINDOW = 1 << 16
B, D = 8, 16  # one batch of released rows (small_digits bottoms output 16 values)


def _protocol():
    doc = small_digits()
    doc["privacy"] = {}  # no pinned noise_seed: a real run's private noise
    for p in doc["parties"]["passive"]:
        params = {"variant": "vanilla", "epsilon": 2.0, "clip": 1.0}
        p["defenses"] = [{"name": "embedding_dp", "params": params}]
    return load_protocol_dict(doc)


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
    proto = _protocol()
    stack = build_stack(proto, "left", "passive")
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
    2^16 seeds in all."""
    key = bytes.fromhex(stream.state()["key"])
    width = WINDOW // 4
    out = []
    for raw in (key[:8], key[-8:]):
        for order in ("big", "little"):
            centre = (int.from_bytes(raw, order) & (2**63 - 1)) & 0xFFFFFFFF
            lo = max(0, centre - width // 2)
            out.append(range(lo, lo + width))
    return out


@pytest.mark.parametrize("planted", [False, True], ids=["real", "planted"])
def test_the_receiver_finds_no_noise_seed_of_a_real_stack(planted: bool, monkeypatch: pytest.MonkeyPatch):
    if planted:  # the weakness put back: the search must then find the seed
        monkeypatch.setattr(SecretStream, "normal", SecretStream.normal)  # undone after the test
        plant_seeded_normal()
    proto = _protocol()
    stack = build_stack(proto, "left", "passive")  # as the party builds it: fresh private noise
    d = stack.defenses[0]
    h = _clean_rows()
    released = _released(stack, h)
    scale = 2.0 * d.sigma * d.t
    # the released rows do carry noise: none lies inside the clip ball as it is
    assert bool((released.norm(dim=1) > d.t).all())
    found = None
    for seeds in oracle_windows(d.gen):  # the defense's own noise stream
        found = search_mt_seed(released, scale, d.t, seeds)
        if found is not None:
            break
    if not planted:
        assert found is None, f"A found the noise seed {found} of a real stack"
        return
    assert found == seeded_seed(d.gen) & 0xFFFFFFFF
    again = torch.randn(h.shape, generator=torch.Generator().manual_seed(found), dtype=torch.float64)
    assert torch.allclose(released - scale * again, h.double(), atol=1e-4)  # every clean row, back
