"""The console command's end (:func:`securevfl.cli.entry`): a command that started
ranks, or ran one, ends the process once its exit handlers have run, without the
interpreter's teardown; the ranks' fork server of a launching command is ended
first; every other command exits as usual."""

from __future__ import annotations

import atexit
import sys

import pytest

from securevfl import cli


class Ended(Exception):
    """What the patched ``os._exit`` raises, with the code it was given."""


@pytest.fixture
def ends(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    said: list[str] = []

    def fake_exit(code: int) -> None:
        said.append(f"os._exit({code})")
        raise Ended(code)

    monkeypatch.setattr(cli, "main", lambda: 3)
    monkeypatch.setattr(cli.os, "_exit", fake_exit)
    monkeypatch.setattr(cli, "stop_rank_server", lambda: said.append("stop_rank_server"))
    monkeypatch.setattr(atexit, "_run_exitfuncs", lambda: said.append("exit handlers"))
    return said


@pytest.mark.parametrize("command", ["run", "predict", "compare"])
def test_a_launching_command_ends_its_fork_server_then_its_process(monkeypatch, ends, command):
    monkeypatch.setattr(sys, "argv", ["securevfl", command, "p.yaml"])
    with pytest.raises(Ended):
        cli.entry()
    assert ends == ["stop_rank_server", "exit handlers", "os._exit(3)"]


def test_a_rank_ends_its_process_after_its_exit_handlers(monkeypatch, ends):
    monkeypatch.setattr(sys, "argv", ["securevfl", "party", "p.yaml", "--rank", "1"])
    with pytest.raises(Ended):
        cli.entry()
    assert ends == ["exit handlers", "os._exit(3)"]


@pytest.mark.parametrize("argv", [["securevfl", "validate", "p.yaml"], ["securevfl"]])
def test_other_commands_exit_as_usual(monkeypatch, ends, argv):
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as exc:
        cli.entry()
    assert exc.value.code == 3
    assert ends == []
