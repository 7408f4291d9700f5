"""Epoch records from rank 0 to the process that launched it.

Under the local launcher every rank is its own OS process; rank 0 (the active
party) writes its progress line to the terminal it inherited, and nothing of it
reaches the launcher. A caller that asks for epoch records
(``securevfl.api.run(..., on_epoch=...)``) gets a one-way pipe from rank 0 to
the launcher: as each epoch ends, rank 0 sends the
:class:`~securevfl.records.EpochRecord` its progress line is made from, as JSON
(never a pickle), and the launcher hands it to the callback while it watches the
ranks (:func:`securevfl.app.launcher.watch_ranks`). The record holds only what
rank 0 shows its owner, who launched every party: no other party sends anything
for it.

The caller's callback runs in the launcher's process while training goes on; a
slow one makes records queue in the pipe (rank 0 would wait only once the pipe's
buffer, some hundreds of records, is full). One that raises stops the run: the
launcher ends every rank and the exception reaches the caller.
"""

from __future__ import annotations

from collections.abc import Callable
from multiprocessing.connection import Connection

from pydantic import ValidationError

from securevfl.errors import ProtocolError
from securevfl.records import EpochRecord


class EpochSender:
    """Rank 0's end: sends each record; if the launcher no longer listens (it is
    stopping the run), training is not disturbed and the rest are dropped."""

    def __init__(self, conn: Connection):
        self.conn: Connection | None = conn

    def __call__(self, record: EpochRecord) -> None:
        if self.conn is None:
            return
        try:
            self.conn.send_bytes(record.model_dump_json().encode())
        except OSError:
            self.conn = None


class EpochStream:
    """The launcher's end: :attr:`conn` is waited on with the ranks' sentinels;
    :meth:`receive` reads one record and calls the callback with it."""

    def __init__(self, conn: Connection, callback: Callable[[EpochRecord], None]):
        self.conn = conn
        self.callback = callback
        self.open = True

    def receive(self) -> None:
        """Read one record (or the end of the stream) and deliver it."""
        try:
            raw = self.conn.recv_bytes()
        except (EOFError, OSError):
            self.close()
            return
        try:
            record = EpochRecord.model_validate_json(raw)
        except ValidationError as exc:
            raise ProtocolError(f"rank 0 sent a malformed epoch record: {exc}") from None
        self.callback(record)

    def drain(self) -> None:
        """Deliver what is left once the ranks have ended."""
        while self.open and self.conn.poll(0):
            self.receive()
        self.close()

    def close(self) -> None:
        if self.open:
            self.open = False
            self.conn.close()
