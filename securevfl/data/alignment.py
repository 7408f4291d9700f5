"""Entity alignment by private set intersection (openmined-psi, ECDH).

The active party is the PSI client of every passive party, with one request
sent to all of them at once (their server work runs concurrently). With each
passive party P_i it learns which of its own IDs P_i also holds (P_i learns only
the size of A's set); it intersects those answers and sends every passive party
the final intersection, sorted, which becomes the agreed row order. So:

* no party ever receives an ID it does not hold itself (PSI messages carry only
  blinded, hashed elements; the final list is a subset of every party's IDs);
* passive parties learn the final intersection and |A|;
* A additionally learns, for each of its own IDs, whether P_i holds it (the
  pairwise intersections), which SECURITY.md documents.

PSI messages are protobufs parsed by openmined-psi; a malformed one is a
:class:`ProtocolError` naming the sender. The RAW data structure is used, so the
intersection is exact (no Bloom-filter false positives).
"""

from __future__ import annotations

import json

import numpy as np
import private_set_intersection.python as psi
from pydantic import BaseModel, ConfigDict

from securevfl.errors import DataError, ProtocolError
from securevfl.runtime.channel import Channel
from securevfl.runtime.layout import Layout
from securevfl.runtime.messages import PSI_HELLO, PSI_REQUEST, PSI_RESPONSE, PSI_RESULT, PSI_SETUP

FPR = 1e-9  # only used by the compressed structures; RAW is exact
MAX_IDS = 50_000_000


class PsiHello(BaseModel):
    model_config = ConfigDict(extra="forbid")
    client_size: int


def _parse(cls, raw: bytes, who: str, what: str):
    msg = cls()
    try:
        msg.ParseFromString(raw)
    except Exception:
        raise ProtocolError(f"{who} sent a malformed PSI {what} message") from None
    return msg


def align_active(channel: Channel, layout: Layout, ids: list[str]) -> np.ndarray:
    """Run PSI with every passive party; return A's row indices in agreed order.

    A builds one PSI request (its IDs blinded under one client key) and sends it
    to every passive party before collecting any answer, so the passive parties'
    server work runs at the same time and A blinds its set once, not once per
    party. Reusing the request is safe in this model: every server sees the
    same pseudorandom blinded elements and the set size, which is what each saw
    from its own request before; A's key never leaves A (SECURITY.md §3)."""
    client = psi.client.CreateWithNewKey(True)
    request = client.CreateRequest(ids).SerializeToString()
    for role in layout.passive:
        channel.send_json(role.rank, PsiHello(client_size=len(ids)), PSI_HELLO)
        channel.send_bytes(role.rank, PSI_REQUEST, request)
    keep = np.ones(len(ids), dtype=bool)
    for role in layout.passive:
        who = f"rank {role.rank} ({role.label})"
        setup = _parse(psi.ServerSetup, channel.recv_bytes(role.rank, PSI_SETUP), who, "setup")
        resp = _parse(psi.Response, channel.recv_bytes(role.rank, PSI_RESPONSE), who, "response")
        if len(resp.encrypted_elements) != len(ids):
            raise ProtocolError(
                f"{who} sent a PSI response with {len(resp.encrypted_elements)} elements for a "
                f"request of {len(ids)}"
            )
        try:
            found = client.GetIntersection(setup, resp)
        except Exception as exc:
            raise ProtocolError(f"{who}: PSI response does not match the request: {exc}") from None
        mask = np.zeros(len(ids), dtype=bool)
        mask[np.asarray(list(found), dtype=np.int64)] = True
        keep &= mask
    final = sorted(ids[i] for i in np.flatnonzero(keep))
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
    hello = channel.recv_json(active, PsiHello, PSI_HELLO)
    if not 0 <= hello.client_size <= MAX_IDS:
        raise ProtocolError(f"{who} announced an implausible PSI set size {hello.client_size}")
    # take the request at once: A sends it to every passive party before it
    # collects any answer, and a transfer completes only once its receiver is ready
    request = _parse(psi.Request, channel.recv_bytes(active, PSI_REQUEST), who, "request")
    server = psi.server.CreateWithNewKey(True)
    setup = server.CreateSetupMessage(FPR, max(1, hello.client_size), ids, psi.DataStructure.RAW)
    try:
        response = server.ProcessRequest(request)
    except Exception as exc:
        raise ProtocolError(f"{who} sent a PSI request that cannot be processed: {exc}") from None
    channel.send_bytes(active, PSI_SETUP, setup.SerializeToString())
    channel.send_bytes(active, PSI_RESPONSE, response.SerializeToString())
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
