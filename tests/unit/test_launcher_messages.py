"""What the local launcher says when ranks fail (securevfl.app.failures.explain_failure):
the root cause from the ranks' error reports, a signal the launcher did not send,
a rank the launcher itself had to stop (not "killed by SIGKILL"), and, without any
report, a cause it can tell: a folder it cannot write, ranks that failed before
their own code ran (the only case for the ``__main__`` guard hint), a crash."""

from __future__ import annotations

from pathlib import Path

import pytest

from securevfl.app.failures import RANK_CRASHED, explain_failure
from securevfl.app.loader import load_checked_dict, load_protocol_dict
from securevfl.app.rank_layout import layout_of
from securevfl.errors import OutputError, PartyFailure, UserCodeError
from securevfl.runtime.session import ErrorNote, Session, write_error_file
from tests.support.protocols import load_yaml

LAYOUT = layout_of(load_checked_dict(load_yaml("plain.yaml")))


def _note(out: Path, rank: int, message: str, lost: int | None = None) -> None:
    write_error_file(out, ErrorNote(rank=rank, kind="PartyFailure", message=message, lost_rank=lost))


def test_a_rank_the_launcher_stopped_is_not_reported_as_killed(tmp_path):
    _note(tmp_path, 0, "rank 2 (passive 'right') stopped responding", lost=2)
    _note(tmp_path, 1, "lost rank 2", lost=2)
    exc = explain_failure(LAYOUT, tmp_path, {0: 3, 1: 3, 2: None})
    text = str(exc)
    assert isinstance(exc, PartyFailure) and exc.rank == 2
    assert "SIGKILL" not in text and "killed" not in text, text
    assert text == (
        "rank 0 (active 'active'): rank 2 (passive 'right') stopped responding (rank 2 (passive 'right') "
        "did not end by itself and was stopped by the launcher)"
    )


def test_a_signal_from_elsewhere_is_named(tmp_path):
    _note(tmp_path, 0, "lost rank 1", lost=1)
    text = str(explain_failure(LAYOUT, tmp_path, {0: 3, 1: -9, 2: 3}))
    assert text.startswith("rank 1 (passive 'left') was killed by SIGKILL"), text


def test_the_guard_hint_only_for_ranks_that_failed_before_their_code_ran(tmp_path):
    text = str(explain_failure(LAYOUT, tmp_path, {0: 1, 1: 1, 2: 1}))
    assert "before their own code ran" in text and "__main__" in text, text
    for codes in ({0: RANK_CRASHED, 1: 0, 2: 0}, {0: 2, 1: 3, 2: 3}):
        text = str(explain_failure(LAYOUT, tmp_path, codes))
        assert "__main__" not in text, text
    assert "rank 0 (active 'active') failed with an internal error" in str(
        explain_failure(LAYOUT, tmp_path, {0: RANK_CRASHED, 1: 0, 2: 0})
    )


def test_a_folder_that_cannot_be_written_is_named_as_the_cause(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("x")  # ranks/ cannot be made under a file
    exc = explain_failure(LAYOUT, blocked, {0: 2, 1: 2, 2: 3})
    assert isinstance(exc, OutputError)
    assert f"the output folder {blocked} cannot be written (Not a directory)" in str(exc)


@pytest.mark.parametrize("code", [2, 3])
def test_no_report_and_a_writable_folder(tmp_path, code):
    text = str(explain_failure(LAYOUT, tmp_path, {0: code, 1: 0, 2: 0}))
    bad = {0: code}
    assert (
        text == f"ranks exited with codes {bad} before writing an error report; their messages are on stderr"
    )
    assert not list((tmp_path / "ranks").iterdir())  # the probe is gone


def test_a_local_ranks_failure_reaches_the_terminal_once(tmp_path, capsys):
    """A factory that raises in rank 1: that rank and the peers that hear of it
    write their error files, and under the local launcher (``echo=False``) print
    nothing; the launcher's one error names the root cause and its detail once.
    A ``securevfl party`` rank (``echo`` by default) prints its own."""
    proto = load_protocol_dict(load_yaml("plain.yaml"))
    says = "bottom model of party 'left': factory 'my_models:raising' raised ValueError"
    root = UserCodeError(says, path="parties.passive[0].model", detail="ValueError: no model (line 3)")
    sessions = {r: Session(proto, LAYOUT, r, "tcp://127.0.0.1:29500", tmp_path, echo=False) for r in range(3)}
    sessions[1].report(root)
    for r in (0, 2):
        sessions[r].report(PartyFailure(f"rank 1 (passive 'left') failed: {root}", rank=1))
    assert capsys.readouterr().err == ""
    text = str(explain_failure(LAYOUT, tmp_path, {0: 3, 1: 2, 2: 3}))
    assert text.count(says) == 1 and text.startswith("rank 1 (passive 'left'): ")
    assert "[ValueError: no model (line 3)]" in text
    Session(proto, LAYOUT, 1, "tcp://127.0.0.1:29500", tmp_path / "party").report(root)
    err = capsys.readouterr().err
    assert err.count(says) == 1 and "for its owner only: ValueError: no model (line 3)" in err


def test_a_rank_that_ended_by_itself_is_the_cause_with_its_exit_code(tmp_path):
    """A rank that exited without a report with a code of its own (user code's
    ``os._exit(7)``), or with 0 before its summary was written, is named with its code,
    before the peers' reports naming it; a rank that says why it ended comes first."""
    _note(tmp_path, 0, "rank 1 (passive 'left') stopped responding", lost=1)
    text = str(explain_failure(LAYOUT, tmp_path, {0: 3, 1: 7, 2: None}))
    assert text.startswith(
        "rank 1 (passive 'left') exited with code 7 by itself, without reporting an error"
    ), text
    assert text.endswith("the launcher stopped the other ranks"), text
    (tmp_path / "ranks" / "rank0.error.json").unlink()
    text = str(explain_failure(LAYOUT, tmp_path, {0: 0, 1: 0, 2: 0}))
    assert text.startswith(
        "rank 0 (active 'active') exited with code 0 before finishing its work, without reporting an error "
        "(so did rank 1 (passive 'left'), rank 2 (passive 'right'))"
    ), text
    (tmp_path / "ranks" / "rank1.summary.json").write_text("{}")  # rank 1 finished
    assert "(so did rank 2 (passive 'right'))" in str(explain_failure(LAYOUT, tmp_path, {0: 0, 1: 0, 2: 0}))
    text = str(explain_failure(LAYOUT, tmp_path, {0: RANK_CRASHED, 1: 0, 2: 0}))
    assert text.startswith("rank 0 (active 'active') failed with an internal error"), text


def test_a_rank_that_reports_itself_stuck_comes_before_the_peers_naming_it(tmp_path):
    _note(
        tmp_path,
        0,
        "rank 2 (passive 'right') stuck 3 s in ... (reported by rank 2 (passive 'right'))",
        lost=2,
    )
    _note(
        tmp_path,
        2,
        "rank 2 (passive 'right') stuck 3 s in defense 'd' of party 'right', hook 'embed'",
        lost=2,
    )
    text = str(explain_failure(LAYOUT, tmp_path, {0: 3, 1: 3, 2: 3}))
    assert text == "rank 2 (passive 'right') stuck 3 s in defense 'd' of party 'right', hook 'embed'", text
