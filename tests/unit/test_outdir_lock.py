"""One run at a time in an output folder: a second run into a folder another run
holds (another process, or another thread of this one) is refused naming the
first, and the lock goes with its holder however that ends."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from securevfl.app import outdir
from securevfl.app.outdir import LOCK_FILE, OutputFolder, resume_folder
from securevfl.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def test_a_second_open_is_refused_naming_the_first_until_the_first_is_done(tmp_path):
    out = tmp_path / "out"
    first = OutputFolder.open(out, overwrite=False)
    assert not first.staged and (out / LOCK_FILE).is_file()
    with pytest.raises(ConfigError) as info:
        OutputFolder.open(out, overwrite=True)
    assert info.value.path == "--out"
    assert "is in use by another securevfl run (this process (thread 'MainThread')" in str(info.value)
    (out / "result.json").write_text("first")
    first.commit()
    assert not (out / LOCK_FILE).exists()
    second = OutputFolder.open(out, overwrite=True)  # the first is done: replaced as asked
    assert second.staged
    second.abandon()
    assert not (out / LOCK_FILE).exists()


def test_the_lock_file_is_no_earlier_result(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / LOCK_FILE).write_text('{"pid": 1}')  # left by a holder killed outright
    f = OutputFolder.open(out, overwrite=False)
    assert not f.staged and f.path == out
    f.release()
    f.release()  # idempotent


def test_threads_opening_one_folder_at_once_get_it_once(tmp_path):
    out = tmp_path / "out"
    n = 6
    start = threading.Barrier(n)
    opened: list[OutputFolder] = []
    refused: list[str] = []

    def open_it() -> None:
        start.wait()
        try:
            opened.append(OutputFolder.open(out, overwrite=True))
        except ConfigError as exc:
            refused.append(str(exc))

    threads = [threading.Thread(target=open_it, name=f"run{i}") for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(opened) == 1 and len(refused) == n - 1, (opened, refused)
    # every refusal names the holder: this process, and its thread
    assert all("in use by another securevfl run (this process (thread 'run" in r for r in refused), refused
    opened[0].commit()


def test_another_process_holding_the_folder_is_named_and_its_death_frees_it(tmp_path):
    out = tmp_path / "out"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; from securevfl.app.outdir import OutputFolder; "
            "f = OutputFolder.open(Path(sys.argv[1]), overwrite=False); print('held', flush=True); "
            "time.sleep(600)",
            str(out),
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(ConfigError) as info:
            OutputFolder.open(out, overwrite=True)
        assert f"in use by another securevfl run (pid {holder.pid} (thread 'MainThread')" in str(info.value)
        with pytest.raises(ConfigError, match="in use by another securevfl run"):
            resume_folder_with_checkpoint(out)
    finally:
        holder.send_signal(signal.SIGKILL)  # no clean-up of its own: the kernel drops the lock
        holder.wait(30)
    deadline = time.monotonic() + 10
    while True:
        try:
            f = OutputFolder.open(out, overwrite=True)
            break
        except ConfigError:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    f.release()


def resume_folder_with_checkpoint(out: Path) -> OutputFolder:
    (out / "ranks" / "rank0" / "checkpoints").mkdir(parents=True, exist_ok=True)
    return resume_folder(out, overwrite=False, ranks=range(1))


@pytest.mark.parametrize("kind", ["folder", "link", "link to a folder", "fifo"])
def test_a_lock_path_that_is_no_regular_file_refuses_the_run(tmp_path, kind):
    """A ``.securevfl-lock`` that is a folder, a link or a FIFO cannot be locked: two
    runs would both go ahead (one result lost), so the run is refused, naming it."""
    out = tmp_path / "out"
    out.mkdir()
    lock = out / LOCK_FILE
    target = tmp_path / "elsewhere"
    if kind == "folder":
        lock.mkdir()
    elif kind == "link":
        target.write_text("")
        lock.symlink_to(target)
    elif kind == "link to a folder":
        target.mkdir()
        lock.symlink_to(target)
    else:
        os.mkfifo(lock)
    for overwrite in (False, True):
        with pytest.raises(ConfigError) as info:
            OutputFolder.open(out, overwrite=overwrite)
        assert info.value.path == "--out"
        assert f"{lock} is " in str(info.value) and "remove it" in str(info.value), str(info.value)
    with pytest.raises(ConfigError, match="not securevfl's lock file"):
        resume_folder_with_checkpoint(out)
    assert not (target.is_file() and target.read_text())  # nothing written through the link


def test_a_file_system_without_locks_refuses_the_run(tmp_path, monkeypatch):
    def no_locks(fd: int, op: int) -> None:
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(outdir.fcntl, "flock", no_locks)
    out = tmp_path / "out"
    with pytest.raises(ConfigError) as info:
        OutputFolder.open(out, overwrite=True)
    assert info.value.path == "--out"
    assert f"cannot lock the output folder {out}" in str(info.value), str(info.value)
    assert "No locks available" in str(info.value)


_KILLED_FRESH_RUN = (
    "import sys, time; from pathlib import Path; from securevfl.app.outdir import OutputFolder; "
    "f = OutputFolder.open(Path(sys.argv[1]), overwrite=False); "
    "(f.path / 'ranks' / 'rank0').mkdir(parents=True); "
    "(f.path / 'ranks' / 'launcher_pids.json').write_text('{}'); "
    "(f.path / 'ranks' / 'rank0.log').write_text('x'); "
    "(f.path / 'ranks' / 'rank0' / 'model.pt').write_text('x'); "
    "print(f.staged, flush=True); time.sleep(600)"
)


def _kill_a_fresh_run(out: Path, *, checkpoints: bool = False) -> None:
    """A launch writing straight into the empty ``out``, killed outright mid-run."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILLED_FRESH_RUN, str(out)], stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "False"  # written in place
        if checkpoints:
            (out / "ranks" / "rank0" / "checkpoints").mkdir()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)


def test_what_a_killed_fresh_run_left_is_removed_by_the_next_run(tmp_path):
    """A fresh run killed outright leaves only its own files: the next run in that
    folder (no --overwrite needed) removes them and writes there; a file of the
    user's put there meanwhile stays, and so refuses the run as before."""
    out = tmp_path / "out"
    _kill_a_fresh_run(out)
    assert (out / "ranks" / "launcher_pids.json").is_file()
    f = OutputFolder.open(out, overwrite=False)
    assert not f.staged and f.path == out
    assert not (out / "ranks").exists()
    f.release()
    assert sorted(p.name for p in out.iterdir()) == []  # the new run's mark and lock go with it

    _kill_a_fresh_run(out)
    (out / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match=r"already holds notes\.txt"):
        OutputFolder.open(out, overwrite=False)
    assert (out / "notes.txt").read_text() == "mine"


def test_a_killed_fresh_run_with_checkpoints_is_kept_for_resume(tmp_path):
    out = tmp_path / "out"
    _kill_a_fresh_run(out, checkpoints=True)
    with pytest.raises(ConfigError, match="already holds ranks/"):
        OutputFolder.open(out, overwrite=False)
    assert (out / "ranks" / "rank0" / "checkpoints").is_dir() and (out / "ranks" / "rank0.log").is_file()
    resume_folder(out, overwrite=False, ranks=range(1)).release()
