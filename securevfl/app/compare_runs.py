"""Which runs of a comparison are already done, and running the rest with
progress (``securevfl compare``; the plan is :mod:`securevfl.app.comparison`).

The comparison folder is a cache: a run's folder holds a marker file
(:data:`~securevfl.app.comparison.MARKER`) written only once the run and its
attacks have finished, with the protocol digest, the seed and a tag of the
``result.json`` the run wrote: an HMAC-SHA256 under the user's cache key, kept
outside every run folder (:mod:`securevfl.app.cache_key`), so that whoever can
write the folder but not read the key cannot pass an edited result off as a
finished run. A run whose marker and result match the plan is not run again.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from securevfl import jsonfile
from securevfl.app.cache_key import cache_key
from securevfl.app.comparison import MARKER, Plan, Run, say_stderr
from securevfl.app.launcher import launch
from securevfl.app.objects import Registration
from securevfl.report.result import RESULT_FILE

# -- the cache ----------------------------------------------------------------------------

_TAG_LABEL = b"securevfl compare cache v1\n"


def result_tag(key: bytes, run: Run, raw: bytes, *, digest: str | None = None) -> str:
    """The marker's tag of a run's ``result.json`` bytes ``raw``: HMAC-SHA256 under
    ``key`` of the run's protocol digest (``digest``: the one the marker holds, when
    an older, compatible securevfl wrote it) and seed and the bytes, so that a result
    is vouched for only in its own run's place."""
    head = json.dumps({"digest": digest or run.digest, "seed": run.seed}, sort_keys=True).encode()
    return hmac.new(key, _TAG_LABEL + head + b"\n" + raw, hashlib.sha256).hexdigest()


def cache_entry(run: Run) -> tuple[dict[str, Any] | None, str | None]:
    """(the finished result of ``run``, None) when its folder holds one of the same
    protocol digest and seed that is what the run wrote; else (None, why it is not
    used), the reason None for a run that is simply not there (never run,
    interrupted, another protocol or seed) and a sentence for a result that was
    there but cannot be trusted (changed since the run wrote it, or a marker
    without the result's tag)."""
    marker, result = run.folder / MARKER, run.folder / RESULT_FILE
    try:
        mark = json.loads(marker.read_text())
        raw = result.read_bytes()
    except (OSError, ValueError):
        return None, None
    if not isinstance(mark, dict) or mark.get("seed") != run.seed:
        return None, None
    # the digest this run's protocol has now, or the one a compatible older securevfl gave it
    saved = mark.get("digest")
    if not isinstance(saved, str) or run.proto.digest_mismatch(saved) is not None:
        return None, None
    tag = mark.get("result_tag")
    if not isinstance(tag, str):
        return None, f"{marker} holds no keyed digest of {RESULT_FILE} (an older securevfl wrote it)"
    if not hmac.compare_digest(result_tag(cache_key(), run, raw, digest=saved), tag):
        return None, f"{result} was changed after the run wrote it"
    try:
        res = jsonfile.loads(raw)
    except ValueError:
        return None, f"{result} is not JSON"
    if not isinstance(res, dict) or res.get("digest") != saved:
        return None, f"{result} is not this protocol's result"
    return res, None


def cached(run: Run) -> dict[str, Any] | None:
    """The finished result of ``run`` when the cache holds one it can use
    (:func:`cache_entry`), else None."""
    return cache_entry(run)[0]


def mark_done(run: Run, seconds: float) -> None:
    """Mark ``run`` finished: its protocol digest, seed and the keyed tag of the
    ``result.json`` it wrote (:func:`result_tag`: a result changed later is not reused)."""
    tmp = run.folder / f".{MARKER}.tmp"
    tag = result_tag(cache_key(), run, (run.folder / RESULT_FILE).read_bytes())
    tmp.write_text(
        json.dumps(
            {
                "digest": run.digest,
                "seed": run.seed,
                "label": run.label,
                "point": run.point,
                "run_s": seconds,
                "result_tag": tag,
            }
        )
    )
    tmp.replace(run.folder / MARKER)


def fmt_duration(s: float) -> str:
    s = max(0, round(s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def execute(
    plan_: Plan,
    out: Path,
    *,
    rerun: bool = False,
    progress: bool = True,
    say: Callable[[str], None] = say_stderr,
    warn: Callable[[str], None] = say_stderr,
    registrations: tuple[Registration, ...] = (),
) -> list[tuple[Run, dict[str, Any]]]:
    """Run what the cache lacks (everything with ``rerun``), in plan order; return
    every run with its result record. Progress (``say``): runs done / total and, once one
    run has been timed, the estimated time left (mean time of this session's runs,
    else the previous runs' own wall time, times the runs left); ``warn``: a cached
    run that is not reused, and why (said even when progress is not). ``registrations``:
    the caller's own component classes, for every run's ranks (:func:`launch`)."""
    runs = plan_.runs
    have: dict[int, dict[str, Any] | None] = {}
    for r in runs:
        have[id(r)], why = (None, None) if rerun else cache_entry(r)
        if why:
            warn(f"{r.label} seed {r.seed}: not reused: {why}; it runs again")
    todo = [r for r in runs if have[id(r)] is None]
    total, n_cached = len(runs), len(runs) - len(todo)
    say(f"{plan_.title}: {total} runs, {n_cached} already done in {out}, {len(todo)} to run")
    spent: list[float] = []
    done = n_cached
    for i, run in enumerate(todo):
        left = len(todo) - i
        eta = f", about {fmt_duration(left * sum(spent) / len(spent))} left" if spent else ""
        say(f"[{done + 1}/{total}] {run.label} seed {run.seed} ({run.proto.exchange.backend}){eta}")
        (run.folder / MARKER).unlink(missing_ok=True)
        t0 = time.monotonic()
        launch(
            run.checked,
            run.folder,
            data_dir=out / "data",
            progress=progress,
            overwrite=True,
            registrations=registrations,
        )
        seconds = time.monotonic() - t0
        mark_done(run, seconds)
        spent.append(seconds)
        done += 1
        # re-read: the attack harness completes result.json after the ranks end
        have[id(run)] = jsonfile.loads((run.folder / RESULT_FILE).read_text())
    if todo:
        say(f"{len(todo)} runs in {fmt_duration(sum(spent))}; {total} of {total} done")
    return [(r, have[id(r)]) for r in runs]  # type: ignore[misc]
