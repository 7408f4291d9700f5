"""Sealed links: one peer, one stream, two directions (SECURITY.md §4a).

A :class:`Link` seals what this rank sends to one peer and opens what it
receives from that peer with AES-256-GCM (NIST SP 800-38D) under per-direction
keys from the handshake (:func:`securevfl.runtime.secure.handshake.stream_key`).
The nonce is the direction's sequence number (96-bit little-endian counter,
starting at 0); the associated data names the stream and both ranks. A frame is
therefore accepted only as the next frame of its stream from that peer: a forged,
replayed, reordered, truncated or misdirected frame fails authentication and
raises :class:`ProtocolError` naming the peer, and the link refuses everything
after that.

Streams are independent (own keys, own counters): the channel's framed messages
use stream ``"channel"``; other traffic that may interleave with them in another
order (CrypTen's, on its own process groups) takes a stream of its own, so that
each stream's frames are opened in the order they were sealed.

A sealed frame is ``len(plaintext) + 16`` bytes (:data:`TAG_BYTES`). The tensor
helpers seal straight from a tensor's memory into a frame buffer and open
straight into the caller's tensor (no intermediate ``bytes``; a frame that fails
authentication leaves the tensor and the frame zeroed), reusing one AEAD
object per direction. Frame buffers come from the rank's
:class:`~securevfl.runtime.secure.frames.FramePool` (shared by its links) and go
back to it once their send has completed or their frame has been opened
(:meth:`Link.release`): fresh buffers, faulted in page by page, cost more than
the cipher. AES-256-GCM rather than ChaCha20-Poly1305: with AES-NI
and carry-less multiply (every x86-64 server of the last decade) OpenSSL seals
2.7x faster here (8.6 vs 3.2 GB/s on 1 MiB), which is most of the channel's
cost under ``mpc``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from securevfl.errors import ProtocolError
from securevfl.runtime.secure.frames import FramePool

TAG_BYTES = 16
NONCE_BYTES = 12
DEFAULT_STREAM = "channel"


def sealed_size(nbytes: int) -> int:
    """Bytes on the wire for a frame carrying ``nbytes`` of plaintext."""
    return nbytes + TAG_BYTES


def _bytes_of(t: torch.Tensor) -> memoryview:
    """A contiguous CPU tensor's memory as bytes, without a copy."""
    return t.reshape(-1).view(torch.uint8).numpy().data


@dataclass
class Meter:
    """CPU seconds spent sealing and opening, frames and sealed bytes, per phase
    (the channel names the phase; the benchmark reports the training phase)."""

    phase_of: Callable[[], str] = lambda: "setup"
    by_phase: dict[str, dict[str, float]] = field(default_factory=dict)

    def add(self, kind: str, seconds: float, nbytes: int) -> None:
        row = self.by_phase.setdefault(
            self.phase_of(), {"seal_cpu_s": 0.0, "open_cpu_s": 0.0, "frames": 0, "sealed_bytes": 0}
        )
        row[kind] += seconds
        if kind == "seal_cpu_s":
            row["frames"] += 1
            row["sealed_bytes"] += nbytes


