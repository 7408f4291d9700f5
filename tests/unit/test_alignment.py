"""PSI entity alignment (securevfl.data.alignment) over an in-memory channel.

The active and passive sides run in threads and talk through a queue-based fake
of the Channel methods they use. Every payload a party receives is kept, so the
tests can scan the raw bytes for IDs the party must never see.
"""

from __future__ import annotations

import json
import queue
import random
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from securevfl.data.alignment import PsiHello, align_active, align_passive
from securevfl.errors import DataError, PartyFailure, ProtocolError
from securevfl.runtime.layout import Layout, Role
from securevfl.runtime.messages import (
    CONTROL,
    PSI_HELLO,
    PSI_REQUEST,
    PSI_RESPONSE,
    PSI_RESULT,
    PSI_SETUP,
    Tag,
)

RECV_TIMEOUT_S = 30.0

LAYOUT = Layout(
    (
        Role(0, "active", "bank", 0),
        Role(1, "passive", "shop", 0),
        Role(2, "passive", "telco", 1),
    )
)


# -- a fake channel ------------------------------------------------------------------------


class Wire:
    """FIFO queues between every ordered pair of ranks, plus a log of what each
    rank received (raw bytes, in arrival order)."""

    def __init__(self, world_size: int):
        self.queues = {(s, d): queue.Queue() for s in range(world_size) for d in range(world_size) if s != d}
        self.received: dict[int, list[tuple[int, str, bytes]]] = {r: [] for r in range(world_size)}

    def channel(self, rank: int) -> FakeChannel:
        return FakeChannel(self, rank)


class FakeChannel:
    """The subset of runtime.channel.Channel that alignment uses, with the same
    ordering rule: a receiver names the tag it expects from one sender, and the
    next message from that sender must carry it."""

    def __init__(self, wire: Wire, rank: int):
        self.wire = wire
        self.rank = rank
        self.names = LAYOUT.names()

    def _who(self, rank: int) -> str:
        return f"rank {rank} ({self.names[rank]})"

    def send_bytes(self, dst: int, tag: Tag, data: bytes) -> None:
        assert isinstance(data, bytes | bytearray)
        self.wire.queues[(self.rank, dst)].put((tag.name, bytes(data)))

    def recv_bytes(self, src: int, tag: Tag, *, max_len: int | None = None) -> bytes:
        try:
            name, data = self.wire.queues[(src, self.rank)].get(timeout=RECV_TIMEOUT_S)
        except queue.Empty:
            raise PartyFailure(f"{self._who(src)} sent nothing (waiting for {tag.name})", rank=src) from None
        self.wire.received[self.rank].append((src, name, data))
        if name != tag.name:
            raise ProtocolError(f"{self._who(src)} sent '{name}' where '{tag.name}' was expected")
        if max_len is not None and len(data) > max_len:
            raise ProtocolError(f"{self._who(src)} sent an oversized '{tag.name}'")
        return data

    def send_json(self, dst: int, msg: BaseModel, tag: Tag = CONTROL) -> None:
        self.send_bytes(dst, tag, msg.model_dump_json().encode())

    def recv_json(self, src: int, model: type[BaseModel], tag: Tag = CONTROL) -> Any:
        raw = self.recv_bytes(src, tag, max_len=64 << 20)
        try:
            return model.model_validate_json(raw)
        except ValidationError:
            raise ProtocolError(f"{self._who(src)} sent an invalid '{tag.name}'") from None


def run_parties(wire: Wire, ids: dict[int, list[str]]) -> dict[int, Any]:
    """Run the active and every passive side in threads; returns per rank either
    the row order or the exception it raised."""
    jobs: dict[int, Callable[[], Any]] = {0: lambda: align_active(wire.channel(0), LAYOUT, ids[0])}
    for role in LAYOUT.passive:
        r = role.rank
        jobs[r] = lambda r=r: align_passive(wire.channel(r), LAYOUT, r, ids[r])
    out: dict[int, Any] = {}
    with ThreadPoolExecutor(len(jobs)) as pool:
        futures = {r: pool.submit(fn) for r, fn in jobs.items()}
        for r, fut in futures.items():
            try:
                out[r] = fut.result(timeout=4 * RECV_TIMEOUT_S)
            except Exception as exc:
                out[r] = exc
    return out


def run_with_peer(fn: Callable[[], Any], script: Callable[[], None]) -> Any:
    """Run one real side in a thread while ``script`` plays its peer here."""
    with ThreadPoolExecutor(1) as pool:
        fut = pool.submit(fn)
        script()
        return fut.result(timeout=2 * RECV_TIMEOUT_S)


# -- IDs -----------------------------------------------------------------------------------


