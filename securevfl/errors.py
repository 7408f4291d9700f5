"""One exception hierarchy for securevfl.

Every error a user can cause (bad protocol file, bad data, a peer that dies or
misbehaves) is a :class:`SecureVFLError`; the CLI turns these into exit code 2 and
a one-paragraph message. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import Any, TextIO


class SecureVFLError(Exception):
    """Base class of every error securevfl raises on purpose."""


class ConfigError(SecureVFLError):
    """A protocol file or override is malformed; the message names the YAML path."""

    def __init__(self, message: str, *, path: str | None = None, source: str | None = None):
        self.message = message  # without the file and path
        self.path = path
        self.source = source
        where = f"{source}: " if source else ""
        at = f"at '{path}': " if path else ""
        super().__init__(f"{where}{at}{message}")


class UnsupportedCombination(ConfigError):
    """A protocol combines parts that cannot work together (e.g. a defense that
    needs what the chosen backend hides)."""


class DataError(SecureVFLError):
    """A party's data is unusable: NaNs, duplicate or missing IDs, missing label
    column, empty intersection.

    ``str(exc)`` is the public message: it names the party, the column and a
    count, never an ID, a value, a line or a file path, because a failing rank
    relays it to every other party (SECURITY.md, "What error messages may
    contain"). ``detail`` is for the owner only: it may name the first offending
    IDs, lines and the file, and is written to the owner's own stderr and error
    file, never sent to a peer.
    """

    def __init__(self, message: str, *, detail: str | None = None):
        self.detail = detail
        super().__init__(message)


class ProtocolError(SecureVFLError):
    """A peer sent something unexpected or malformed; names sender and message."""


class Diverged(SecureVFLError):
    """This party's own computation produced NaN or infinite values, or a value
    outside a bound the exchange is sized for (training diverged: a learning rate
    too large for the data's scale, say). Raised by the party where it happened,
    before anything derived from the value goes on the wire, so the failure names
    that party instead of a peer refusing the message.

    ``str(exc)`` is public (it reaches every peer): it names the value and the
    bound it passed, never a quantity computed from the data. ``detail``, for the
    owner only (its stderr and error file, as :class:`DataError`'s), may give the
    offending norm, row or column."""

    def __init__(self, message: str, *, detail: str | None = None):
        self.detail = detail
        super().__init__(message)


class PartyFailure(SecureVFLError):
    """A peer rank died, stalled or reported an error; names the lost rank."""

    def __init__(self, message: str, *, rank: int | None = None):
        self.rank = rank
        super().__init__(message)


class RankFailed(SecureVFLError):
    """A rank run in this process (``securevfl party``, :func:`securevfl.api.party`)
    ended with an error it has already reported: on stderr, in its error file and
    to its peers. ``exit_code`` is the rank's (2: a user error, 3: a lost peer, 1:
    a bug); ``kept_aside`` is where its files went when an earlier result in its
    output folder was kept."""

    def __init__(self, message: str, *, exit_code: int, kept_aside: Path | None = None):
        self.exit_code = exit_code
        self.kept_aside = kept_aside
        super().__init__(message)


class CheckpointError(SecureVFLError):
    """A checkpoint or saved model cannot be used: missing, corrupted, written for
    another protocol or rank, or not the one the other ranks hold. The message
    names the rank, the file or field, and the reason (exit code 2)."""


class OutputError(SecureVFLError):
    """A file of the run cannot be written: a full disk, a quota, a read-only file
    system, missing permissions (exit code 2; the earlier result in the output
    folder is kept). ``str(exc)`` gives the reason and may be relayed to the other
    parties; ``detail``, for the owner only, names the file (a path on the
    owner's machine, as in :class:`DataError`)."""

    def __init__(self, message: str, *, detail: str | None = None):
        self.detail = detail
        super().__init__(message)


class UserCodeError(ConfigError):
    """User code named in a protocol file (a plugin module, a model factory)
    cannot be used in this process: its invocation does not allow it, it fails
    to import, it raises, or it returns something securevfl cannot train
    (:mod:`securevfl.usercode`). Exit code 2, no traceback.

    ``str(exc)`` is public: it names the YAML field, the party, the module or
    factory and the exception's type, and a failing rank relays it to its peers.
    ``detail`` is for the owner only: the exception's own text and where in the
    user's file it was raised (the text may quote the party's data), written to
    the owner's stderr and error file, never sent to a peer (as
    :class:`DataError`'s)."""

    def __init__(
        self, message: str, *, path: str | None = None, source: str | None = None, detail: str | None = None
    ):
        self.detail = detail
        super().__init__(message, path=path, source=source)


class CryptoParameterError(ConfigError):
    """Crypto parameters below the security floor, refused at load."""


class DataWarning(UserWarning):
    """A party's data is usable but probably not what the user meant (e.g. a label
    column with nearly one class per row); printed to the owner's stderr."""


class SecurityWarning(UserWarning):
    """A run goes on with a protection switched off by its user (e.g. ranks on
    several hosts that present keys nobody pinned); printed to the rank's stderr,
    naming what an attacker could then do."""


def show_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: TextIO | None = None,
    line: str | None = None,
) -> None:
    """``warnings.showwarning`` for securevfl's entry points: a :class:`DataWarning`
    or :class:`SecurityWarning` prints as one ``securevfl: warning:`` line, anything
    else as Python would."""
    if issubclass(category, (DataWarning, SecurityWarning)):
        print(f"securevfl: warning: {message}", file=file or sys.stderr, flush=True)
    else:
        _python_showwarning(message, category, filename, lineno, file, line)


_python_showwarning: Any = warnings.showwarning
