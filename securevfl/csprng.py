"""The one source of secret randomness: AES-256-CTR keystreams as torch tensors.

Everything that hides or protects a value draws from a :class:`SecretStream`:
secret shares, Beaver triples and the dealer's streams, pseudo-random zero
sharings, HE and Paillier masks, weight-share initialisation, every DP and
defense noise and randomized response (docs/design.md §13, SECURITY.md
"Randomness and masking"). ``torch.Generator`` (Mersenne Twister with a 32-bit
effective seed on CPU), ``numpy.random`` and ``random`` never touch a secret:
MT19937's state follows from 624 outputs and a 32-bit seed falls to a search,
while predicting an AES-CTR keystream without its key is as hard as
distinguishing AES from a random permutation.

A stream is AES-256 in counter mode (OpenSSL through ``cryptography``) under a
256-bit key: a fresh one from ``os.urandom`` (:meth:`SecretStream.fresh`), one
two parties agreed (:class:`SecretStream` with that key), or one derived from a
pinned ``privacy.noise_seed`` (:meth:`SecretStream.from_seed`), which makes a run
reproducible and, by construction, **not private**: anyone who knows the seed
regenerates the noise. Sub-streams for separate purposes come from
:meth:`SecretStream.child` (HKDF-SHA256 of the key and a label), so two uses never
share keystream.

Samplers turn keystream words into values without bias where exactness is
possible (ring elements, k-bit words and bits are raw keystream; integers in a
range use rejection; uniform floats use the top 53 bits of a word: exactly the
float64 grid of [0, 1) with step 2^-53). Gaussian samples are computed in
float64 from those uniforms (Box-Muller), Laplace samples from a uniform on the
open interval (0, 1) (:func:`open_uniform`, inverse CDF), so neither is ever
infinite. They are not certified DP samplers: nothing snaps or discretizes the
values, and the floating-point attacks on such noise (Mironov 2012) are a stated
residual risk (SECURITY.md §6a, "Floating-point noise").

A stream's state is its key and its position (bytes consumed), so a checkpoint
can resume it exactly (:meth:`SecretStream.state`); the state is as secret as
the noise it protects and stays in its owner's checkpoint (a saved model keeps
none: a prediction draws fresh keys).
"""

from __future__ import annotations

import hashlib
import math
import os
from typing import Any

import numpy as np
import torch
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

KEY_BYTES = 32  # AES-256
BLOCK = 16
_TWO_PI = 2.0 * math.pi
_INV_2_53 = 2.0**-53
_CHUNK = 1 << 20  # keystream bytes per OpenSSL call
_ZEROS = bytes(_CHUNK)  # the plaintext whose encryption is the keystream (read-only)

__all__ = ["KEY_BYTES", "SecretStream", "fresh_key", "laplace_from_words", "open_uniform"]


def fresh_key() -> bytes:
    """A new 256-bit key from the operating system's entropy."""
    return os.urandom(KEY_BYTES)


def open_uniform(words: np.ndarray) -> np.ndarray:
    """Uniform float64 on the open interval (0, 1) from 64-bit words (uint64): the
    top 52 bits k of each word give the midpoint (2k + 1) 2^-53 of one of 2^52 equal
    cells. Every value is exact (2k + 1 < 2^53), 2^-53 <= u <= 1 - 2^-53, and the set
    of values is symmetric about 1/2 (u and 1 - u are both midpoints), which 1/2
    itself is not."""
    k = np.asarray(words, dtype=np.uint64) >> np.uint64(12)
    return (k * np.uint64(2) + np.uint64(1)).astype(np.float64) * _INV_2_53


def laplace_from_words(words: np.ndarray, scale: float = 1.0) -> np.ndarray:
    """Laplace(0, scale) float64 from 64-bit words by the inverse CDF of
    :func:`open_uniform`: with v = u - 1/2 (exact: a multiple of 2^-53 below 1 in
    absolute value, as u and 1/2 are), -scale sign(v) log(1 - 2|v|), where 1 - 2|v| >= 2^-52,
    so every value is finite, |value| <= 52 ln 2 scale, and the distribution is
    exactly symmetric. (A uniform closed at 1, or rounding to it, would give
    log(0) = -inf: an infinite release.)"""
    v = open_uniform(words) - 0.5
    return -scale * np.sign(v) * np.log1p(-2.0 * np.abs(v))


