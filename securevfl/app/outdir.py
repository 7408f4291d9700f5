"""A run's output folder: never lose an earlier result.

A run writes ``result.json``, ``ranks/rank<R>.*`` and ``attacks/*.npz`` under its
output folder (a prediction ``predictions.csv``, ``prediction.json`` and
``ranks/rank<R>.predict_*``). An existing folder that already holds anything (other than the
materialized-data cache the run itself uses) is refused unless the user asks to
overwrite. With ``overwrite`` the new run is written to a staging folder inside
the output folder; only when it has finished are securevfl's own earlier files
removed and the new ones moved into their place. Files securevfl did not write
are never touched. A run that fails leaves the earlier result as it was and its
own files in ``OUT/failed-run/``; a launch that dies before either (SIGKILL)
leaves its staging folder, which the next run in ``OUT`` removes. A run into an
empty folder writes there directly and marks it (``OUT/.securevfl-fresh-<pid>``)
until it ends; what such a launch killed outright left (no result, no
checkpoint to resume from) is removed by the next run in ``OUT`` too.

One run at a time: a run holds a lock on its output folder (:class:`FolderLock`,
``OUT/.securevfl-lock``) from the moment it opens it until its files are in
place, so a second run into the same folder (another command, or another
thread of the same script) is refused with exit 2, naming the first, instead of
both reporting success with one result lost.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import shutil
import stat
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from securevfl.errors import ConfigError, OutputError
from securevfl.private_files import PRIVATE_DIR, private_dir
from securevfl.runtime.lifeline import alive

# what the file system answers when a file cannot be written for reasons of the
# machine, not of securevfl: full disk, quota, file size limit, read-only, permissions,
# a name past the file system's limit
WRITE_ERRNOS = frozenset(
    {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM, errno.ENAMETOOLONG}
)
STAGING_PREFIX = ".securevfl-staging-"
# a run writing straight into a fresh (empty) output folder marks it so, until it ends
FRESH_PREFIX = ".securevfl-fresh-"
LOCK_FILE = ".securevfl-lock"
FAILED_RUN = "failed-run"
# what securevfl writes under an output folder (paths relative to it)
OWN_FILES = re.compile(
    r"^(result\.json|predictions\.csv|prediction\.json"
    r"|ranks/(rank\d+\.[A-Za-z0-9_.]+|launcher_pids\.json)|attacks/[^/]+\.npz)$"
)
# each rank's own folder of checkpoints and its final model (securevfl.app.checkpoints)
OWN_DIRS = re.compile(r"^ranks/rank\d+$")


def is_own(relpath: str) -> bool:
    """Whether a file (path relative to the output folder, '/'-separated) is one
    that securevfl writes, and so may replace."""
    return OWN_FILES.match(relpath) is not None


def _entries(out: Path, keep: set[Path]) -> list[Path]:
    return sorted(
        p
        for p in out.iterdir()
        if p.name != LOCK_FILE and not p.name.startswith(FRESH_PREFIX) and p.resolve() not in keep
    )


@dataclass
class FolderLock:
    """An exclusive lock on an output folder for the length of one run: ``flock``
    on ``OUT/.securevfl-lock``, which holds who took it (pid, thread, start time,
    command line) so that a refused run can name the first. The kernel drops the
    lock when its holder ends, however it ends (SIGKILL included); a lock file
    left behind so is taken over by the next run. ``flock`` locks belong to an
    open file, so two threads of one process exclude each other too."""

    path: Path
    fd: int | None

    @classmethod
    def take(cls, out: Path, *, flag: str = "--out") -> FolderLock:
        """Lock ``out`` (created if missing) or raise :class:`ConfigError` (path
        ``flag``): naming the run that holds it; or saying why no lock can be
        taken (a folder that cannot be written, a ``.securevfl-lock`` that is a
        folder, a link or anything but a regular file, a file system without
        ``flock``). A run that cannot lock its folder does not run: two such
        runs would both report success with one result lost."""
        lock = Path(out) / LOCK_FILE
        while True:
            fd = _open_lock(Path(out), lock, flag)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _holder(fd)
                os.close(fd)
                raise ConfigError(
                    f"the output folder {out} is in use by another securevfl run ({holder}): wait for it "
                    "to end, or choose another folder",
                    path=flag,
                ) from None
            except OSError as exc:  # ENOLCK, EOPNOTSUPP: no locks on this file system
                os.close(fd)
                raise ConfigError(
                    f"cannot lock the output folder {out} ({lock}: {exc.strerror or exc}): its file system "
                    "offers no file locks, and without one a second run into the folder could replace "
                    "this one's result; choose a folder on a local file system",
                    path=flag,
                ) from None
            # the holder before us may have removed the file between our open and our lock
            try:
                current = os.stat(lock, follow_symlinks=False).st_ino
            except OSError:
                current = None
            if current == os.fstat(fd).st_ino:
                break
            os.close(fd)
        who = {
            "pid": os.getpid(),
            "thread": threading.current_thread().name,
            "started": time.strftime("%Y-%m-%d %H:%M:%S"),
            "command": " ".join(sys.argv),
        }
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(who).encode(), 0)
        return cls(lock, fd)

    def release(self) -> None:
        """Remove the lock file and let the lock go (idempotent)."""
        if self.fd is None:
            return
        with contextlib.suppress(OSError):
            self.path.unlink()
        os.close(self.fd)
        self.fd = None


def _open_lock(out: Path, lock: Path, flag: str) -> int:
    """Open (create) the lock file ``lock`` in ``out``, never through a link, and
    only when it is a regular file; else raise :class:`ConfigError` naming it."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO) or (
            lock.is_symlink() or (lock.exists() and not lock.is_file())
        ):
            raise _not_a_lock(lock, flag) from None
        raise ConfigError(
            f"cannot write to the output folder {out}: {exc.strerror or exc}", path=flag
        ) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise _not_a_lock(lock, flag)
    return fd


