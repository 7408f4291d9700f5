"""CrypTen's randomness from :class:`~securevfl.csprng.SecretStream`: the draws, and the keys.

CrypTen draws every secret of its protocols (the shares of a pseudo-random zero
sharing, the TTP provider's triple shares, the trusted-first-party tuples, a
party's local randomness) through two module-level functions of
``crypten/common/rng.py``, ``generate_random_ring_element`` and
``generate_kbit_random_tensor``, from ``torch.Generator`` objects (Mersenne
Twister) that ``crypten._setup_prng`` seeds and keeps in ``crypten.generators``
(``prev``/``next``: shared with the neighbouring ranks, ``global``: shared by all,
from which CrypTen draws only dropout masks, public to every party; ``local``: the
party's own). MT19937's state follows from 624 of its outputs, and
in the ``mpc`` backend a party receives that many raw outputs of its peer's stream
in a few openings; its CPU seed has 32 effective bits (docs/design.md §13).

securevfl puts secret streams in their place:

* **the two draw functions** are replaced, in ``crypten.common.rng`` and in every
  CrypTen module that imported them by name, by :func:`ring_element` and
  :func:`kbit_tensor`, which draw from a :class:`SecretStream` (AES-256-CTR) and
  **refuse** anything else, a ``torch.Generator`` included, with an error naming
  it: no Mersenne Twister path survives silently. CrypTen has no seam for its
  PRG; the replacement, with the check that CrypTen still has its functions where
  0.4.1 has them, is :func:`securevfl.exchange.crypten_patches.install`, which also
  draws CrypTen's dropout masks from the ``global`` stream;
* **``crypten.generators``** holds :class:`SecretStream` objects under 256-bit keys
  (:func:`agree_streams`, in place of ``crypten._setup_prng``): every MPC party
  draws its ``next`` key, its ``local`` key and (rank 0) the ``global`` key from
  ``os.urandom``, sends ``next`` to the next rank (which keeps it as ``prev``) and
  rank 0 sends ``global`` to the others, each as one sealed frame of the
  framed communicator, as CrypTen's ``_sync_seeds`` sends its 64-bit seeds. One
  stream per name serves every device (a draw for a CUDA tensor is made on the CPU
  and moved), so parties on different devices stay aligned;
* **the dealer's streams**: the trusted dealer draws one 256-bit key per MPC party
  and sends it to that party alone (:func:`dealer_keys`, :func:`client_key`), in
  place of CrypTen's 64-bit seeds; both ends draw that party's tuple shares from
  ``SecretStream(key)`` (:mod:`securevfl.exchange.crypten_pool`,
  :mod:`securevfl.exchange.crypten_dealer`);
* **pair keys** (:func:`pair_keys`): a 256-bit key that one party sends one peer,
  for a stream only those two share (the pairwise layout's input re-sharing).

Keys are logged into the ledger as frames (size, peer) without their bytes, so no
view or trace ever holds one; a key never leaves its owner except to the one peer
that must hold the same stream, over the sealed channel.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from securevfl.csprng import KEY_BYTES, SecretStream, fresh_key
from securevfl.errors import ProtocolError
from securevfl.exchange.crypten_api import CUDALongTensor, crypten

RING_BITS = 64
GENERATOR_NAMES = ("prev", "next", "local", "global")

__all__ = [
    "NotASecretStream",
    "agree_streams",
    "client_key",
    "dealer_keys",
    "kbit_tensor",
    "pair_keys",
    "ring_element",
]


class NotASecretStream(ProtocolError):
    """CrypTen asked for secret randomness from something other than a SecretStream."""


# -- the draw functions ----------------------------------------------------------------------


def _stream(generator: Any, device: Any) -> SecretStream:
    """The stream to draw from: ``generator``, or CrypTen's ``local`` stream when
    it is None (as CrypTen's own functions fall back to its local generator)."""
    if generator is None:
        generator = crypten.generators["local"].get(torch.device("cpu"))
        if generator is None:
            raise NotASecretStream(
                "CrypTen drew local randomness before securevfl agreed its secret streams "
                "(crypten.generators['local'] is empty)"
            )
    if not isinstance(generator, SecretStream):
        raise NotASecretStream(
            f"CrypTen asked for secret randomness from a {type(generator).__module__}."
            f"{type(generator).__qualname__}; securevfl draws every share, mask and triple from a "
            "SecretStream (AES-256-CTR), never from torch.Generator (Mersenne Twister)"
        )
    return generator


def _size(size: Any) -> tuple[int, ...]:
    if isinstance(size, int):
        return (size,)
    return tuple(int(s) for s in size)


def _placed(t: torch.Tensor, device: Any) -> Any:
    if device is None or torch.device(device).type == "cpu":
        return t
    return CUDALongTensor(t.to(device))


def _checked_kwargs(kwargs: dict[str, Any]) -> Any:
    extra = set(kwargs) - {"device"}
    if extra:
        raise NotASecretStream(
            f"CrypTen drew ring elements with options {sorted(extra)} securevfl does not serve"
        )
    return kwargs.get("device")


def ring_element(size: Any, ring_size: int = 2**RING_BITS, generator: Any = None, **kwargs: Any) -> Any:
    """CrypTen's ``generate_random_ring_element`` from a :class:`SecretStream`:
    uniform elements of Z_2^64 as int64 (every value), on ``device`` (CUDA tensors
    as CrypTen's ``CUDALongTensor``). Refuses a ``torch.Generator``."""
    device = _checked_kwargs(kwargs)
    if ring_size != 2**RING_BITS:
        raise NotASecretStream(f"CrypTen asked for a ring of size {ring_size}; securevfl's ring is Z_2^64")
    return _placed(_stream(generator, device).ring(_size(size)), device)


def kbit_tensor(size: Any, bitlength: int | None = None, generator: Any = None, **kwargs: Any) -> Any:
    """CrypTen's ``generate_kbit_random_tensor`` from a :class:`SecretStream`:
    uniform integers in [0, 2^bitlength) (64 bits: the whole ring). Refuses a
    ``torch.Generator``."""
    device = _checked_kwargs(kwargs)
    bits = RING_BITS if bitlength is None else int(bitlength)
    return _placed(_stream(generator, device).kbits(_size(size), bits), device)


def _set_generators(streams: dict[str, SecretStream]) -> None:
    """Install ``streams`` in ``crypten.generators`` for the CPU and every CUDA
    device, as ``crypten._setup_prng`` lays out its generators."""
    devices = [torch.device("cpu")]
    if torch.cuda.is_available():
        devices += [torch.device("cuda")] + [
            torch.device(f"cuda:{i}") for i in range(torch.cuda.device_count())
        ]
    for name in GENERATOR_NAMES:
        crypten.generators[name].clear()
        for dev in devices:
            crypten.generators[name][dev] = streams[name]


def clear_generators() -> None:
    """Forget the run's streams (:func:`agree_streams` installs new ones)."""
    for name in GENERATOR_NAMES:
        crypten.generators[name].clear()


# -- the keys ---------------------------------------------------------------------------------


def _key_tensor(key: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(key), dtype=torch.uint8)


def _key(t: torch.Tensor) -> bytes:
    return t.numpy().tobytes()


def _exchange_keys(comm: Any, sends: Sequence[tuple[int, bytes]], recv_from: Sequence[int]) -> list[bytes]:
    """One round: send each (peer, key) and receive one key from each rank of
    ``recv_from`` (a rank may appear twice: its frames arrive in the order it
    posted them); every frame is logged as ``mpc.key`` without its bytes."""
    bufs = [(p, torch.zeros(KEY_BYTES, dtype=torch.uint8)) for p in recv_from]
    out = [(p, _key_tensor(k)) for p, k in sends]
    comm.exchange(out, bufs)
    for p, t in out:
        comm._log("sent", comm.rank, p, "key", t)
    for p, t in bufs:
        comm._log("recv", p, comm.rank, "key", t)  # the key itself is not kept
    return [_key(t) for _, t in bufs]


def agree_streams(comm: Any) -> dict[str, SecretStream]:
    """At an MPC party: agree CrypTen's four PRG streams (module docstring) in one
    round and install them in ``crypten.generators``. Every MPC party calls it at
    the same point. Rank 0 sends rank 1 its ``next`` key, then the ``global`` key."""
    n, rank = comm.get_world_size(), comm.get_rank()
    nxt, local = fresh_key(), fresh_key()
    glob = fresh_key() if rank == 0 else b""
    prev = nxt
    if n > 1:
        sends = [((rank + 1) % n, nxt)]
        if rank == 0:
            sends += [(p, glob) for p in range(1, n)]
        got = _exchange_keys(comm, sends, [(rank - 1) % n] + ([0] if rank else []))
        prev = got[0]
        if rank:
            glob = got[1]
    streams = {
        "prev": SecretStream(prev),
        "next": SecretStream(nxt),
        "local": SecretStream(local),
        "global": SecretStream(glob),
    }
    _set_generators(streams)
    return streams


def dealer_keys(comm: Any) -> list[SecretStream]:
    """At the dealer: one fresh 256-bit key per MPC party, each sent to its party
    alone (one frame each); returns the streams, by party rank."""
    keys = [fresh_key() for _ in range(comm.get_world_size())]
    _exchange_keys(comm, list(enumerate(keys)), [])
    return [SecretStream(k) for k in keys]


def client_key(comm: Any) -> SecretStream:
    """At an MPC party: the stream it shares with the dealer (the dealer's key)."""
    return SecretStream(_exchange_keys(comm, [], [comm.get_ttp_rank()])[0])


def pair_keys(comm: Any, peers: Sequence[int], *, send: bool) -> dict[int, SecretStream]:
    """A stream shared with each of ``peers``: the sender (``send=True``) draws a
    fresh key per peer and sends it to that peer alone; the receiver takes one from
    each. One round; both ends must call it at the same point."""
    if send:
        keys = [fresh_key() for _ in peers]
        _exchange_keys(comm, list(zip(peers, keys, strict=True)), [])
    else:
        keys = _exchange_keys(comm, [], list(peers))
    return {p: SecretStream(k) for p, k in zip(peers, keys, strict=True)}
