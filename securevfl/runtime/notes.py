"""Store notes: what a rank writes into the rendezvous store for its peers, and
its error report.

Whoever reaches rank 0's port can read and write the store, so every value a
rank acts on is signed with its writer's Ed25519 identity key over
:func:`~securevfl.runtime.secure.handshake.note_message`: the run (rank 0's run
nonce for a claim or a hello, the session hash for what is written once every
hello is in), the writer's rank and the value's kind. A value signed in an
earlier run, for another rank or of another kind does not verify
(:func:`open_note`) and is ignored. Store values are JSON validated by pydantic,
never pickles.

A rank's first error goes to its own error file and stderr, and (public part
only) to its peers through the store; :func:`exit_code_for` maps it to the
process exit code (SECURITY.md §5).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from securevfl.errors import DataError, Diverged, PartyFailure, SecureVFLError, UserCodeError
from securevfl.private_files import private_dir, write_private
from securevfl.runtime.secure import handshake as hs
from securevfl.runtime.secure import keys
from securevfl.runtime.secure.keys import Identity

EXIT_USER_ERROR = 2
EXIT_PARTY_FAILURE = 3
EXIT_INTERRUPTED = 130  # stopped by Ctrl-C (SIGINT), as shells report it: 128 + 2


class SignedNote(BaseModel):
    """A value a rank publishes in the store for its peers (a hello, an error
    report, a heartbeat, a done flag), signed with its identity key over
    :func:`~securevfl.runtime.secure.handshake.note_message`."""

    model_config = ConfigDict(extra="forbid")
    body: str
    sig: str


def sign_note(identity: Identity, binding: bytes, rank: int, kind: str, body: str) -> str:
    """``body`` signed by ``identity`` as rank ``rank``'s value of ``kind`` in the
    run ``binding`` names, as the store carries it."""
    sig = identity.sign(hs.note_message(binding, rank, kind, body.encode()))
    return SignedNote(body=body, sig=sig.hex()).model_dump_json()


def open_note(raw: bytes, signer: bytes, binding: bytes, rank: int, kind: str) -> str | None:
    """The body of a value from :func:`sign_note`, or None when it is malformed or
    not signed by ``signer`` as rank ``rank``'s ``kind`` for this run (forged, or
    replayed from another run)."""
    try:
        signed = SignedNote.model_validate_json(raw)
        sig = bytes.fromhex(signed.sig)
    except (ValidationError, ValueError):
        return None
    if not keys.verify(signer, sig, hs.note_message(binding, rank, kind, signed.body.encode())):
        return None
    return signed.body


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
    to be shared (a :class:`DataError` keeps IDs and values in its ``detail``, a
    :class:`UserCodeError` the text of the user code's exception;
    :class:`Diverged` the norm that passed a bound);
    any other exception is a bug whose text may quote data, so only its type
    crosses to the peers."""
    if isinstance(exc, SecureVFLError):
        return ErrorNote(
            rank=rank,
            kind=type(exc).__name__,
            message=str(exc),
            lost_rank=exc.rank if isinstance(exc, PartyFailure) else None,
            detail=exc.detail if isinstance(exc, (DataError, Diverged, UserCodeError)) else None,
        )
    return ErrorNote(
        rank=rank,
        kind=type(exc).__name__,
        message=f"internal error ({type(exc).__name__}); the traceback is in this rank's own log",
        detail=f"{type(exc).__name__}: {exc}",
    )


def write_error_file(out_dir: Path, note: ErrorNote) -> None:
    d = private_dir(Path(out_dir) / "ranks")
    write_private(d / f"rank{note.rank}.error.json", note.model_dump_json(indent=2))


def exit_code_for(exc: BaseException) -> int:
    if isinstance(exc, PartyFailure):
        return EXIT_PARTY_FAILURE
    if isinstance(exc, SecureVFLError):
        return EXIT_USER_ERROR
    return 1
