"""Party identities: long-term Ed25519 key pairs, their files and their pins.

A party's identity is an Ed25519 key pair (RFC 8032). The secret key lives in a
PKCS#8 PEM file readable by its owner only (mode 0600; a file others may read is
refused); the public key is written as a key string ``ed25519:<64 hex>`` and
identified by its fingerprint ``sha256:<64 hex>`` (SHA-256 of the 32 raw public
key bytes). A protocol pins a party's key under its party entry (``key:``) with
either form; :func:`matches` checks a presented public key against a pin.

Local runs use throw-away identities (:func:`Identity.generate`) that never
touch the disk.

Key files are read by :func:`read_key_file`: opened without blocking, checked
to be a regular file (a symbolic link is followed, as secret stores mount keys
so, but what it leads to must be a regular file: not ``/dev/zero``, a named pipe,
a socket or a folder) of at most :data:`MAX_KEY_FILE_BYTES`, and only then read,
so a wrong ``--key`` is refused at once instead of read without end or waited on.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from securevfl.config import PIN_PATTERN
from securevfl.errors import ConfigError
from securevfl.private_files import private_dir, write_private
from securevfl.regular_files import kind_of_mode

KEY_PREFIX = "ed25519:"
MAX_KEY_FILE_BYTES = 64 << 10
"""The largest key file read: a securevfl secret key file is 119 bytes, a public one
about 80."""
FINGERPRINT_PREFIX = "sha256:"
_PIN = re.compile(PIN_PATTERN)


def key_string(public: bytes) -> str:
    """``ed25519:<hex>`` of 32 raw public key bytes."""
    return KEY_PREFIX + public.hex()


def fingerprint(public: bytes) -> str:
    """``sha256:<hex>``: SHA-256 of the raw public key."""
    return FINGERPRINT_PREFIX + hashlib.sha256(public).hexdigest()


def matches(pin: str, public: bytes) -> bool:
    """Whether ``public`` (raw bytes) is the key ``pin`` names (key string or fingerprint)."""
    if not _PIN.match(pin):
        return False
    if pin.startswith(KEY_PREFIX):
        return pin == key_string(public)
    return pin == fingerprint(public)


def short(public: bytes) -> str:
    """A fingerprint short enough for an error message."""
    return fingerprint(public)[:23]


def verify(public: bytes, signature: bytes, message: bytes) -> bool:
    """Ed25519 verification; False for a bad key, signature or message."""
    try:
        Ed25519PublicKey.from_public_bytes(public).verify(signature, message)
    except (InvalidSignature, ValueError):
        return False
    return True


@dataclass(frozen=True, repr=False)
class Identity:
    """A party's long-term signing key. ``repr`` never shows the secret."""

    _secret: Ed25519PrivateKey

    @classmethod
    def generate(cls) -> Identity:
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def from_seed(cls, seed: bytes) -> Identity:
        """A deterministic identity from 32 seed bytes (tests, throw-away keys
        handed to a child process)."""
        return cls(Ed25519PrivateKey.from_private_bytes(seed))

    @property
    def public(self) -> bytes:
        return self._secret.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )

    def seed(self) -> bytes:
        """The 32 secret bytes, for handing a throw-away identity to a local child."""
        return self._secret.private_bytes(
            serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
        )

    def sign(self, message: bytes) -> bytes:
        return self._secret.sign(message)

    def __repr__(self) -> str:
        return f"Identity({short(self.public)})"

    # -- files ------------------------------------------------------------------------
    def write(self, out_dir: Path, party: str) -> tuple[Path, Path]:
        """Write ``PARTY.key`` (secret, mode 0600; ``out_dir``, when this makes it, mode
        0700: :mod:`securevfl.private_files`) and ``PARTY.pub``; an existing file is
        never overwritten."""
        out_dir = private_dir(Path(out_dir), tighten=False)  # a folder it makes: 0700
        secret_path, public_path = out_dir / f"{party}.key", out_dir / f"{party}.pub"
        for p in (secret_path, public_path):
            if p.exists():
                raise ConfigError(f"{p} exists: refusing to overwrite a key file", path="--out")
        pem = self._secret.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        write_private(secret_path, pem, exclusive=True)
        public_path.write_text(f"{key_string(self.public)} {party}\n")
        return secret_path, public_path

    @classmethod
    def load(cls, path: Path) -> Identity:
        """Read a secret key file written by ``securevfl keygen``; refuse anything
        but a regular file of key size (:func:`read_key_file`), a file that group
        or others may read, or anything but an Ed25519 key."""
        path = Path(path)
        raw, mode = read_key_file(path)
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise ConfigError(
                f"the key file {path} may be read by others (mode {stat.S_IMODE(mode):o}): chmod 600 {path}",
                path="--key",
            )
        try:
            key = serialization.load_pem_private_key(raw, password=None)
        except (ValueError, TypeError):
            raise ConfigError(
                f"{path} is not a securevfl secret key file (PKCS#8 PEM)", path="--key"
            ) from None
        if not isinstance(key, Ed25519PrivateKey):
            raise ConfigError(f"{path} holds a {type(key).__name__}, not an Ed25519 key", path="--key")
        return cls(key)


