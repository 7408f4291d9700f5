"""Why a local launch failed: the root cause among the ranks' error reports and
exit codes, as the one error the launcher raises (named rank, named party, the
owner's message)."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

from securevfl.errors import (
    CheckpointError,
    ConfigError,
    DataError,
    Diverged,
    OutputError,
    PartyFailure,
    ProtocolError,
    SecureVFLError,
)
from securevfl.private_files import open_private, private_dir
from securevfl.runtime.layout import Layout
from securevfl.runtime.notes import EXIT_INTERRUPTED, EXIT_PARTY_FAILURE, EXIT_USER_ERROR
from securevfl.runtime.session import ErrorNote

#: a rank's exit code when its entry point raised before the rank could report it;
#: exit code 1 without a report then means it failed before its entry point ran
RANK_CRASHED = 70
#: written to the output folder to tell a full disk from other silent failures
PROBE_BYTES = 1 << 16

ERROR_KINDS: dict[str, type[SecureVFLError]] = {
    "ConfigError": ConfigError,
    "UnsupportedCombination": ConfigError,
    "UserCodeError": ConfigError,
    "CryptoParameterError": ConfigError,
    "DataError": DataError,
    "CheckpointError": CheckpointError,
    "Diverged": Diverged,
    "ProtocolError": ProtocolError,
    "PartyFailure": PartyFailure,
    "OutputError": OutputError,
}


#: exit codes that say something of their own: a failure the rank reported (its error
#: file says which), a stop, a crash with its traceback, a failure before its code ran
SPEAKING_CODES = frozenset({1, EXIT_USER_ERROR, EXIT_PARTY_FAILURE, EXIT_INTERRUPTED, RANK_CRASHED})


def ended_unreported(out_dir: Path, rank: int, code: int | None, files: str = "") -> bool:
    """Whether a rank that exited with ``code`` by itself left no word of why:
    exit code 0 before its work was done (no run summary,
    ``ranks/rank<R>.<files>summary.json``, which a rank writes as it finishes), or
    an exit code of no meaning to securevfl without an error report. Something in
    its process ended it: user code calling ``os._exit``. (A signal is named by
    :func:`explain_failure` as it is.)"""
    ranks = Path(out_dir) / "ranks"
    if code == 0:
        return not (ranks / f"rank{rank}.{files}summary.json").is_file()
    if code is None or code < 0 or code in SPEAKING_CODES:
        return False
    return not (ranks / f"rank{rank}.error.json").is_file()


def explain_failure(
    layout: Layout, out_dir: Path, codes: dict[int, int | None], files: str = ""
) -> SecureVFLError:
    """Pick the root cause among the ranks' error files and exit codes (``files``:
    the prefix of the phase's summary files, :func:`ended_unreported`)."""
    notes: dict[int, ErrorNote] = {}
    for r in codes:
        f = out_dir / "ranks" / f"rank{r}.error.json"
        if f.is_file():
            with contextlib.suppress(Exception):
                notes[r] = ErrorNote.model_validate_json(f.read_text())
    names = layout.names()
    # a signal this launcher did not send (codes of ranks it killed are None)
    killed = [r for r, c in codes.items() if c is not None and c < 0 and r not in notes]
    origin = [n for n in notes.values() if n.kind != "PartyFailure"]
    if origin:
        n = origin[0]
        cls = ERROR_KINDS.get(n.kind, SecureVFLError)
        # the local launcher's user runs every party, so the owner's detail is theirs
        detail = f" [{n.detail}]" if n.detail else ""
        return cls(f"rank {n.rank} ({names[n.rank]}): {n.message}{detail}")
    quiet = [r for r, c in codes.items() if r not in notes and ended_unreported(out_dir, r, c, files)]
    if any(c is not None and c != 0 and (c < 0 or c in SPEAKING_CODES) for c in codes.values()):
        # a rank that says why it ended is the cause before one that ended with 0
        quiet = [r for r in quiet if codes[r] != 0]
    if quiet:
        r = quiet[0]
        how = "before finishing its work" if codes[r] == 0 else "by itself"
        also = f" (so did {', '.join(f'rank {q} ({names[q]})' for q in quiet[1:])})" if quiet[1:] else ""
        stopped_too = "; the launcher stopped the other ranks" if None in codes.values() else ""
        return PartyFailure(
            f"rank {r} ({names[r]}) exited with code {codes[r]} {how}, without reporting an error{also}: "
            "something in its process ended it (user code calling os._exit(), in a model factory, a "
            f"defense or a plugin){stopped_too}",
            rank=r,
        )
    if killed:
        r = killed[0]
        sig = signal.Signals(-codes[r]).name  # type: ignore[operator]
        others = sorted(notes)
        return PartyFailure(
            f"rank {r} ({names[r]}) was killed by {sig}; ranks {others} stopped with errors naming it",
            rank=r,
        )
    stalled = [r for r, c in codes.items() if c is None]
    stopped = (
        f" ({', '.join(f'rank {r} ({names[r]})' for r in stalled)} did not end by itself and was stopped "
        "by the launcher)"
        if stalled
        else ""
    )
    # a rank that found the fault in itself (its user code stuck: securevfl.runtime.watchdog)
    # before the peers that name it
    failures = sorted(
        (n for n in notes.values() if n.lost_rank is not None), key=lambda n: (n.lost_rank != n.rank, n.rank)
    )
    if failures:
        n = failures[0]
        own = f"rank {n.rank} ({names[n.rank]})"
        said = n.message if n.message.startswith(own) else f"{own}: {n.message}"
        return PartyFailure(f"{said}{stopped}", rank=n.lost_rank)
    return _without_reports(out_dir, codes, names, stopped)


def _without_reports(
    out_dir: Path, codes: dict[int, int | None], names: dict[int, str], stopped: str
) -> SecureVFLError:
    """Why ranks failed without writing an error report, as far as the launcher can
    tell: a folder it cannot write either (a full disk), ranks that failed before
    their entry point ran (exit code 1: a rank first re-imports the main module of
    the program that launched it), a rank that crashed (:data:`RANK_CRASHED`)."""
    bad = {r: c for r, c in codes.items() if c not in (0, None)}
    try:
        probe = out_dir / "ranks" / f".securevfl-probe-{os.getpid()}"
        private_dir(probe.parent)
        try:
            with open_private(probe) as fh:
                fh.write(bytes(PROBE_BYTES))
                fh.flush()
                os.fsync(fh.fileno())
        finally:
            probe.unlink(missing_ok=True)
    except OSError as exc:
        return OutputError(
            f"ranks {sorted(bad)} stopped without writing an error report: the output folder {out_dir} "
            f"cannot be written ({exc.strerror or exc}); free some space or choose another --out{stopped}"
        )
    if any(c == 1 for c in bad.values()):
        return PartyFailure(
            f"ranks exited with codes {bad} before writing an error report: they failed before their own "
            "code ran, while importing the main module of the program that launched them (a script "
            "that calls launch() needs an `if __name__ == '__main__':` guard); their tracebacks are on "
            f"stderr{stopped}",
            rank=None,
        )
    crashed = [r for r, c in bad.items() if c == RANK_CRASHED]
    if crashed:
        r = crashed[0]
        return PartyFailure(
            f"rank {r} ({names[r]}) failed with an internal error before it could report it; its "
            f"traceback is on stderr{stopped}",
            rank=r,
        )
    return PartyFailure(
        f"ranks exited with codes {bad} before writing an error report; their messages are on "
        f"stderr{stopped}",
        rank=None,
    )