class SecretStream:
    """An AES-256-CTR keystream under ``key`` with samplers that fill torch tensors.

    Not thread-safe: one owner draws from a stream, in program order (two parties
    holding the same key draw the same values only if they draw in the same
    order, as CrypTen's PRG streams require).
    """

    __slots__ = ("_enc", "_key", "_pos", "pinned")

    def __init__(self, key: bytes, *, pinned: bool = False):
        if not isinstance(key, (bytes, bytearray)) or len(key) != KEY_BYTES:
            raise ValueError(f"a secret stream needs a {KEY_BYTES}-byte key")
        self._key = bytes(key)
        self._pos = 0
        self._enc: Any = None
        #: derived from a pinned seed (reproducible, not private)
        self.pinned = pinned

    # -- making streams ---------------------------------------------------------------
    @classmethod
    def fresh(cls) -> SecretStream:
        """A stream under a fresh key from ``os.urandom``."""
        return cls(fresh_key())

    @classmethod
    def from_seed(cls, seed: int, *labels: object) -> SecretStream:
        """A reproducible stream for experiments: its key is SHA-256 of the seed and
        the labels. A run that uses one is marked as not private (module docstring)."""
        text = "|".join(["securevfl-pinned-noise", str(int(seed)), *map(str, labels)]).encode()
        return cls(hashlib.sha256(text).digest(), pinned=True)

    def child(self, *labels: object) -> SecretStream:
        """An independent stream for one purpose: its key is HKDF-SHA256 of this
        stream's key with ``labels`` as the info string (this stream is not advanced)."""
        info = "|".join(["securevfl-child", *map(str, labels)]).encode()
        key = HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=None, info=info).derive(self._key)
        return SecretStream(key, pinned=self.pinned)

    # -- state (checkpoints) ----------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """Key and position: what resumes this stream exactly (secret: owner only)."""
        return {"key": self._key.hex(), "position": self._pos, "pinned": self.pinned}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> SecretStream:
        try:
            s = cls(bytes.fromhex(state["key"]), pinned=bool(state.get("pinned", False)))
            pos = int(state["position"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"malformed secret-stream state ({exc})") from None
        if pos < 0:
            raise ValueError("malformed secret-stream state (negative position)")
        s._seek(pos)
        return s

    @property
    def position(self) -> int:
        """Keystream bytes consumed so far."""
        return self._pos

    def _seek(self, pos: int) -> None:
        block, skip = divmod(pos, BLOCK)
        self._enc = Cipher(algorithms.AES(self._key), modes.CTR(block.to_bytes(BLOCK, "big"))).encryptor()
        if skip:
            self._enc.update(bytes(skip))
        self._pos = pos

    # -- raw keystream ----------------------------------------------------------------
    def _fill(self, n: int) -> np.ndarray:
        """The next ``n`` keystream bytes as a fresh uint8 array (OpenSSL writes into
        it directly; 15 spare bytes at the end satisfy ``update_into``)."""
        if n < 0:
            raise ValueError("negative byte count")
        if self._enc is None:
            self._seek(self._pos)
        out = np.empty(n + BLOCK - 1, dtype=np.uint8)
        view = out.data
        zeros = memoryview(_ZEROS)
        at = 0
        while at < n:
            m = min(_CHUNK, n - at)
            self._enc.update_into(zeros[:m], view[at : at + m + BLOCK - 1])
            at += m
        self._pos += n
        return out[:n]

    def bytes(self, n: int) -> bytes:
        """The next ``n`` keystream bytes."""
        return self._fill(n).tobytes()

    def _words(self, count: int) -> np.ndarray:
        """``count`` uniform 64-bit words (uint64)."""
        return self._fill(8 * count).view("<u8")

    # -- integer samplers -------------------------------------------------------------
    def ring(
        self, shape: tuple[int, ...] | torch.Size, device: torch.device | str | None = None
    ) -> torch.Tensor:
        """Uniform elements of Z_2^64 as int64 (every value, -2^63 and 2^63 - 1 included)."""
        n = math.prod(shape)
        t = torch.from_numpy(self._words(n).view(np.int64)).reshape(tuple(shape))
        return t if device is None else t.to(device)

    def kbits(
        self, shape: tuple[int, ...] | torch.Size, bits: int, device: torch.device | str | None = None
    ) -> torch.Tensor:
        """Uniform integers in [0, 2^bits) as int64, 1 <= bits <= 64 (64: :meth:`ring`)."""
        if not 1 <= bits <= 64:
            raise ValueError(f"bits must lie in 1..64, got {bits}")
        if bits == 64:
            return self.ring(shape, device)
        w = self._words(math.prod(shape)) >> np.uint64(64 - bits)
        t = torch.from_numpy(w.view(np.int64)).reshape(tuple(shape))
        return t if device is None else t.to(device)

    def bits(self, shape: tuple[int, ...] | torch.Size) -> torch.Tensor:
        """Uniform booleans."""
        n = math.prod(shape)
        raw = np.unpackbits(self._fill((n + 7) // 8))[:n]
        return torch.from_numpy(raw.astype(bool)).reshape(tuple(shape))

    def integers(self, shape: tuple[int, ...] | torch.Size, low: int, high: int) -> torch.Tensor:
        """Uniform integers in [low, high) (int64), exactly: each draw takes the top
        ceil(log2(high - low)) bits of a word and redraws the values outside the range
        (at most half the draws, so the expected number of words is below 2 per value)."""
        span = int(high) - int(low)
        if span <= 0 or span > 2**63:
            raise ValueError(f"empty or too wide range [{low}, {high})")
        n = math.prod(shape)
        out = np.empty(n, dtype=np.int64)
        if span == 1:
            out.fill(low)
            return torch.from_numpy(out).reshape(tuple(shape))
        k = (span - 1).bit_length()
        filled = 0
        while filled < n:
            need = n - filled
            cand = self._words(need + need // 2 + 8) >> np.uint64(64 - k)
            ok = cand[cand < np.uint64(span)][:need]
            out[filled : filled + len(ok)] = ok.astype(np.int64) + low
            filled += len(ok)
        return torch.from_numpy(out).reshape(tuple(shape))

    def integers_np(self, shape: tuple[int, ...], low: int, high: int) -> np.ndarray:
        """:meth:`integers` as a numpy array."""
        return self.integers(shape, low, high).numpy()

    def below(self, bound: int) -> int:
        """One uniform Python integer in [0, bound) of any size (rejection on
        ceil(log2 bound) bits), e.g. a Paillier mask modulo n."""
        if bound <= 0:
            raise ValueError("bound must be positive")
        k = max(1, (bound - 1).bit_length())
        nbytes = (k + 7) // 8
        while True:
            v = int.from_bytes(self.bytes(nbytes), "big") >> (8 * nbytes - k)
            if v < bound:
                return v

    def permutation_np(self, n: int) -> np.ndarray:
        """A uniform permutation of 0..n-1: the order of n uniform 64-bit keys (ties,
        which would bias it, have probability below n^2 / 2^65)."""
        return np.argsort(self._words(n), kind="stable")

    def choice_np(self, items: int | np.ndarray, size: int) -> np.ndarray:
        """``size`` distinct elements of ``items`` (or of 0..items-1), uniformly."""
        pool = np.arange(items) if isinstance(items, int) else np.asarray(items)
        if not 0 <= size <= len(pool):
            raise ValueError(f"cannot choose {size} of {len(pool)} without replacement")
        return pool[self.permutation_np(len(pool))[:size]]

    def weighted_index(self, p: np.ndarray) -> int:
        """One index drawn with probabilities ``p`` (non-negative, summing to 1 up to
        rounding) by the inverse CDF of a 53-bit uniform."""
        cdf = np.cumsum(np.asarray(p, dtype=np.float64))
        if cdf.size == 0 or not np.isfinite(cdf[-1]) or cdf[-1] <= 0:
            raise ValueError("weighted_index needs finite, non-negative weights with a positive sum")
        u = float(self.uniform_np((1,))[0]) * cdf[-1]
        return int(min(np.searchsorted(cdf, u, side="right"), cdf.size - 1))

    # -- real samplers ----------------------------------------------------------------
    def uniform_np(self, shape: tuple[int, ...]) -> np.ndarray:
        """Uniform float64 in [0, 1) on the 2^-53 grid (every grid point equally likely)."""
        return (self._words(math.prod(shape)) >> np.uint64(11)).astype(np.float64).reshape(shape) * _INV_2_53

    def uniform(
        self, shape: tuple[int, ...] | torch.Size, dtype: torch.dtype = torch.float64
    ) -> torch.Tensor:
        return torch.from_numpy(self.uniform_np(tuple(shape))).to(dtype)

    def normal_np(self, shape: tuple[int, ...]) -> np.ndarray:
        """Standard normal float64 by Box-Muller on two 53-bit uniforms per pair
        (|value| <= 8.58: the first uniform is at least 2^-53)."""
        n = math.prod(shape)
        m = (n + 1) // 2
        u = self.uniform_np((2, m))
        r = np.sqrt(-2.0 * np.log1p(-u[0]))  # 1 - u in (0, 1]: the log is finite
        th = _TWO_PI * u[1]
        return np.concatenate([r * np.cos(th), r * np.sin(th)])[:n].reshape(shape)

    def normal(self, shape: tuple[int, ...] | torch.Size, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        return torch.from_numpy(self.normal_np(tuple(shape))).to(dtype)

    def laplace_np(self, shape: tuple[int, ...], scale: float = 1.0) -> np.ndarray:
        """Laplace(0, scale) float64 by the inverse CDF of an open uniform
        (:func:`laplace_from_words`): finite, |value| <= 52 ln 2 scale."""
        return laplace_from_words(self._words(math.prod(shape)), scale).reshape(shape)

    def laplace(
        self, shape: tuple[int, ...] | torch.Size, scale: float = 1.0, dtype: torch.dtype = torch.float64
    ) -> torch.Tensor:
        return torch.from_numpy(self.laplace_np(tuple(shape), scale)).to(dtype)

    def __repr__(self) -> str:  # never the key
        return f"SecretStream(position={self._pos}{', pinned' if self.pinned else ''})"
