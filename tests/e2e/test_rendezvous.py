"""The rendezvous with real ``securevfl party`` processes: rank 0's store listens
on the address given in ``--rendezvous`` only; a second process claiming a rank is
refused (exit 2, naming the holder) while the run goes on; a rank whose rank 0
never appears, or does not answer, gives up within ``runtime.startup_timeout_s``
(exit 3, naming rank 0) without native stack traces.

Time bounds are taken inside the rank's life, from the moment its ``ranks/``
folder appears (created just before the session starts) to its error file, so
that a loaded machine's slow interpreter start-up does not blur them."""

from __future__ import annotations

import json
import socket
import subprocess
import time
from pathlib import Path

import pytest

from securevfl.app.launcher import free_port
from tests.support.protocols import write_yaml
from tests.support.runs import party_process

pytestmark = pytest.mark.timeout(300)

NATIVE_TRACE = ("frame #", "Exception raised from", "[c10d]")
LISTEN = "0A"  # TCP state in /proc/net/tcp*
LOOPBACK_HEX = "0100007F"  # 127.0.0.1 as /proc/net/tcp writes it
# runtime.startup_timeout_s of the ranks that must give up: each test waits it out once
GIVE_UP_S = 2
# what the bounds below allow past it: the 2 s grace for a blocked native call and
# writing the error file
SLACK_S = 3.5


def _protocol(folder: Path) -> Path:
    """A tiny CSV protocol (active 'active' with the labels, passive 'left' and
    'right'): each rank reads its own file, so no materializing child process
    slows the start of every rank down."""
    tables = {
        "active": (["label"], lambda i: [i % 2]),
        "left": (["a", "b"], lambda i: [i % 7, i % 5]),
        "right": (["c", "d"], lambda i: [i % 3, i % 11]),
    }
    for party, (cols, values) in tables.items():
        rows = [",".join(map(str, [f"id-{i:03d}", *values(i)])) for i in range(64)]
        (folder / f"{party}.csv").write_text("\n".join([",".join(["id", *cols]), *rows]) + "\n")
    model = {"kind": "mlp", "hidden": [4], "out": 4}
    doc = {
        "name": "rendezvous",
        "dataset": {"name": "csv"},
        "parties": {
            "active": {
                "name": "active",
                "source": {"path": str(folder / "active.csv"), "label_column": "label"},
            },
            "passive": [
                {"name": p, "source": {"path": str(folder / f"{p}.csv")}, "model": model}
                for p in ("left", "right")
            ],
        },
        "interactive": {"out": 4},
        "training": {"epochs": 1, "batch_size": 16},
    }
    return write_yaml(folder / "p.yaml", doc)


def _party(
    proto: Path, rank: int, port: int, out: Path, *extra: str, host: str = "127.0.0.1"
) -> subprocess.Popen[str]:
    return party_process(proto, rank, port, out, "--quiet", *extra, host=host)


def _finish(procs: list[subprocess.Popen[str]], timeout: float) -> list[str]:
    """Wait for every process (bounded); kill and reap any left; their stderr."""
    errs = []
    try:
        for p in procs:
            errs.append(p.communicate(timeout=timeout)[1])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    return errs


def _flat(err: str) -> str:
    """stderr with the CLI's line wrapping undone."""
    return " ".join(err.split())


def _startup_began(proc: subprocess.Popen[str], out: Path, timeout: float = 120) -> float:
    """When the rank's session began: its ``ranks/`` folder appears just before."""
    end = time.monotonic() + timeout
    while not (out / "ranks").is_dir():
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        assert time.monotonic() < end, "the rank never reached its session"
        time.sleep(0.02)
    return time.time()