def make_ids(n: int, seed: int) -> list[str]:
    """Long, distinctive, equal-length IDs: none is a substring of another."""
    rng = random.Random(seed)
    hexes: set[str] = set()
    while len(hexes) < n:
        hexes.add(f"{rng.getrandbits(24):06x}")
    return [f"cust-{h}-{i:04d}" for i, h in enumerate(sorted(hexes))]


@pytest.fixture(scope="module")
def party_ids() -> dict[int, list[str]]:
    universe = make_ids(300, seed=1)
    rng = random.Random(2)
    ids = {}
    for r in range(3):
        own = rng.sample(universe, 200)  # shuffled, partly overlapping
        ids[r] = own
    return ids


def intersection(ids: dict[int, list[str]]) -> list[str]:
    common = set(ids[0])
    for v in ids.values():
        common &= set(v)
    return sorted(common)


# -- happy path ----------------------------------------------------------------------------


def test_every_party_ends_with_the_intersection_in_sorted_order(party_ids):
    expected = intersection(party_ids)
    pairwise = set(party_ids[0]) & set(party_ids[1])
    assert 40 < len(expected) < len(pairwise) < 200  # the sets really overlap only partly
    wire = Wire(3)
    result = run_parties(wire, party_ids)
    for r in range(3):
        order = result[r]
        assert not isinstance(order, Exception), f"rank {r}: {order!r}"
        assert order.dtype.kind == "i"
        assert [party_ids[r][i] for i in order] == expected, f"rank {r}"


def test_one_request_serves_every_passive_party(party_ids):
    wire = Wire(3)
    run_parties(wire, party_ids)
    requests = [[d for src, tag, d in wire.received[r] if tag == PSI_REQUEST.name] for r in (1, 2)]
    assert len(requests[0]) == len(requests[1]) == 1
    assert requests[0] == requests[1]  # A blinded its set once
    assert len(requests[0][0]) > 33 * len(party_ids[0])  # and it is the whole blinded set


def test_no_party_receives_a_foreign_or_non_intersection_id(party_ids):
    expected = set(intersection(party_ids))
    universe = set().union(*map(set, party_ids.values()))
    wire = Wire(3)
    result = run_parties(wire, party_ids)
    assert not any(isinstance(v, Exception) for v in result.values()), result
    for r in range(3):
        received = wire.received[r]
        assert received, f"rank {r} received nothing"
        allowed = set(party_ids[r]) & expected
        for src, tag, payload in received:
            for v in universe - allowed:
                assert v.encode() not in payload, (
                    f"rank {r} received ID {v!r} in '{tag}' from rank {src}; it "
                    + ("does not hold it" if v not in party_ids[r] else "is outside the intersection")
                )
    # the scan is meaningful: the passive parties do receive the agreed IDs as text,
    # and only in the final result message
    for r in (1, 2):
        blob = b"".join(p for _, tag, p in wire.received[r] if tag == PSI_RESULT.name)
        assert all(v.encode() in blob for v in expected)
        tags = [tag for _, tag, _ in wire.received[r]]
        assert tags == [PSI_HELLO.name, PSI_REQUEST.name, PSI_RESULT.name]
    # the active party receives only blinded PSI messages from each passive party
    tags = [(src, tag) for src, tag, _ in wire.received[0]]
    assert tags == [
        (1, PSI_SETUP.name),
        (1, PSI_RESPONSE.name),
        (2, PSI_SETUP.name),
        (2, PSI_RESPONSE.name),
    ]


def test_passive_learns_only_the_size_of_the_active_set(party_ids):
    wire = Wire(3)
    run_parties(wire, party_ids)
    hello = next(p for _, tag, p in wire.received[1] if tag == PSI_HELLO.name)
    assert json.loads(hello) == {"client_size": len(party_ids[0])}


def test_identical_sets_align_to_the_same_rows():
    ids = make_ids(50, seed=3)
    shuffled = {r: random.Random(10 + r).sample(ids, len(ids)) for r in range(3)}
    result = run_parties(Wire(3), shuffled)
    for r in range(3):
        assert [shuffled[r][i] for i in result[r]] == sorted(ids)


# -- empty intersection --------------------------------------------------------------------


def test_empty_intersection_is_a_data_error_everywhere():
    universe = make_ids(90, seed=4)
    ids = {0: universe[0:40], 1: universe[30:70], 2: universe[60:90]}  # pairwise overlaps only
    assert not intersection(ids)
    result = run_parties(Wire(3), ids)
    assert isinstance(result[0], DataError), result[0]
    assert "empty intersection" in str(result[0])
    for r in (1, 2):
        assert isinstance(result[r], DataError), result[r]
        assert "empty intersection" in str(result[r])
        assert "rank 0" in str(result[r])


