"""Planted weaknesses for the attack tests (test doubles, never imported by securevfl).

The attack tests must fail when the weakness they guard against is put back, so
each has a variant that puts it back and must then succeed:

* :func:`plant_mt_keystream`: every :class:`~securevfl.csprng.SecretStream`'s
  keystream becomes Mersenne Twister output (MT19937 seeded from the stream's
  key, its 32-bit outputs as little-endian bytes) instead of AES-256-CTR: the
  same key still gives the same stream at every holder, so a run works as
  before, but 624 outputs give the generator away (:mod:`tests.threat_model.mt19937`).
* :func:`plant_seeded_normal`: Gaussian noise drawn the way a seeded sampler
  draws it, in one of :data:`SEEDINGS`: ``torch.randn`` under a ``torch.Generator``
  seeded from the first eight key bytes (of which torch keeps the low 32 bits);
  torch's global generator seeded so (``torch.manual_seed``) and drawn in torch's
  default float32; numpy's global generator seeded so (``np.random.seed``, 32 bits)
  feeding torch; or a ``torch.Generator`` seeded from the protocol's public
  training seed and the party's and defense's names (:func:`securevfl.seeding.generator`).

* :func:`plant_ring32`: ring elements holding only 32 random bits, in one of
  :data:`RING32` ways (a 32-bit draw zero- or sign-extended, placed in the high
  half, or repeated in both halves), each still AES keystream, so no generator can
  be rebuilt from them.

``python -m tests.threat_model.weak_stream ARGS`` runs ``securevfl ARGS`` in this
process with the keystream planted (a ``securevfl party`` rank of a planted run).
"""

from __future__ import annotations

import math
import sys
from typing import Any

import numpy as np
import torch

from securevfl import cli
from securevfl.csprng import SecretStream
from securevfl.seeding import derive_seed


class MTKeystream:
    """Stands in for the AES-CTR encryptor a stream holds: ``update_into`` writes the
    next bytes of MT19937 output instead of keystream."""

    def __init__(self, key: bytes, position: int):
        self._bits = np.random.MT19937(int.from_bytes(key[:8], "big"))
        self._buffer = b""
        self._take(position)

    def _take(self, n: int) -> bytes:
        while len(self._buffer) < n:
            words = self._bits.random_raw(max(1024, (n - len(self._buffer) + 3) // 4))
            self._buffer += words.astype("<u4").tobytes()
        out, self._buffer = self._buffer[:n], self._buffer[n:]
        return out

    def update(self, data: bytes) -> bytes:
        return self._take(len(data))

    def update_into(self, data: Any, buf: Any) -> int:
        n = len(data)
        buf[:n] = self._take(n)
        return n


def _mt_seek(self: SecretStream, pos: int) -> None:
    self._enc = MTKeystream(self._key, pos)
    self._pos = pos


def plant_mt_keystream() -> None:
    """Every secret stream of this process draws MT19937 output from now on."""
    SecretStream._seek = _mt_seek  # type: ignore[method-assign]


def seeded_seed(stream: SecretStream) -> int:
    """The seed :func:`plant_seeded_normal` takes from a stream's key: its first eight
    bytes, as a non-negative 63-bit integer (torch keeps the low 32 bits)."""
    return int.from_bytes(bytes.fromhex(stream.state()["key"])[:8], "big") & (2**63 - 1)


#: the ways a seeded sampler may draw a defense's noise (:func:`plant_seeded_normal`)
SEEDINGS = ("generator", "global", "numpy", "protocol")


def _seeded_normal(
    way: str, seed: int, shape: tuple[int, ...], dtype: torch.dtype = torch.float64
) -> torch.Tensor:
    if way in ("generator", "protocol"):
        g = torch.Generator().manual_seed(seed)
        return torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
    if way == "global":  # the process's generator, left as it was after
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return torch.randn(shape).to(dtype)  # torch's default dtype, float32
    assert way == "numpy", way
    saved = np.random.get_state()
    try:
        np.random.seed(seed & 0xFFFFFFFF)  # numpy takes a 32-bit seed
        return torch.from_numpy(np.random.standard_normal(shape)).to(dtype)
    finally:
        np.random.set_state(saved)


def plant_seeded_normal(
    way: str = "generator", *, protocol_seed: int = 0, labels: tuple[str, ...] = ()
) -> None:
    """Every secret stream of this process draws its Gaussians from a seeded
    sampler, seeded as :data:`SEEDINGS` lists: from the stream's key
    (:func:`seeded_seed`), or, for ``protocol``, from ``derive_seed(protocol_seed,
    *labels)``, as :func:`securevfl.seeding.generator` seeds."""
    if way not in SEEDINGS:
        raise ValueError(f"no seeding {way!r}: {SEEDINGS}")

    def normal(
        self: SecretStream, shape: tuple[int, ...] | torch.Size, dtype: torch.dtype = torch.float64
    ) -> torch.Tensor:
        seed = derive_seed(protocol_seed, *labels) if way == "protocol" else seeded_seed(self)
        return _seeded_normal(way, seed, tuple(shape), dtype)

    SecretStream.normal = normal  # type: ignore[method-assign]


#: ways a 64-bit ring element may hold only 32 random bits (:func:`plant_ring32`)
RING32 = ("low32", "signed32", "high32", "repeated32")


def _ring32(words: np.ndarray, way: str) -> np.ndarray:
    """uint64 ring elements from the top 32 bits of each keystream word, as ``way`` places them."""
    r = words >> np.uint64(32)
    if way == "low32":
        return r
    if way == "signed32":
        return r.astype(np.uint32).view(np.int32).astype(np.int64).view(np.uint64)
    if way == "high32":
        return r << np.uint64(32)
    assert way == "repeated32", way
    return r | (r << np.uint64(32))


def plant_ring32(way: str) -> None:
    """Every secret stream of this process fills its ring elements (masks, shares) from
    32 random bits each (:data:`RING32`)."""
    if way not in RING32:
        raise ValueError(f"no ring32 way {way!r}: {RING32}")

    def ring(
        self: SecretStream, shape: tuple[int, ...] | torch.Size, device: torch.device | str | None = None
    ) -> torch.Tensor:
        n = math.prod(shape)
        w = _ring32(self._words(n), way)
        t = torch.from_numpy(w.view(np.int64).copy()).reshape(tuple(shape))
        return t if device is None else t.to(device)

    SecretStream.ring = ring  # type: ignore[method-assign]


def main() -> int:
    plant_mt_keystream()
    return cli.main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
