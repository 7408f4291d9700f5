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

import atexit
import concurrent.futures.thread
import contextlib
import json
import multiprocessing as mp
import os
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from multiprocessing.connection import wait as wait_for
from pathlib import Path
from typing import Any

from securevfl import jsonfile
from securevfl.app.checkpoints import check_one_run
from securevfl.app.epochs import EpochStream
from securevfl.app.failures import RANK_CRASHED, ended_unreported, explain_failure
from securevfl.app.harness import run_attacks
from securevfl.app.loader import resolve_protocol
from securevfl.app.objects import Registration, register_in_rank
from securevfl.app.outdir import OutputFolder, resume_folder
from securevfl.app.rank import Phase, run_rank
from securevfl.app.rank_layout import layout_of
from securevfl.app.rank_server import START_METHOD_ENV as START_METHOD_ENV
from securevfl.app.rank_server import rank_context, start_processes
from securevfl.app.threads import rank_threads
from securevfl.app.training import Train
from securevfl.components import CheckedProtocol
from securevfl.config import Protocol
from securevfl.data.partition import materialize, materializing
from securevfl.errors import (
    ConfigError,
    SecureVFLError,
)
from securevfl.private_files import private_dir, write_private
from securevfl.records import EpochRecord
from securevfl.runtime.layout import Layout
from securevfl.runtime.lifeline import adopt_descendants, die_with, end_descendants
from securevfl.runtime.notes import error_note, exit_code_for, write_error_file
from securevfl.runtime.safepath import safe_env
from securevfl.runtime.secure.keys import Identity, key_string
from securevfl.runtime.session import EXIT_INTERRUPTED
from securevfl.usercode import CodePolicy


