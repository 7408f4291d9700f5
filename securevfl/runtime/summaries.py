"""Run summaries: at the end of a run every rank sends its summary to rank 0,
sealed on a stream of its own, then sets its signed ``done`` flag; rank 0 waits
for every flag, opens every summary and returns them all. A summary that does
not open is a :class:`~securevfl.errors.ProtocolError` naming its sender.
"""

from __future__ import annotations

import json
import time
from base64 import b64decode, b64encode
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

from securevfl.errors import PartyFailure, ProtocolError
from securevfl.runtime.seat import Seat
from securevfl.runtime.secure.link import Links

SUMMARY_STREAM = "summary"  # run summaries go to rank 0 sealed on their own stream


def send_summary(seat: Seat, store: dist.TCPStore, links: Links, summary: dict[str, Any]) -> None:
    """A rank other than 0: its summary, sealed for rank 0, then its ``done`` flag."""
    sealed = links.link(0, SUMMARY_STREAM).seal(json.dumps(summary).encode())
    store.set(f"summary/{seat.rank}", b64encode(sealed).decode())
    store.set(f"done/{seat.rank}", seat.signed("1", "done"))


def gather_summaries(
    seat: Seat,
    store: dist.TCPStore,
    links: Links,
    summary: dict[str, Any],
    timeout_s: float,
    lost: Callable[[], PartyFailure | None],
) -> list[dict[str, Any]]:
    """Rank 0: wait (at most ``timeout_s``, or until ``lost`` names a lost peer)
    for every peer's signed ``done`` flag, then every summary, its own first."""
    deadline = time.monotonic() + timeout_s
    waiting = set(range(1, seat.layout.world_size))
    while waiting:
        for r in sorted(waiting):
            if store.check([f"done/{r}"]) and seat.done(r, store.get(f"done/{r}")):
                waiting.discard(r)
        if not waiting:
            break
        failure = lost()
        if failure is not None:
            raise failure
        if time.monotonic() > deadline:
            raise PartyFailure("peers did not finish in time", rank=None)
        time.sleep(0.05)
    out = [json.loads(json.dumps(summary))]  # as the peers' summaries: through JSON
    for r in range(1, seat.layout.world_size):
        raw = store.get(f"summary/{r}")
        try:
            sealed = b64decode(raw, validate=True)
        except ValueError:
            raise ProtocolError(f"{seat.who(r)} sent a malformed run summary") from None
        plain = links.link(r, SUMMARY_STREAM).open(sealed)  # ProtocolError naming r if forged
        try:
            out.append(json.loads(plain))
        except json.JSONDecodeError:
            raise ProtocolError(f"{seat.who(r)} sent a malformed run summary") from None
    return out


def linger(seat: Seat, store: dist.TCPStore, seconds: float = 5.0) -> None:
    """Rank 0 hosts the store: after an error, keep it up briefly so that the
    peers can read the error note (until each has reported or finished)."""
    end = time.monotonic() + seconds
    others = range(1, seat.layout.world_size)
    while time.monotonic() < end:
        if all(store.check([f"err/{r}"]) or store.check([f"done/{r}"]) for r in others):
            return
        time.sleep(0.1)
