"""Entity alignment by private set intersection (Diffie-Hellman PSI, X25519).

The active party A is the PSI client of every passive party P_i; the curve
arithmetic is in :mod:`securevfl.data.dh_psi` (HFHH'99 commutative blinding with
X25519 on Curve25519). One run, with fresh secret scalars a (A's) and b_i (P_i's):

1. every P_i hashes its IDs onto the curve and blinds them with b_i: its
   *setup*, sorted, so it carries no trace of P_i's row order; it sends it to A
   as soon as it is ready;
2. A hashes its IDs and blinds them with a: one *request*; once it holds every
   setup, it sends the request to every P_i;
3. P_i blinds each request element with b_i: its *response*, in request order;
   meanwhile A blinds each setup element with a, getting H(y)^{b_i a} for each
   of P_i's IDs y;
4. A keeps its own IDs x whose response element H(x)^{a b_i} is among P_i's
   doubly blinded setup (X25519 has no inverse scalar to unblind the response
   with);
5. A sends every passive party the final intersection, sorted: the row order.

So (SECURITY.md §3):

* no party ever receives an ID it does not hold itself (PSI messages carry only
  hashed, blinded group elements; the final list is a subset of every party's IDs);
* passive parties learn the final intersection and |A|;
* A additionally learns, for each of its own IDs, whether P_i holds it (the
  pairwise intersections) and |P_i|, which SECURITY.md documents.

Messages are streamed in batches of :data:`BATCH` elements (32 bytes each)
instead of one message of the whole set. The request and the response have
|A| elements in batches of BATCH; a setup stream ends with its first batch of
fewer than BATCH elements (possibly empty).

Where the time goes (``benchmarks/scale.py``): blindings, (3k + 1) n of them
for k passive parties of n IDs, and hashes, (k + 1) n. All parties compute
their own sets at the same time (step 1-2); then the passive parties' responses
and A's blinding of every setup run at the same time (step 3), A's on worker
processes (:class:`~securevfl.data.dh_psi.Blinder`), so that neither core waits
for A at the end. A learns nothing earlier than before: the setups are the same
messages, only sent sooner.

A malformed message (wrong length, an element that is not a canonical
u-coordinate or is of small order) is a :class:`ProtocolError` naming the sender.
"""

from __future__ import annotations

import json

import numpy as np
from pydantic import BaseModel, ConfigDict

from securevfl.data import dh_psi
from securevfl.errors import DataError, ProtocolError
from securevfl.runtime.channel import Channel
from securevfl.runtime.layout import Layout
from securevfl.runtime.messages import PSI_HELLO, PSI_REQUEST, PSI_RESPONSE, PSI_RESULT, PSI_SETUP, Tag

MAX_IDS = 50_000_000
BATCH = 1 << 16  # elements per PSI message: 2 MiB
E = dh_psi.ELEMENT_BYTES


class PsiHello(BaseModel):
    model_config = ConfigDict(extra="forbid")
    client_size: int


def _batches(packed: bytes) -> list[bytes]:
    """A packed buffer cut into messages of BATCH elements."""
    step = BATCH * E
    return [packed[i : i + step] for i in range(0, len(packed), step)]


def _send_stream(channel: Channel, dst: int, tag: Tag, packed: bytes) -> None:
    """Send a set whose size the receiver does not know: full batches, ended by
    the first batch of fewer than BATCH elements (an empty one if need be)."""
    parts = _batches(packed)
    if not parts or len(parts[-1]) == BATCH * E:
        parts.append(b"")
    for part in parts:
        channel.send_bytes(dst, tag, part)


def _recv_stream(channel: Channel, src: int, tag: Tag, who: str, what: str) -> bytes:
    parts: list[bytes] = []
    total = 0
    while True:
        part = channel.recv_bytes(src, tag, max_len=BATCH * E)
        if len(part) % E:
            raise ProtocolError(f"{who} sent a PSI {what} batch of {len(part)} bytes (not whole elements)")
        parts.append(part)
        total += len(part) // E
        if total > MAX_IDS:
            raise ProtocolError(f"{who} sent a PSI {what} larger than {MAX_IDS} elements")
        if len(part) < BATCH * E:
            return b"".join(parts)


def _recv_exact(channel: Channel, src: int, tag: Tag, n: int, who: str, what: str) -> bytes:
    """Receive ``n`` elements sent as batches of BATCH (the last one shorter)."""
    parts: list[bytes] = []
    left = n
    while left > 0:
        want = min(BATCH, left)
        part = channel.recv_bytes(src, tag, max_len=BATCH * E)
        if len(part) != want * E:
            raise ProtocolError(
                f"{who} sent a PSI {what} batch of {len(part)} bytes where {want} elements "
                f"({want * E} bytes) were expected"
            )
        parts.append(part)
        left -= want
    return b"".join(parts)


def _blind_or_refuse(pending: dh_psi.Pending, who: str, what: str) -> bytes:
    try:
        return pending.result()
    except dh_psi.InvalidElement as exc:
        raise ProtocolError(f"{who} sent a PSI {what} that is not a group element: {exc}") from None


