"""The local launcher: every rank as its own OS process, on loopback.

Ranks start through a fork server by default (:func:`rank_context`): one clean
server process imports securevfl once, and every rank is forked from it, so a
rank is running in milliseconds instead of re-importing torch, scikit-learn and
securevfl on its own.

It starts the ranks, materializes built-in datasets into per-party files while
they start up (so ranks only read their own; a rank waits for its file,
:func:`~securevfl.data.partition.await_materialized`), and watches them. When a rank fails, the others end
themselves through their watchdogs; any still alive after a grace period are
killed. The error raised names the lost rank and the root cause. After a
successful run it runs the protocol's attacks on the ranks' saved views
(securevfl.app.harness).
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing as mp
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from multiprocessing.connection import wait as wait_for
from pathlib import Path
from typing import Any

from securevfl.app.harness import run_attacks
from securevfl.app.loader import resolve_protocol
from securevfl.app.outdir import OutputFolder, resume_folder
from securevfl.app.rank import run_rank
from securevfl.app.rank_layout import layout_of
from securevfl.config import Protocol
from securevfl.data.partition import materialize, materializing
from securevfl.errors import (
    CheckpointError,
    ConfigError,
    DataError,
    Diverged,
    PartyFailure,
    ProtocolError,
    SecureVFLError,
)
from securevfl.runtime.layout import Layout
from securevfl.runtime.secure.keys import Identity, key_string
from securevfl.runtime.session import ErrorNote

ERROR_KINDS: dict[str, type[SecureVFLError]] = {
    "ConfigError": ConfigError,
    "UnsupportedCombination": ConfigError,
    "CryptoParameterError": ConfigError,
    "DataError": DataError,
    "CheckpointError": CheckpointError,
    "Diverged": Diverged,
    "ProtocolError": ProtocolError,
    "PartyFailure": PartyFailure,
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


RANK_PROCESS = "securevfl-rank"
START_METHOD_ENV = "SECUREVFL_START_METHOD"
START_METHODS = ("forkserver", "spawn")
# what the fork server imports once, before it forks any rank: the ranks' entry points,
# and the command line, which a rank started from the `securevfl` console script re-imports
# with that script as its main module (3.4 of 18.6 CPU s of a 2-step plain `securevfl run`)
RANK_MODULES = ["securevfl.app.launcher", "securevfl.app.predict", "securevfl.cli"]
KILL_REAP_S = 0.1  # after killing the ranks left, how long one wait for them lasts at most
STOP_GRACE_S = 2.0  # a stopped launch's ranks get this long to end on SIGTERM before SIGKILL


def _child(
    proto_json: str,
    rank: int,
    rendezvous: str,
    out_dir: str,
    data_dir: str,
    progress: bool,
    resume: bool,
    seed: bytes,
    pins: dict[int, str],
) -> None:
    proto = resolve_protocol(Protocol.model_validate_json(proto_json))
    identity = Identity.from_seed(seed)
    code = run_rank(
        proto,
        rank,
        rendezvous,
        Path(out_dir),
        Path(data_dir),
        progress=progress,
        resume=resume,
        identity=identity,
        pins=pins,
    )
    sys.exit(code)


def launch(
    proto: Protocol,
    out_dir: Path,
    *,
    data_dir: Path | None = None,
    progress: bool = True,
    overwrite: bool = False,
    resume: bool = False,
) -> dict[str, Any]:
    """Run every rank locally; return the result record (also in out_dir/result.json).

    An ``out_dir`` that already holds results is refused unless ``overwrite``;
    then the new run is written aside and replaces securevfl's earlier files only
    once it has finished (:class:`~securevfl.app.outdir.OutputFolder`).
    ``resume``: continue the interrupted run in ``out_dir`` from the newest
    checkpoint every rank holds (the ranks agree on it at start-up), writing
    into ``out_dir`` itself."""
    if mp.current_process().name.startswith(RANK_PROCESS):
        # Each rank re-imports the caller's main module on start-up (spawn and
        # forkserver alike); a script that calls launch() at top level would launch again.
        raise SecureVFLError(
            "launch() was called inside a rank process: the calling script has no "
            "`if __name__ == '__main__':` guard, so every rank re-ran it on start-up"
        )

    if proto.attacks and not proto.runtime.record_views:
        raise ConfigError(
            "attacks run on the views the ranks record; runtime.record_views is off",
            path="runtime.record_views",
        )
    out_dir = Path(out_dir)
    data_dir = Path(data_dir) if data_dir else out_dir / "data"
    if resume:
        folder = resume_folder(out_dir, overwrite=overwrite, ranks=range(layout_of(proto).world_size))
    else:
        folder = OutputFolder.open(out_dir, overwrite=overwrite, keep=(data_dir,))
    try:
        result = _launch(proto, folder.path, data_dir, progress, resume)
    except BaseException as exc:
        failed = folder.abandon()
        if failed is not None and isinstance(exc, SecureVFLError):
            exc.args = (
                f"{exc} (the earlier result in {out_dir} is untouched; this run's files are in {failed})",
            )
        raise
    folder.commit()
    return result


def _launch(proto: Protocol, out_dir: Path, data_dir: Path, progress: bool, resume: bool) -> dict[str, Any]:
    blob = proto.model_dump_json()
    with materializing(proto, data_dir) as pending:
        procs = start_ranks(
            proto,
            out_dir,
            _child,
            lambda rank, rendezvous: (blob, rank, rendezvous, str(out_dir), str(data_dir), progress, resume),
        )
        if pending:  # while the ranks start up (interpreter, imports, rendezvous)
            try:
                materialize(proto, data_dir)
            except BaseException:
                stop_ranks(procs)
                raise
    return _watch(proto, out_dir, procs)


def rank_context() -> Any:
    """The multiprocessing context ranks start in, from ``SECUREVFL_START_METHOD``.

    ``forkserver`` (the default where the OS has it): a server process, started once
    per launching process and kept for its later runs, imports :data:`RANK_MODULES`
    and forks every rank from itself. A rank then starts in milliseconds instead of
    importing torch, scikit-learn and securevfl again (about 5 CPU s a rank on the
    2026-11-26 test box; a local run's start-up was mostly that). The server is a
    fresh interpreter that has only imported modules (no threads, no process group,
    no CUDA), which is what makes forking it safe; it is the default start method of
    Python 3.14 on Linux. ``spawn``: every rank a fresh interpreter, for tools that
    inject code at interpreter start-up (a ``sitecustomize`` probe, a re-imported
    benchmark script), and the only method on Windows. Each rank gets the launcher's
    environment as it is at launch either way (:func:`_rank_main`)."""
    available = mp.get_all_start_methods()
    method = os.environ.get(START_METHOD_ENV) or ("forkserver" if "forkserver" in available else "spawn")
    if method not in START_METHODS or method not in available:
        raise ConfigError(
            f"{START_METHOD_ENV}={method!r}: ranks start with one of "
            f"{[m for m in START_METHODS if m in available]}"
        )
    ctx = mp.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload(RANK_MODULES)  # read when the server starts; later calls change nothing
    return ctx


def _rank_main(target: Callable[..., None], env: dict[str, str], *args: Any) -> None:
    """A rank's first step: the launcher's environment at launch time (a fork server's
    own is the one it started with), then the rank's entry point."""
    os.environ.clear()
    os.environ.update(env)
    target(*args)


def start_ranks(
    proto: Protocol,
    out_dir: Path,
    target: Callable[..., None],
    args: Callable[[int, str], tuple[Any, ...]],
) -> list[Any]:
    """Start one process per rank (:func:`rank_context`), ``target(*args(rank,
    rendezvous), seed, pins)`` on a free loopback port (``seed``: the rank's
    throw-away identity key, ``pins``: every rank's public key), and record their pids."""
    layout = layout_of(proto)
    rendezvous = f"tcp://127.0.0.1:{free_port()}"
    ctx = rank_context()
    env = dict(os.environ)
    # Throw-away identities for this run (issue #19): every rank gets its own secret
    # key through its start arguments (a local pipe, never a file) and every rank pins
    # all public keys; keys a protocol pins are for multi-host runs and are not used here.
    identities = [Identity.generate() for _ in layout.roles]
    pins = {r.rank: key_string(identities[r.rank].public) for r in layout.roles}
    procs = [
        ctx.Process(
            target=_rank_main,
            name=f"{RANK_PROCESS}{r.rank}",
            args=(target, env, *args(r.rank, rendezvous), identities[r.rank].seed(), pins),
        )
        for r in layout.roles
    ]
    for p in procs:
        p.start()
    ranks_dir = out_dir / "ranks"
    ranks_dir.mkdir(parents=True, exist_ok=True)
    (ranks_dir / "launcher_pids.json").write_text(json.dumps({r: p.pid for r, p in enumerate(procs)}))
    return procs


def watch_ranks(proto: Protocol, procs: list[Any]) -> dict[int, int | None]:
    """Wait for every rank; kill the rest a grace period after the first failure.
    Returns the exit codes by rank.

    Event-driven: it sleeps on the ranks' process sentinels, so it wakes the moment
    a rank ends (no polling slice added to every run); while a failure's grace
    period runs it wakes at the latest when the period is over."""
    grace = proto.runtime.peer_timeout_s + 30.0
    first_failure: float | None = None
    try:
        while alive := [p for p in procs if p.is_alive()]:
            if first_failure is None and any(p.exitcode not in (None, 0) for p in procs):
                first_failure = time.monotonic()
            timeout = None
            if first_failure is not None:
                left = first_failure + grace - time.monotonic()
                if left <= 0:
                    for p in alive:
                        p.kill()
                timeout = max(left, KILL_REAP_S)
            wait_for([p.sentinel for p in alive], timeout=timeout)
    except BaseException:  # Ctrl-C, SIGTERM (securevfl.cli), an error here: no rank outlives it
        stop_ranks(procs)
        raise
    for p in procs:
        p.join()
    return {r: p.exitcode for r, p in enumerate(procs)}


def stop_ranks(procs: list[Any], grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM every rank still running, SIGKILL those alive ``grace_s`` later, and
    reap them all."""
    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + grace_s
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(KILL_REAP_S)


def _watch(proto: Protocol, out_dir: Path, procs: list[Any]) -> dict[str, Any]:
    """The run's result once every rank has ended, or the root cause of its failure."""
    codes = watch_ranks(proto, procs)
    if all(c == 0 for c in codes.values()):
        if proto.attacks:  # DESIGN §6: attacks run on the saved views once every rank is done
            run_attacks(proto, out_dir)
        return json.loads((out_dir / "result.json").read_text())
    raise explain_failure(layout_of(proto), out_dir, codes)


def explain_failure(layout: Layout, out_dir: Path, codes: dict[int, int | None]) -> SecureVFLError:
    """Pick the root cause among the ranks' error files and exit codes."""
    notes: dict[int, ErrorNote] = {}
    for r in codes:
        f = out_dir / "ranks" / f"rank{r}.error.json"
        if f.is_file():
            with contextlib.suppress(Exception):
                notes[r] = ErrorNote.model_validate_json(f.read_text())
    names = layout.names()
    killed = [r for r, c in codes.items() if c is not None and c < 0 and r not in notes]
    origin = [n for n in notes.values() if n.kind != "PartyFailure"]
    if origin:
        n = origin[0]
        cls = ERROR_KINDS.get(n.kind, SecureVFLError)
        # the local launcher's user runs every party, so the owner's detail is theirs
        detail = f" [{n.detail}]" if n.detail else ""
        return cls(f"rank {n.rank} ({names[n.rank]}): {n.message}{detail}")
    if killed:
        r = killed[0]
        sig = signal.Signals(-codes[r]).name  # type: ignore[operator]
        others = sorted(notes)
        return PartyFailure(
            f"rank {r} ({names[r]}) was killed by {sig}; ranks {others} stopped with errors naming it",
            rank=r,
        )
    failures = [n for n in notes.values() if n.lost_rank is not None]
    if failures:
        n = failures[0]
        return PartyFailure(f"rank {n.rank} ({names[n.rank]}): {n.message}", rank=n.lost_rank)
    bad = {r: c for r, c in codes.items() if c != 0}
    return PartyFailure(
        f"ranks exited with codes {bad} before writing an error report; their tracebacks are on "
        "stderr (a rank fails this way when, e.g., the script calling launch() lacks an "
        "`if __name__ == '__main__':` guard)",
        rank=None,
    )
