"""Point-to-point frames between ranks, the wire of CrypTen's communicator
(:mod:`.communicator`).

Both calls of a :class:`FrameTransport` post and return at once; frames between
one pair of ranks arrive in the order they were posted. :class:`SealedFrames`
(every rank of a run) seals each frame on the session's authenticated link to
the peer (:mod:`securevfl.runtime.secure.link`, stream ``"crypten"``) and moves
it with ``dist.isend``/``dist.irecv`` on the default process group under
CrypTen's own gloo tag, so CrypTen's frames keep their own order, apart from the
:class:`~securevfl.runtime.channel.Channel`'s messages (tag 0); a frame that
fails to open aborts the run naming the sender. :class:`GlooFrames` moves the
same frames unsealed, for a process group made without a session (unit tests,
``benchmarks/mpc_comm.py``).
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
import torch.distributed as dist

from securevfl.errors import ProtocolError
from securevfl.runtime.channel import Channel
from securevfl.runtime.secure.link import Link

CRYPTEN_TAG = 0x4372  # gloo tag of CrypTen's frames ("Cr"); the Channel uses tag 0
STREAM = "crypten"  # the sealed links' stream for CrypTen's frames


def _posted(work: dist.Work | None) -> Pending:
    """torch types ``isend``/``irecv`` as possibly None (it is None only for a
    rank outside the group, which a frame's peer never is)."""
    if work is None:
        raise ProtocolError("torch.distributed posted no request for a point-to-point frame")
    return work


class Pending(Protocol):
    """A posted frame; ``wait`` returns once it is sent (or received into its buffer)."""

    def wait(self) -> Any: ...


class FrameTransport(Protocol):
    """Point-to-point frames between ranks. Both calls post and return at once;
    frames between one pair of ranks arrive in the order they were posted. A
    receive names the buffer (shape and dtype the receiver expects) the frame's
    payload must fill exactly."""

    def post_send(self, peer: int, tensor: torch.Tensor) -> Pending: ...

    def post_recv(self, peer: int, tensor: torch.Tensor) -> Pending: ...


class GlooFrames:
    """Frames as plain ``dist.isend``/``dist.irecv`` of the tensor's bytes on the
    default process group, under :data:`CRYPTEN_TAG`."""

    def post_send(self, peer: int, tensor: torch.Tensor) -> Pending:
        return _posted(dist.isend(tensor, dst=peer, tag=CRYPTEN_TAG))

    def post_recv(self, peer: int, tensor: torch.Tensor) -> Pending:
        return _posted(dist.irecv(tensor, src=peer, tag=CRYPTEN_TAG))


class _Opening:
    """A posted receive of a sealed frame: waits for it, then opens it into the
    caller's buffer (in the order the receives were posted, as the link needs)
    and gives the frame's buffer back to the link's pool."""

    def __init__(self, pending: Pending, link: Link, frame: torch.Tensor, out: torch.Tensor):
        self.pending, self.link, self.frame, self.out = pending, link, frame, out

    def wait(self) -> None:
        self.pending.wait()
        self.link.open_tensor(self.frame, self.out)
        self.link.release(self.frame)


class _Sending:
    """A posted send of a sealed frame: the frame's buffer goes back to the
    link's pool only once the send has completed."""

    def __init__(self, pending: Pending, link: Link, frame: torch.Tensor):
        self.pending, self.link, self.frame = pending, link, frame

    def wait(self) -> None:
        self.pending.wait()
        self.link.release(self.frame)


class SealedFrames:
    """Frames sealed on the session's authenticated per-peer links (stream
    :data:`STREAM`, AES-256-GCM under per-direction keys, sequence-numbered:
    :mod:`securevfl.runtime.secure.link`), moved like :class:`GlooFrames`. A
    frame that fails to open (forged, altered, replayed, reordered, truncated)
    raises :class:`ProtocolError` naming the sender; the link then refuses
    everything from it. Every CrypTen frame between two ranks is sealed and
    opened in the order posted, which is the order gloo delivers one (peer, tag).
    Frame buffers come from the links' pool and go back to it when the send has
    completed or the frame has been opened (:mod:`securevfl.runtime.secure.frames`)."""

    def __init__(self, channel: Channel):
        self.channel = channel

    def post_send(self, peer: int, tensor: torch.Tensor) -> Pending:
        link = self.channel.link(peer, STREAM)
        frame = link.seal_tensor(tensor)
        return _Sending(_posted(dist.isend(frame, dst=peer, tag=CRYPTEN_TAG)), link, frame)

    def post_recv(self, peer: int, tensor: torch.Tensor) -> Pending:
        link = self.channel.link(peer, STREAM)
        frame = link.frame_for(tensor)
        return _Opening(_posted(dist.irecv(frame, src=peer, tag=CRYPTEN_TAG)), link, frame, tensor)


def transport_for(channel: Channel) -> FrameTransport:
    """:class:`SealedFrames` when the channel has the session's links (every
    rank of a run), else :class:`GlooFrames` (a process group made without a
    session: unit tests and the communicator benchmark)."""
    return SealedFrames(channel) if channel.links is not None else GlooFrames()