def free_port() -> int:
    """A loopback port free at the moment (tests starting `securevfl party` ranks;
    it may be taken before they listen: local launches reserve theirs instead,
    :func:`reserve_port`)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def reserve_port() -> socket.socket:
    """A loopback port for rank 0's rendezvous, held bound (not listening) by the
    launcher until the launch has ended.

    Picking a free port and releasing it before rank 0 listens is a race: another
    process may take the port in between ("Address already in use" after a
    minute of start-up). While this socket is bound, the kernel hands the port to
    no one else: not to another ``bind`` to port 0, not as the local port of an
    outgoing connection, and an explicit ``bind`` to it fails. Rank 0 still binds
    and listens on it, because both sockets set ``SO_REUSEADDR`` (as
    :func:`securevfl.runtime.session.listen_socket` does) and this one never
    listens. The socket is not inherited by the ranks (close-on-exec, and a fork
    server's children get only the descriptors sent to them)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


class RankGroup(list[Any]):
    """One launch's rank processes, by rank, and the port reserved for its
    rendezvous (:func:`reserve_port`), released once every rank has ended."""

    def __init__(self, procs: list[Any], reservation: socket.socket | None = None):
        super().__init__(procs)
        self.reservation = reservation

    def release(self) -> None:
        if self.reservation is not None:
            self.reservation.close()
            self.reservation = None


def _release(procs: list[Any]) -> None:
    if isinstance(procs, RankGroup):
        procs.release()


RANK_PROCESS = "securevfl-rank"
KILL_REAP_S = 0.1  # after killing the ranks left, how long one wait for them lasts at most
STOP_GRACE_S = 2.0  # a stopped launch's ranks get this long to end on SIGTERM before SIGKILL


def _child(
    proto_json: str,
    rank: int,
    rendezvous: str,
    policy: CodePolicy,
    registrations: list[tuple[str, str, str]],
    layout: Layout,
    phase: Phase,
    seed: bytes,
    pins: dict[int, str],
) -> None:
    """A rank of a local launch, whatever its phase (training, resuming, predicting).
    ``policy``: the launcher's user code policy; ``registrations``: the caller's own
    component classes, by reference, loaded under that policy
    (:func:`~securevfl.app.objects.register_in_rank`); ``layout``: the launch's rank
    layout, derived once by the launcher."""
    checked = rank_protocol(proto_json, rank, policy, Path(phase.out_dir), registrations)
    identity = Identity.from_seed(seed)
    # the launcher reports the root cause of a failure once; its ranks do not print theirs too
    sys.exit(run_rank(checked, layout, rank, rendezvous, phase, identity=identity, pins=pins, echo=False))


def rank_protocol(
    proto_json: str,
    rank: int,
    code: CodePolicy,
    out_dir: Path,
    registrations: Sequence[tuple[str, str, str]] = (),
) -> CheckedProtocol:
    """The protocol a rank receives from the local launcher, resolved in the rank
    under the launcher's user code policy (the caller's registered classes
    loaded and its plugins imported here, both under ``code``). User code that
    fails here, though it imported in the launcher, ends the rank with exit code
    2 and its error file, which the launcher reports (once: the rank does not
    print it too)."""
    try:
        register_in_rank(registrations, code)
        return resolve_protocol(Protocol.model_validate_json(proto_json), code, rank=rank)
    except SecureVFLError as exc:
        write_error_file(out_dir, error_note(rank, exc))
        sys.exit(exit_code_for(exc))


def launch(
    checked: CheckedProtocol,
    out_dir: Path,
    *,
    data_dir: Path | None = None,
    progress: bool = True,
    overwrite: bool = False,
    resume: bool = False,
    on_epoch: Callable[[EpochRecord], None] | None = None,
    registrations: tuple[Registration, ...] = (),
) -> dict[str, Any]:
    """Run every rank of a checked protocol locally; return the result record
    (also in out_dir/result.json).

    An ``out_dir`` that already holds results is refused unless ``overwrite``;
    then the new run is written aside and replaces securevfl's earlier files only
    once it has finished (:class:`~securevfl.app.outdir.OutputFolder`).
    ``resume``: continue the interrupted run in ``out_dir`` from the newest
    checkpoint every rank holds (the ranks agree on it at start-up), writing
    into ``out_dir`` itself. ``on_epoch``: called in this process with rank 0's
    :class:`~securevfl.records.EpochRecord` as each epoch ends
    (:mod:`securevfl.app.epochs`); if it raises, every rank is stopped and the
    exception propagates. ``registrations``: the caller's own defense and attack
    classes, registered in every rank for this launch
    (:mod:`securevfl.app.objects`; the caller registers them in this process)."""
    if mp.current_process().name.startswith(RANK_PROCESS):
        # Each rank re-imports the caller's main module on start-up (spawn and
        # forkserver alike); a script that calls launch() at top level would launch again.
        raise SecureVFLError(
            "launch() was called inside a rank process: the calling script has no "
            "`if __name__ == '__main__':` guard, so every rank re-ran it on start-up"
        )

    rank_threads()  # a bad SECUREVFL_THREADS is refused here, not in every rank
    proto = checked.protocol
    if proto.attacks and not proto.runtime.record_views:
        raise ConfigError(
            "attacks run on the views the ranks record; runtime.record_views is off",
            path="runtime.record_views",
        )
    out_dir = Path(out_dir)
    data_dir = Path(data_dir) if data_dir else out_dir / "data"
    layout = layout_of(checked)
    if resume:
        folder = resume_folder(out_dir, overwrite=overwrite, ranks=range(layout.world_size))
        parties = [r.rank for r in layout.roles if r.kind != "helper"]
        try:
            check_one_run(out_dir, parties, protocol_digest=proto.digest_mismatch)
        except BaseException:
            folder.release()
            raise
    else:
        folder = OutputFolder.open(out_dir, overwrite=overwrite, keep=(data_dir,))
    try:
        result = _launch(checked, layout, folder.path, data_dir, progress, resume, on_epoch, registrations)
    except BaseException as exc:
        failed = folder.abandon()
        if failed is not None and isinstance(exc, SecureVFLError):
            exc.args = (
                f"{exc} (the earlier result in {out_dir} is untouched; this run's files are in {failed})",
            )
        raise
    folder.commit()
    return result


def _launch(
    checked: CheckedProtocol,
    layout: Layout,
    out_dir: Path,
    data_dir: Path,
    progress: bool,
    resume: bool,
    on_epoch: Callable[[EpochRecord], None] | None,
    registrations: tuple[Registration, ...],
) -> dict[str, Any]:
    # the launcher's user code policy, for every rank: the file's own modules, and
    # the modules of the caller's own classes (the caller runs every party)
    proto = checked.protocol
    code = checked.code.allowing(r.module for r in registrations)
    regs = [r.for_rank() for r in registrations]
    reader, writer = mp.Pipe(duplex=False) if on_epoch is not None else (None, None)
    stream = None if reader is None or on_epoch is None else EpochStream(reader, on_epoch)

    def phase(rank: int) -> Train:
        return Train(out_dir, data_dir, progress, resume, epochs=writer if rank == 0 else None)

    try:
        with materializing(proto, data_dir) as pending:
            procs = start_ranks(proto, layout, out_dir, phase, policy=code, registrations=regs)
            if writer is not None:
                writer.close()  # rank 0 holds the only writing end: the stream ends with it
            if pending:  # while the ranks start up (interpreter, imports, rendezvous)
                try:
                    materialize(proto, data_dir)
                except BaseException:
                    stop_ranks(procs)
                    raise
        return _watch(checked, layout, out_dir, procs, stream)
    finally:
        if writer is not None:
            writer.close()
        if stream is not None:
            stream.close()


def _rank_main(target: Callable[..., None], env: dict[str, str], launcher: int, *args: Any) -> None:
    """A rank's first steps: end with the launcher, however it ends (SIGKILL
    included: :func:`~securevfl.runtime.lifeline.die_with`), adopt the processes
    its user code starts (:func:`~securevfl.runtime.lifeline.adopt_descendants`),
    take the launcher's environment at launch time (a fork server's own is the one
    it started with), then run the rank's entry point; and its last steps
    (:func:`_end_rank`)."""
    interrupted: list[int] = []

    def on_sigint(signum: int, frame: Any) -> None:
        interrupted.append(signum)
        raise KeyboardInterrupt

    code: int | str | None = 0
    try:
        # Ctrl-C stops the rank from here on (a rank forked by the fork server starts
        # with SIGINT ignored: securevfl.app.rank_preload)
        signal.signal(signal.SIGINT, on_sigint)
        die_with(launcher)
        adopt_descendants()
        os.environ.clear()
        os.environ.update(env)
        target(*args)
    except SystemExit as exc:
        code = exc.code
    except KeyboardInterrupt:
        # Ctrl-C reaches every process of the terminal's group, a rank still starting
        # up included (these first steps too): a stop the launcher reports, not a bug
        # (and a traceback cut short by the launcher's SIGTERM would reach the user's
        # terminal)
        code = EXIT_INTERRUPTED
    except BaseException:
        if interrupted:
            # the interrupt surfaced as another exception: code that catches it and raises
            # its own (pydantic's schema builder turns it into a SchemaError) is still a stop
            code = EXIT_INTERRUPTED
        else:
            # a bug before the rank could report it: keep the traceback
            traceback.print_exc()
            sys.stderr.flush()
            code = RANK_CRASHED
    _end_rank(code)


#: how long a rank that has done its work waits for threads its user code left running
THREAD_GRACE_S = 1.0


def _end_rank(code: int | str | None) -> None:
    """A rank's last steps, once its work is done (or has failed): end the processes
    its user code started (:func:`~securevfl.runtime.lifeline.end_descendants`), and
    exit with ``code``. Threads its user code started and left running (not
    daemons) would keep the process alive at the interpreter's exit, and the
    launcher waiting for it: past :data:`THREAD_GRACE_S` the rank says so and
    leaves without them (``os._exit``, after flushing its output)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # its work is over: a Ctrl-C now is the launcher's
    with contextlib.suppress(Exception):  # nothing to end is no reason to fail the rank's exit
        end_descendants()
    # idle worker threads of thread pools (paillier's modexp pool) end as at the interpreter's exit
    with contextlib.suppress(Exception):
        getattr(concurrent.futures.thread, "_python_exit", lambda: None)()
    deadline = time.monotonic() + THREAD_GRACE_S
    for t in threading.enumerate():
        if t is not threading.current_thread() and not t.daemon:
            t.join(max(0.0, deadline - time.monotonic()))
    left = [t.name for t in threading.enumerate() if t is not threading.current_thread() and not t.daemon]
    if not left:
        sys.exit(code)
    name = mp.current_process().name.removeprefix(RANK_PROCESS)
    print(
        f"securevfl: rank {name}: threads {left} that its user code started were still running when the rank "
        "ended; they were stopped with it",
        file=sys.stderr,
        flush=True,
    )
    atexit._run_exitfuncs()  # the exit handlers still run; only the threads are left behind
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code if isinstance(code, int) else (0 if code is None else 1))


def start_ranks(
    proto: Protocol,
    layout: Layout,
    out_dir: Path,
    phase: Callable[[int], Phase],
    *,
    policy: CodePolicy,
    registrations: Sequence[tuple[str, str, str]] = (),
) -> list[Any]:
    """Start one process per rank of ``layout`` (:func:`rank_context`), each running
    :func:`_child` with the protocol, the launcher's user code ``policy`` and
    ``registrations``, and ``phase(rank)``, on a reserved loopback port
    (:func:`reserve_port`), with its throw-away identity key and every rank's public
    key; and record their pids. Each rank ends with the launcher (:func:`_rank_main`)."""
    ctx = rank_context()
    reservation = reserve_port()
    rendezvous = f"tcp://127.0.0.1:{reservation.getsockname()[1]}"
    env = safe_env(dict(os.environ))
    blob = proto.model_dump_json()
    regs = list(registrations)
    # Throw-away identities for this run (SECURITY.md §4a): every rank gets its own secret
    # key through its start arguments (a local pipe, never a file) and every rank pins
    # all public keys; keys a protocol pins are for multi-host runs and are not used here.
    identities = [Identity.generate() for _ in layout.roles]
    pins = {r.rank: key_string(identities[r.rank].public) for r in layout.roles}
    procs = RankGroup(
        [
            ctx.Process(
                target=_rank_main,
                name=f"{RANK_PROCESS}{r.rank}",
                args=(
                    _child,
                    env,
                    os.getpid(),
                    blob,
                    r.rank,
                    rendezvous,
                    policy,
                    regs,
                    layout,
                    phase(r.rank),
                    identities[r.rank].seed(),
                    pins,
                ),
            )
            for r in layout.roles
        ],
        reservation,
    )
    try:
        start_processes(procs)
        pids = out_dir / "ranks" / "launcher_pids.json"
        try:
            private_dir(pids.parent)
            write_private(pids, json.dumps({r: p.pid for r, p in enumerate(procs)}))
        except OSError as exc:  # the error of a failed write does not name its file
            raise OSError(exc.errno, exc.strerror, str(pids)) from None
    except BaseException:  # a full disk, Ctrl-C: no rank outlives a failed start
        stop_ranks([p for p in procs if p.pid is not None])
        procs.release()
        raise
    return procs


def watch_ranks(
    proto: Protocol,
    procs: list[Any],
    stream: EpochStream | None = None,
    *,
    unreported: Callable[[int, int], bool] | None = None,
) -> dict[int, int | None]:
    """Wait for every rank; kill the rest a grace period after the first failure.
    Returns the exit codes by rank; None for a rank this launcher had to kill (it
    stalled: it did not end by itself within the grace period, or a peer ended
    without a word). ``stream``: rank 0's epoch records, delivered as they come
    (the last ones once every rank has ended); if delivering one raises, every
    rank is stopped and it propagates. ``unreported(rank, code)``: whether a rank
    that exited with ``code`` ended without saying why
    (:func:`~securevfl.app.failures.ended_unreported`); the others, which would
    wait for it until their watchdogs give up on its heartbeat, are stopped at once.

    Event-driven: it sleeps on the ranks' process sentinels (and the stream), so it
    wakes the moment a rank ends (no polling slice added to every run); while a
    failure's grace period runs it wakes at the latest when the period is over."""
    grace = proto.runtime.peer_timeout_s + 30.0
    first_failure: float | None = None
    killed: set[int] = set()
    seen: set[int] = set()
    try:
        while alive := [p for p in procs if p.is_alive()]:
            if stream is not None and stream.open and stream.conn.poll(0):
                stream.receive()
                continue
            ended = [r for r, p in enumerate(procs) if p.exitcode is not None and r not in seen]
            seen.update(ended)
            if unreported is not None and any(unreported(r, procs[r].exitcode) for r in ended):
                killed.update(procs.index(p) for p in alive)
                stop_ranks(procs)
                break
            if first_failure is None and any(p.exitcode not in (None, 0) for p in procs):
                first_failure = time.monotonic()
            timeout = None
            if first_failure is not None:
                left = first_failure + grace - time.monotonic()
                if left <= 0:
                    for p in alive:
                        killed.add(procs.index(p))
                        p.kill()
                timeout = max(left, KILL_REAP_S)
            listening = [stream.conn] if stream is not None and stream.open else []
            wait_for([p.sentinel for p in alive] + listening, timeout=timeout)
        if stream is not None:
            stream.drain()
    except BaseException:  # Ctrl-C, SIGTERM (securevfl.cli), a callback's error: no rank outlives it
        stop_ranks(procs)
        raise
    for p in procs:
        p.join()
    _release(procs)
    return {r: None if r in killed else p.exitcode for r, p in enumerate(procs)}


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
    _release(procs)


#: how long a launcher whose ranks all stopped on a Ctrl-C waits for its own (seconds)
INTERRUPT_GRACE_S = 0.5


def _watch(
    checked: CheckedProtocol,
    layout: Layout,
    out_dir: Path,
    procs: list[Any],
    stream: EpochStream | None = None,
) -> dict[str, Any]:
    """The run's result once every rank has ended, or the root cause of its failure."""
    proto = checked.protocol
    codes = watch_ranks(
        proto, procs, stream, unreported=lambda r, c: ended_unreported(out_dir, r, c, Train.files)
    )
    if all(c == 0 for c in codes.values()) and (out_dir / "result.json").is_file():
        if proto.attacks:  # docs/design.md §6: attacks run on the saved views once every rank is done
            run_attacks(checked, layout, out_dir)
        return jsonfile.loads((out_dir / "result.json").read_text())
    if all(c in (0, EXIT_INTERRUPTED) for c in codes.values()) and EXIT_INTERRUPTED in codes.values():
        # every rank stopped on a Ctrl-C to the terminal's group: this process got the same
        # signal, whose handler may not have run yet when the ranks' exits are seen. Give it a
        # moment to (so that it is the one interrupt this process sees), else say it here
        time.sleep(INTERRUPT_GRACE_S)
        raise KeyboardInterrupt
    raise explain_failure(layout, out_dir, codes, Train.files)
