"""A rank's session: rendezvous, start-up checks, liveness watchdog, shutdown.

Rank 0 hosts a TCP key-value store at the rendezvous address; every rank
publishes a hello (its rank, party, pid, protocol digest), checks that world size,
roles and protocol digest agree, and only then joins the gloo process group.
A watchdog thread publishes a heartbeat and watches every peer's: a peer that
dies, stalls (no heartbeat for ``peer_timeout_s``) or reports an error ends this
rank with a :class:`PartyFailure` naming it, even while the main thread is
blocked in a receive. Store values are JSON validated by pydantic, never pickles.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import torch.distributed as dist
from pydantic import BaseModel, ConfigDict, ValidationError

from securevfl import __version__
from securevfl.config import Protocol
from securevfl.errors import ConfigError, DataError, PartyFailure, ProtocolError, SecureVFLError
from securevfl.runtime.layout import Layout, Role

EXIT_USER_ERROR = 2
EXIT_PARTY_FAILURE = 3
HEARTBEAT_S = 0.5


class Hello(BaseModel):
    model_config = ConfigDict(extra="forbid")
    rank: int
    world_size: int
    party: str
    role: str
    digest: str
    pid: int
    host: str
    version: str


class ErrorNote(BaseModel):
    """A rank's error report. ``message`` is public: it goes to every peer
    through the store. ``detail`` (the owner's own IDs, lines, paths, or a bug's
    exception text) stays in the owner's error file and stderr and is removed
    from the copy published to peers (:meth:`public`)."""

    model_config = ConfigDict(extra="forbid")
    rank: int
    kind: str
    message: str
    lost_rank: int | None = None
    detail: str | None = None

    def public(self) -> ErrorNote:
        return self.model_copy(update={"detail": None})


def error_note(rank: int, exc: BaseException) -> ErrorNote:
    """What a failing rank reports. A :class:`SecureVFLError`'s message is written
    to be shared (a :class:`DataError` keeps IDs and values in its ``detail``);
    any other exception is a bug whose text may quote data, so only its type
    crosses to the peers."""
    if isinstance(exc, SecureVFLError):
        return ErrorNote(
            rank=rank,
            kind=type(exc).__name__,
            message=str(exc),
            lost_rank=exc.rank if isinstance(exc, PartyFailure) else None,
            detail=exc.detail if isinstance(exc, DataError) else None,
        )
    return ErrorNote(
        rank=rank,
        kind=type(exc).__name__,
        message=f"internal error ({type(exc).__name__}); the traceback is in this rank's own log",
        detail=f"{type(exc).__name__}: {exc}",
    )


def parse_rendezvous(addr: str) -> tuple[str, int]:
    u = urlparse(addr)
    if u.scheme != "tcp" or not u.hostname or not u.port:
        raise ConfigError(f"rendezvous must look like tcp://HOST:PORT (got {addr!r})", path="--rendezvous")
    return u.hostname, u.port


def is_loopback(host: str) -> bool:
    try:
        return socket.gethostbyname(host).startswith("127.")
    except OSError:
        return False


class Session:
    """Context manager around one rank's life in the run."""

    def __init__(self, proto: Protocol, layout: Layout, rank: int, rendezvous: str, out_dir: Path):
        self.proto = proto
        self.layout = layout
        self.role: Role = layout.role(rank)
        self.rank = rank
        self.host, self.port = parse_rendezvous(rendezvous)
        self.rt = proto.runtime
        self.out_dir = Path(out_dir)
        self.names = layout.names()
        self.store: dist.TCPStore | None = None
        self.hellos: dict[int, Hello] = {}
        self._lost: PartyFailure | None = None
        self._lost_event = threading.Event()
        self._stop = threading.Event()
        self._report_lock = threading.Lock()
        self._reported = False
        self._watchdog: threading.Thread | None = None

    # -- naming ---------------------------------------------------------------------
    def who(self, rank: int) -> str:
        return f"rank {rank} ({self.names.get(rank, '?')})"

    # -- start-up ---------------------------------------------------------------------
    def __enter__(self) -> Session:
        if is_loopback(self.host):
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        self.store = self._connect(timeout=self.rt.startup_timeout_s)
        self._handshake()
        dist.init_process_group(
            "gloo",
            store=dist.PrefixStore("pg/", self.store),
            rank=self.rank,
            world_size=self.layout.world_size,
            timeout=timedelta(seconds=self.rt.op_timeout_s),
        )
        self._watchdog = threading.Thread(target=self._watch, name="securevfl-watchdog", daemon=True)
        self._watchdog.start()
        return self

    def _connect(self, timeout: float) -> dist.TCPStore:
        try:
            return dist.TCPStore(
                self.host,
                self.port,
                self.layout.world_size if self.rank == 0 else None,
                is_master=self.rank == 0,
                timeout=timedelta(seconds=timeout),
                wait_for_workers=False,
            )
        except Exception as exc:
            if self.rank == 0:
                raise ConfigError(
                    f"cannot listen on {self.host}:{self.port} for the rendezvous: {exc}",
                    path="--rendezvous",
                ) from None
            raise PartyFailure(
                f"could not reach the rendezvous at {self.host}:{self.port} hosted by "
                f"{self.who(0)} within {timeout:.0f} s: {exc}",
                rank=0,
            ) from None

    def _handshake(self) -> None:
        assert self.store is not None
        me = Hello(
            rank=self.rank,
            world_size=self.layout.world_size,
            party=self.role.party,
            role=self.role.kind,
            digest=self.proto.digest(),
            pid=os.getpid(),
            host=socket.gethostname(),
            version=__version__,
        )
        self.store.set(f"hb/{self.rank}", "0")
        self.store.set(f"hello/{self.rank}", me.model_dump_json())
        keys = [f"hello/{r}" for r in range(self.layout.world_size)]
        deadline = time.monotonic() + self.rt.startup_timeout_s
        while not self.store.check(keys):
            if time.monotonic() > deadline:
                missing = [r for r in range(self.layout.world_size) if not self.store.check([f"hello/{r}"])]
                raise PartyFailure(
                    "start-up timed out after "
                    f"{self.rt.startup_timeout_s:.0f} s: "
                    + ", ".join(self.who(r) for r in missing)
                    + " never joined the rendezvous",
                    rank=missing[0],
                )
            time.sleep(0.05)
        for r in range(self.layout.world_size):
            raw = self.store.get(f"hello/{r}")
            try:
                h = Hello.model_validate_json(raw)
            except ValidationError:
                raise ProtocolError(f"{self.who(r)} sent a malformed start-up hello") from None
            expect = self.layout.roles[r]
            if h.rank != r or h.world_size != self.layout.world_size:
                raise ConfigError(
                    f"{self.who(r)} was started with world size {h.world_size} as rank {h.rank}; "
                    f"this protocol needs world size {self.layout.world_size}"
                )
            if h.digest != me.digest:
                raise ConfigError(
                    f"{self.who(r)} runs a different protocol (digest {h.digest}, mine {me.digest}): "
                    "start every rank with the same protocol file and --set overrides"
                )
            if (h.party, h.role) != (expect.party, expect.kind):
                raise ConfigError(
                    f"rank {r} announced itself as {h.role} '{h.party}', expected {expect.label}"
                )
            self.hellos[r] = h

    @property
    def pids(self) -> dict[int, int]:
        return {r: h.pid for r, h in self.hellos.items()}

    # -- liveness -------------------------------------------------------------------------
    def _watch(self) -> None:
        try:
            client = dist.TCPStore(
                self.host,
                self.port,
                None,
                is_master=False,
                timeout=timedelta(seconds=5),
                wait_for_workers=False,
            )
        except Exception:
            self._declare(PartyFailure(f"lost the rendezvous host {self.who(0)}", rank=0))
            return
        peers = [r for r in range(self.layout.world_size) if r != self.rank]
        last: dict[int, tuple[bytes, float]] = {}
        beat = 0
        while not self._stop.is_set():
            now = time.monotonic()
            try:
                beat += 1
                client.set(f"hb/{self.rank}", str(beat))
                for r in list(peers):
                    if client.check([f"err/{r}"]):
                        self._declare(self._peer_error(r, client.get(f"err/{r}")))
                        return
                    if client.check([f"done/{r}"]):
                        peers.remove(r)
                        continue
                    v = client.get(f"hb/{r}")
                    if r not in last or last[r][0] != v:
                        last[r] = (v, now)
                    elif now - last[r][1] > self.rt.peer_timeout_s:
                        self._declare(
                            PartyFailure(
                                f"{self.who(r)} stopped responding: no heartbeat for "
                                f"{self.rt.peer_timeout_s:.0f} s (the process died or stalled)",
                                rank=r,
                            )
                        )
                        return
            except Exception as exc:
                if self._stop.is_set():
                    return
                self._declare(
                    PartyFailure(
                        f"lost the rendezvous host {self.who(0)} (it died or the network failed: {exc})",
                        rank=0,
                    )
                )
                return
            self._stop.wait(HEARTBEAT_S)

    def _peer_error(self, r: int, raw: bytes) -> PartyFailure:
        try:
            note = ErrorNote.model_validate_json(raw)
        except ValidationError:
            return PartyFailure(f"{self.who(r)} failed (its error report was malformed)", rank=r)
        if note.lost_rank is not None and note.lost_rank != self.rank:
            return PartyFailure(f"{note.message} (reported by {self.who(r)})", rank=note.lost_rank)
        return PartyFailure(f"{self.who(r)} failed: {note.message}", rank=r)

    def _declare(self, failure: PartyFailure) -> None:
        """Record a lost peer; if the main thread has not picked it up within a
        grace period (it may be blocked in a receive), end the process."""
        self._lost = failure
        self._lost_event.set()
        if self._stop.wait(3.0):
            return
        self.report(failure)
        os._exit(EXIT_PARTY_FAILURE)

    def diagnose(self, peer: int, exc: Exception) -> PartyFailure:
        """Called by the channel when a send/recv fails: which rank was lost?"""
        if self._lost_event.wait(self.rt.peer_timeout_s + 5.0) and self._lost is not None:
            self._stop.set()
            return self._lost
        if peer < 0:
            return PartyFailure(f"an MPC collective failed (a peer was lost): {exc}", rank=None)
        return PartyFailure(f"lost connection to {self.who(peer)}: {exc}", rank=peer)

    # -- reporting ---------------------------------------------------------------------
    def report(self, exc: BaseException) -> None:
        """Publish this rank's error (for peers), write it to its error file and
        stderr. Only the first report counts."""
        with self._report_lock:
            if self._reported:
                return
            self._reported = True
        note = error_note(self.rank, exc)
        write_error_file(self.out_dir, note)
        print(f"securevfl: rank {self.rank} ({self.role.label}): {note.message}", file=sys.stderr, flush=True)
        if note.detail:
            print(
                f"securevfl: rank {self.rank}, for its owner only: {note.detail}", file=sys.stderr, flush=True
            )
        if self.store is not None:
            try:
                self.store.set(f"err/{self.rank}", note.public().model_dump_json())
                if self.rank == 0:
                    self._linger()
            except Exception:
                pass

    def _linger(self, seconds: float = 5.0) -> None:
        """Rank 0 hosts the store: keep it up briefly so peers can read the error."""
        assert self.store is not None
        end = time.monotonic() + seconds
        others = range(1, self.layout.world_size)
        while time.monotonic() < end:
            if all(self.store.check([f"err/{r}"]) or self.store.check([f"done/{r}"]) for r in others):
                return
            time.sleep(0.1)

    # -- shutdown ------------------------------------------------------------------------
    def finish(self, summary: dict[str, Any]) -> list[dict[str, Any]] | None:
        """Publish this rank's summary; rank 0 collects and returns all of them."""
        assert self.store is not None
        if self.rank != 0:
            self._stop.set()
            if self._watchdog is not None:
                self._watchdog.join(timeout=5)
            self.store.set(f"summary/{self.rank}", json.dumps(summary))
            self.store.set(f"done/{self.rank}", "1")
            return None
        self.store.set("summary/0", json.dumps(summary))
        deadline = time.monotonic() + self.rt.op_timeout_s
        keys = [f"done/{r}" for r in range(1, self.layout.world_size)]
        while not self.store.check(keys):
            if self._lost is not None:
                raise self._lost
            if time.monotonic() > deadline:
                raise PartyFailure("peers did not finish in time", rank=None)
            time.sleep(0.05)
        self._stop.set()
        out = []
        for r in range(self.layout.world_size):
            try:
                out.append(json.loads(self.store.get(f"summary/{r}")))
            except json.JSONDecodeError:
                raise ProtocolError(f"{self.who(r)} sent a malformed run summary") from None
        return out

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if dist.is_initialized():
            with contextlib.suppress(Exception):
                dist.destroy_process_group()


def write_error_file(out_dir: Path, note: ErrorNote) -> None:
    d = Path(out_dir) / "ranks"
    d.mkdir(parents=True, exist_ok=True)
    (d / f"rank{note.rank}.error.json").write_text(note.model_dump_json(indent=2))


def exit_code_for(exc: BaseException) -> int:
    if isinstance(exc, PartyFailure):
        return EXIT_PARTY_FAILURE
    if isinstance(exc, SecureVFLError):
        return EXIT_USER_ERROR
    return 1