def read_key_file(path: Path, *, flag: str = "--key", limit: int = MAX_KEY_FILE_BYTES) -> tuple[bytes, int]:
    """(content, mode) of a key file, read as a regular file of at most ``limit``
    bytes. The file is opened without blocking (opening a named pipe would wait
    for a writer), then checked on its open descriptor: anything but a regular
    file (a device such as ``/dev/zero`` behind a symbolic link, a pipe, a socket,
    a folder) or a file larger than ``limit`` is a :class:`ConfigError` naming
    ``flag`` and what the path is; nothing of it is read before."""
    path = Path(path)

    def not_a_file(mode: int) -> ConfigError:
        kind = kind_of_mode(mode)
        return ConfigError(
            f"the key file {path} is {kind}, not a file: give the path of the key file itself", path=flag
        )

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        with contextlib.suppress(OSError):  # a socket cannot be opened at all: say what it is
            mode = os.stat(path).st_mode
            if not stat.S_ISREG(mode):
                raise not_a_file(mode) from None
        raise ConfigError(f"cannot read the key file {path}: {exc.strerror or exc}", path=flag) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise not_a_file(st.st_mode)
        if st.st_size > limit:
            raise ConfigError(
                f"the key file {path} holds {st.st_size:,} bytes; a securevfl key file holds a few "
                f"hundred (at most {limit:,} are read): is it the right file?",
                path=flag,
            )
        chunks, left = [], limit + 1
        while left > 0:
            chunk = os.read(fd, left)
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        if len(data) > limit:  # the file grew after the check
            raise ConfigError(f"the key file {path} holds more than {limit:,} bytes", path=flag)
        return data, st.st_mode
    except OSError as exc:
        raise ConfigError(f"cannot read the key file {path}: {exc.strerror or exc}", path=flag) from None
    finally:
        os.close(fd)


def read_public(path: Path) -> bytes:
    """The raw public key in a ``PARTY.pub`` file."""
    first = read_key_file(path)[0].decode("utf-8", errors="replace").split()
    if not first or not re.fullmatch(r"ed25519:[0-9a-f]{64}", first[0]):
        raise ConfigError(f"{path} is not a securevfl public key file")
    return bytes.fromhex(first[0][len(KEY_PREFIX) :])


# The helper ranks securevfl's exchange backends add (the ``mpc`` backend's TTP
# dealer: ``Mpc.helper_names``). A helper is not a party entry of the protocol:
# its key is pinned under ``security.helper_keys`` (a unit test keeps this in
# step with the backends).
HELPER_RANKS = frozenset({"dealer"})


def pin_instructions(name: str, public: bytes) -> list[str]:
    """The lines ``securevfl keygen`` prints to say where the protocol file pins
    the key of ``name``: under the party's entry, or for a helper rank under
    ``security.helper_keys``."""
    if name in HELPER_RANKS:
        return [
            f"'{name}' is a helper rank, not a party: pin it in the protocol file under "
            "security.helper_keys:",
            f'    helper_keys: {{{name}: "{key_string(public)}"}}',
        ]
    return [f"pin it in the protocol file, under the entry of '{name}':", f"    key: {key_string(public)}"]
