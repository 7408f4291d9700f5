"""One rank's seat in the run: who it is, the keys it judges its peers by, and
the run its store values are bound to.

Shared by the start-up steps (:mod:`.claims`, :mod:`.admission`), the
:mod:`.watchdog` and the :mod:`.summaries`: a seat signs what this rank writes
into the store and opens what its peers wrote (:mod:`.notes`), bound to rank
0's run nonce until every hello is in and to the session hash after.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from pydantic import ValidationError

from securevfl.errors import PartyFailure
from securevfl.runtime.layout import Layout, Role
from securevfl.runtime.notes import ErrorNote, open_note, sign_note
from securevfl.runtime.rendezvous import Rendezvous
from securevfl.runtime.secure.keys import Identity


@dataclass
class Seat:
    """``pins``: the key each rank must present, by rank (the protocol's, or the
    local launcher's throw-away keys). ``nonce`` and ``session`` are set during
    start-up; ``keys`` holds the identity key of every rank whose hello counts."""

    rank: int
    layout: Layout
    digest: str
    identity: Identity
    pins: dict[int, str]
    rendezvous: Rendezvous
    nonce: bytes = b""
    session: bytes = b""
    keys: dict[int, bytes] = field(default_factory=dict)
    ignored: dict[int, bytes] = field(default_factory=dict)  # error notes that did not verify

    @property
    def role(self) -> Role:
        return self.layout.roles[self.rank]

    def who(self, rank: int) -> str:
        return f"rank {rank} ({self.layout.names().get(rank, '?')})"

    # -- signed store values ------------------------------------------------------------
    def signed(self, body: str, kind: str) -> str:
        """``body`` as this rank's ``kind`` value for the store, signed over the
        session hash (over the run nonce, before every hello is in)."""
        return sign_note(self.identity, self.session or self.nonce, self.rank, kind, body)

    def opened(self, r: int, raw: bytes, kind: str) -> str | None:
        """The body of rank ``r``'s ``kind`` value if it is signed by the identity
        key of ``r``'s hello over this run's session hash or run nonce, else None
        (forged, or replayed from another run)."""
        if r not in self.keys:
            return None
        for binding in (self.session, self.nonce):
            body = open_note(raw, self.keys[r], binding, r, kind) if binding else None
            if body is not None:
                return body
        return None

    def beat(self, r: int, raw: bytes) -> int | None:
        """Rank ``r``'s heartbeat counter, if ``raw`` is its signed heartbeat."""
        body = self.opened(r, raw, "hb")
        return int(body) if body is not None and body.isdigit() else None

    def done(self, r: int, raw: bytes) -> bool:
        """Whether ``raw`` is rank ``r``'s signed ``done`` flag."""
        return self.opened(r, raw, "done") == "1"

    def peer_failure(self, r: int, raw: bytes) -> PartyFailure | None:
        """The failure rank ``r``'s error note reports, or None when the note is
        not signed by ``r``'s identity key for this run (someone else wrote it,
        or it is replayed from an earlier run: ignored, and said once) or ``r``
        has no hello that counts yet."""
        if self.ignored.get(r) == raw or r not in self.keys:
            return None
        body = self.opened(r, raw, "error")
        if body is None:
            self.ignored[r] = raw
            print(
                f"securevfl: rank {self.rank}: ignoring an error note for {self.who(r)} in the rendezvous "
                "store that is not signed by its identity key for this run (forged, or replayed from "
                "another run)",
                file=sys.stderr,
                flush=True,
            )
            return None
        try:
            note = ErrorNote.model_validate_json(body)
        except ValidationError:
            return PartyFailure(f"{self.who(r)} failed (its error report was malformed)", rank=r)
        if note.lost_rank is not None and note.lost_rank != self.rank:
            return PartyFailure(f"{note.message} (reported by {self.who(r)})", rank=note.lost_rank)
        return PartyFailure(f"{self.who(r)} failed: {note.message}", rank=r)
