"""The channel: sealed, framed tensor and control messages over torch.distributed (gloo).

Every message is a fixed header (int64[12]: magic, tag code, dtype code, ndim,
round, shape) followed by the payload tensor. Both travel sealed on the session's
link to the peer (:class:`~securevfl.runtime.secure.link.Link`, stream
``"channel"``): the header as one 112-byte frame, the payload as one frame of its
size plus 16 bytes, each authenticated with the direction's next sequence number,
so a forged, replayed, reordered or truncated frame raises :class:`ProtocolError`
naming the peer before anything in it is used. The receiver names the tag it
expects and may constrain dtype and shape; a mismatch, an unknown tag or an
oversized payload raises :class:`ProtocolError` naming the sender and the message
before any payload is accepted. Control messages are JSON in uint8 tensors,
validated by a strict pydantic model. Nothing is unpickled. Every message is
logged in the rank's :class:`Ledger`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch
import torch.distributed as dist
from pydantic import BaseModel, ValidationError

from securevfl.errors import Diverged, PartyFailure, ProtocolError
from securevfl.runtime.ledger import Ledger, Record
from securevfl.runtime.messages import CONTROL, DTYPE_CODES, DTYPES, Tag, tag_by_code
from securevfl.runtime.secure.link import DEFAULT_STREAM, Link, Links

MAGIC = 0x5346_4C01  # "SFL", version 1
MAX_NDIM = 7
HEADER_LEN = 5 + MAX_NDIM
DEFAULT_MAX_BYTES = 1 << 31

M = TypeVar("M", bound=BaseModel)


class Channel:
    """Point-to-point messages between ranks, metered into a ledger.

    ``names`` maps rank -> human label ("passive 'left'") for error messages;
    ``on_comm_error(peer, exc)`` turns a transport failure into the right
    :class:`PartyFailure` (the session's watchdog knows which rank was lost).
    ``links`` are the session's authenticated links (:attr:`Session.links`); a
    channel without them sends and receives nothing (it may still carry the
    phase, round and ledger for code that moves its own sealed frames).
    Code holding the channel reaches the link to peer R with :meth:`link`.
    """

    def __init__(
        self,
        rank: int,
        names: dict[int, str],
        ledger: Ledger,
        *,
        on_comm_error: Callable[[int, Exception], PartyFailure] | None = None,
        max_bytes: int = DEFAULT_MAX_BYTES,
        links: Links | None = None,
    ):
        self.rank = rank
        self.names = names
        self.ledger = ledger
        self.phase = "setup"
        self.round = -1
        self._on_comm_error = on_comm_error
        self.max_bytes = max_bytes
        self.links = links
        if links is not None:  # the links' CPU time and sealed bytes, per phase, in this ledger
            links.meter.phase_of = lambda: self.phase
            links.meter.by_phase = ledger.channel

    def link(self, peer: int, stream: str = DEFAULT_STREAM) -> Link:
        """The sealed link to ``peer`` (a global rank) on ``stream``; other
        traffic than the channel's own frames takes a stream of its own."""
        if self.links is None:
            raise ProtocolError(
                f"{self._who(self.rank)} has no authenticated links: no session handshake ran"
            )
        return self.links.link(peer, stream)

    # -- transport ---------------------------------------------------------------
    def _who(self, rank: int) -> str:
        return f"rank {rank} ({self.names.get(rank, '?')})"

    def comm_failure(self, peer: int, exc: Exception) -> PartyFailure:
        """The PartyFailure for a transport error while talking to ``peer``
        (-1: a collective), asking the session which rank was lost."""
        if self._on_comm_error is not None:
            return self._on_comm_error(peer, exc)
        return PartyFailure(f"lost connection to {self._who(peer)}: {exc}", rank=peer if peer >= 0 else None)

    def _io(self, fn: Callable[..., object], tensor: torch.Tensor, peer: int) -> None:
        try:
            if fn is dist.send:
                dist.send(tensor, dst=peer)
            else:
                dist.recv(tensor, src=peer)
        except (RuntimeError, dist.DistBackendError) as exc:  # gloo: peer gone / timeout
            raise self.comm_failure(peer, exc) from None

    # -- tensors -----------------------------------------------------------------
    def send(self, dst: int, tag: Tag, tensor: torch.Tensor) -> None:
        t = tensor.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        t = t.contiguous()
        if t.dtype not in tag.dtypes:
            raise ProtocolError(f"refusing to send {tag.name} as {t.dtype} (allowed {tag.dtypes})")
        if t.dim() > MAX_NDIM:
            raise ProtocolError(f"{tag.name}: tensors of more than {MAX_NDIM} dims not supported")
        if t.is_floating_point() and not torch.isfinite(t).all():
            raise Diverged(
                f"{self._who(self.rank)} computed '{tag.name}' with NaN or infinite values in step "
                f"{self.round}: training diverged (lower training.lr or interactive.lr, or "
                "standardize the features)"
            )
        link = self.link(dst)
        header = torch.tensor(
            [MAGIC, tag.code, DTYPE_CODES[t.dtype], t.dim(), self.round, *t.shape]
            + [0] * (MAX_NDIM - t.dim()),
            dtype=torch.int64,
        )
        wire = self._send_frame(link, header, dst)
        if t.numel():
            wire += self._send_frame(link, t, dst)
        nbytes = t.numel() * t.element_size()
        self.ledger.log(
            Record(
                "sent",
                self.phase,
                self.round,
                self.rank,
                dst,
                tag.name,
                tuple(t.shape),
                str(t.dtype).removeprefix("torch."),
                nbytes,
                wire,
            )
        )

    def recv(
        self,
        src: int,
        tag: Tag,
        *,
        shape: tuple[int | None, ...] | None = None,
        dtype: torch.dtype | None = None,
        decode: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Receive one message from ``src`` that must carry ``tag``; ``shape`` may
        use None for free dimensions. ``decode`` turns a compact wire form into the
        tensor the caller works with (e.g. packed bits into +-1 codes): the ledger
        records the wire's shape, dtype and bytes, the recorded view the decoded
        tensor, which is what is returned."""
        link = self.link(src)
        who = self._who(src)
        header = torch.empty(HEADER_LEN, dtype=torch.int64)
        wire = self._recv_frame(link, header, src, tag)
        h = header.tolist()
        if h[0] != MAGIC:
            raise ProtocolError(f"{who} sent a malformed frame (bad magic) where '{tag.name}' was expected")
        got = tag_by_code(h[1])
        if h[1] != tag.code:
            name = got.name if got else f"unknown tag #{h[1]}"
            raise ProtocolError(f"{who} sent '{name}' where '{tag.name}' was expected")
        dt = DTYPES.get(h[2])
        if dt is None or dt not in tag.dtypes or (dtype is not None and dt != dtype):
            raise ProtocolError(f"{who} sent '{tag.name}' with a disallowed dtype code {h[2]}")
        ndim = h[3]
        if not 0 <= ndim <= MAX_NDIM:
            raise ProtocolError(f"{who} sent '{tag.name}' with {ndim} dimensions")
        shp = tuple(h[5 : 5 + ndim])
        if any(s < 0 for s in shp):
            raise ProtocolError(f"{who} sent '{tag.name}' with a negative dimension {shp}")
        if shape is not None and (
            len(shape) != ndim or any(e is not None and e != s for e, s in zip(shape, shp, strict=False))
        ):
            raise ProtocolError(f"{who} sent '{tag.name}' of shape {shp}, expected {shape}")
        numel = 1
        for s in shp:
            numel *= s
        nbytes = numel * torch.empty((), dtype=dt).element_size()
        if nbytes > self.max_bytes:
            raise ProtocolError(f"{who} announced a {nbytes}-byte '{tag.name}' (limit {self.max_bytes})")
        out = torch.empty(shp, dtype=dt)
        if numel:
            wire += self._recv_frame(link, out, src, tag)
        if dt.is_floating_point and not torch.isfinite(out).all():
            raise ProtocolError(f"{who} sent '{tag.name}' containing NaN or infinite values")
        if decode is not None:
            out = decode(out)
        self.ledger.log(
            Record(
                "recv",
                self.phase,
                h[4],
                src,
                self.rank,
                tag.name,
                shp,
                str(dt).removeprefix("torch."),
                nbytes,
                wire,
            ),
            out,
        )
        return out

    def _send_frame(self, link: Link, t: torch.Tensor, dst: int) -> int:
        """Seal ``t`` and send it as one frame (the send blocks until the frame is
        on its way, so its buffer goes back to the link's pool); returns its bytes."""
        frame = link.seal_tensor(t)
        self._io(dist.send, frame, dst)
        link.release(frame)
        return frame.numel()

    def _recv_frame(self, link: Link, out: torch.Tensor, src: int, tag: Tag) -> int:
        """Receive one frame and open it into ``out`` (whose size the header fixed
        and checked); returns its bytes. A frame that fails to open raises
        :class:`ProtocolError` naming the sender and the message."""
        frame = link.frame_for(out)
        self._io(dist.recv, frame, src)
        try:
            link.open_tensor(frame, out)
        except ProtocolError as exc:
            raise ProtocolError(f"{exc} (while receiving '{tag.name}')") from None
        link.release(frame)
        return frame.numel()

    # -- bytes and JSON control ------------------------------------------------------
    def send_bytes(self, dst: int, tag: Tag, data: bytes) -> None:
        self.send(dst, tag, torch.frombuffer(bytearray(data), dtype=torch.uint8))

    def recv_bytes(self, src: int, tag: Tag, *, max_len: int | None = None) -> bytes:
        t = self.recv(src, tag, dtype=torch.uint8)
        if t.dim() != 1 or (max_len is not None and t.numel() > max_len):
            raise ProtocolError(f"{self._who(src)} sent an oversized or non-flat '{tag.name}'")
        return t.numpy().tobytes()

    def send_json(self, dst: int, msg: BaseModel, tag: Tag = CONTROL) -> None:
        self.send_bytes(dst, tag, msg.model_dump_json().encode())

    def recv_json(self, src: int, model: type[M], tag: Tag = CONTROL) -> M:
        raw = self.recv_bytes(src, tag, max_len=64 << 20)
        try:
            return model.model_validate_json(raw)
        except ValidationError as exc:
            first = exc.errors()[0]
            raise ProtocolError(
                f"{self._who(src)} sent an invalid '{tag.name}' message "
                f"({model.__name__}): {first['msg']} at {first['loc']}"
            ) from None
