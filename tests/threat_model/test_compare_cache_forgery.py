"""Whoever can write a comparison folder passes an edited result off as a finished run
(SECURITY.md §7, "The comparison cache").

Threat: ``securevfl compare`` reuses a run whose folder holds a marker vouching for
its ``result.json`` (securevfl.app.compare_runs). The marker sits beside the result,
so a digest anyone can compute vouches for nothing: edit the result (a test accuracy
of 0.99), recompute the digest, and the edited result reaches the comparison table as
a finished run. The test plays that writer with everything the run folder holds: it
edits the result and rewrites every digest field of the marker it can compute
(SHA-256 of the edited bytes, keyed with nothing or with anything found in the run
folder). The result must run again, not be reused. The marker's tag is an HMAC under
a per-user key kept outside the run folder, readable by its owner alone; the positive
control gives the writer that key, and the forgery is then reused: the key is what
keeps it out.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import stat
from pathlib import Path

import pytest

import securevfl.app.compare_runs as compare_runs
from securevfl.app.cache_key import KEY_ENV, cache_key
from securevfl.app.compare_runs import cached, mark_done
from securevfl.app.comparison import MARKER, Source, plan
from tests.support.protocols import PROTOCOLS


@pytest.fixture
def run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """One finished run of a comparison (result and marker as the run left them),
    under a cache key of its own outside the comparison folder."""
    monkeypatch.setenv(KEY_ENV, str(tmp_path / "state" / "cache.key"))
    p = plan("t", [Source(PROTOCOLS / "plain.yaml", ())], [0], tmp_path / "cmp")
    r = p.runs[0]
    r.folder.mkdir(parents=True)
    (r.folder / "result.json").write_text(json.dumps({"digest": r.digest, "test_accuracy": 0.54}))
    mark_done(r, 1.0)
    assert cached(r) == {"digest": r.digest, "test_accuracy": 0.54}  # untouched: reused
    return r


def _forge(run, keys: list[bytes]) -> dict:
    """Edit the result to 0.99 and rewrite each hex digest field of the marker: the
    plain SHA-256 of the edited result, or an HMAC-SHA256 of it under each of ``keys``
    (with the message the marker's own tag covers, when the key is the right one)."""
    result, marker = run.folder / "result.json", run.folder / MARKER
    raw = json.dumps({"digest": run.digest, "test_accuracy": 0.99}).encode()
    result.write_bytes(raw)
    mark = json.loads(marker.read_text())
    hexes = [k for k, v in mark.items() if isinstance(v, str) and len(v) == 64]
    assert hexes, f"the marker holds no digest field: {mark}"
    candidates = [hashlib.sha256(raw).hexdigest()]
    for key in keys:
        candidates += [hmac.new(key, raw, hashlib.sha256).hexdigest(), compare_runs.result_tag(key, run, raw)]
    for tag in candidates:
        marker.write_text(json.dumps({**mark, **dict.fromkeys(hexes, tag)}))
        if cached(run) is not None:
            return cached(run)
    return {}


def test_an_edited_result_with_a_recomputed_digest_runs_again(run) -> None:
    folder_bytes = [p.read_bytes() for p in run.folder.parent.parent.rglob("*") if p.is_file()]
    forged = _forge(run, keys=[b"", *folder_bytes])  # everything the comparison folder holds
    assert not forged, f"an edited result was reused as finished: {forged}"
    assert cached(run) is None


def test_the_key_is_its_owners_alone_outside_the_run_folder(run, tmp_path: Path) -> None:
    key_file = tmp_path / "state" / "cache.key"
    assert key_file.is_file() and not key_file.is_relative_to(tmp_path / "cmp")
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(key_file.parent.stat().st_mode) == 0o700
    assert len(cache_key()) == 32 and cache_key() == key_file.read_bytes()


def test_positive_control_a_writer_holding_the_key_forges_a_result(run) -> None:
    assert _forge(run, keys=[cache_key()])["test_accuracy"] == 0.99