# -- malformed peers -----------------------------------------------------------------------


GARBAGE = b"\xff\xff\xff\xffnot a protobuf"


def _psi():
    import private_set_intersection.python as psi

    return psi


def test_garbage_setup_is_a_protocol_error_naming_the_sender():
    ids = make_ids(20, seed=5)
    wire = Wire(3)
    peer = wire.channel(1)

    def script() -> None:
        peer.recv_json(0, PsiHello, PSI_HELLO)
        peer.recv_bytes(0, PSI_REQUEST)
        peer.send_bytes(0, PSI_SETUP, GARBAGE)

    with pytest.raises(ProtocolError) as info:
        run_with_peer(lambda: align_active(wire.channel(0), LAYOUT, ids), script)
    msg = str(info.value)
    assert "rank 1" in msg and "shop" in msg and "setup" in msg


def test_garbage_response_is_a_protocol_error_naming_the_sender():
    psi = _psi()
    ids = make_ids(20, seed=6)
    wire = Wire(3)
    peer = wire.channel(1)

    def script() -> None:
        hello = peer.recv_json(0, PsiHello, PSI_HELLO)
        peer.recv_bytes(0, PSI_REQUEST)
        server = psi.server.CreateWithNewKey(True)
        setup = server.CreateSetupMessage(1e-9, hello.client_size, ids[:10], psi.DataStructure.RAW)
        peer.send_bytes(0, PSI_SETUP, setup.SerializeToString())
        peer.send_bytes(0, PSI_RESPONSE, GARBAGE)

    with pytest.raises(ProtocolError) as info:
        run_with_peer(lambda: align_active(wire.channel(0), LAYOUT, ids), script)
    msg = str(info.value)
    assert "rank 1" in msg and "shop" in msg and "response" in msg


def test_garbage_request_is_a_protocol_error_naming_the_active_party():
    ids = make_ids(20, seed=8)
    wire = Wire(3)
    peer = wire.channel(0)

    def script() -> None:
        peer.send_json(1, PsiHello(client_size=20), PSI_HELLO)
        peer.send_bytes(1, PSI_REQUEST, GARBAGE)

    with pytest.raises(ProtocolError) as info:
        run_with_peer(lambda: align_passive(wire.channel(1), LAYOUT, 1, ids), script)
    msg = str(info.value)
    assert "rank 0" in msg and "bank" in msg and "request" in msg


def test_implausible_set_size_is_a_protocol_error():
    wire = Wire(3)
    wire.channel(0).send_json(1, PsiHello(client_size=-5), PSI_HELLO)
    with pytest.raises(ProtocolError, match=r"rank 0.*-5"):
        align_passive(wire.channel(1), LAYOUT, 1, make_ids(5, seed=9))


def _honest_client_then(result: bytes, ids: list[str], wire: Wire) -> Callable[[], None]:
    """Play an honest PSI client for rank 1, then send ``result`` as the final list."""
    psi = _psi()
    peer = wire.channel(0)

    def script() -> None:
        client = psi.client.CreateWithNewKey(True)
        peer.send_json(1, PsiHello(client_size=len(ids)), PSI_HELLO)
        peer.send_bytes(1, PSI_REQUEST, client.CreateRequest(ids).SerializeToString())
        peer.recv_bytes(1, PSI_SETUP)
        peer.recv_bytes(1, PSI_RESPONSE)
        peer.send_bytes(1, PSI_RESULT, result)

    return script


@pytest.mark.parametrize(
    "result",
    [
        b"{not json",
        json.dumps({"ids": []}).encode(),
        json.dumps([1, 2]).encode(),
    ],
)
def test_malformed_intersection_list_is_a_protocol_error(result):
    ids = make_ids(10, seed=10)
    wire = Wire(3)
    with pytest.raises(ProtocolError, match=r"rank 0.*malformed intersection"):
        run_with_peer(
            lambda: align_passive(wire.channel(1), LAYOUT, 1, ids),
            _honest_client_then(result, ids, wire),
        )


@pytest.mark.parametrize("kind", ["foreign", "repeated"])
def test_intersection_with_foreign_or_repeated_ids_is_refused(kind):
    ids = make_ids(10, seed=11)
    foreign = make_ids(1, seed=12)[0]
    assert foreign not in ids
    final = sorted(ids[:3]) + ([foreign] if kind == "foreign" else [ids[0]])
    wire = Wire(3)
    with pytest.raises(ProtocolError, match=r"rank 0.*does not hold or repeats"):
        run_with_peer(
            lambda: align_passive(wire.channel(1), LAYOUT, 1, ids),
            _honest_client_then(json.dumps(final).encode(), ids, wire),
        )
