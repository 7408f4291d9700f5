"""The comparison cache's key: one secret per user, kept outside every run folder.

``securevfl compare`` reuses a finished run when the marker beside its
``result.json`` vouches for it (securevfl.app.compare_runs). A digest anyone can
compute vouches for nothing against whoever can write the folder (edit the
result, recompute the digest), so the marker carries an HMAC-SHA256 under this key
instead: a 256-bit key from :func:`securevfl.csprng.fresh_key`, in a file its owner
alone may read (0600 in a 0700 folder, :mod:`securevfl.private_files`), made on
first use. Where it lives: ``$SECUREVFL_CACHE_KEY`` when set (tests, or a shared
machine's own policy), else ``$XDG_STATE_HOME/securevfl/compare-cache.key``, else
``~/.local/state/securevfl/compare-cache.key``. Losing it costs only re-runs: a
marker made under another key is not trusted, and the run runs again.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

from securevfl.csprng import KEY_BYTES, fresh_key
from securevfl.errors import ConfigError
from securevfl.private_files import private_dir, write_private

KEY_ENV = "SECUREVFL_CACHE_KEY"
KEY_NAME = "compare-cache.key"


def key_path() -> Path:
    """Where this user's cache key lives (module docstring)."""
    if os.environ.get(KEY_ENV):
        return Path(os.environ[KEY_ENV]).expanduser()
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "securevfl" / KEY_NAME


def cache_key() -> bytes:
    """This user's cache key, made on first use. Two processes that make it at once
    agree on one: each writes its own file and links it into place, and the one
    that finds a key there already reads it. A key file that others may read, or
    that is not a key, is refused (:class:`ConfigError` naming it)."""
    path = key_path()
    if not path.exists():
        private_dir(path.parent, tighten=False)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.unlink(missing_ok=True)
        write_private(tmp, fresh_key(), exclusive=True)
        try:
            with contextlib.suppress(FileExistsError):
                os.link(tmp, path)
        finally:
            tmp.unlink()
    return _read(path)


def _read(path: Path) -> bytes:
    try:
        with open(path, "rb") as fh:
            mode = os.fstat(fh.fileno()).st_mode
            raw = fh.read(KEY_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read the comparison cache key {path}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(mode) or len(raw) != KEY_BYTES:
        raise ConfigError(
            f"{path} is not a comparison cache key ({KEY_BYTES} bytes): remove it and a new one is made "
            f"(finished runs then run again), or point {KEY_ENV} at another file"
        )
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(
            f"the comparison cache key {path} may be read by others (mode {stat.S_IMODE(mode):o}): "
            f"chmod 600 {path}"
        )
    return raw
