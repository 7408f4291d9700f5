"""CrypTen's communicator as point-to-point frames (securevfl.exchange.mpc.crypten.communicator).

The ranks are threads and the transport an in-memory queue per (sender,
receiver) pair, a test double that records every frame: each collective must
give CrypTen's result, move one frame per peer per round, never carry another
party's destination data, and name the peer when a frame is lost. The sealed
transport's frame buffers are checked with torch.distributed's isend/irecv
replaced by recorders; the sealed transport over real processes is covered by
the e2e and wire-tap tests."""

from __future__ import annotations

import hashlib
import queue
import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import torch
import torch.distributed as dist

from securevfl.errors import PartyFailure, ProtocolError
from securevfl.exchange.mpc.crypten.collective import RankSet, combine, flat_cat, split_like
from securevfl.exchange.mpc.crypten.communicator import FramedCommunicator
from securevfl.exchange.mpc.crypten.frames import CRYPTEN_TAG, SealedFrames
from securevfl.runtime.channel import Channel
from securevfl.runtime.ledger import Ledger
from securevfl.runtime.secure.link import Links


class QueueFrames:
    """In-memory frames between threads; ``log`` holds (sender, receiver, numel)."""

    def __init__(self, hub: QueueHub, rank: int):
        self.hub, self.rank = hub, rank

    def post_send(self, peer: int, tensor: torch.Tensor) -> Any:
        if peer in self.hub.dead:
            raise RuntimeError(f"connection to rank {peer} closed")
        self.hub.q(self.rank, peer).put(tensor.clone())
        with self.hub.lock:
            self.hub.log.append((self.rank, peer, tensor.numel()))
        return _Done()

    def post_recv(self, peer: int, tensor: torch.Tensor) -> Any:
        return _Take(self.hub.q(peer, self.rank), tensor, peer in self.hub.dead)


class _Done:
    def wait(self) -> None:
        return None


class _Take:
    def __init__(self, q: queue.Queue, out: torch.Tensor, dead: bool):
        self.q, self.out, self.dead = q, out, dead

    def wait(self) -> None:
        if self.dead:
            raise RuntimeError("Connection closed by peer")
        got = self.q.get(timeout=10)
        if got.numel() != self.out.numel() or got.dtype != self.out.dtype:
            raise RuntimeError("message size mismatch")
        self.out.copy_(got.reshape(self.out.shape))


class QueueHub:
    def __init__(self) -> None:
        self.queues: dict[tuple[int, int], queue.Queue] = {}
        self.lock = threading.Lock()
        self.log: list[tuple[int, int, int]] = []
        self.dead: set[int] = set()

    def q(self, src: int, dst: int) -> queue.Queue:
        with self.lock:
            return self.queues.setdefault((src, dst), queue.Queue())


def _comms(n_mpc: int, world: int | None = None) -> tuple[QueueHub, list[FramedCommunicator]]:
    world = world or n_mpc
    hub = QueueHub()
    out = []
    for r in range(world):
        ch = Channel(r, {i: f"r{i}" for i in range(world)}, Ledger(r))
        out.append(
            FramedCommunicator(QueueFrames(hub, r), ch, n_mpc, world, ch.comm_failure),
        )
    return hub, out


def _each(comms: list[FramedCommunicator], fn: Callable[[FramedCommunicator], Any]) -> list[Any]:
    with ThreadPoolExecutor(len(comms)) as pool:
        return list(pool.map(fn, comms))