class Link:
    """This rank's sealed link to one peer on one stream.

    ``seal``/``open`` work on bytes; ``seal_tensor``/``open_tensor`` on tensors
    (for ``isend``/``irecv``), with frame buffers from ``pool`` (the rank's,
    shared by its links; a pool of its own if none): a frame from
    ``seal_tensor`` or ``frame_for`` goes back with ``release`` once its send has
    completed or it has been opened. ``send``/``recv`` seal and move one frame
    over torch.distributed (default group unless ``group`` is given; ``peer`` is
    a global rank). Both ends must open frames in the order they were sealed.
    """

    def __init__(
        self,
        rank: int,
        peer: int,
        stream: str,
        send_key: bytes,
        recv_key: bytes,
        who: str,
        meter: Meter | None = None,
        pool: FramePool | None = None,
    ):
        self.rank = rank
        self.peer = peer
        self.stream = stream
        self.who = who
        self._tx = AESGCM(send_key)
        self._rx = AESGCM(recv_key)
        self._aad_tx = f"securevfl/1 {stream} {rank}->{peer}".encode()
        self._aad_rx = f"securevfl/1 {stream} {peer}->{rank}".encode()
        self.sent = 0  # sequence number of the next frame sealed
        self.received = 0  # sequence number of the next frame opened
        self.broken = False
        self.meter = meter or Meter()
        self.pool = pool or FramePool()

    def __repr__(self) -> str:
        return f"Link({self.rank}->{self.peer} {self.stream!r}, sent={self.sent}, received={self.received})"

    # -- nonces and failures -----------------------------------------------------------
    def _next_tx(self) -> bytes:
        n = self.sent
        self.sent += 1
        return n.to_bytes(NONCE_BYTES, "little")

    def _refuse(self, what: str) -> ProtocolError:
        self.broken = True
        return ProtocolError(
            f"{self.who} sent a frame that failed authentication ({what}, stream '{self.stream}', "
            f"frame #{self.received}): it was forged, altered, replayed, reordered or truncated "
            "on the way; the run is aborted"
        )

    def _check_open(self) -> None:
        if self.broken:
            raise ProtocolError(f"the link from {self.who} (stream '{self.stream}') failed earlier")

    # -- bytes -------------------------------------------------------------------------
    def seal(self, data: bytes | bytearray | memoryview) -> bytes:
        """``data`` sealed as the next frame to the peer (``len(data) + 16`` bytes)."""
        t0 = time.thread_time()
        out = self._tx.encrypt(self._next_tx(), data, self._aad_tx)
        self.meter.add("seal_cpu_s", time.thread_time() - t0, len(out))
        return out

    def open(self, frame: bytes | bytearray | memoryview) -> bytes:
        """The plaintext of the next frame from the peer; ProtocolError otherwise."""
        self._check_open()
        t0 = time.thread_time()
        nonce = self.received.to_bytes(NONCE_BYTES, "little")
        try:
            out = self._rx.decrypt(nonce, frame, self._aad_rx)
        except InvalidTag:
            raise self._refuse("bad tag") from None
        self.received += 1
        self.meter.add("open_cpu_s", time.thread_time() - t0, 0)
        return out

    # -- tensors -----------------------------------------------------------------------
    def seal_tensor(self, t: torch.Tensor) -> torch.Tensor:
        """A contiguous CPU tensor sealed into a uint8 frame of
        ``sealed_size(t.nbytes)`` elements from the pool, ready for
        ``dist.send``/``isend``; :meth:`release` it once the send has completed."""
        t0 = time.thread_time()
        frame = self.pool.take(sealed_size(t.numel() * t.element_size()))
        self._tx.encrypt_into(self._next_tx(), _bytes_of(t), self._aad_tx, frame.numpy().data)
        self.meter.add("seal_cpu_s", time.thread_time() - t0, frame.numel())
        return frame

    def frame_for(self, out: torch.Tensor) -> torch.Tensor:
        """A uint8 buffer from the pool for the frame that will carry ``out``'s
        bytes: receive into it, :meth:`open_tensor` it into ``out``, then
        :meth:`release` it."""
        return self.pool.take(sealed_size(out.numel() * out.element_size()))

    def release(self, frame: torch.Tensor) -> None:
        """Give a frame from :meth:`seal_tensor` or :meth:`frame_for` back to the pool:
        only once its send has completed or it has been opened (a buffer in the
        pool is handed out again)."""
        self.pool.give(frame)

    def open_tensor(self, frame: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """Open a received uint8 ``frame`` into the contiguous CPU tensor ``out``
        (whose size fixes the plaintext length); returns ``out``. A frame of any
        other size is refused before anything is decrypted."""
        self._check_open()
        t0 = time.thread_time()
        nonce = self.received.to_bytes(NONCE_BYTES, "little")
        expected = sealed_size(out.numel() * out.element_size())
        if frame.numel() != expected:
            raise self._refuse(f"{frame.numel()} bytes where {expected} were expected")
        try:
            self._rx.decrypt_into(nonce, _bytes_of(frame), self._aad_rx, _bytes_of(out))
        except InvalidTag:
            # OpenSSL decrypts into ``out`` before it checks the tag: wipe what it
            # wrote (unauthenticated plaintext) and the frame before refusing
            out.reshape(-1).view(torch.uint8).zero_()
            frame.zero_()
            raise self._refuse("bad tag") from None
        self.received += 1
        self.meter.add("open_cpu_s", time.thread_time() - t0, 0)
        return out

    # -- transport ---------------------------------------------------------------------
    def send(self, t: torch.Tensor, group: dist.ProcessGroup | None = None) -> int:
        """Seal ``t`` and send it to the peer as one frame; returns the wire bytes.
        Transport errors propagate (the caller names the lost rank)."""
        frame = self.seal_tensor(t.detach().cpu().contiguous())
        dist.send(frame, dst=self.peer, group=group)  # blocking: the frame is on its way
        self.release(frame)
        return frame.numel()

    def recv(self, out: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
        """Receive one frame from the peer and open it into ``out`` (its size and
        dtype are what both ends agreed on); returns ``out``."""
        frame = self.frame_for(out)
        dist.recv(frame, src=self.peer, group=group)
        self.open_tensor(frame, out)
        self.release(frame)
        return out


KeyFn = Callable[[int, str], tuple[bytes, bytes]]


class Links:
    """Every sealed link of one rank, created on first use per (peer, stream).

    ``keys(peer, stream)`` returns the (send, receive) keys for that stream, from
    the handshake's per-pair secret; ``who(peer)`` names a peer for errors. The
    links share one meter and one frame pool."""

    def __init__(self, rank: int, peers: list[int], keys: KeyFn, who: Callable[[int], str]):
        self.rank = rank
        self.peers = list(peers)
        self._keys = keys
        self._who = who
        self._links: dict[tuple[int, str], Link] = {}
        self.meter = Meter()
        self.pool = FramePool()  # every link's frame buffers

    def link(self, peer: int, stream: str = DEFAULT_STREAM) -> Link:
        """The link to ``peer`` (a global rank) on ``stream``."""
        got = self._links.get((peer, stream))
        if got is not None:
            return got
        if peer not in self.peers:
            raise ProtocolError(f"rank {self.rank} has no authenticated link to rank {peer}")
        tx, rx = self._keys(peer, stream)
        got = Link(self.rank, peer, stream, tx, rx, self._who(peer), self.meter, self.pool)
        self._links[(peer, stream)] = got
        return got