def _listeners(port: int) -> set[tuple[str, str]]:
    """(table, local address in hex) of every socket listening on ``port``."""
    found = set()
    for table in ("tcp", "tcp6"):
        lines = Path(f"/proc/net/{table}").read_text().splitlines()[1:]
        for line in lines:
            fields = line.split()
            addr, port_hex = fields[1].split(":")
            if fields[3] == LISTEN and int(port_hex, 16) == port:
                found.add((table, addr))
    return found


def test_second_claim_of_a_rank_is_refused(tmp_path: Path):
    """Two processes started as rank 1 at once: exactly one runs, the other exits
    2 naming the rank and the holder's pid and host; the run completes. A rank 1
    started again after the run (the store is gone) exits 3 within the start-up
    timeout instead of hanging."""
    proto = _protocol(tmp_path)
    port = free_port()
    procs = {
        "0": _party(proto, 0, port, tmp_path / "r0"),
        "1a": _party(proto, 1, port, tmp_path / "r1a"),
        "1b": _party(proto, 1, port, tmp_path / "r1b"),
        "2": _party(proto, 2, port, tmp_path / "r2"),
    }
    errs = dict(zip(procs, _finish(list(procs.values()), timeout=180), strict=True))
    codes = {k: p.returncode for k, p in procs.items()}
    assert sorted(codes[k] for k in ("1a", "1b")) == [0, 2], (codes, errs)
    won, lost = ("1a", "1b") if codes["1a"] == 0 else ("1b", "1a")
    assert codes["0"] == 0 and codes["2"] == 0, (codes, errs)
    text = _flat(errs[lost])
    holder = f"pid {procs[won].pid} on host {socket.gethostname()}"
    assert f"rank 1 is already claimed by another process ({holder})" in text, text
    assert "--rank" in text and "Traceback" not in text, text
    assert not any(t in errs[lost] for t in NATIVE_TRACE), errs[lost][-2000:]
    # the run went on with the first claimant: its pid is the one recorded
    result = json.loads((tmp_path / "r0" / "result.json").read_text())
    assert result["party_pids"]["1"] == procs[won].pid

    late_out = tmp_path / "late"
    late = _party(proto, 1, port, late_out, "--set", f"runtime.startup_timeout_s={GIVE_UP_S}")
    try:
        began = _startup_began(late, late_out)
    finally:
        (err,) = _finish([late], timeout=60)
    assert late.returncode == 3, err[-2000:]
    assert "rank 0 (active 'active')" in err and f"within {GIVE_UP_S} s" in err, err[-2000:]
    ended = (late_out / "ranks" / "rank1.error.json").stat().st_mtime
    assert ended - began < GIVE_UP_S + SLACK_S, f"gave up after {ended - began:.1f} s"


def test_store_listens_on_the_rendezvous_address_only(tmp_path: Path):
    """With ``tcp://127.0.0.1:PORT`` rank 0's store listens on 127.0.0.1:PORT and on
    no other address (not 0.0.0.0, not ::). A second rank 0 on the same address
    cannot listen there: exit 2, naming ``--rendezvous``."""
    proto = _protocol(tmp_path)
    port = free_port()
    first = _party(proto, 0, port, tmp_path / "a", "--set", "runtime.startup_timeout_s=120")
    try:
        end = time.monotonic() + 120
        while not _listeners(port):
            assert first.poll() is None, first.communicate()[1][-2000:]
            assert time.monotonic() < end, "rank 0 never listened"
            time.sleep(0.05)
        time.sleep(0.5)  # every socket of the store is up by now
        assert _listeners(port) == {("tcp", LOOPBACK_HEX)}, _listeners(port)

        second = _party(proto, 0, port, tmp_path / "b")
        (err,) = _finish([second], timeout=120)
        assert first.poll() is None, "the first rank 0 must still be waiting for its peers"
    finally:
        first.kill()
        first.communicate()
    assert second.returncode == 2, err[-2000:]
    text = _flat(err)
    assert "--rendezvous" in text and f"127.0.0.1:{port}" in text, text
    assert "already listens there" in text, text
    assert not any(t in err for t in NATIVE_TRACE), err[-2000:]


