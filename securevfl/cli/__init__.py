"""Command line: ``securevfl run|party|predict|audit|attack|keygen|compare|validate|list|criteo``.

User errors (bad protocol file, bad data, a peer that failed) exit with code 2
(3 for a lost peer) and a one-paragraph message; ``--debug`` shows the traceback.

This module parses the command line and dispatches; each command lives in a
module of this package (:data:`COMMANDS`), imported when that command runs, so
``--help``, ``list`` and ``validate`` never pay for torch or the reports.
"""

from __future__ import annotations

import argparse
import atexit
import os
import signal
import sys
import textwrap
import threading
import warnings
from collections.abc import Callable
from types import FrameType

from securevfl.app.outdir import output_error
from securevfl.app.rank_server import stop_rank_server
from securevfl.errors import PartyFailure, SecureVFLError, UserCodeError, show_warning
from securevfl.registry import Registry

#: a command: its parsed arguments in, its exit code out
Command = Callable[[argparse.Namespace], int]


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a protocol field, e.g. --set training.epochs=3 (repeatable)",
    )
    p.add_argument("--debug", action="store_true", help="show tracebacks")


def _add_overwrite(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace securevfl's earlier results in the output folder (once the new run has "
        "finished; other files are left alone); without it a non-empty folder is refused",
    )


def _add_data(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--data",
        action="append",
        default=[],
        metavar="PARTY=PATH",
        help="prediction: the file of new records of party PARTY (repeatable; default: the file "
        "its party entry names)",
    )


def _add_resume(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue the interrupted run in --out from the newest checkpoint every rank holds "
        "(training.checkpoint_every writes them under OUT/ranks/rank<R>/checkpoints)",
    )