def _not_a_lock(lock: Path, flag: str) -> ConfigError:
    kind = "a link" if lock.is_symlink() else "a folder" if lock.is_dir() else "not a regular file"
    return ConfigError(
        f"{lock} is {kind}, not securevfl's lock file: no run can lock the output folder while it is "
        "there; remove it, or choose another folder",
        path=flag,
    )


#: how long a refused run waits for the holder to write who it is (it writes right
#: after taking the lock; a loaded machine can hold it between the two)
HOLDER_WAIT_S = 2.0


def _read_holder(fd: int) -> dict[str, Any] | None:
    try:
        info: Any = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) and "pid" in info else None


def _holder(fd: int) -> str:
    """Who holds a lock, as its file says: ``pid 123 (thread 'MainThread'), started
    ..., securevfl run p.yaml --out r``. The holder writes it just after taking the
    lock, so an empty or half-written file is read again for up to
    :data:`HOLDER_WAIT_S`."""
    deadline = time.monotonic() + HOLDER_WAIT_S
    while (info := _read_holder(fd)) is None and time.monotonic() < deadline:
        time.sleep(0.01)
    if info is None:
        return "its details are not written yet"
    pid = info.get("pid")
    who = "this process" if pid == os.getpid() else f"pid {pid}"
    parts = [f"{who} (thread '{info.get('thread', '?')}')", f"started {info.get('started', '?')}"]
    if info.get("command"):
        parts.append(str(info["command"]))
    return ", ".join(parts)


