"""A rank's session: its life in the run, from the rendezvous to shutdown.

The session composes the runtime's steps, each in its own module:

* :mod:`.rendezvous`: rank 0 hosts a TCP key-value store at the rendezvous
  address (listening on that address only) and publishes a fresh run nonce;
  the other ranks connect to it;
* :mod:`.claims`: every rank claims its rank in the store; a claim counts only
  when it is signed for this run with the rank's pinned key, and which ranks
  must present one (:func:`.claims.pins_required`);
* :mod:`.admission`: the ranks exchange signed hellos, check that they run this
  protocol in their roles and authenticate every peer (SIGMA-style), which
  yields the sealed links;
* :mod:`.resume`: the checkpoint every rank of a ``--resume`` run goes on from;
* :mod:`.watchdog`: the heartbeat thread that ends this rank, naming the peer,
  when a peer dies, stalls or fails;
* :mod:`.notes`: what the ranks write into the store for each other, signed and
  bound to the run, and this rank's error report;
* :mod:`.summaries`: the run summaries rank 0 collects at the end.

Connecting, claiming and the handshake share one deadline,
``runtime.startup_timeout_s``, which holds even when the address answers TCP but
never speaks the store's protocol; only then do the ranks join the gloo process
group (SECURITY.md §4a, §5).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch.distributed as dist

from securevfl import __version__
from securevfl.config import Protocol
from securevfl.errors import PartyFailure
from securevfl.runtime.address import check_rendezvous
from securevfl.runtime.admission import Hello, authenticate, check_hellos, exchange_hellos
from securevfl.runtime.claims import PRESENT_S, claim_rank, own_key_refusal, pins_of, present
from securevfl.runtime.layout import Layout, Role
from securevfl.runtime.notes import EXIT_INTERRUPTED, ErrorNote, error_note, exit_code_for, write_error_file
from securevfl.runtime.rendezvous import PROBE_S, Rendezvous, is_loopback
from securevfl.runtime.resume import ResumeOffer, agree_checkpoint
from securevfl.runtime.seat import Seat
from securevfl.runtime.secure import handshake as hs
from securevfl.runtime.secure.keys import Identity
from securevfl.runtime.secure.link import Links
from securevfl.runtime.summaries import gather_summaries, linger, send_summary
from securevfl.runtime.watchdog import Watchdog

# what the app imports from here
__all__ = ["EXIT_INTERRUPTED", "ErrorNote", "ResumeOffer", "Session", "exit_code_for"]

STARTUP_GRACE_S = 2.0  # past the start-up deadline, a blocked native call is abandoned


class Session:
    """Context manager around one rank's life in the run.

    ``identity`` is this rank's long-term key (``securevfl party --key``; a
    throw-away one if None); ``pins`` overrides the protocol's pins (the local
    launcher pins the throw-away keys it hands its ranks). Without ``pins`` the
    protocol's pins apply, required by :func:`.claims.pins_required` (a
    rendezvous that is not a loopback address makes the run span hosts).
    ``echo``: whether :meth:`report` prints this rank's error to stderr; the
    local launcher's ranks share its terminal and leave it to the launcher,
    which reports the root cause once (:mod:`securevfl.app.failures`)."""

    def __init__(
        self,
        proto: Protocol,
        layout: Layout,
        rank: int,
        rendezvous: str,
        out_dir: Path,
        resume: ResumeOffer | None = None,
        *,
        identity: Identity | None = None,
        pins: dict[int, str] | None = None,
        purpose: str = "train",
        echo: bool = True,
    ):
        self.proto = proto
        self.echo = echo
        self.purpose = purpose
        self.resume = resume
        # set by the handshake: the run's id, and the checkpoint epoch every rank resumes from
        self.run_id = ""
        self.resume_epoch: int | None = None
        self.layout = layout
        self.role: Role = layout.role(rank)
        self.rank = rank
        self.host, self.port = check_rendezvous(rendezvous)
        self.rt = proto.runtime
        self.out_dir = Path(out_dir)
        self.store: dist.TCPStore | None = None
        self._claimed = False  # this process holds its rank in the store
        self.hellos: dict[int, Hello] = {}
        self._report_lock = threading.Lock()
        self._reported = False
        self._watch_client: dist.TCPStore | None = None  # the watchdog's own, made at start-up
        self._watchdog: Watchdog | None = None
        self._own_pins = pins is None  # the protocol's pins (not the local launcher's)
        self._spans_hosts = (
            None if is_loopback(self.host) else f"the rendezvous {self.host} is not a loopback address"
        )
        names = layout.names()
        self.seat = Seat(
            rank=rank,
            layout=layout,
            digest=proto.digest(),
            identity=identity if identity is not None else Identity.generate(),
            pins=pins if pins is not None else pins_of(proto, layout, spans_hosts=self._spans_hosts),
            rendezvous=Rendezvous(self.host, self.port, self.rt.startup_timeout_s, f"rank 0 ({names[0]})"),
        )
        self._ephemeral = hs.ephemeral()
        self.links: Links | None = None  # set once the handshake has authenticated every peer

    # -- naming ---------------------------------------------------------------------
    def who(self, rank: int) -> str:
        return self.seat.who(rank)

    @property
    def pids(self) -> dict[int, int]:
        return {r: h.pid for r, h in self.hellos.items()}

    # -- start-up ---------------------------------------------------------------------
    def __enter__(self) -> Session:
        if is_loopback(self.host):
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        self._start_up()
        assert self.store is not None and self._watch_client is not None
        dist.init_process_group(
            "gloo",
            store=dist.PrefixStore("pg/", self.store),
            rank=self.rank,
            world_size=self.layout.world_size,
            timeout=timedelta(seconds=self.rt.op_timeout_s),
        )
        self._watchdog = Watchdog(
            self.seat, self._watch_client, self.rt.peer_timeout_s, self.report, self.rt.user_code_timeout_s
        )
        self._watchdog.start()
        return self

    def _start_up(self) -> None:
        """Connect, claim this rank, handshake and connect the watchdog's store
        client, all before one deadline (``runtime.startup_timeout_s``).

        The work runs in a daemon thread: a torch store client whose peer accepts
        TCP but never answers (a stopped rank 0, another service on the port)
        blocks in native code past its own timeout. The thread is abandoned
        then, and this rank fails naming rank 0 instead of hanging."""
        seat, rz = self.seat, self.seat.rendezvous
        timeout = self.rt.startup_timeout_s
        deadline = time.monotonic() + timeout
        stores: list[dist.TCPStore] = []
        failure: list[BaseException] = []
        claimed = threading.Event()

        def work() -> None:
            try:
                refusal = own_key_refusal(seat)
                if refusal is not None:
                    raise present(seat, refusal, min(deadline, time.monotonic() + PRESENT_S))
                store = rz.host_store(self.layout.world_size) if self.rank == 0 else rz.connect(deadline)
                stores.append(store)
                seat.nonce = rz.publish_nonce(store) if self.rank == 0 else rz.read_nonce(store, deadline)
                claim_rank(seat, store, deadline)
                claimed.set()
                self._handshake(store, deadline)
                # the watchdog's own client, within the deadline (at least one probe's time)
                client = rz.client(max(deadline - time.monotonic(), PROBE_S))
                if isinstance(client, str):
                    raise rz.lost(client)
                self._watch_client = client
            except BaseException as exc:  # re-raised in the calling thread
                failure.append(exc)

        worker = threading.Thread(target=work, name="securevfl-startup", daemon=True)
        worker.start()
        worker.join(max(deadline - time.monotonic(), 0.0) + STARTUP_GRACE_S)
        if worker.is_alive():  # blocked in native code: leave the store alone
            raise PartyFailure(
                f"start-up did not finish within {timeout:g} s: the rendezvous at "
                f"{self.host}:{self.port} hosted by {self.who(0)} accepts connections but does not "
                "answer (a stopped rank 0, or another service on that port)",
                rank=0,
            )
        self.store = stores[0] if stores else None
        self._claimed = claimed.is_set()
        if failure:
            raise failure[0]

    def _handshake(self, store: dist.TCPStore, deadline: float) -> None:
        """Exchange hellos, check them, agree on the checkpoint to resume from and
        authenticate every peer; a store that fails meanwhile is rank 0 lost."""
        seat = self.seat
        me = Hello(
            rank=self.rank,
            world_size=self.layout.world_size,
            party=self.role.party,
            role=self.role.kind,
            digest=seat.digest,
            pid=os.getpid(),
            host=socket.gethostname(),
            version=__version__,
            purpose=self.purpose,
            run_id=secrets.token_hex(8),
            checkpoints=None if self.resume is None else self.resume.checkpoints,
            checkpoint_error=None if self.resume is None else self.resume.error,
            identity=seat.identity.public.hex(),
            ephemeral=hs.ephemeral_public(self._ephemeral).hex(),
        )
        try:
            raws, hellos = exchange_hellos(seat, store, me, deadline)
            check_hellos(seat, hellos, me)
            self.hellos = hellos
            hosts = sorted({h.host for h in hellos.values()})
            if self._own_pins and self._spans_hosts is None and len(hosts) > 1:
                # ranks on several hosts (a forwarded loopback port): the rule for runs across hosts
                pins_of(self.proto, self.layout, spans_hosts="its ranks run on hosts " + ", ".join(hosts))
            self.resume_epoch, self.run_id = agree_checkpoint(hellos, self.who)
            self.links = authenticate(seat, store, raws, hellos, self._ephemeral, deadline)
        except RuntimeError as exc:  # the store went away mid-handshake
            raise seat.rendezvous.lost(exc) from exc

    # -- liveness -------------------------------------------------------------------------
    def diagnose(self, peer: int, exc: Exception) -> PartyFailure:
        """Called by the channel when a send/recv fails: which rank was lost?"""
        assert self._watchdog is not None
        return self._watchdog.diagnose(peer, exc)

    # -- reporting ---------------------------------------------------------------------
    def report(self, exc: BaseException) -> None:
        """Publish this rank's error (for peers), write it to its error file and
        (with ``echo``) stderr. Only the first report counts. A process that never claimed its
        rank (a duplicate) keeps the report out of the store: the error is its
        own, not the run's."""
        with self._report_lock:
            if self._reported:
                return
            self._reported = True
        note = error_note(self.rank, exc)
        write_error_file(self.out_dir, note)
        if self.echo:
            print(
                f"securevfl: rank {self.rank} ({self.role.label}): {note.message}",
                file=sys.stderr,
                flush=True,
            )
            if note.detail:
                print(
                    f"securevfl: rank {self.rank}, for its owner only: {note.detail}",
                    file=sys.stderr,
                    flush=True,
                )
        if self.store is not None and self._claimed and self.seat.nonce:
            try:
                self.store.set(f"err/{self.rank}", self.seat.signed(note.public().model_dump_json(), "error"))
                if self.rank == 0:
                    linger(self.seat, self.store)
            except Exception:
                pass

    # -- shutdown ------------------------------------------------------------------------
    def finish(self, summary: dict[str, Any]) -> list[dict[str, Any]] | None:
        """Publish this rank's summary; rank 0 collects and returns all of them."""
        assert self.store is not None and self.links is not None and self._watchdog is not None
        watchdog = self._watchdog
        if self.rank != 0:
            watchdog.stop(join_s=5)
            send_summary(self.seat, self.store, self.links, summary)
            return None
        out = gather_summaries(
            self.seat, self.store, self.links, summary, self.rt.op_timeout_s, lambda: watchdog.lost
        )
        watchdog.stop()
        return out

    def __exit__(self, *exc: object) -> None:
        if self._watchdog is not None:
            self._watchdog.stop()
        if dist.is_initialized():
            with contextlib.suppress(Exception):
                dist.destroy_process_group()
