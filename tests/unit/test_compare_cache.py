"""The comparison folder as a cache: a finished run is reused when its marker and
result carry the digest of the protocol planned now and the same seed; a changed
protocol, a missing marker or another seed runs again. `execute` runs only what
the cache lacks (the launcher is replaced by a recording double here; the e2e
test runs it for real)."""

from __future__ import annotations

import json
import os
import stat

import pytest

import securevfl.app.compare_runs as compare_runs
import securevfl.app.comparison as comparison
from securevfl.app.cache_key import KEY_ENV, cache_key, key_path
from securevfl.app.compare_runs import cached, execute, mark_done
from securevfl.app.comparison import MARKER, Source, plan
from tests.support.protocols import PROTOCOLS


def _finish(run) -> None:
    """What a finished run leaves: its result (with the protocol digest) and marker."""
    run.folder.mkdir(parents=True, exist_ok=True)
    (run.folder / "result.json").write_text(json.dumps({"digest": run.digest, "protocol": run.base}))
    mark_done(run, 1.0)


def _plan(tmp_path, *sets: str, seeds=(0, 1)):
    return plan("t", [Source(PROTOCOLS / "plain.yaml", tuple(sets))], list(seeds), tmp_path)


def test_identical_rerun_is_cached(tmp_path) -> None:
    p = _plan(tmp_path)
    assert [cached(r) for r in p.runs] == [None, None]
    _finish(p.runs[0])
    again = _plan(tmp_path)  # a fresh plan of the same command
    assert cached(again.runs[0]) == {"digest": again.runs[0].digest, "protocol": "plain"}
    assert cached(again.runs[1]) is None


def test_digest_change_invalidates(tmp_path) -> None:
    p = _plan(tmp_path)
    _finish(p.runs[0])
    changed = _plan(tmp_path, "training.epochs=3")
    assert changed.runs[0].folder == p.runs[0].folder  # same place, other protocol
    assert changed.runs[0].digest != p.runs[0].digest
    assert cached(changed.runs[0]) is None


def test_a_run_an_older_compatible_securevfl_cached_is_reused_and_an_incompatible_one_runs_again(
    tmp_path,
) -> None:
    """A run cached under the digest securevfl wrote before the schema version
    (its marker, its result and the keyed tag all under that digest) is reused when
    the protocol still matches it; one of another schema version runs again."""
    p = _plan(tmp_path)
    run = p.runs[0]
    legacy = run.proto.legacy_digest()
    run.folder.mkdir(parents=True, exist_ok=True)
    raw = json.dumps({"digest": legacy, "protocol": run.base}).encode()
    (run.folder / "result.json").write_bytes(raw)
    tag = compare_runs.result_tag(cache_key(), run, raw, digest=legacy)
    (run.folder / MARKER).write_text(json.dumps({"digest": legacy, "seed": run.seed, "result_tag": tag}))
    assert cached(_plan(tmp_path).runs[0]) == {"digest": legacy, "protocol": "plain"}
    other = "v9-" + run.digest[-16:]
    raw = json.dumps({"digest": other, "protocol": run.base}).encode()
    (run.folder / "result.json").write_bytes(raw)
    tag = compare_runs.result_tag(cache_key(), run, raw, digest=other)
    (run.folder / MARKER).write_text(json.dumps({"digest": other, "seed": run.seed, "result_tag": tag}))
    assert cached(_plan(tmp_path).runs[0]) is None


def test_missing_marker_or_other_seed_is_not_cached(tmp_path) -> None:
    p = _plan(tmp_path)
    _finish(p.runs[0])
    (p.runs[0].folder / MARKER).unlink()  # an interrupted run: result without marker
    assert cached(p.runs[0]) is None
    _finish(p.runs[0])
    mark = json.loads((p.runs[0].folder / MARKER).read_text())
    (p.runs[0].folder / MARKER).write_text(json.dumps({**mark, "seed": 7}))
    assert cached(p.runs[0]) is None


def test_execute_runs_only_what_is_missing(tmp_path, monkeypatch) -> None:
    launched = []

    def fake_launch(checked, folder, **kw):
        proto = checked.protocol
        assert kw["overwrite"] is True
        launched.append((proto.training.seed, folder))
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "result.json").write_text(json.dumps({"digest": proto.digest(), "protocol": proto.name}))

    monkeypatch.setattr(compare_runs, "launch", fake_launch)
    said: list[str] = []
    p = _plan(tmp_path, seeds=(0, 1, 2))
    _finish(p.runs[1])
    done = execute(p, tmp_path, progress=False, say=said.append, warn=said.append)
    assert [s for s, _ in launched] == [0, 2]
    assert len(done) == 3 and all(res["digest"] == r.digest for r, res in done)
    assert said[0] == "t: 3 runs, 1 already done in " + str(tmp_path) + ", 2 to run"
    assert said[1].startswith("[2/3] plain seed 0") and said[2].startswith("[3/3] plain seed 2")
    assert "left" in said[2]  # an estimate once one run is timed
    launched.clear()
    execute(_plan(tmp_path, seeds=(0, 1, 2)), tmp_path, progress=False, say=said.append, warn=said.append)
    assert launched == []
    execute(
        _plan(tmp_path, seeds=(0, 1, 2)),
        tmp_path,
        rerun=True,
        progress=False,
        say=said.append,
        warn=said.append,
    )
    assert len(launched) == 3