@dataclass
class OutputFolder:
    """Where one run writes. ``path`` is the folder the ranks write to: the output
    folder itself when it was empty, else a staging folder inside it that
    :meth:`commit` moves into place. ``lock``: the run's lock on the output folder,
    held until :meth:`commit`, :meth:`abandon` or :meth:`release`."""

    out: Path
    path: Path
    staged: bool
    lock: FolderLock | None = None
    fresh: Path | None = None  # the mark of a run written straight into an empty folder

    @classmethod
    def open(
        cls, out: Path, *, overwrite: bool, keep: tuple[Path, ...] = (), flag: str = "--overwrite"
    ) -> OutputFolder:
        """Lock ``out``, check it and choose where the run writes. ``keep`` lists
        entries of ``out`` that do not count as earlier results (the data cache).
        Raises :class:`ConfigError` (path ``--out``) for a folder that another run
        holds, or that holds earlier results when ``overwrite`` is false."""
        out = Path(out)
        if out.exists() and not out.is_dir():
            raise ConfigError(f"the output folder {out} is a file", path="--out")
        lock = FolderLock.take(out)
        try:
            sweep_stale_staging(out)
            sweep_dead_fresh(out)
            check_available(out, overwrite=overwrite, keep=keep, flag=flag)
            check_writable(out)
            kept = {Path(k).resolve() for k in keep}
            if not _entries(out, kept):
                mark = out / f"{FRESH_PREFIX}{os.getpid()}"
                mark.touch()
                return cls(out, out, staged=False, lock=lock, fresh=mark)
            staging = out / f"{STAGING_PREFIX}{os.getpid()}"
            if staging.exists():
                shutil.rmtree(staging)
            staging.mkdir()
            return cls(out, staging, staged=True, lock=lock)
        except BaseException:
            lock.release()
            raise

    def release(self) -> None:
        """Let the output folder's lock go (idempotent; :meth:`commit` and
        :meth:`abandon` do)."""
        if self.fresh is not None:
            with contextlib.suppress(OSError):
                self.fresh.unlink()
            self.fresh = None
        if self.lock is not None:
            self.lock.release()

    def commit(self) -> None:
        """Replace securevfl's earlier files in the output folder by the new run's."""
        try:
            if not self.staged:
                return
            for old in _own_files(self.out):
                old.unlink()
            for old_dir in _own_dirs(self.out):  # an earlier run's checkpoints must not mix with these
                shutil.rmtree(old_dir)
            for new in sorted(p for p in self.path.rglob("*") if p.is_file()):
                dest = self.out / new.relative_to(self.path)
                _folders_like(self.path, self.out, new.parent.relative_to(self.path))
                os.replace(new, dest)
            shutil.rmtree(self.path)
        finally:
            self.release()

    def abandon(self) -> Path | None:
        """After a failed run: leave the earlier result as it was and keep the
        failed run's files in ``OUT/failed-run`` (returned), replacing an older one."""
        try:
            if not self.staged or not self.path.exists():
                return None
            failed = self.out / FAILED_RUN
            if failed.exists():
                shutil.rmtree(failed)
            os.replace(self.path, failed)
            return failed
        finally:
            self.release()


def _folders_like(src: Path, dst: Path, rel: Path) -> None:
    """Make ``dst/rel`` and the folders between as ``src/rel``'s are: a private one
    (``ranks/``, a rank's model folder, ``attacks/``: mode 0700,
    :mod:`securevfl.private_files`) is created private, or made so where an earlier
    run left it open, before the new run's files move into it."""
    for part in reversed((rel, *rel.parents)):
        if part == Path("."):
            continue
        private = stat.S_IMODE((src / part).stat().st_mode) == PRIVATE_DIR
        if private:
            private_dir(dst / part)
        else:
            (dst / part).mkdir(exist_ok=True)


def output_error(exc: BaseException, *, shared: bool = True) -> OutputError | None:
    """The user's error behind ``exc``, when it is a file that could not be written
    (:data:`WRITE_ERRNOS`), else None (a bug: keep the traceback). ``shared``: the
    message may reach the other parties (a rank's report), so the file's path goes
    to ``detail`` only; otherwise (the command's own error) the message names it."""
    if not isinstance(exc, OSError) or exc.errno not in WRITE_ERRNOS:
        return None
    reason = exc.strerror or str(exc)
    hint = "; free some space or choose another --out" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else ""
    where = f"cannot write {exc.filename}: {reason}" if exc.filename else None
    if shared:
        return OutputError(f"cannot write its output files: {reason}{hint}", detail=where)
    return OutputError((where or f"cannot write the run's files: {reason}") + hint)


