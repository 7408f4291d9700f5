"""CrypTen's communicator on securevfl's frames: every byte point to point.

CrypTen's own ``DistributedCommunicator`` runs its collectives (all-reduce,
reduce, broadcast, gather) as gloo collectives on process sub-groups, and the
dealer's seeds as raw ``dist.isend``. None of that passes through a channel a
party could authenticate or encrypt, so an observer of the links would see both
shares of every opened value. :class:`FramedCommunicator` is a CrypTen
communicator (a subclass of ``crypten.communicator.Communicator``; CrypTen has no
function to register one, so :func:`securevfl.exchange.crypten_runtime.start_crypten`
puts it where ``crypten.communicator.get()`` looks, ``DistributedCommunicator.instance``,
through :func:`securevfl.exchange.crypten_patches.use_communicator`)
whose every operation is a set of point-to-point frames through one
:class:`FrameTransport`:

* **collectives as exchanges of shares**: an all-reduce of additive (or XOR)
  shares among up to :attr:`FramedCommunicator.EXCHANGE_MAX` (3) parties is one
  round in which each party sends its share to every other party and adds what
  it receives (the reduction happens at the receivers, in rank order, never in
  the transport); among more parties it is two rounds in which each party
  reduces 1/n of the vector and sends the result to the others (a reduce-scatter
  and an all-gather), so that its bytes grow linearly in the parties (2 (n - 1) / n
  of a share in and out per party, as a ring all-reduce, instead of n - 1 shares).
  A reduce, gather or reveal sends to the destination only; a
  broadcast sends from the source to each member of the group. With up to 3 MPC
  parties (the reference workload) every collective is one round, as the gloo
  collective it replaces, so the round counts of :mod:`securevfl.exchange.mpc.plan`
  hold; with more, each opening takes two rounds;
* **one frame per peer per round**: a batched operation (CrypTen's ``batched``
  lists, :meth:`FramedCommunicator.reveal_many`) concatenates everything bound
  for one peer into one frame;
* **groups are names**: CrypTen passes its ``main_group``, ``ttp_group`` and
  ``ttp_comm_group`` back into ``broadcast``/``send_obj``; here they are the rank
  sets of :class:`RankSet` (no torch process sub-group is created), so a peer
  outside the group is refused;
* **keys**: the 256-bit keys of CrypTen's PRG streams and of the dealer's stream
  with each MPC party (:mod:`securevfl.exchange.crypten_rng`) travel as frames
  too, each to the one peer that shares the stream, metered without their bytes.

The transport decides what a frame looks like on the wire. :class:`SealedFrames`
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

import functools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.distributed as dist

from securevfl.errors import PartyFailure, ProtocolError
from securevfl.exchange.crypten_api import Communicator
from securevfl.runtime.channel import Channel
from securevfl.runtime.ledger import Record
from securevfl.runtime.secure.link import Link

GROUP = -1  # ledger peer for collectives: "the MPC group"
CRYPTEN_TAG = 0x4372  # gloo tag of CrypTen's frames ("Cr"); the Channel uses tag 0
STREAM = "crypten"  # the sealed links' stream for CrypTen's frames
PHASES = {"setup", "psi", "train", "eval"}
MAX_OBJ_BYTES = 1 << 20
REDUCE_OPS: dict[Any, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    dist.ReduceOp.SUM: torch.Tensor.add_,
    dist.ReduceOp.BXOR: torch.Tensor.bitwise_xor_,
}


def _posted(work: dist.Work | None) -> Pending:
    """torch types ``isend``/``irecv`` as possibly None (it is None only for a
    rank outside the group, which a frame's peer never is)."""
    if work is None:
        raise ProtocolError("torch.distributed posted no request for a point-to-point frame")
    return work


# -- JSON object codec ----------------------------------------------------------------


def encode_obj(obj: Any) -> bytes:
    """Encode a CrypTen control object (str/int/float/bool/None, lists, tuples,
    dicts with str keys, torch.Size) as JSON; anything else is refused."""

    def enc(o: Any) -> Any:
        if o is None or isinstance(o, (bool, int, float, str)):
            return o
        if isinstance(o, torch.Size):
            return {"__t": "size", "v": [int(x) for x in o]}
        if isinstance(o, tuple):
            return {"__t": "tuple", "v": [enc(x) for x in o]}
        if isinstance(o, list):
            return [enc(x) for x in o]
        if isinstance(o, dict) and all(isinstance(k, str) for k in o):
            return {"__t": "dict", "v": {k: enc(v) for k, v in o.items()}}
        raise TypeError(f"securevfl does not send objects of type {type(o).__name__} between parties")

    return json.dumps(enc(obj)).encode()


def decode_obj(raw: bytes) -> Any:
    """Inverse of :func:`encode_obj`; malformed input raises ValueError."""

    def dec(o: Any) -> Any:
        if o is None or isinstance(o, (bool, int, float, str)):
            return o
        if isinstance(o, list):
            return [dec(x) for x in o]
        if isinstance(o, dict):
            kind = o.get("__t")
            if kind == "size" and all(isinstance(x, int) and x >= 0 for x in o["v"]):
                return torch.Size(o["v"])
            if kind == "tuple":
                return tuple(dec(x) for x in o["v"])
            if kind == "dict" and isinstance(o.get("v"), dict):
                return {str(k): dec(v) for k, v in o["v"].items()}
        raise ValueError("malformed object")

    return dec(json.loads(raw.decode()))


# -- the transport ----------------------------------------------------------------------


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


@dataclass(frozen=True)
class RankSet:
    """One of CrypTen's communication groups, as the ranks it contains."""

    name: str
    ranks: tuple[int, ...]


# -- CrypTen's CUDA shares ----------------------------------------------------------------
# On CUDA CrypTen keeps a share as a ``CUDALongTensor``, a wrapper (not a torch.Tensor)
# whose int64 CUDA tensor is its ``data``. The communicator moves that tensor (frames are
# CPU bytes either way) and hands results back in the wrapper type it was given, as
# CrypTen's own communicator does; plain tensors pass through untouched. Duck-typed so
# this module stays free of CrypTen imports.


def _raw(x: Any, seen: list[type]) -> Any:
    if x is None or isinstance(x, (torch.Tensor, int, float, str, RankSet)):
        return x
    if isinstance(x, (list, tuple)):
        return type(x)(_raw(v, seen) for v in x)
    data = getattr(x, "data", None)
    if isinstance(data, torch.Tensor) and hasattr(x, "tensor"):
        seen.append(type(x))
        return data
    return x


def _wrap(x: Any, cls: type) -> Any:
    if isinstance(x, torch.Tensor):
        return cls(x)
    if isinstance(x, list):
        return [_wrap(v, cls) for v in x]
    if isinstance(x, tuple):
        return tuple(_wrap(v, cls) for v in x)
    return x


def cuda_shares(method: Callable[..., Any]) -> Callable[..., Any]:
    """Let a communicator method take and return CrypTen's CUDA share wrappers."""

    @functools.wraps(method)
    def call(self: Any, *args: Any, **kw: Any) -> Any:
        seen: list[type] = []
        args = tuple(_raw(a, seen) for a in args)
        kw = {k: _raw(v, seen) for k, v in kw.items()}
        out = method(self, *args, **kw)
        return _wrap(out, seen[0]) if seen else out

    return call


# -- helpers (pure) -----------------------------------------------------------------------


def flat_cat(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """One contiguous CPU tensor of every part's elements, in order (one frame)."""
    if len(parts) == 1:
        return parts[0].detach().reshape(-1).contiguous().cpu()
    dtypes = {p.dtype for p in parts}
    if len(dtypes) != 1:
        raise ProtocolError(f"CrypTen batched operation over mixed dtypes {sorted(map(str, dtypes))}")
    return torch.cat([p.detach().reshape(-1).cpu() for p in parts])


def split_like(flat: torch.Tensor, like: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Inverse of :func:`flat_cat`: views of ``flat`` shaped as ``like``, on their devices."""
    out, at = [], 0
    for t in like:
        n = t.numel()
        out.append(flat[at : at + n].reshape(t.shape).to(t.device))
        at += n
    return out


def combine(own: torch.Tensor, others: Sequence[torch.Tensor], op: Any) -> torch.Tensor:
    """``own`` reduced with ``others`` (in the given order) by SUM (ring addition,
    wrapping modulo 2^64 as CrypTen's shares do) or BXOR."""
    fn = REDUCE_OPS.get(op)
    if fn is None:
        raise ProtocolError(f"CrypTen reduction {op} is not used by securevfl's MPC exchange")
    total = own.clone()
    for t in others:
        fn(total, t)
    return total


def _numel_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


# -- the communicator ---------------------------------------------------------------------


class _Req:
    """CrypTen's isend/irecv handle: waits on the transport, names the peer on
    failure, meters the frame."""

    def __init__(
        self,
        comm: FramedCommunicator,
        pending: Pending,
        peer: int,
        buf: torch.Tensor,
        done: Callable[[], None],
    ):
        self.comm, self.pending, self.peer, self.done = comm, pending, peer, done
        self.buf = buf  # the frame's tensor lives until the transport is done with it

    def wait(self) -> None:
        self.comm._wait(self.peer, self.pending)
        self.done()

    def is_completed(self) -> bool:
        return False


class FramedCommunicator(Communicator):
    """CrypTen's communicator interface over :class:`FrameTransport` frames.

    MPC parties are ranks ``0..n_mpc-1``; a trusted dealer, if any, is rank
    ``n_mpc`` (CrypTen's ``get_ttp_rank``). Every tensor is metered into the
    rank's ledger as ``mpc.<operation>`` records (bytes this rank actually sent
    or received); a transport error becomes ``on_failure(peer)``, the
    :class:`PartyFailure` naming the peer of the frame that failed."""

    BYTES_PER_ELEMENT = 8
    EXCHANGE_MAX = 3  # MPC parties up to which an all-reduce is one all-to-all round

    def __init__(
        self,
        transport: FrameTransport,
        channel: Channel,
        n_mpc: int,
        world_size: int,
        on_failure: Callable[[int, Exception], PartyFailure],
    ):
        self.transport = transport
        self.channel = channel
        self.on_failure = on_failure
        self.rank = channel.rank
        self.world_size = n_mpc
        self.main_group = RankSet("main", tuple(range(n_mpc)))
        self.ttp_group = RankSet("ttp", tuple(range(world_size)))
        self.ttp_comm_group = RankSet("ttp_comm", (0, world_size - 1))
        self.ttp_initialized = world_size > n_mpc
        self._name = f"rank{self.rank}"
        self.frames_sent = 0
        self.frames_received = 0
        self.reset_communication_stats()

    # -- CrypTen's bookkeeping ------------------------------------------------------
    def reset_communication_stats(self) -> None:
        self.comm_rounds = 0
        self.comm_bytes = 0
        self.comm_time = 0

    def get_world_size(self) -> int:
        return self.world_size

    def get_rank(self) -> int:
        return self.rank

    def get_ttp_rank(self) -> int:
        return self.world_size

    def set_name(self, name: str) -> None:
        self._name = name

    def get_name(self) -> str:
        return self._name

    def get_distributed_backend(self) -> str:
        return "securevfl-frames"

    # -- frames ------------------------------------------------------------------------
    def _others(self, ranks: Sequence[int]) -> list[int]:
        """The other members of ``ranks``, starting after this rank (so that not
        every party sends to rank 0 first)."""
        n = len(ranks)
        at = ranks.index(self.rank) if self.rank in ranks else 0
        return [ranks[(at + i) % n] for i in range(1, n + 1) if ranks[(at + i) % n] != self.rank]

    def _member(self, group: RankSet | None, *ranks: int) -> RankSet:
        g = self.main_group if group is None else group
        if not isinstance(g, RankSet) or any(r not in g.ranks for r in ranks):
            raise ProtocolError(f"CrypTen addressed ranks {ranks} outside its group {g}")
        return g

    def _wait(self, peer: int, pending: Pending) -> None:
        try:
            pending.wait()
        except (RuntimeError, dist.DistBackendError) as exc:
            raise self.on_failure(peer, exc) from None

    def _post(self, post: Callable[[int, torch.Tensor], Pending], peer: int, t: torch.Tensor) -> Pending:
        try:
            return post(peer, t)
        except (RuntimeError, dist.DistBackendError) as exc:
            raise self.on_failure(peer, exc) from None

    def exchange(
        self, sends: Sequence[tuple[int, torch.Tensor]], recvs: Sequence[tuple[int, torch.Tensor]]
    ) -> None:
        """One round: post every receive and every send, then wait for all of them."""
        posted = [(p, self._post(self.transport.post_recv, p, t)) for p, t in recvs]
        posted += [(p, self._post(self.transport.post_send, p, t)) for p, t in sends]
        for p, req in posted:
            self._wait(p, req)
        self.frames_sent += len(sends)
        self.frames_received += len(recvs)

    # -- ledger ------------------------------------------------------------------------
    def _log(
        self,
        direction: str,
        sender: int,
        receiver: int,
        tag: str,
        t: torch.Tensor,
        nbytes: int | None = None,
        payload: torch.Tensor | None = None,
    ) -> None:
        ch = self.channel
        ch.ledger.log(
            Record(
                direction,
                ch.phase,
                ch.round,
                sender,
                receiver,
                f"mpc.{tag}",
                tuple(t.shape),
                str(t.dtype).removeprefix("torch."),
                _numel_bytes(t) if nbytes is None else nbytes,
            ),
            payload,
        )

    # -- point to point ----------------------------------------------------------------
    @cuda_shares
    def send(self, tensor: torch.Tensor, dst: int) -> None:
        self._member(None, dst)
        self.exchange([(dst, flat_cat([tensor]))], [])
        self._log("sent", self.rank, dst, "send", tensor)

    @cuda_shares
    def recv(self, tensor: torch.Tensor, src: int | None = None) -> torch.Tensor:
        if src is None:
            raise ProtocolError("securevfl's MPC exchange never receives from an unnamed rank")
        self._member(None, src)
        buf = torch.empty(tensor.numel(), dtype=tensor.dtype)
        self.exchange([], [(src, buf)])
        out = buf.reshape(tensor.shape).to(tensor.device)
        self._log("recv", src, self.rank, "recv", out, payload=out)
        return out

    @cuda_shares
    def isend(self, tensor: torch.Tensor, dst: int) -> _Req:
        self._member(self.ttp_group, dst)
        t = flat_cat([tensor])
        pending = self._post(self.transport.post_send, dst, t)

        def done() -> None:
            self.frames_sent += 1
            self._log("sent", self.rank, dst, "send", tensor)

        return _Req(self, pending, dst, t, done)

    @cuda_shares
    def irecv(self, tensor: torch.Tensor, src: int | None = None) -> _Req:
        """Receive into ``tensor`` (in place, as CrypTen's irecv). Used for PRG
        seeds: metered without keeping the payload."""
        if src is None:
            raise ProtocolError("securevfl's MPC exchange never receives from an unnamed rank")
        self._member(self.ttp_group, src)
        buf = torch.empty(tensor.numel(), dtype=tensor.dtype)
        pending = self._post(self.transport.post_recv, src, buf)

        def done() -> None:
            tensor.copy_(buf.reshape(tensor.shape))
            self.frames_received += 1
            self._log("recv", src, self.rank, "recv", tensor)

        return _Req(self, pending, src, buf, done)

    # -- collectives as point-to-point exchanges -----------------------------------------
    @staticmethod
    def _parts(x: Any, batched: bool) -> list[torch.Tensor]:
        if batched:
            if not isinstance(x, list):
                raise ProtocolError("CrypTen batched operation without a list")
            return list(x)
        return [x]

    @cuda_shares
    def all_reduce(self, input: Any, op: Any = dist.ReduceOp.SUM, batched: bool = False) -> Any:
        """Open the reduction of every party's share to every party. With up to
        :attr:`EXCHANGE_MAX` parties, one round: each sends its (concatenated)
        share to every other and reduces what it receives (n (n - 1) shares on
        the wire). With more, two rounds in which every party reduces 1/n of the
        vector (reduce-scatter, then all-gather of the reduced pieces): each
        party sends and receives 2 (n - 1) / n of a share, as a ring all-reduce,
        so the bytes grow linearly in n and no party carries more than another."""
        parts = self._parts(input, batched)
        flat = flat_cat(parts)
        ranks = self.main_group.ranks
        peers = self._others(ranks)
        n = len(ranks)
        if n <= self.EXCHANGE_MAX or flat.numel() < n:
            bufs = {p: torch.empty_like(flat) for p in peers}
            self.exchange([(p, flat) for p in peers], list(bufs.items()))
            total = combine(flat, [bufs[p] for p in sorted(peers)], op)
            moved = flat.numel() * len(peers)
        else:
            pieces = dict(zip(ranks, torch.tensor_split(flat, n), strict=True))
            mine = pieces[self.rank]
            bufs = {p: torch.empty_like(mine) for p in peers}
            self.exchange([(p, pieces[p].contiguous()) for p in peers], list(bufs.items()))
            reduced = combine(mine, [bufs[p] for p in sorted(peers)], op)
            got = {p: torch.empty_like(pieces[p]) for p in peers}
            self.exchange([(p, reduced) for p in peers], list(got.items()))
            got[self.rank] = reduced
            total = torch.cat([got[r] for r in ranks])
            moved = (flat.numel() - mine.numel()) + mine.numel() * len(peers)
        outs = split_like(total, parts)
        item = flat.element_size()
        for t_in, t_out in zip(parts, outs, strict=True):
            # this rank's bytes on the wire (each way), apportioned to each tensor of the batch
            nbytes = moved * item * t_in.numel() // max(1, flat.numel())
            self._log("sent", self.rank, GROUP, "all_reduce", t_in, nbytes)
            self._log("recv", GROUP, self.rank, "all_reduce", t_out, nbytes, t_out)
        return outs if batched else outs[0]

    @cuda_shares
    def reduce(self, input: Any, dst: int, op: Any = dist.ReduceOp.SUM, batched: bool = False) -> Any:
        """Open the reduction of every party's share to ``dst`` alone: the others
        send their shares there (one frame each)."""
        self._member(None, dst)
        parts = self._parts(input, batched)
        flat = flat_cat(parts)
        if self.rank != dst:
            self.exchange([(dst, flat)], [])
            for t_in in parts:
                self._log("sent", self.rank, dst, "reveal", t_in)
            return None
        peers = self._others(self.main_group.ranks)
        bufs = {p: torch.empty_like(flat) for p in peers}
        self.exchange([], list(bufs.items()))
        outs = split_like(combine(flat, [bufs[p] for p in sorted(peers)], op), parts)
        for t_in, t_out in zip(parts, outs, strict=True):
            self._log("recv", GROUP, self.rank, "reveal", t_out, _numel_bytes(t_in) * len(peers), t_out)
        return outs if batched else outs[0]

    @cuda_shares
    def reveal_many(self, shares: list[torch.Tensor], dsts: list[int]) -> list[torch.Tensor | None]:
        """Open shares[j] to rank dsts[j] only, every opening in the same round,
        one frame per (sender, destination) pair carrying all the sender's shares
        for that destination. Returns, per j, the opened value at its destination
        and None elsewhere; logged like ``reduce``."""
        n = self.world_size
        for d in dsts:
            self._member(None, d)
        mine = [j for j, d in enumerate(dsts) if d == self.rank]
        outgoing: dict[int, list[int]] = {}
        for j, d in enumerate(dsts):
            if d != self.rank:
                outgoing.setdefault(d, []).append(j)
        sends = [(d, flat_cat([shares[j] for j in js])) for d, js in outgoing.items()]
        own = flat_cat([shares[j] for j in mine]) if mine else None
        peers = self._others(self.main_group.ranks) if mine else []
        assert own is not None or not peers
        bufs = {p: torch.empty_like(own) for p in peers} if own is not None else {}
        self.exchange(sends, list(bufs.items()))
        for d, js in outgoing.items():
            for j in js:
                self._log("sent", self.rank, d, "reveal", shares[j])
        out: list[torch.Tensor | None] = [None] * len(shares)
        if own is not None:
            totals = split_like(
                combine(own, [bufs[p] for p in sorted(peers)], dist.ReduceOp.SUM), [shares[j] for j in mine]
            )
            for j, total in zip(mine, totals, strict=True):
                out[j] = total
                self._log("recv", GROUP, self.rank, "reveal", total, _numel_bytes(total) * (n - 1), total)
        return out

    @cuda_shares
    def reveal_open(
        self, shares: list[torch.Tensor], dsts: list[int], opening: torch.Tensor
    ) -> tuple[list[torch.Tensor | None], torch.Tensor]:
        """:meth:`reveal_many` and, in the same round, the sum of every party's
        ``opening`` opened to every party (as :meth:`all_reduce`): each party sends
        every other one frame, its shares for that destination followed by its
        ``opening``. Returns reveal_many's list and the opened sum; logged as
        ``reveal`` and ``all_reduce``."""
        for d in dsts:
            self._member(None, d)
        peers = self._others(self.main_group.ranks)
        mine = [j for j, d in enumerate(dsts) if d == self.rank]
        sends = []
        for p in peers:
            js = [j for j, d in enumerate(dsts) if d == p]
            sends.append((p, flat_cat([*(shares[j] for j in js), opening])))
        own = flat_cat([shares[j] for j in mine]) if mine else torch.zeros(0, dtype=opening.dtype)
        flat_open = flat_cat([opening])
        bufs = {p: torch.empty(own.numel() + flat_open.numel(), dtype=flat_open.dtype) for p in peers}
        self.exchange(sends, list(bufs.items()))
        for p in peers:
            for j, d in enumerate(dsts):
                if d == p:
                    self._log("sent", self.rank, d, "reveal", shares[j])
        out: list[torch.Tensor | None] = [None] * len(shares)
        if mine:
            parts = [bufs[p][: own.numel()] for p in sorted(peers)]
            totals = split_like(combine(own, parts, dist.ReduceOp.SUM), [shares[j] for j in mine])
            for j, total in zip(mine, totals, strict=True):
                out[j] = total
                self._log("recv", GROUP, self.rank, "reveal", total, _numel_bytes(total) * len(peers), total)
        opened = combine(flat_open, [bufs[p][own.numel() :] for p in sorted(peers)], dist.ReduceOp.SUM)
        nbytes = _numel_bytes(flat_open) * len(peers)
        self._log("sent", self.rank, GROUP, "all_reduce", opening, nbytes)
        self._log("recv", GROUP, self.rank, "all_reduce", opened, nbytes, opened)
        return out, opened

    def p2p_round(
        self, sends: Sequence[tuple[int, torch.Tensor]], recvs: Sequence[tuple[int, torch.Tensor]], tag: str
    ) -> list[torch.Tensor]:
        """Point-to-point messages among any subset of the MPC parties in one round
        (securevfl's addition for the pairwise share layout, :mod:`securevfl.exchange.mpc.pairwise`,
        whose pairs are not CrypTen groups): every send (dst, tensor) and receive (src, buffer)
        posted at once. Returns the received tensors, shaped like their buffers; logged as
        ``mpc.<tag>`` per peer, received payloads kept like every other receive."""
        got = self.p2p_parts([(d, [(tag, t)]) for d, t in sends], [(s, [(tag, b)]) for s, b in recvs])
        return [parts[0] for parts in got]

    def p2p_parts(
        self,
        sends: Sequence[tuple[int, Sequence[tuple[str, torch.Tensor]]]],
        recvs: Sequence[tuple[int, Sequence[tuple[str, torch.Tensor]]]],
    ) -> list[list[torch.Tensor]]:
        """:meth:`p2p_round` with each message made of tagged parts (tag, tensor), all
        of one message in one frame: each part is logged as ``mpc.<tag>``. Receives
        name their parts' buffers; returns, per receive, its parts shaped like them."""
        for p, _ in [*sends, *recvs]:
            self._member(None, p)
        flat = [(d, flat_cat([t for _, t in parts])) for d, parts in sends]
        bufs = [
            (s, torch.empty(sum(b.numel() for _, b in parts), dtype=parts[0][1].dtype)) for s, parts in recvs
        ]
        self.exchange(flat, bufs)
        for d, parts in sends:
            for tag, t in parts:
                self._log("sent", self.rank, d, tag, t)
        out = []
        for (s, parts), (_, got) in zip(recvs, bufs, strict=True):
            pieces = split_like(got, [b for _, b in parts])
            for (tag, _), t in zip(parts, pieces, strict=True):
                self._log("recv", s, self.rank, tag, t, payload=t)
            out.append(pieces)
        return out

    @cuda_shares
    def gather(self, tensor: torch.Tensor, dst: int) -> list[Any]:
        """Every party's tensor at ``dst`` (in rank order); [None] elsewhere."""
        self._member(None, dst)
        flat = flat_cat([tensor])
        if self.rank != dst:
            self.exchange([(dst, flat)], [])
            self._log("sent", self.rank, dst, "gather", tensor)
            return [None]
        bufs = {p: torch.empty_like(flat) for p in self._others(self.main_group.ranks)}
        self.exchange([], list(bufs.items()))
        return self._in_group_order(tensor, bufs, "gather")

    @cuda_shares
    def all_gather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        flat = flat_cat([tensor])
        peers = self._others(self.main_group.ranks)
        bufs = {p: torch.empty_like(flat) for p in peers}
        self.exchange([(p, flat) for p in peers], list(bufs.items()))
        self._log("sent", self.rank, GROUP, "all_gather", tensor, _numel_bytes(tensor) * len(peers))
        return self._in_group_order(tensor, bufs, "all_gather")

    def _in_group_order(
        self, tensor: torch.Tensor, bufs: dict[int, torch.Tensor], op: str
    ) -> list[torch.Tensor]:
        """This rank's ``tensor`` and every peer's received buffer, shaped like it,
        in the MPC group's rank order (each received one logged under ``op``)."""
        out = []
        for src in self.main_group.ranks:
            if src == self.rank:
                out.append(tensor)
                continue
            t = bufs[src].reshape(tensor.shape).to(tensor.device)
            self._log("recv", src, self.rank, op, t, payload=t)
            out.append(t)
        return out

    @cuda_shares
    def broadcast(self, input: Any, src: int, group: Any = None, batched: bool = False) -> Any:
        """``src`` sends its tensor(s) to each other member of ``group`` (one
        frame per member); the others receive in place, as CrypTen's broadcast."""
        g = self._member(group, src, self.rank)
        parts = self._parts(input, batched)
        if self.rank == src:
            flat = flat_cat(parts)
            peers = self._others(g.ranks)
            self.exchange([(p, flat) for p in peers], [])
            for t in parts:
                self._log("sent", self.rank, GROUP, "broadcast", t, _numel_bytes(t) * len(peers))
            return input
        buf = torch.empty(sum(t.numel() for t in parts), dtype=parts[0].dtype)
        self.exchange([], [(src, buf)])
        for t, got in zip(parts, split_like(buf, parts), strict=True):
            t.copy_(got)
            self._log("recv", src, self.rank, "broadcast", t, payload=t)
        return input

    # -- objects: JSON, never pickle -----------------------------------------------------
    def send_obj(self, obj: Any, dst: int, group: Any = None) -> None:
        self._member(self.ttp_group if group is None else group, dst)
        # the phase and round travel with the object so the dealer's ledger
        # attributes its replies to the right training step
        buf = encode_obj({"phase": self.channel.phase, "round": self.channel.round, "obj": obj})
        if len(buf) > MAX_OBJ_BYTES:
            raise ProtocolError(f"refusing to send a {len(buf)}-byte MPC control object")
        size = torch.tensor([len(buf)], dtype=torch.int64)
        arr = torch.frombuffer(bytearray(buf), dtype=torch.uint8)
        self.exchange([(dst, size), (dst, arr)], [])
        self._log("sent", self.rank, dst, "object", arr)

    def recv_obj(self, src: int, group: Any = None) -> Any:
        self._member(self.ttp_group if group is None else group, src)
        size = torch.zeros(1, dtype=torch.int64)
        self.exchange([], [(src, size)])
        n = int(size[0])
        if not 0 < n <= MAX_OBJ_BYTES:
            raise ProtocolError(f"rank {src} announced a {n}-byte MPC control object")
        arr = torch.empty(n, dtype=torch.uint8)
        self.exchange([], [(src, arr)])
        try:
            env = decode_obj(arr.numpy().tobytes())
            phase, rnd = env["phase"], env["round"]
            if phase not in PHASES or not isinstance(rnd, int) or set(env) != {"phase", "round", "obj"}:
                raise ValueError("envelope")
        except (ValueError, UnicodeDecodeError, TypeError, KeyError):
            raise ProtocolError(f"rank {src} sent a malformed MPC control object") from None
        self.channel.phase, self.channel.round = phase, rnd
        self._log("recv", src, self.rank, "object", arr)
        return env["obj"]

    # -- refused -------------------------------------------------------------------------
    def broadcast_obj(self, obj: Any, src: int, group: Any = None) -> Any:
        raise ProtocolError("securevfl's MPC exchange never broadcasts objects (sizes are agreed)")

    def scatter(self, *args: Any, **kw: Any) -> Any:
        raise ProtocolError("CrypTen operation 'scatter' is not used by securevfl's MPC exchange")

    def barrier(self) -> None:
        raise ProtocolError("CrypTen operation 'barrier' is not used by securevfl's MPC exchange")