def _add_allow(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument(
        "--allow-plugin",
        dest="allow_plugins",
        action="append",
        default=[],
        metavar="MODULE|PATH|NAME=sha256:DIGEST",
        help=f"allow {what} to import code for the protocol file: a plugin it names, or this party's "
        "model factory (repeatable). MODULE: your installed module (and its submodules), never "
        "looked up beside the protocol file; PATH: the module is that .py file or package folder; "
        "NAME=sha256:DIGEST: NAME.py beside the protocol file, if its SHA-256 is DIGEST. A module "
        "the file names but no --allow-plugin allows is refused before anything is imported "
        "(SECURITY.md §4b)",
    )


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="securevfl", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run every rank of a protocol locally, one process each")
    run.add_argument("file")
    run.add_argument("--out", help="output folder (default: runs/<protocol name>)")
    run.add_argument("--data-dir", help="where built-in datasets are materialized (default: OUT/data)")
    run.add_argument("--quiet", action="store_true", help="no progress display")
    _add_overwrite(run)
    _add_resume(run)
    _add_common(run)

    party = sub.add_parser("party", help="run one rank (one organization) of a protocol")
    party.add_argument("file")
    party.add_argument("--rank", type=int, required=True)
    party.add_argument("--rendezvous", required=True, help="tcp://HOST:PORT, hosted by rank 0")
    party.add_argument("--out", help="output folder (default: runs/<protocol name>-rank<R>)")
    party.add_argument("--data-dir", help="where built-in datasets are materialized (default: OUT/data)")
    party.add_argument("--quiet", action="store_true")
    party.add_argument(
        "--predict",
        metavar="RUN_DIR",
        help="predict with this rank's model saved in RUN_DIR (its output folder of the training "
        "run) instead of training; every rank of the prediction is started with --predict",
    )
    party.add_argument(
        "--key",
        help="this party's secret key file (securevfl keygen); required when the protocol pins this "
        "rank's key, otherwise a throw-away key is used and the peers cannot authenticate this rank",
    )
    _add_allow(party, "this rank")
    _add_data(party)
    _add_overwrite(party)
    _add_resume(party)
    _add_common(party)

    pred = sub.add_parser(
        "predict",
        help="apply a trained model to new records, every rank locally (federated prediction)",
        description="Every party loads its own saved model from RUN_DIR and its own file of new "
        "records, the parties align the IDs by PSI and the exchange backend of the run computes the "
        "scores; the active party writes OUT/predictions.csv.",
    )
    pred.add_argument("run_dir", metavar="RUN_DIR", help="output folder of the training run")
    pred.add_argument("--out", required=True, help="output folder for predictions.csv")
    pred.add_argument(
        "--data-dir",
        help="where built-in datasets are materialized (default: RUN_DIR/data where the run left them, "
        "else a temporary folder; the run's folder is only read)",
    )
    _add_data(pred)
    _add_overwrite(pred)
    pred.add_argument("--debug", action="store_true", help="show tracebacks")

    kg = sub.add_parser(
        "keygen",
        help="write a party's long-term identity key pair (PARTY.key, secret, mode 0600; PARTY.pub)",
    )
    kg.add_argument("--party", required=True, help="the party (or helper, e.g. dealer) the key is for")
    kg.add_argument(
        "--out", required=True, help="folder for the key files (existing files are never overwritten)"
    )
    kg.add_argument("--debug", action="store_true", help="show tracebacks")

    cmp_ = sub.add_parser(
        "compare",
        help="run several protocols (per seed, per grid point) and tabulate them",
        description="Runs every protocol once per seed and grid point into OUT/<protocol>[/<point>]/seed<S>; "
        "runs already finished there with the same protocol are reused, so an interrupted comparison "
        "continues where it stopped.",
    )
    cmp_.add_argument("files", nargs="+", help="protocol files, folders of them, or one comparison file")
    cmp_.add_argument("--out", default="runs/compare")
    cmp_.add_argument(
        "--seeds",
        type=int,
        nargs="+",
        metavar="SEED",
        help="run each protocol once per seed (training.seed); the report gives mean and 95%% interval",
    )
    cmp_.add_argument(
        "--grid",
        action="append",
        default=[],
        metavar="KEY=V1,V2,...",
        help="expand every protocol into one run per value (KEY as in --set, list indices allowed; "
        "repeatable: the product of all axes), e.g. --grid parties.active.defenses[0].params.epsilon=0.5,1,2;"
        " a protocol without the list element KEY goes through (no defense) runs once, as the reference row",
    )
    cmp_.add_argument("--quiet", action="store_true", help="no per-run progress display")
    cmp_.add_argument(
        "--overwrite",
        action="store_true",
        help="re-run every run, also those already finished in OUT with the same protocol",
    )
    _add_common(cmp_)

    val = sub.add_parser(
        "validate",
        help="check protocol files without running them",
        description="Checks protocol files (or comparison files) without running them. A file's "
        "plugins are imported (they register the components it names) only where --allow-plugin "
        "allows them: a file received from another organization can be validated without running "
        "its code. Model factories are not imported.",
    )
    val.add_argument("files", nargs="+")
    _add_allow(val, "validate")
    _add_common(val)

    aud = sub.add_parser(
        "audit",
        help="re-audit a finished run's DP mechanisms from its saved models (no retraining)",
        description="Rebuilds every party's defense stack from RUN's saved models under fresh noise keys, "
        "runs each declared DP mechanism on canaries at its boundary and prints the audited lower bound "
        "on epsilon beside the claim (docs/privacy.md, 'The audit'). Exits 1 when a sound claim is "
        "violated, 2 for a folder that is not a finished run.",
    )
    aud.add_argument("run_dir", metavar="RUN", help="output folder of the training run")
    aud.add_argument(
        "--trials", type=int, help="canary trials per mechanism (default: the run's privacy.audit)"
    )
    aud.add_argument("--confidence", type=float, help="confidence of the lower bound (default: the run's)")
    aud.add_argument("--debug", action="store_true", help="show tracebacks")

    atk = sub.add_parser(
        "attack",
        help="run an attack again on a finished run's saved views (no retraining)",
        description="Runs attack NAME on the views RUN's ranks saved (a run saves them when its protocol "
        "lists attacks or sets runtime.dump_views), on the adversary's view alone with the attack's "
        "declared prior knowledge, as an attack listed in the protocol runs after training "
        "(docs/attacks.md, 'Attacking a finished run'). Prints its metrics and writes them to "
        "RUN/attacks/<key>.json; the run's result.json stays as it was.",
    )
    atk.add_argument("run_dir", metavar="RUN", help="output folder of the training run")
    atk.add_argument("--attack", required=True, metavar="NAME", help="a registered attack (securevfl list)")
    atk.add_argument(
        "--param",
        dest="params",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an option of the attack, e.g. --param target=left --param aux_fraction=0.2 (repeatable)",
    )
    atk.add_argument(
        "--plugin",
        dest="plugins",
        action="append",
        default=[],
        metavar="MODULE|PATH",
        help="your own module that registers the attack, imported in this process only, before the "
        "run's protocol is checked: an installed module, a .py file or package folder by its path, or "
        "NAME=sha256:DIGEST for NAME.py beside the run's protocol file (as --allow-plugin; repeatable)",
    )
    atk.add_argument("--debug", action="store_true", help="show tracebacks")

    lst = sub.add_parser("list", help="registered backends, defenses, attacks, datasets, models")
    crit = sub.add_parser(
        "criteo",
        help="split a Criteo TSV into the passive and active parties' CSV files (docs/methods/dravl.md §4.4)",
    )
    crit.add_argument("file", help="Criteo Display Advertising TSV (label, I1..I13, C1..C26)")
    crit.add_argument("--out", required=True, help="folder for passive.csv, active.csv, protocol.yaml")
    crit.add_argument("--top-k", type=int, default=8, help="one-hot columns per categorical field")
    crit.add_argument("--max-rows", type=int, help="read at most this many records")
    crit.add_argument("--debug", action="store_true", help="show tracebacks")
    lst.add_argument("--debug", action="store_true")
    return ap


#: ``command -> "module:function"``: a command's module is imported when it runs, so
#: ``securevfl --help``, ``list`` and ``validate`` load no torch, scikit-learn or plotting
COMMANDS: Registry[Command] = Registry("command")
COMMANDS.add_path("run", "securevfl.cli.launching:cmd_run")
COMMANDS.add_path("party", "securevfl.cli.training:cmd_party")
COMMANDS.add_path("predict", "securevfl.cli.launching:cmd_predict")
COMMANDS.add_path("compare", "securevfl.cli.launching:cmd_compare")
COMMANDS.add_path("keygen", "securevfl.cli.keys:cmd_keygen")
COMMANDS.add_path("validate", "securevfl.cli.checking:cmd_validate")
COMMANDS.add_path("list", "securevfl.cli.checking:cmd_list")
COMMANDS.add_path("criteo", "securevfl.cli.criteo:cmd_criteo")
COMMANDS.add_path("audit", "securevfl.cli.audit:cmd_audit")
COMMANDS.add_path("attack", "securevfl.cli.attack:cmd_attack")


LAUNCHING = frozenset({"run", "predict", "compare"})  # commands that start every rank locally


class Terminated(KeyboardInterrupt):
    """SIGTERM reached the command (``kill``, ``timeout``, a job scheduler): it stops
    as on Ctrl-C, and the launcher stops every rank it started (no orphaned ranks)."""


def _on_stop(signum: int, frame: FrameType | None) -> None:
    """SIGTERM or Ctrl-C to a command that started ranks: stop it, once. Later
    signals of either kind are ignored while it stops (a stop takes moments:
    :func:`_stopped`); raised again inside the stop, they would cut it short with a
    traceback, and one that came after the handler is put back would end the
    command by the signal itself (exit -15 rather than 143)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise Terminated if signum == signal.SIGTERM else KeyboardInterrupt


#: the exceptions :func:`_on_stop` raises, by the signal that raised them
_STOP_SIGNALS: tuple[tuple[type[BaseException], signal.Signals], ...] = (
    (Terminated, signal.SIGTERM),
    (KeyboardInterrupt, signal.SIGINT),
)


def _stop_signal(exc_type: type[BaseException]) -> signal.Signals | None:
    """The signal whose stop ``exc_type`` is (:func:`_on_stop`), or None."""
    return next((sig for kind, sig in _STOP_SIGNALS if issubclass(exc_type, kind)), None)


#: how long after a stop was swallowed (:func:`_stop_hook`) it is delivered again (seconds)
REDELIVER_S = 0.01


def _stop_hook(
    previous: Callable[[sys.UnraisableHookArgs], object],
) -> Callable[[sys.UnraisableHookArgs], None]:
    """A ``sys.unraisablehook`` for a command that stops on SIGTERM and Ctrl-C
    (:func:`_on_stop`). A signal handler runs wherever the main thread happens to
    be, and where that is a weakref callback (an import lock's), a ``__del__`` or
    another place whose exceptions cannot propagate, the stop :func:`_on_stop`
    raises there is swallowed: Python prints it as "Exception ignored in: ..."
    with a traceback and goes on, the command not stopped. This hook prints
    nothing for such a stop and delivers it again: it puts :func:`_on_stop` back
    for that signal (which it had set to be ignored) and sends the signal to the
    main thread :data:`REDELIVER_S` later, from a timer thread, so that the
    handler raises it once the callback has returned, where the command's stop
    path takes it (:func:`securevfl.app.launcher.stop_ranks`, :func:`_stopped`);
    the signal wakes a main thread asleep in a system call (waiting on its ranks),
    as the first one would have. Marking the signal pending at once instead would
    run the handler inside this hook, itself a place whose exceptions cannot
    propagate. One that lands in such a place again is delivered again; none is
    sent once the command has ended (its hook put back).

    Every other unraisable exception goes to ``previous`` unchanged, as does a
    stop in another thread (no signal handler raised it there)."""

    def redeliver(thread: int, sig: signal.Signals) -> None:
        if sys.unraisablehook is hook:  # the command has not ended meanwhile
            signal.pthread_kill(thread, sig)

    def hook(unraisable: sys.UnraisableHookArgs) -> None:
        sig = _stop_signal(unraisable.exc_type)
        main = threading.main_thread()
        if sig is None or threading.current_thread() is not main or main.ident is None:
            previous(unraisable)
            return
        signal.signal(sig, _on_stop)
        timer = threading.Timer(REDELIVER_S, redeliver, (main.ident, sig))
        timer.daemon = True  # nothing to wait for at the command's exit
        timer.start()

    return hook


def _stopped(command: str, code: int, *, program: bool) -> int:
    """The end of a command stopped by Ctrl-C or SIGTERM, once it has said so: a
    command that started ranks (the launcher has stopped them by now:
    :func:`securevfl.app.launcher.stop_ranks`) ends its fork server
    (:func:`~securevfl.app.rank_server.stop_rank_server`) and, when it is the
    program itself (``argv`` not given), ends the process at once, without
    tearing down its interpreter: that teardown (torch, scikit-learn, securevfl
    loaded) costs about 1 CPU s and waits on every rank process's exit status
    (multiprocessing joins its children at exit), which is nothing a stopped
    command needs. A stop then takes the ranks' grace period at most
    (``STOP_GRACE_S``) plus the launcher's own few steps, however loaded the
    machine (README, Ctrl-C and SIGTERM). Returns ``code`` otherwise."""
    if command in LAUNCHING:
        stop_rank_server()
        if program:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    return code


def _error(exc: SecureVFLError, code: int) -> int:
    """Print ``exc`` as the command's one-paragraph error; return ``code``."""
    msg = textwrap.fill(f"securevfl: error: {exc}", width=100, break_long_words=False, break_on_hyphens=False)
    print(msg, file=sys.stderr)
    detail = getattr(exc, "detail", None) if isinstance(exc, UserCodeError) else None
    if detail:  # the user code's own exception, on this machine's terminal
        print(f"securevfl: {detail}", file=sys.stderr)
    return code


#: commands whose process runs a rank itself (torch.distributed's native objects live in it)
RANK_COMMANDS = frozenset({"party"})


def entry() -> None:
    """The ``securevfl`` console command: :func:`main`, then the end of the process.

    A process that ran a rank (``securevfl party``) or started ranks (:data:`LAUNCHING`)
    ends as soon as its files are written and its exit handlers have run, without the
    interpreter's own teardown, which ``os._exit`` skips:

    - in a rank, the teardown of torch.distributed's native objects (the rendezvous
      store, gloo's threads) kept each party process alive 5-7 s after its "done" line;
    - in a launching command, the teardown of an interpreter with torch, pandas and
      scikit-learn loaded took 1.4 s at idle after the exit handlers, and tens of
      seconds at load 11 on two cores; and the ranks' fork server, which holds the
      command's stderr, tore down its own interpreter after the command had ended
      (:func:`~securevfl.app.rank_server.stop_rank_server`, which ends it at once: its
      ranks have ended by now, and it holds nothing else).

    Other commands exit as usual."""
    code = main()
    command = sys.argv[1] if len(sys.argv) > 1 else None
    if command in LAUNCHING:
        stop_rank_server()
    if command in RANK_COMMANDS or command in LAUNCHING:
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    warnings.showwarning = show_warning
    if not args.debug:
        # torch's C++ logs append native stack traces; securevfl reports its errors
        # itself. torch reads this when it loads: in this process (a command that
        # needs torch loads it after this line) and in the ranks the local launcher
        # spawns, which inherit it.
        os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")
    # the commands that start ranks themselves stop them on SIGTERM and Ctrl-C, once
    # (_on_stop); elsewhere (one `party` rank, which may sit in a transport call) SIGTERM
    # keeps its default action
    stops_ranks = args.command in LAUNCHING and threading.current_thread() is threading.main_thread()
    stops = (signal.SIGTERM, signal.SIGINT) if stops_ranks else ()
    previous = {sig: signal.signal(sig, _on_stop) for sig in stops}
    unraisable = sys.unraisablehook
    if stops_ranks:  # a stop landing where its exception cannot propagate is delivered again
        sys.unraisablehook = _stop_hook(unraisable)
    try:
        return COMMANDS.get(args.command)(args)
    except SecureVFLError as exc:
        if args.debug:
            raise
        return _error(exc, 3 if isinstance(exc, PartyFailure) and args.command != "validate" else 2)
    except OSError as exc:  # a full disk or a read-only folder under the command itself
        user = output_error(exc, shared=False)
        if user is None or args.debug:
            raise
        return _error(user, 2)
    except Terminated:
        print("securevfl: terminated (SIGTERM); every rank this command started was stopped", file=sys.stderr)
        return _stopped(args.command, 128 + signal.SIGTERM, program=argv is None)
    except KeyboardInterrupt:
        print("securevfl: interrupted", file=sys.stderr)
        return _stopped(args.command, 130, program=argv is None)
    finally:
        sys.unraisablehook = unraisable
        for sig, handler in previous.items():
            if handler is not None:
                signal.signal(sig, handler)


if __name__ == "__main__":
    sys.exit(main())