def align_active(
    channel: Channel, layout: Layout, ids: list[str], *, workers: int | None = None
) -> np.ndarray:
    """Run PSI with every passive party; return A's row indices in agreed order.

    A blinds its set once and sends the same request to every passive party.
    Reusing the request is safe in this model: every server sees the same
    pseudorandom blinded elements and the set size, which is what each saw from
    its own request before; A's key never leaves A (SECURITY.md §3). A checks
    only the response elements of its IDs that every earlier passive party also
    holds: the others cannot reach the final intersection. ``workers``: A's
    blinding processes (default: its cores)."""
    with dh_psi.Blinder(dh_psi.Key.fresh(), workers) as blinder:
        blinding = blinder.submit(dh_psi.hash_to_group(ids))
        whos = [f"rank {role.rank} ({role.label})" for role in layout.passive]
        # H(y)^{b_i a} for P_i's IDs y, comparable with the response, H(x)^{a b_i};
        # blinded on A's workers after the request, while the passive parties
        # compute their responses
        pending = []
        for role, who in zip(layout.passive, whos, strict=True):
            setup = _recv_stream(channel, role.rank, PSI_SETUP, who, "setup")
            try:
                pending.append(blinder.submit(setup))
            except dh_psi.InvalidElement as exc:
                raise ProtocolError(f"{who} sent a PSI setup that is not a group element: {exc}") from None
        request = blinding.result()
        for role in layout.passive:
            channel.send_json(role.rank, PsiHello(client_size=len(ids)), PSI_HELLO)
            for part in _batches(request):
                channel.send_bytes(role.rank, PSI_REQUEST, part)
        del request
        alive = np.arange(len(ids), dtype=np.int64)  # A's IDs every passive party so far holds
        for role, who, blinded in zip(layout.passive, whos, pending, strict=True):
            response = _recv_exact(channel, role.rank, PSI_RESPONSE, len(ids), who, "response")
            try:
                dh_psi.check_canonical(response)
            except dh_psi.InvalidElement as exc:
                raise ProtocolError(f"{who} sent a PSI response that is not a group element: {exc}") from None
            theirs = set(dh_psi.unpack(_blind_or_refuse(blinded, who, "setup")))
            held = (response[i * E : (i + 1) * E] in theirs for i in alive.tolist())
            alive = alive[np.fromiter(held, dtype=bool, count=len(alive))]
            del response, theirs
        del pending
    final = sorted(ids[i] for i in alive.tolist())
    payload = json.dumps(final).encode()
    for role in layout.passive:
        channel.send_bytes(role.rank, PSI_RESULT, payload)
    if not final:
        raise DataError(
            "entity alignment: the parties' ID sets have an empty intersection "
            f"(active party holds {len(ids)} IDs); check that every party uses the same ID column"
        )
    pos = {v: i for i, v in enumerate(ids)}
    return np.asarray([pos[v] for v in final], dtype=np.int64)


def align_passive(channel: Channel, layout: Layout, rank: int, ids: list[str]) -> np.ndarray:
    """Serve PSI for the active party; return this party's rows in agreed order."""
    active = layout.active.rank
    who = f"rank {active} ({layout.active.label})"
    key = dh_psi.Key.fresh()
    # the setup needs nothing from A: compute it while A blinds its own set, and
    # send it at once, so that A can blind it while this party computes its response
    setup = dh_psi.sorted_elements(dh_psi.multiply(key, dh_psi.hash_to_group(ids)))
    _send_stream(channel, active, PSI_SETUP, setup)
    del setup
    hello = channel.recv_json(active, PsiHello, PSI_HELLO)
    if not 0 <= hello.client_size <= MAX_IDS:
        raise ProtocolError(f"{who} announced an implausible PSI set size {hello.client_size}")
    # take the whole request at once: A sends it to every passive party before it
    # collects any response, and a transfer completes only once its receiver is ready
    request = _recv_exact(channel, active, PSI_REQUEST, hello.client_size, who, "request")
    try:
        response = dh_psi.multiply(key, request)
    except dh_psi.InvalidElement as exc:
        raise ProtocolError(f"{who} sent a PSI request that is not a group element: {exc}") from None
    del request
    for part in _batches(response):
        channel.send_bytes(active, PSI_RESPONSE, part)
    raw = channel.recv_bytes(active, PSI_RESULT)
    try:
        final = json.loads(raw)
        if not isinstance(final, list) or not all(isinstance(v, str) for v in final):
            raise ValueError
    except ValueError:
        raise ProtocolError(f"{who} sent a malformed intersection list") from None
    if not final:
        raise DataError(f"entity alignment: {who} reports an empty intersection of the parties' IDs")
    pos = {v: i for i, v in enumerate(ids)}
    unknown = [v for v in final if v not in pos]
    if unknown or len(set(final)) != len(final):
        raise ProtocolError(f"{who} sent an intersection with IDs this party does not hold or repeats")
    return np.asarray([pos[v] for v in final], dtype=np.int64)
