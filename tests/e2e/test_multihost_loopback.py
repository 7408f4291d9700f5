"""protocols/multihost-loopback.yaml: the multi-host walk-through on one machine,
as its header tells a newcomer to run it (three ``securevfl party`` commands on
loopback; then with keys made by ``securevfl keygen`` and pinned)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from securevfl.app.launcher import free_port
from securevfl.cli import build_parser, main
from tests.support.protocols import PROTOCOLS

pytestmark = pytest.mark.timeout(600)

FILE = PROTOCOLS / "multihost-loopback.yaml"


def header_commands() -> list[list[str]]:
    """The ``securevfl ...`` command lines in the file's header comment."""
    lines = [ln.lstrip("#").strip() for ln in FILE.read_text().splitlines() if ln.startswith("#")]
    return [shlex.split(ln)[1:] for ln in lines if ln.startswith("securevfl ")]


def test_the_header_commands_are_what_the_command_line_takes():
    commands = header_commands()
    parties = [c for c in commands if c[0] == "party"]
    keygens = [c for c in commands if c[0] == "keygen"]
    assert len(parties) == 3 and len(keygens) == 3
    for rank, cmd in enumerate(parties):
        args = build_parser().parse_args(cmd)
        assert (args.rank, args.rendezvous, Path(args.file)) == (
            rank,
            "tcp://127.0.0.1:29500",
            Path("protocols") / FILE.name,
        )
    names = [build_parser().parse_args(c).party for c in keygens]
    doc = yaml.safe_load(FILE.read_text())
    assert names == [doc["parties"]["active"]["name"]] + [p["name"] for p in doc["parties"]["passive"]]


def _run_parties(commands: list[list[str]], cwd: Path) -> list[tuple[int, str, str]]:
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "securevfl", *cmd],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=cwd,
        )
        for cmd in commands
    ]
    outs = []
    for p in procs:
        try:
            out, err = p.communicate(timeout=400)
        finally:
            if p.poll() is None:
                p.kill()
        outs.append((p.returncode, out, err))
    return outs


def test_each_party_process_ends_within_2_s_of_its_last_line(tmp_path: Path):
    """The header's three ``securevfl party`` commands (a short schedule, another port): each
    process exits within 2 s of printing its last line (its result or "done"), where the
    interpreter's teardown of torch.distributed's native objects once kept it 5-7 s more."""
    port = free_port()
    done: dict[int, float] = {}
    ended: dict[int, float] = {}

    def watch(rank: int, p: subprocess.Popen[str]) -> None:
        assert p.stdout is not None
        for line in p.stdout:
            if line.startswith(("done:", "result:")):
                done[rank] = time.monotonic()
        p.wait()
        ended[rank] = time.monotonic()

    procs = []
    for rank, cmd in enumerate(c for c in header_commands() if c[0] == "party"):
        cmd = [a.replace("29500", str(port)) for a in cmd]
        cmd[cmd.index("--out") + 1] = str(tmp_path / f"r{rank}")
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "securevfl", *cmd, "--set", "training.max_steps=3", "--quiet"],
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
                cwd=PROTOCOLS.parent,
            )
        )
    threads = [threading.Thread(target=watch, args=(r, p)) for r, p in enumerate(procs)]
    for t in threads:
        t.start()
    try:
        for t in threads:
            t.join(timeout=400)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in procs] == [0, 0, 0] and sorted(done) == [0, 1, 2]
    lingered = {r: round(ended[r] - done[r], 2) for r in done}
    assert all(s <= 2.0 for s in lingered.values()), lingered


@pytest.mark.slow
def test_the_walk_through_with_pinned_keys(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    """keygen for the three parties, their keys pinned in a copy of the file,
    require_pinned_keys on, each rank started with its --key, as the header says;
    rank 0 names the result, ranks 1 and 2 print one line each.
    (Default suite: test_party_commands_reproduce_run runs three party commands.)"""
    pins = {}
    for cmd in (c for c in header_commands() if c[0] == "keygen"):
        assert main([*cmd[:-1], str(tmp_path / "keys")]) == 0
        pins[cmd[2]] = re.search(r"key: (ed25519:[0-9a-f]{64})", capsys.readouterr().out).group(1)
    doc = yaml.safe_load(FILE.read_text())
    for entry in [doc["parties"]["active"], *doc["parties"]["passive"]]:
        entry["key"] = pins[entry["name"]]
    doc["security"] = {"require_pinned_keys": True}
    (tmp_path / "protocols").mkdir()
    (tmp_path / "protocols" / FILE.name).write_text(yaml.safe_dump(doc, sort_keys=False))
    port = str(free_port())
    commands = []
    for cmd, party in zip((c for c in header_commands() if c[0] == "party"), pins, strict=True):
        cmd = [a.replace("29500", port) for a in cmd]
        commands.append([*cmd, "--key", str(tmp_path / "keys" / f"{party}.key"), "--quiet"])
    outs = _run_parties(commands, tmp_path)
    assert [o[0] for o in outs] == [0, 0, 0], [o[2][-1500:] for o in outs]
    assert "result: runs/mh-bank/result.json" in outs[0][1]
    for rank, (name, (_, out, _)) in enumerate(zip(("left", "right"), outs[1:], strict=True), start=1):
        assert re.fullmatch(
            rf"done: rank {rank} \(passive '{name}'\): \d+ training steps on 1797 aligned rows; its model "
            rf"is in runs/mh-{name}/ranks/rank{rank}/model\n",
            out,
        ), out
    assert (tmp_path / "runs" / "mh-bank" / "result.json").is_file()