def test_rank0_refuses_an_address_of_another_machine(tmp_path: Path):
    """Rank 0 binds the address it is given: one that is not this machine's
    (192.0.2.1, TEST-NET-1) is a user error naming ``--rendezvous``, at once.
    (The protocol pins no key, so it opts out of pinned keys to get that far,
    and is warned about it.)"""
    proto = _protocol(tmp_path)
    out = tmp_path / "r0"
    proc = _party(
        proto,
        0,
        free_port(),
        out,
        *("--set", "runtime.startup_timeout_s=30", "--set", "security.require_pinned_keys=false"),
        host="192.0.2.1",
    )
    try:
        began = _startup_began(proc, out)
    finally:
        (err,) = _finish([proc], timeout=120)
    assert proc.returncode == 2, err[-2000:]
    text = _flat(err)
    assert "--rendezvous" in text and "192.0.2.1 is not an address of this machine" in text, text
    assert "securevfl: warning: security.require_pinned_keys is false and this run spans hosts" in text, text
    assert "anyone who reaches the rendezvous can take their place" in text, text
    ended = (out / "ranks" / "rank0.error.json").stat().st_mtime
    assert ended - began < 5, f"took {ended - began:.1f} s"


def test_a_rank_across_hosts_without_pinned_keys_is_refused(tmp_path: Path):
    """A rendezvous that is not a loopback address makes the run span hosts: with
    ``security.require_pinned_keys`` left at ``auto`` every rank must present a
    pinned key, so a protocol pinning none is refused at once (exit 2), before
    anything is sent, naming the ranks and the opt-out."""
    proto = _protocol(tmp_path)
    timeout = ("--set", f"runtime.startup_timeout_s={GIVE_UP_S}")
    proc = _party(proto, 1, free_port(), tmp_path / "r1", *timeout, host="192.0.2.1")
    (err,) = _finish([proc], timeout=120)
    assert proc.returncode == 2, err[-2000:]
    text = _flat(err)
    assert "this run spans hosts (the rendezvous 192.0.2.1 is not a loopback address)" in text, text
    assert "no key is pinned for active 'active' (rank 0), passive 'left' (rank 1)" in text, text
    assert "security.require_pinned_keys: false" in text and "Traceback" not in text, text
    assert not (tmp_path / "r1" / "ranks" / "rank1.error.json").exists()  # refused before the session


@pytest.mark.parametrize("rank0", ["absent", "silent"])
def test_passive_rank_gives_up_within_startup_timeout(tmp_path: Path, rank0: str):
    """Rank 0 never appears (nothing listens) or does not answer (a socket that
    accepts TCP and stays silent, as a stopped rank 0 would): rank 1 exits 3
    naming rank 0 and the timeout, within ``startup_timeout_s`` plus the 2 s grace
    for a blocked native call, and prints no native stack trace."""
    proto = _protocol(tmp_path)
    silent = None
    if rank0 == "silent":
        silent = socket.socket()
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)  # the kernel completes connections; nobody ever answers
        port = silent.getsockname()[1]
    else:
        port = free_port()
    out = tmp_path / "r1"
    proc = _party(proto, 1, port, out, "--set", f"runtime.startup_timeout_s={GIVE_UP_S}")
    try:
        began = _startup_began(proc, out)
    finally:
        (err,) = _finish([proc], timeout=90)
        if silent is not None:
            silent.close()
    assert proc.returncode == 3, err[-2000:]
    text = _flat(err)
    assert "rank 0 (active 'active')" in text and f"{GIVE_UP_S} s" in text, text
    assert not any(t in err for t in NATIVE_TRACE), err[-3000:]
    ended = (out / "ranks" / "rank1.error.json").stat().st_mtime
    assert ended - began < GIVE_UP_S + SLACK_S, f"gave up after {ended - began:.1f} s"