def _shares(n: int, secret: torch.Tensor, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    parts = [torch.randint(-(2**62), 2**62, secret.shape, generator=g) for _ in range(n - 1)]
    last = secret.clone()
    for p in parts:
        last -= p
    return [*parts, last]


# -- pure helpers ---------------------------------------------------------------------------


def test_flat_cat_and_split_round_trip():
    parts = [torch.arange(6).reshape(2, 3), torch.arange(4), torch.tensor(7)]
    flat = flat_cat(parts)
    assert flat.shape == (11,) and flat.is_contiguous()
    back = split_like(flat, parts)
    assert all(torch.equal(a, b) for a, b in zip(parts, back, strict=True))


def test_flat_cat_refuses_mixed_dtypes():
    with pytest.raises(ProtocolError, match="mixed dtypes"):
        flat_cat([torch.zeros(2, dtype=torch.long), torch.zeros(2)])


def test_combine_wraps_in_the_ring_and_xors():
    big = torch.tensor([2**62, -(2**63)])
    total = combine(big, [big, big], dist.ReduceOp.SUM)
    assert total.tolist() == [3 * 2**62 - 2**64, -(2**63)]  # modulo 2^64
    x = torch.tensor([0b1010, 0b0110])
    assert combine(x, [torch.tensor([0b0011, 0b0110])], dist.ReduceOp.BXOR).tolist() == [0b1001, 0]
    with pytest.raises(ProtocolError, match="not used"):
        combine(x, [x], dist.ReduceOp.MAX)


# -- collectives ----------------------------------------------------------------------------


def test_all_reduce_opens_the_sum_in_one_frame_per_peer():
    hub, comms = _comms(3)
    secrets = [torch.arange(12).reshape(3, 4) * 1000, torch.arange(5) - 2]
    shares = [_shares(3, s, seed=i) for i, s in enumerate(secrets)]
    got = _each(comms, lambda c: c.all_reduce([shares[0][c.rank], shares[1][c.rank]], batched=True))
    for out in got:
        assert torch.equal(out[0], secrets[0]) and torch.equal(out[1], secrets[1])
    # one frame to each other party, both tensors in it
    assert sorted((s, r) for s, r, _ in hub.log) == [(s, r) for s in range(3) for r in range(3) if s != r]
    assert {n for _, _, n in hub.log} == {17}
    rec = [r for r in comms[1].channel.ledger.records if r.direction == "sent"]
    assert [r.bytes for r in rec] == [12 * 8 * 2, 5 * 8 * 2]  # what rank 1 put on the wire, per tensor


def test_all_reduce_of_many_parties_is_a_reduce_scatter_and_all_gather():
    """Beyond EXCHANGE_MAX parties an opening is two rounds in which each party
    reduces 1/n of the vector: every party sends 2 (n - 1) frames of about 1/n
    of a share (linear bytes, balanced), and everyone gets the exact sum."""
    n = FramedCommunicator.EXCHANGE_MAX + 2
    hub, comms = _comms(n)
    secrets = [torch.arange(23) * 7 - 50, torch.arange(6).reshape(2, 3)]
    sh = [_shares(n, s, seed=i) for i, s in enumerate(secrets)]
    got = _each(comms, lambda c: c.all_reduce([sh[0][c.rank], sh[1][c.rank]], batched=True))
    assert all(torch.equal(g[0], secrets[0]) and torch.equal(g[1], secrets[1]) for g in got)
    assert Counter(s for s, _, _ in hub.log) == {r: 2 * (n - 1) for r in range(n)}
    assert sum(k for _, _, k in hub.log) == 2 * (n - 1) * 29  # 29 elements per share
    assert max(k for _, _, k in hub.log) == -(-29 // n)


def test_all_reduce_xor_of_binary_shares():
    _, comms = _comms(2)
    a, b = torch.tensor([0b1100, 7]), torch.tensor([0b1010, 7])
    got = _each(comms, lambda c: c.all_reduce([a, b][c.rank], op=dist.ReduceOp.BXOR))
    assert all(g.tolist() == [0b0110, 0] for g in got)


def test_reduce_opens_to_the_destination_only():
    hub, comms = _comms(3)
    secret = torch.arange(6).reshape(2, 3)
    sh = _shares(3, secret)
    got = _each(comms, lambda c: c.reduce(sh[c.rank], 2))
    assert got[0] is None and got[1] is None and torch.equal(got[2], secret)
    assert sorted((s, r) for s, r, _ in hub.log) == [(0, 2), (1, 2)]


def test_reveal_many_one_frame_per_destination():
    """Values 0 and 2 go to rank 1, value 1 to rank 2: each party sends one
    frame per destination it does not hold, carrying only that destination's
    shares."""
    hub, comms = _comms(3)
    secrets = [torch.full((2, 2), 10), torch.full((3,), 20), torch.full((1, 4), 30)]
    sh = [_shares(3, s, seed=j) for j, s in enumerate(secrets)]
    dsts = [1, 2, 1]
    got = _each(comms, lambda c: c.reveal_many([sh[j][c.rank] for j in range(3)], dsts))
    assert got[0] == [None, None, None]
    assert torch.equal(got[1][0], secrets[0]) and torch.equal(got[1][2], secrets[2]) and got[1][1] is None
    assert torch.equal(got[2][1], secrets[1]) and got[2][0] is None and got[2][2] is None
    sizes = {(s, r): n for s, r, n in hub.log}
    assert len(hub.log) == len(sizes)  # one frame per (sender, destination)
    assert sizes == {(0, 1): 8, (2, 1): 8, (0, 2): 3, (1, 2): 3}


def test_gather_and_all_gather():
    _, comms = _comms(3)
    mine = [torch.full((2,), 10 * r) for r in range(3)]
    got = _each(comms, lambda c: c.gather(mine[c.rank], 0))
    assert [t.tolist() for t in got[0]] == [[0, 0], [10, 10], [20, 20]]
    assert got[1] == [None] and got[2] == [None]
    _, comms = _comms(3)
    got = _each(comms, lambda c: c.all_gather(mine[c.rank]))
    assert all([t.tolist() for t in g] == [[0, 0], [10, 10], [20, 20]] for g in got)


def test_broadcast_within_a_group_fills_in_place():
    """The dealer (rank 2 of 2 MPC parties) broadcasts on CrypTen's {0, dealer}
    group: rank 0 receives, rank 1 is not addressed."""
    hub, comms = _comms(2, world=3)
    bufs = [torch.zeros(3, dtype=torch.long), torch.zeros(2, dtype=torch.long)]
    src = [torch.tensor([1, 2, 3]), torch.tensor([4, 5])]

    def go(c: FramedCommunicator) -> Any:
        if c.rank == 1:
            return None
        mine = src if c.rank == 2 else bufs
        return c.broadcast(mine, 2, c.ttp_comm_group, batched=True)

    _each(comms, go)
    assert bufs[0].tolist() == [1, 2, 3] and bufs[1].tolist() == [4, 5]
    assert hub.log == [(2, 0, 5)]


def test_isend_irecv_in_place_as_crypten_seeds_its_neighbours():
    _, comms = _comms(3)

    def ring(c: FramedCommunicator) -> int:
        nxt, prev = (c.rank + 1) % 3, (c.rank - 1) % 3
        got = torch.tensor([0])
        reqs = [c.isend(torch.tensor([100 + c.rank]), nxt), c.irecv(got, src=prev)]
        for r in reqs:
            r.wait()
        return int(got)

    assert _each(comms, ring) == [102, 100, 101]


# -- objects, refusals and failures ---------------------------------------------------------------


def test_objects_travel_as_json_with_phase_and_round():
    _, comms = _comms(2, world=3)
    comms[0].channel.phase, comms[0].channel.round = "train", 7

    def go(c: FramedCommunicator) -> Any:
        if c.rank == 0:
            c.send_obj({"function": "bundle", "args": [torch.Size([2, 3])]}, 2)
        elif c.rank == 2:
            return c.recv_obj(0)
        return None

    got = _each(comms, go)[2]
    assert got == {"function": "bundle", "args": [torch.Size([2, 3])]}
    assert (comms[2].channel.phase, comms[2].channel.round) == ("train", 7)


def test_malformed_object_names_the_sender():
    hub, comms = _comms(2, world=3)
    raw = torch.frombuffer(bytearray(b'{"obj": 1}'), dtype=torch.uint8)
    hub.q(0, 2).put(torch.tensor([raw.numel()]))
    hub.q(0, 2).put(raw.clone())
    with pytest.raises(ProtocolError, match="rank 0 sent a malformed MPC control object"):
        comms[2].recv_obj(0)
    hub.q(0, 2).put(torch.tensor([1 << 30]))
    with pytest.raises(ProtocolError, match="rank 0 announced a 1073741824-byte"):
        comms[2].recv_obj(0)


def test_refused_operations_and_ranks_outside_the_group():
    _, comms = _comms(2, world=3)
    c = comms[0]
    for call in (c.barrier, lambda: c.scatter([], 0), lambda: c.broadcast_obj(1, 0)):
        with pytest.raises(ProtocolError):
            call()
    with pytest.raises(ProtocolError, match="unnamed rank"):
        c.recv(torch.zeros(1))
    with pytest.raises(ProtocolError, match="outside its group"):
        c.send(torch.zeros(1), 2)  # the dealer is not in the MPC parties' group
    with pytest.raises(ProtocolError, match="outside its group"):
        c.broadcast(torch.zeros(1), 1, RankSet("ttp_comm", (0, 2)))


def test_a_lost_peer_is_named():
    hub, comms = _comms(3)
    hub.dead.add(2)
    with pytest.raises(PartyFailure) as err:
        comms[0].all_reduce(torch.zeros(3, dtype=torch.long))
    assert err.value.rank == 2 and "rank 2 (r2)" in str(err.value)


# -- the sealed transport's frame buffers ---------------------------------------------------


class _Posted:
    """A posted isend/irecv of the patched torch.distributed: holds the tensor it
    was given; ``wait`` marks it complete."""

    def __init__(self, tensor: torch.Tensor, peer: int, tag: int):
        self.tensor, self.peer, self.tag, self.done = tensor, peer, tag, False

    def wait(self) -> bool:
        self.done = True
        return True


def _sealed_channel(rank: int) -> Channel:
    def key(a: int, b: int, stream: str) -> bytes:
        return hashlib.sha256(f"test {stream} {a}->{b}".encode()).digest()

    links = Links(rank, [1 - rank], lambda p, st: (key(rank, p, st), key(p, rank, st)), lambda p: f"rank {p}")
    return Channel(rank, {0: "A", 1: "B"}, Ledger(rank), links=links)


def test_sealed_frames_give_a_buffer_back_only_once_sent_or_opened(monkeypatch: pytest.MonkeyPatch):
    """Frames in flight keep their buffers: two sends posted at once seal into two
    buffers and the first frame's bytes stay as posted; a sender's buffer goes back
    to the pool when its send completes, a receiver's when its frame is opened, and
    the next frame of that size reuses it."""
    posted: list[_Posted] = []

    def isend(tensor: torch.Tensor, dst: int, tag: int = 0) -> _Posted:
        posted.append(_Posted(tensor, dst, tag))
        return posted[-1]

    def irecv(tensor: torch.Tensor, src: int, tag: int = 0) -> _Posted:
        posted.append(_Posted(tensor, src, tag))
        return posted[-1]

    monkeypatch.setattr(dist, "isend", isend)
    monkeypatch.setattr(dist, "irecv", irecv)
    a, b = _sealed_channel(0), _sealed_channel(1)
    ta, tb = SealedFrames(a), SealedFrames(b)
    x, y = torch.arange(32, dtype=torch.long), -torch.arange(32, dtype=torch.long)
    s1, s2 = ta.post_send(1, x), ta.post_send(1, y)
    w1, w2 = posted[0], posted[1]
    assert w1.tag == w2.tag == CRYPTEN_TAG and w1.tensor.data_ptr() != w2.tensor.data_ptr()
    first = w1.tensor.clone()
    assert a.links is not None and b.links is not None
    assert a.links.pool.outstanding == 2
    out1, out2 = torch.empty(32, dtype=torch.long), torch.empty(32, dtype=torch.long)
    o1, o2 = tb.post_recv(0, out1), tb.post_recv(0, out2)
    r1, r2 = posted[2], posted[3]
    assert r1.tensor.data_ptr() != r2.tensor.data_ptr() and b.links.pool.outstanding == 2
    r1.tensor.copy_(w1.tensor)  # the wire
    r2.tensor.copy_(w2.tensor)
    o1.wait()
    assert torch.equal(out1, x) and b.links.pool.outstanding == 1
    o2.wait()
    assert torch.equal(out2, y) and b.links.pool.outstanding == 0
    assert torch.equal(w1.tensor, first)  # not overwritten while its send was pending
    s2.wait()
    assert a.links.pool.outstanding == 1
    ta.post_send(1, x)
    assert posted[-1].tensor is w2.tensor  # s2's buffer, free again
    ta.post_send(1, y)
    assert posted[-1].tensor is not w1.tensor and torch.equal(w1.tensor, first)  # s1 still pending
    s1.wait()
    assert a.links.pool.outstanding == 2
    tb.post_recv(0, torch.empty(32, dtype=torch.long))
    assert posted[-1].tensor is r2.tensor  # the last buffer given back is handed out first