def check_writable(out: Path) -> None:
    """Create ``out`` if needed and check that a file can be created in it, so that
    a folder the user may not write (or a read-only file system) is refused with
    its reason before any rank starts."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".securevfl-probe-", dir=out)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise ConfigError(
            f"cannot write to the output folder {out}: {exc.strerror or exc}", path="--out"
        ) from None


def sweep_stale_staging(out: Path) -> list[Path]:
    """Remove the staging folders in ``out`` left by launches that ended without
    committing or abandoning them (a launcher killed by SIGKILL, or a power cut):
    ``.securevfl-staging-<pid>`` of a process that no longer runs. Its ranks
    ended with it (they die with their parent, :mod:`securevfl.runtime.lifeline`),
    and the earlier result in ``out`` was never touched. A staging folder of a
    running process is left alone (a launch in progress, or a reused pid).
    Returns the folders removed."""
    removed: list[Path] = []
    if not out.is_dir():
        return removed
    for p in sorted(out.glob(f"{STAGING_PREFIX}*")):
        pid = p.name[len(STAGING_PREFIX) :]
        if p.is_dir() and pid.isdigit() and int(pid) != os.getpid() and not alive(int(pid)):
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
    return removed


def sweep_dead_fresh(out: Path) -> list[Path]:
    """Remove what a launch that wrote straight into an empty ``out`` left there
    when it was killed outright (SIGKILL, a power cut): its mark
    ``.securevfl-fresh-<pid>`` names a process that no longer runs. The folder was
    empty when that launch began, so securevfl's own files there (:func:`is_own`,
    the ranks' folders) are that launch's leftovers, and they go; files securevfl
    did not write stay. Kept, with only the mark removed: a ``result.json`` (the
    run finished) and a folder with checkpoints (``--resume`` continues from them).
    The mark of a running process is left alone. Returns the files and folders
    removed."""
    removed: list[Path] = []
    if not out.is_dir():
        return removed
    for mark in sorted(out.glob(f"{FRESH_PREFIX}*")):
        pid = mark.name[len(FRESH_PREFIX) :]
        if not pid.isdigit() or int(pid) == os.getpid() or alive(int(pid)):
            continue
        finished = (out / "result.json").is_file()
        resumable = any((d / "checkpoints").is_dir() for d in _own_dirs(out))
        if not (finished or resumable):
            for f in _own_files(out):
                f.unlink()
                removed.append(f)
            for d in _own_dirs(out):
                shutil.rmtree(d)
                removed.append(d)
            for sub in ("attacks", "ranks"):
                with contextlib.suppress(OSError):
                    (out / sub).rmdir()  # only when empty: nothing of the user's goes
        with contextlib.suppress(OSError):
            mark.unlink()
    return removed


def holds_training_run(folder: Path) -> list[str]:
    """What in ``folder`` belongs to a training run: its ``result.json`` and the
    ranks' own folders (saved models, checkpoints); empty when there is none."""
    folder = Path(folder)
    found = ["result.json"] if (folder / "result.json").is_file() else []
    return found + [f"ranks/{p.name}/" for p in _own_dirs(folder)]


def check_available(
    out: Path, *, overwrite: bool, keep: tuple[Path, ...] = (), flag: str = "--overwrite"
) -> None:
    """Refuse an output folder that already holds earlier results, unless
    ``overwrite``; a path that is a file is always refused."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"the output folder {out} is a file", path="--out")
    if not out.exists() or overwrite:
        return
    kept = {Path(k).resolve() for k in keep}
    found = _entries(out, kept)
    if found:
        shown = ", ".join(p.name + ("/" if p.is_dir() else "") for p in found[:4])
        raise ConfigError(
            f"the output folder {out} already holds {shown}{', ...' if len(found) > 4 else ''}: "
            f"choose another folder, or pass {flag} to replace securevfl's earlier results there "
            "(the new run is written aside and moves in only once it has finished)",
            path="--out",
        )


def resume_folder(out: Path, *, overwrite: bool, ranks: range) -> OutputFolder:
    """The output folder of an interrupted run to ``--resume``: it is written in
    place (its checkpoints are what the run continues from, and nothing of an
    earlier result is replaced until a rank writes its new files). Refused with a
    ConfigError (path ``--resume``) when it holds no checkpoint of any of
    ``ranks``, when the run there has finished, or together with ``overwrite``."""
    out = Path(out)
    if overwrite:
        raise ConfigError(
            "--resume continues the run in --out; it cannot be combined with --overwrite", path="--resume"
        )
    if not any((out / "ranks" / f"rank{r}" / "checkpoints").is_dir() for r in ranks):
        raise ConfigError(
            f"{out} holds no checkpoint to resume from (none under {out / 'ranks'}/rank<R>/checkpoints; "
            "a run writes them with training.checkpoint_every)",
            path="--resume",
        )
    if (out / "result.json").is_file():
        raise ConfigError(
            f"the run in {out} has finished (result.json is there): there is nothing to resume",
            path="--resume",
        )
    return OutputFolder(out, out, staged=False, lock=FolderLock.take(out))


def _own_dirs(out: Path) -> list[Path]:
    ranks = out / "ranks"
    if not ranks.is_dir():
        return []
    return [p for p in sorted(ranks.iterdir()) if p.is_dir() and OWN_DIRS.match(f"ranks/{p.name}")]


def _own_files(out: Path) -> list[Path]:
    """securevfl's files in an output folder (not the staging or failed-run folders)."""
    found = []
    for sub in ("", "ranks", "attacks"):
        d = out / sub if sub else out
        if not d.is_dir():
            continue
        for p in d.iterdir():
            rel = f"{sub}/{p.name}" if sub else p.name
            if p.is_file() and is_own(rel):
                found.append(p)
    return found
