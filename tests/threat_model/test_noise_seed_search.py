"""A receiver searches the seed of a defense's DP noise (SECURITY.md, "Randomness and masking").

Threat: under ``plain`` the active party A receives every h'_i = clip(h_i) + noise
from ``embedding_dp``. If the noise came from a seeded Mersenne Twister, A could
enumerate seeds: the right one leaves residual rows h' - noise inside the clip
ball of radius t, a wrong one leaves rows of norm about 2 sigma t sqrt(d). torch's
CPU generator keeps only the low 32 bits of a seed, so every seed, however it was
derived, lies in a 2^32 space: a day of one core, minutes on a GPU.

The test plays A with exactly what A receives (the released rows of one batch)
and searches a window of 2^16 Mersenne Twister seeds. To keep it fast an oracle
centres the window on the party's effective MT seed where one exists (an attacker
pays 2^16 times more without it). With securevfl's noise drawn from an AES-256-CTR
stream under a fresh 256-bit key there is no MT seed to find: the search fails.
Run against code that seeds torch (commit 6d717c1), the same test finds the seed
and recovers every clean embedding exactly, so the assertion that it fails fails.
The positive control below shows the search itself works on noise drawn as that
code drew it.
"""

from __future__ import annotations

import torch

from securevfl.app.loader import load_protocol_dict
from securevfl.defenses.base import build_stack
from securevfl.seeding import derive_seed
from tests.support.protocols import small_digits

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


def test_the_receiver_cannot_find_the_noise_seed_of_a_real_stack():
    proto = _protocol()
    stack = build_stack(proto, "left", "passive")  # as the party builds it: fresh private noise
    d = stack.defenses[0]
    h = _clean_rows()
    released = _released(stack, h)
    scale = 2.0 * d.sigma * d.t
    # the released rows do carry noise: none lies inside the clip ball as it is
    assert bool((released.norm(dim=1) > d.t).all())
    if hasattr(stack, "noise_seeds"):  # code that seeds torch: the oracle knows the effective seed
        centre = derive_seed(stack.noise_seeds()[0], "embedding_dp", "noise") & 0xFFFFFFFF
    else:  # no MT seed exists; any window is as good as another
        centre = int.from_bytes(bytes.fromhex(stack.noise_keys()[0]["key"])[:4], "big")
    lo = max(0, centre - WINDOW // 2)
    assert search_mt_seed(released, scale, d.t, range(lo, lo + WINDOW)) is None