def test_repeated_seeds_are_refused(tmp_path) -> None:
    with pytest.raises(comparison.ConfigError, match="seeds repeat"):
        _plan(tmp_path, seeds=(0, 0))


def _recording_launch(monkeypatch) -> list[int]:
    launched: list[int] = []

    def fake_launch(checked, folder, **kw):
        proto = checked.protocol
        launched.append(proto.training.seed)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "result.json").write_text(
            json.dumps({"digest": proto.digest(), "protocol": proto.name, "test_accuracy": 0.54})
        )

    monkeypatch.setattr(compare_runs, "launch", fake_launch)
    return launched


@pytest.mark.parametrize("edit", [0.999, 2.5, "abc", None])
def test_a_result_edited_after_its_run_is_run_again_saying_why(tmp_path, monkeypatch, edit) -> None:
    """The marker keeps a keyed tag of the result.json the run wrote: an edited
    metric (a better accuracy, an impossible one, a string) never reaches the table;
    the run is named and runs again."""
    launched = _recording_launch(monkeypatch)
    p = _plan(tmp_path, seeds=(0,))
    execute(p, tmp_path, progress=False, say=lambda _: None)
    assert launched == [0]
    result = p.runs[0].folder / "result.json"
    doc = json.loads(result.read_text())
    assert cached(p.runs[0]) == doc  # untouched: reused
    result.write_text(json.dumps({**doc, "test_accuracy": edit}))
    again = _plan(tmp_path, seeds=(0,))
    assert cached(again.runs[0]) is None
    said: list[str] = []
    done = execute(again, tmp_path, progress=False, say=said.append, warn=said.append)
    assert launched == [0, 0]
    assert done[0][1]["test_accuracy"] == 0.54  # what the run measured, not the edit
    assert said[0] == f"plain seed 0: not reused: {result} was changed after the run wrote it; it runs again"


def test_a_marker_without_the_results_digest_is_not_trusted(tmp_path, monkeypatch) -> None:
    launched = _recording_launch(monkeypatch)
    p = _plan(tmp_path, seeds=(0,))
    _finish(p.runs[0])
    marker = p.runs[0].folder / MARKER
    mark = json.loads(marker.read_text())
    del mark["result_tag"]
    marker.write_text(json.dumps(mark))
    said: list[str] = []
    execute(_plan(tmp_path, seeds=(0,)), tmp_path, progress=False, say=said.append, warn=said.append)
    assert launched == [0]
    assert said[0] == (
        f"plain seed 0: not reused: {marker} holds no keyed digest of result.json (an older securevfl "
        "wrote it); it runs again"
    )


def test_empty_seeds_are_refused(tmp_path) -> None:
    with pytest.raises(comparison.ConfigError, match="at least one seed") as info:
        _plan(tmp_path, seeds=())
    assert info.value.path == "--seeds"


def test_the_cache_key_is_made_once_private_and_where_the_user_says(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv(KEY_ENV)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    assert key_path() == tmp_path / "state" / "securevfl" / "compare-cache.key"
    old = os.umask(0)
    try:
        key = cache_key()
    finally:
        os.umask(old)
    assert cache_key() == key and len(key) == 32  # made once, then read
    assert stat.S_IMODE(key_path().stat().st_mode) == 0o600
    assert stat.S_IMODE(key_path().parent.stat().st_mode) == 0o700
    assert [p.name for p in key_path().parent.iterdir()] == ["compare-cache.key"]  # no temporary left
    monkeypatch.setenv(KEY_ENV, str(tmp_path / "mine.key"))
    assert key_path() == tmp_path / "mine.key" and cache_key() != key


def test_a_cache_key_others_may_read_or_not_a_key_is_refused_naming_it(tmp_path, monkeypatch) -> None:
    path = tmp_path / "k.key"
    monkeypatch.setenv(KEY_ENV, str(path))
    path.write_bytes(bytes(32))
    path.chmod(0o644)
    with pytest.raises(comparison.ConfigError, match=f"{path} may be read by others .*chmod 600"):
        cache_key()
    path.chmod(0o600)
    path.write_bytes(b"short")
    with pytest.raises(comparison.ConfigError, match=f"{path} is not a comparison cache key"):
        cache_key()
