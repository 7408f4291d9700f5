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

from securevfl.data import dh_psi
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
    assert len(requests[0][0]) == 32 * len(party_ids[0])  # and it is the whole blinded set


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
    # the active party receives only blinded PSI messages from each passive party:
    # every setup (sent as soon as it is ready), then every response
    tags = [(src, tag) for src, tag, _ in wire.received[0]]
    assert tags == [
        (1, PSI_SETUP.name),
        (2, PSI_SETUP.name),
        (1, PSI_RESPONSE.name),
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


def test_garbage_setup_is_a_protocol_error_naming_the_sender():
    ids = make_ids(20, seed=5)
    wire = Wire(3)
    peer = wire.channel(1)

    def script() -> None:  # the setup comes first, before A sends anything
        peer.send_bytes(0, PSI_SETUP, GARBAGE)

    with pytest.raises(ProtocolError) as info:
        run_with_peer(lambda: align_active(wire.channel(0), LAYOUT, ids), script)
    msg = str(info.value)
    assert "rank 1" in msg and "shop" in msg and "setup" in msg


def test_garbage_response_is_a_protocol_error_naming_the_sender():
    ids = make_ids(20, seed=6)
    wire = Wire(3)
    peer = wire.channel(1)

    def script() -> None:
        key = dh_psi.Key.fresh()
        setup = dh_psi.multiply(key, dh_psi.hash_to_group(ids[:10]))
        peer.send_bytes(0, PSI_SETUP, setup)
        wire.channel(2).send_bytes(0, PSI_SETUP, b"")  # rank 2: an empty set
        peer.recv_json(0, PsiHello, PSI_HELLO)
        peer.recv_bytes(0, PSI_REQUEST)
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
    peer = wire.channel(0)

    def script() -> None:
        key = dh_psi.Key.fresh()
        peer.send_json(1, PsiHello(client_size=len(ids)), PSI_HELLO)
        peer.recv_bytes(1, PSI_SETUP)
        peer.send_bytes(1, PSI_REQUEST, dh_psi.multiply(key, dh_psi.hash_to_group(ids)))
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


# -- engine cross-check, streaming, barely overlapping sets ----------------------------------


def openmined_intersection(client_ids: list[str], server_ids: list[str]) -> set[str]:
    """The pairwise intersection openmined-psi's ECDH PSI computes (RAW, exact)."""
    import private_set_intersection.python as psi

    client = psi.client.CreateWithNewKey(True)
    server = psi.server.CreateWithNewKey(True)
    setup = server.CreateSetupMessage(1e-9, len(client_ids), server_ids, psi.DataStructure.RAW)
    response = server.ProcessRequest(client.CreateRequest(client_ids))
    return {client_ids[i] for i in client.GetIntersection(setup, response)}


def test_same_intersection_as_openmined_psi(party_ids):
    expected = set(party_ids[0])
    for r in (1, 2):
        expected &= openmined_intersection(party_ids[0], party_ids[r])
    result = run_parties(Wire(3), party_ids)
    assert [party_ids[0][i] for i in result[0]] == sorted(expected)
    assert 40 < len(expected) < 200


def test_a_barely_overlapping_party_aligns_on_one_row_and_leaks_nothing_else():
    universe = make_ids(400, seed=21)
    ids = {0: universe[:200], 1: universe[:200], 2: universe[199:399]}  # rank 2 shares one ID
    result = run_parties(wire := Wire(3), ids)
    for r in range(3):
        assert not isinstance(result[r], Exception), result[r]
        assert [ids[r][i] for i in result[r]] == [universe[199]]
    assert openmined_intersection(ids[0], ids[2]) == {universe[199]}
    for r in range(3):
        for _src, _tag, payload in wire.received[r]:
            for v in set(universe) - set(ids[r]) - {universe[199]}:
                assert v.encode() not in payload


def test_streams_many_batches_with_an_empty_terminator(monkeypatch, party_ids):
    from securevfl.data import alignment

    monkeypatch.setattr(alignment, "BATCH", 8)  # 200 IDs: 25 full batches, then an empty one
    wire = Wire(3)
    result = run_parties(wire, party_ids)
    expected = intersection(party_ids)
    for r in range(3):
        assert [party_ids[r][i] for i in result[r]] == expected, f"rank {r}"
    setups = [p for src, tag, p in wire.received[0] if tag == PSI_SETUP.name and src == 1]
    assert [len(p) for p in setups] == [8 * 32] * 25 + [0]
    requests = [p for src, tag, p in wire.received[1] if tag == PSI_REQUEST.name]
    assert len(requests) == 25 and all(len(p) == 8 * 32 for p in requests)


def test_setup_is_sorted_and_carries_every_passive_id_once(party_ids):
    wire = Wire(3)
    run_parties(wire, party_ids)
    setup = b"".join(p for src, tag, p in wire.received[0] if tag == PSI_SETUP.name and src == 1)
    elems = dh_psi.unpack(setup)
    assert len(elems) == len(set(elems)) == len(party_ids[1])
    assert elems == sorted(elems)  # no trace of the passive party's row order


def test_a_response_element_off_the_group_is_a_protocol_error():
    ids = make_ids(20, seed=22)
    wire = Wire(3)
    peer = wire.channel(1)

    def script() -> None:
        peer.send_bytes(0, PSI_SETUP, b"")
        wire.channel(2).send_bytes(0, PSI_SETUP, b"")
        peer.recv_json(0, PsiHello, PSI_HELLO)
        request = peer.recv_bytes(0, PSI_REQUEST)
        peer.send_bytes(0, PSI_RESPONSE, request[:-32] + b"\xff" * 32)

    with pytest.raises(ProtocolError, match=r"rank 1 .*shop.*response.*not a group element"):
        run_with_peer(lambda: align_active(wire.channel(0), LAYOUT, ids), script)


def test_a_short_request_is_a_protocol_error_naming_the_active_party():
    wire = Wire(3)
    peer = wire.channel(0)
    peer.send_json(1, PsiHello(client_size=3), PSI_HELLO)
    peer.send_bytes(1, PSI_REQUEST, dh_psi.hash_to_group(["a", "b"]))
    with pytest.raises(ProtocolError, match=r"rank 0 .*bank.*request"):
        align_passive(wire.channel(1), LAYOUT, 1, make_ids(5, seed=23))
