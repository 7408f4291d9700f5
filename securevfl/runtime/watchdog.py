"""The liveness watchdog: a thread in every rank that beats this rank's
heartbeat and watches every peer's.

A peer is declared lost when its signed heartbeat has not advanced for
``runtime.peer_timeout_s``, when its signed error note appears, or when rank 0's
store cannot be reached; its signed ``done`` flag ends the watch of it. Values
that do not verify for this run (:class:`~securevfl.runtime.seat.Seat`) are
ignored, so a forged heartbeat or ``done`` flag cannot hide a dead or stalled
peer. A lost peer ends this rank with a :class:`PartyFailure` naming it, even
while the main thread is blocked in a receive (SECURITY.md §5).

A heartbeat says the process lives, not that it gets anywhere: a rank whose main
thread blocks in its owner's code (a model factory, a defense hook) keeps
beating while its peers wait in their receives. So the watchdog also reads where
the rank is in user code (:mod:`securevfl.usercall`): once one call has lasted
``runtime.user_code_timeout_s``, it reports this rank stuck there (its peers
hear of it through the store and end too) and ends the process.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

import torch.distributed as dist

from securevfl.errors import PartyFailure
from securevfl.runtime.lifeline import end_descendants
from securevfl.runtime.notes import EXIT_PARTY_FAILURE
from securevfl.runtime.rendezvous import native_message
from securevfl.runtime.seat import Seat
from securevfl.usercall import stuck_for

HEARTBEAT_S = 0.5
DECLARE_GRACE_S = 3.0  # the main thread's time to raise a declared loss itself


class Watchdog:
    """Watches the peers of ``seat`` through its own store ``client`` (connected
    within the start-up deadline). ``report`` publishes this rank's error before
    the watchdog ends a process whose main thread is blocked. ``user_code_timeout_s``:
    how long one call into user code may last (None: unbounded)."""

    def __init__(
        self,
        seat: Seat,
        client: dist.TCPStore,
        peer_timeout_s: float,
        report: Callable[[BaseException], None],
        user_code_timeout_s: float | None = None,
    ):
        self.seat = seat
        self.client = client
        self.peer_timeout_s = peer_timeout_s
        self.user_code_timeout_s = user_code_timeout_s
        self.report = report
        self.lost: PartyFailure | None = None
        self._lost_event = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="securevfl-watchdog", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, join_s: float | None = None) -> None:
        """Stop watching; with ``join_s``, wait that long for the thread to end."""
        self._stop.set()
        if join_s is not None and self._thread.is_alive():
            self._thread.join(timeout=join_s)

    def _run(self) -> None:
        seat, client = self.seat, self.client
        peers = [r for r in range(seat.layout.world_size) if r != seat.rank]
        start = time.monotonic()
        last: dict[int, tuple[int, float]] = {r: (0, start) for r in peers}  # newest beat, seen when
        seen: dict[int, bytes] = {}
        beat = 0
        while not self._stop.is_set():
            now = time.monotonic()
            self._check_user_code(now)
            try:
                beat += 1
                client.set(f"hb/{seat.rank}", seat.signed(str(beat), "hb"))
                for r in list(peers):
                    if client.check([f"err/{r}"]):
                        failure = seat.peer_failure(r, client.get(f"err/{r}"))
                        if failure is not None:
                            self.declare(failure)
                            return
                    if client.check([f"done/{r}"]) and seat.done(r, client.get(f"done/{r}")):
                        peers.remove(r)
                        continue
                    v = client.get(f"hb/{r}")
                    if seen.get(r) != v:
                        seen[r] = v
                        n = seat.beat(r, v)
                        if n is not None and n > last[r][0]:
                            last[r] = (n, now)
                    if now - last[r][1] > self.peer_timeout_s:
                        self.declare(
                            PartyFailure(
                                f"{seat.who(r)} stopped responding: no heartbeat for "
                                f"{self.peer_timeout_s:.0f} s (the process died or stalled)",
                                rank=r,
                            )
                        )
                        return
            except Exception as exc:
                if self._stop.is_set():
                    return
                self.declare(
                    PartyFailure(
                        f"lost the rendezvous host {seat.who(0)} (it died or the network failed: "
                        f"{native_message(exc)})",
                        rank=0,
                    )
                )
                return
            self._stop.wait(HEARTBEAT_S)

    def _check_user_code(self, now: float) -> None:
        """End this rank when its main thread has been in one user code call for
        ``user_code_timeout_s`` (:mod:`securevfl.usercall`): it reports itself stuck
        there, naming the call, and exits at once (its main thread is the one stuck)."""
        if self.user_code_timeout_s is None:
            return
        stuck = stuck_for(self.user_code_timeout_s, now)
        if stuck is None:
            return
        what, waited = stuck
        failure = PartyFailure(
            f"{self.seat.who(self.seat.rank)} stuck {waited:.0f} s in {what} (one call into user code "
            f"lasts at most runtime.user_code_timeout_s = {self.user_code_timeout_s:g} s)",
            rank=self.seat.rank,
        )
        self.lost = failure
        self._lost_event.set()
        self.report(failure)
        end_descendants()
        os._exit(EXIT_PARTY_FAILURE)

    def declare(self, failure: PartyFailure) -> None:
        """Record a lost peer; if the main thread has not picked it up within a
        grace period (it may be blocked in a receive), end the process."""
        self.lost = failure
        self._lost_event.set()
        if self._stop.wait(DECLARE_GRACE_S):
            return
        self.report(failure)
        end_descendants()
        os._exit(EXIT_PARTY_FAILURE)

    def diagnose(self, peer: int, exc: Exception) -> PartyFailure:
        """Called by the channel when a send/recv fails: which rank was lost?"""
        if self._lost_event.wait(self.peer_timeout_s + 5.0) and self.lost is not None:
            self._stop.set()
            return self.lost
        if peer < 0:
            return PartyFailure(
                f"an MPC collective failed (a peer was lost): {native_message(exc)}", rank=None
            )
        return PartyFailure(f"lost connection to {self.seat.who(peer)}: {native_message(exc)}", rank=peer)
