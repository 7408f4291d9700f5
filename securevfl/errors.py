"""One exception hierarchy for securevfl.

Every error a user can cause (bad protocol file, bad data, a peer that dies or
misbehaves) is a :class:`SecureVFLError`; the CLI turns these into exit code 2 and
a one-paragraph message. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class SecureVFLError(Exception):
    """Base class of every error securevfl raises on purpose."""


class ConfigError(SecureVFLError):
    """A protocol file or override is malformed; the message names the YAML path."""

    def __init__(self, message: str, *, path: str | None = None, source: str | None = None):
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
    column, empty intersection. The message names the party and the column."""


class ProtocolError(SecureVFLError):
    """A peer sent something unexpected or malformed; names sender and message."""


class PartyFailure(SecureVFLError):
    """A peer rank died, stalled or reported an error; names the lost rank."""

    def __init__(self, message: str, *, rank: int | None = None):
        self.rank = rank
        super().__init__(message)


class CryptoParameterError(ConfigError):
    """Crypto parameters below the security floor, refused at load."""
