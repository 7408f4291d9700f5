"""The output folder never loses an earlier result (securevfl.app.outdir)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from securevfl.app.outdir import (
    FAILED_RUN,
    STAGING_PREFIX,
    OutputFolder,
    check_available,
    holds_training_run,
    is_own,
)
from securevfl.errors import ConfigError


def _earlier_run(out: Path) -> None:
    (out / "ranks").mkdir(parents=True)
    (out / "result.json").write_text("old result")
    for r in range(3):
        (out / "ranks" / f"rank{r}.summary.json").write_text(f"old {r}")
    (out / "ranks" / "launcher_pids.json").write_text("{}")
    (out / "ranks" / "notes.txt").write_text("the user's own file")
    (out / "ranks" / "keep").mkdir()  # a subfolder the user made
    (out / "attacks").mkdir()
    (out / "attacks" / "feature_reconstruction.npz").write_bytes(b"old")
    (out / "README.md").write_text("the user's own file")


@pytest.mark.parametrize(
    ("rel", "own"),
    [
        ("result.json", True),
        ("ranks/rank0.summary.json", True),
        ("ranks/rank12.view.pt", True),
        ("ranks/launcher_pids.json", True),
        ("attacks/feature_reconstruction.npz", True),
        ("ranks/notes.txt", False),
        ("README.md", False),
        ("ranks/keep/rank0.summary.json", False),
        ("data/digits/p1.csv", False),
    ],
)
def test_own_files(rel, own):
    assert is_own(rel) is own


def test_empty_or_missing_folder_is_written_directly(tmp_path):
    f = OutputFolder.open(tmp_path / "new", overwrite=False)
    assert f.path == tmp_path / "new" and not f.staged and f.path.is_dir()
    f.release()  # one run at a time: the lock goes with the run
    g = OutputFolder.open(tmp_path / "new", overwrite=False)
    assert g.path == tmp_path / "new"


def test_the_data_cache_does_not_count_as_an_earlier_result(tmp_path):
    (tmp_path / "out" / "data").mkdir(parents=True)
    f = OutputFolder.open(tmp_path / "out", overwrite=False, keep=(tmp_path / "out" / "data",))
    assert not f.staged


def test_a_folder_with_results_is_refused_and_left_as_it_was(tmp_path):
    out = tmp_path / "out"
    _earlier_run(out)
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    with pytest.raises(ConfigError, match=r"at '--out'.*already holds.*--overwrite"):
        OutputFolder.open(out, overwrite=False)
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before
    assert (out / "result.json").read_text() == "old result"


def test_a_file_is_refused(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(ConfigError, match="is a file"):
        check_available(tmp_path / "f", overwrite=True)


def test_overwrite_replaces_only_securevfls_files_once_committed(tmp_path):
    out = tmp_path / "out"
    _earlier_run(out)
    f = OutputFolder.open(out, overwrite=True)
    assert f.staged and f.path.parent == out
    # the new run (two ranks) writes aside; the earlier result is intact meanwhile
    (f.path / "ranks").mkdir()
    (f.path / "result.json").write_text("new result")
    for r in range(2):
        (f.path / "ranks" / f"rank{r}.summary.json").write_text(f"new {r}")
    assert (out / "result.json").read_text() == "old result"
    f.commit()
    assert (out / "result.json").read_text() == "new result"
    assert sorted(p.name for p in (out / "ranks").iterdir()) == [
        "keep",
        "notes.txt",
        "rank0.summary.json",
        "rank1.summary.json",
    ]  # the earlier rank2 file is gone: it would mix two runs
    assert (out / "ranks" / "rank0.summary.json").read_text() == "new 0"
    assert (out / "README.md").read_text() == "the user's own file"
    assert not (out / "attacks" / "feature_reconstruction.npz").exists()
    assert not f.path.exists()


def test_a_failed_overwrite_leaves_the_earlier_result(tmp_path):
    out = tmp_path / "out"
    _earlier_run(out)
    f = OutputFolder.open(out, overwrite=True)
    (f.path / "ranks").mkdir()
    (f.path / "ranks" / "rank1.error.json").write_text("{}")
    failed = f.abandon()
    assert failed == out / FAILED_RUN
    assert (failed / "ranks" / "rank1.error.json").is_file()
    assert (out / "result.json").read_text() == "old result"
    assert (out / "ranks" / "rank2.summary.json").read_text() == "old 2"


def _dead_pid() -> int:
    """The pid of a process that has ended (and been reaped)."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_a_staging_folder_of_a_dead_launch_is_removed_by_the_next_run(tmp_path):
    """A launcher killed by SIGKILL leaves OUT/.securevfl-staging-<pid>/ with its
    ranks' partial files: the next run in OUT removes it (with or without
    --overwrite), and keeps a staging folder whose process still runs."""
    out = tmp_path / "out"
    _earlier_run(out)
    dead = out / f"{STAGING_PREFIX}{_dead_pid()}"
    (dead / "ranks").mkdir(parents=True)
    (dead / "ranks" / "rank0.summary.json").write_text("partial")
    alive = out / f"{STAGING_PREFIX}{os.getppid()}"  # a running process: left alone
    alive.mkdir()
    with pytest.raises(ConfigError, match="already holds"):
        OutputFolder.open(out, overwrite=False)
    assert not dead.exists() and alive.is_dir()
    assert (out / "result.json").read_text() == "old result"
    f = OutputFolder.open(out, overwrite=True)
    f.commit()
    assert sorted(p.name for p in out.glob(f"{STAGING_PREFIX}*")) == [alive.name]


def test_an_unwritable_output_folder_is_refused_naming_it(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ConfigError) as info:
        OutputFolder.open(blocker / "out", overwrite=False)
    assert info.value.path == "--out" and f"cannot write to the output folder {blocker / 'out'}" in str(
        info.value
    )


def test_a_training_run_is_recognised(tmp_path):
    assert holds_training_run(tmp_path) == []
    (tmp_path / "ranks" / "rank2" / "model").mkdir(parents=True)
    (tmp_path / "ranks" / "rank0.predict_summary.json").write_text("{}")
    assert holds_training_run(tmp_path) == ["ranks/rank2/"]
    (tmp_path / "result.json").write_text("{}")
    assert holds_training_run(tmp_path) == ["result.json", "ranks/rank2/"]
