"""The secure channel on the wire (SECURITY.md §4a), with real ``securevfl party``
processes on loopback, each run through a transport tap
(:mod:`tests.threat_model.wire_tap`) that records every frame and every store
value exactly as it leaves the rank:

* a keyed ``plain`` run: no frame carries an embedding or gradient row the
  sender holds in the clear, every frame is the sealed size of its message, and
  no secret key (raw, hex, PEM) is in any frame, store value, log, ledger or
  result file;
* one flipped byte in a frame aborts the run, the receiver naming the sender;
* a rank with a key the protocol does not pin, and an extra process that
  takes a rank's place in the store with the pinned public key but without its
  secret, are refused at start-up by the honest ranks (exit 2, naming the rank
  and the reason) before any frame is sent;
* such a process cannot squat the rank: the real rank still runs, and the
  squatter learns nothing about it; claims and error notes of an earlier run,
  replayed into the store, neither take a rank nor abort the run;
* the local launcher's throw-away keys never reach the output folder.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from base64 import b64encode
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

import securevfl.app.launcher as launcher
from securevfl import __version__
from securevfl.app.launcher import free_port, launch
from securevfl.app.loader import load_checked, load_protocol
from securevfl.runtime.ledger import SEAL_BYTES
from securevfl.runtime.secure import handshake as hs
from securevfl.runtime.secure.keys import Identity
from tests.support.protocols import ROOT, write_yaml
from tests.support.runs import cli
from tests.threat_model.wire_tap import read_frames, write_party_files

pytestmark = pytest.mark.timeout(300)

PARTIES = ("active", "left", "right")
STARTUP_S = 30.0
# the squatting and replay tests start ranks only once rank 0 listens (or another rank
# has stopped): interpreter start-up under load (over 30 s at a load of 6 on 2 cores)
# must fit, twice, into the start-up deadline
SEQUENTIAL_STARTUP_S = 120.0
HEADER_FRAME = 12 * 8 + SEAL_BYTES


def _protocol(
    folder: Path,
    keys: dict[str, str] | None = None,
    passive: tuple[str, ...] = ("left", "right"),
    startup_s: float = STARTUP_S,
) -> Path:
    """A tiny CSV protocol (active with labels, passive 'left' and 'right' or
    those named), pinning ``keys`` (party -> key string) and then requiring
    pinned keys."""
    write_party_files(folder)
    model = {"kind": "mlp", "hidden": [4], "out": 4}
    keys = keys or {}

    def entry(p: str) -> dict[str, Any]:
        return {"key": keys[p]} if p in keys else {}

    doc: dict[str, Any] = {
        "name": "wiretap",
        "dataset": {"name": "csv"},
        "parties": {
            "active": {
                "name": "active",
                "source": {"path": str(folder / "active.csv"), "label_column": "label"},
                **entry("active"),
            },
            "passive": [
                {"name": p, "source": {"path": str(folder / f"{p}.csv")}, "model": model, **entry(p)}
                for p in passive
            ],
        },
        "interactive": {"out": 4},
        "training": {"epochs": 1, "batch_size": 16},
        "runtime": {"startup_timeout_s": startup_s, "dump_views": True},
    }
    if keys:
        doc["security"] = {"require_pinned_keys": True}
    return write_yaml(folder / f"p{len(passive)}.yaml", doc)


def _tapped(
    proto: Path, rank: int, port: int, out: Path, tap: Path, key: Path | None, flip: int = -1
) -> subprocess.Popen[str]:
    args = [sys.executable, "-m", "tests.threat_model.wire_tap", "party", str(proto), "--rank", str(rank)]
    args += ["--rendezvous", f"tcp://127.0.0.1:{port}", "--out", str(out), "--quiet"]
    if key is not None:
        args += ["--key", str(key)]
    env = {**os.environ, "TAP_DIR": str(tap), "TAP_FLIP": str(flip)}
    return subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env
    )


def _wait(procs: dict[int, subprocess.Popen[str]], timeout: float = 240) -> dict[int, tuple[int, str]]:
    out = {}
    for r, p in procs.items():
        try:
            so, se = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            so, se = p.communicate()
        out[r] = (p.returncode, so + se)
    return out


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Key pairs for the three parties (one through ``securevfl keygen``), a
    protocol pinning them, and one tapped multi-host ``plain`` run of it."""
    root = tmp_path_factory.mktemp("keyed")
    keys = root / "keys"
    made = cli("keygen", "--party", "active", "--out", str(keys))
    assert made.returncode == 0, made.stderr
    assert "fingerprint: sha256:" in made.stdout and "key: ed25519:" in made.stdout
    for p in ("left", "right"):
        Identity.generate().write(keys, p)
    pins = {p: (keys / f"{p}.pub").read_text().split()[0] for p in PARTIES}
    proto = _protocol(root, pins)
    tap = root / "tap"
    port = free_port()
    procs = {
        r: _tapped(proto, r, port, root / f"r{r}", tap, keys / f"{p}.key") for r, p in enumerate(PARTIES)
    }
    done = _wait(procs)
    for r, (code, text) in done.items():
        assert code == 0, f"rank {r}: {text[-3000:]}"
    return {"root": root, "keys": keys, "proto": proto, "tap": tap, "logs": done, "pins": pins}


def _rows(t: torch.Tensor) -> list[bytes]:
    """Each row of a float tensor as raw bytes (what a clear frame would contain)."""
    t = t.detach().contiguous()
    return [t[i].numpy().tobytes() for i in range(t.shape[0])]


def test_no_frame_carries_a_clear_embedding_or_gradient(keyed: dict[str, Any]):
    root, tap = keyed["root"], keyed["tap"]
    views = {
        r: torch.load(root / f"r{r}" / "ranks" / f"rank{r}.view.pt", weights_only=False) for r in range(3)
    }
    frames = {r: read_frames(tap / f"rank{r}.frames") for r in range(3)}
    # what crossed in the clear at the application layer: embeddings into A, gradients into P_i
    crossed = {1: [], 2: [], 0: []}
    for r in (1, 2):
        crossed[r] += [t for _, t in views[r]["own"]["embeddings"]]
        crossed[0] += [t for _, t in views[r]["received"]["embedding_grad"]]
    assert all(len(v) >= 4 for v in crossed.values())
    received = views[0]["received"]["embedding"]
    # the receiver's recorded view holds the very tensors the senders kept (so the search is for real bytes)
    assert any(torch.equal(received[0][1], t) for t in crossed[1] + crossed[2])
    for sender, tensors in crossed.items():
        wire = b"".join(f for _, f in frames[sender])
        rows = [row for t in tensors for row in _rows(t)]
        assert rows and all(len(row) >= 16 for row in rows)
        leaked = [row for row in rows if row in wire]
        assert not leaked, f"rank {sender}: {len(leaked)} clear rows on the wire"


def test_every_frame_is_a_sealed_header_or_payload(keyed: dict[str, Any]):
    """The tap sees exactly the ledger's sealed bytes: two frames per message,
    a 112-byte sealed header and the payload plus its 16-byte tag."""
    root, tap = keyed["root"], keyed["tap"]
    for r in range(3):
        records = [
            json.loads(line)
            for line in (root / f"r{r}" / "ranks" / f"rank{r}.ledger.jsonl").read_text().splitlines()
        ]
        sent = [x for x in records if x["direction"] == "sent"]
        frames = read_frames(tap / f"rank{r}.frames")
        expect = []
        for x in sent:
            expect.append((x["receiver"], HEADER_FRAME))
            if x["bytes"]:
                expect.append((x["receiver"], x["bytes"] + SEAL_BYTES))
            assert x["sealed"] == HEADER_FRAME + (x["bytes"] + SEAL_BYTES if x["bytes"] else 0)
        assert [(p, len(f)) for p, f in frames] == expect


def _secret_forms(keys: Path) -> dict[str, list[bytes]]:
    forms = {}
    for p in PARTIES:
        pem = (keys / f"{p}.key").read_bytes()
        seed = Identity.load(keys / f"{p}.key").seed()
        body = b"".join(line for line in pem.splitlines() if not line.startswith(b"-----"))
        forms[p] = [seed, seed.hex().encode(), b64encode(seed), body]
    return forms


def _everything_written(folders: list[Path]) -> dict[str, bytes]:
    return {str(f): f.read_bytes() for d in folders for f in d.rglob("*") if f.is_file()}


def test_secret_keys_appear_in_no_message_log_ledger_or_result(keyed: dict[str, Any]):
    root, tap = keyed["root"], keyed["tap"]
    files = _everything_written([root / f"r{r}" for r in range(3)] + [tap])
    assert any(name.endswith("result.json") for name in files)
    assert any(name.endswith(".store") and b"hello/1" in data for name, data in files.items())
    logs = {f"rank {r} output": text.encode() for r, (_, text) in keyed["logs"].items()}
    for party, forms in _secret_forms(keyed["keys"]).items():
        for where, data in {**files, **logs}.items():
            for form in forms:
                assert form not in data, f"{party}'s secret key in {where}"
    # the public keys do cross (in the hellos): the check above is not vacuous about the store
    store = b"".join(d for n, d in files.items() if n.endswith(".store"))
    assert all(keyed["pins"][p].split(":")[1].encode() in store for p in PARTIES)


@pytest.fixture(scope="module")
def flipped(tmp_path_factory: pytest.TempPathFactory, keyed: dict[str, Any]) -> dict[str, Any]:
    """A tapped run of the keyed protocol in which rank 1's fourth frame leaves
    with one byte flipped."""
    root = tmp_path_factory.mktemp("flipped")
    keys, proto = keyed["keys"], keyed["proto"]
    port = free_port()
    procs = {
        r: _tapped(proto, r, port, root / f"r{r}", root / "tap", keys / f"{p}.key", flip=3 if r == 1 else -1)
        for r, p in enumerate(PARTIES)
    }
    return {"root": root, "tap": root / "tap", "done": _wait(procs)}


def test_flipped_byte_aborts_naming_the_sender(flipped: dict[str, Any]):
    done = flipped["done"]
    code0, text0 = done[0]
    assert code0 == 2, text0[-2000:]
    assert "rank 1 (passive 'left') sent a frame that failed authentication" in text0
    assert all(code != 0 for code, _ in done.values())
    assert not (flipped["root"] / "r0" / "result.json").exists()


def _refused_within(done: dict[int, tuple[int, str]], ranks: list[int], reason: str) -> None:
    for r in ranks:
        code, text = done[r]
        assert code == 2, f"rank {r}: {text[-2000:]}"
        assert "rank 1 (passive 'left')" in text and reason in text, text[-2000:]


def _sessions_began(procs: dict[int, subprocess.Popen[str]], outs: dict[int, Path]) -> dict[int, float]:
    """When each rank's session began (its ``ranks/`` folder appears just before),
    so that start-up is timed without the interpreter's start-up under load."""
    began: dict[int, float] = {}
    end = time.monotonic() + 240
    while len(began) < len(outs) and time.monotonic() < end:
        for r, out in outs.items():
            if r not in began and (out / "ranks").is_dir():
                began[r] = time.time()
            assert r in began or procs[r].poll() is None, f"rank {r} ended before its session"
        time.sleep(0.02)
    return began


def test_rank_with_an_unpinned_key_is_refused_before_any_frame(tmp_path: Path, keyed: dict[str, Any]):
    """The rank with the wrong key stops at once naming its ``--key``; the honest
    ranks wait for the pinned key until the start-up deadline (the real rank may
    still come), then refuse rank 1 naming the key it presented."""
    keys, proto = keyed["keys"], keyed["proto"]
    wrong, _ = Identity.generate().write(tmp_path / "keys", "left")
    port = free_port()
    tap = tmp_path / "tap"
    key_of = {0: keys / "active.key", 1: wrong, 2: keys / "right.key"}
    procs = {r: _tapped(proto, r, port, tmp_path / f"r{r}", tap, key_of[r]) for r in range(3)}
    began = _sessions_began({r: procs[r] for r in (0, 2)}, {r: tmp_path / f"r{r}" for r in (0, 2)})
    done = _wait(procs)
    for r in (0, 2):  # at the deadline, not later (the 2 s grace and writing the file included)
        ended = (tmp_path / f"r{r}" / "ranks" / f"rank{r}.error.json").stat().st_mtime
        assert ended - began[r] < STARTUP_S + 5, f"rank {r} gave up after {ended - began[r]:.1f} s"
    _refused_within(done, [0, 2], "not the key the protocol pins for passive 'left'")
    code1, text1 = done[1]
    assert code1 == 2 and "this rank's identity key" in text1
    assert all(read_frames(tap / f"rank{r}.frames") == [] for r in range(3))


def test_extra_process_with_the_pinned_public_key_is_refused(tmp_path: Path, keyed: dict[str, Any]):
    """An extra process reaches the rendezvous first, claims rank 1 and publishes
    a hello with left's pinned (public) key and its own ephemeral key, and an
    answer it cannot sign: the honest rank refuses rank 1 at start-up. (Two
    parties, so that one honest process suffices.)"""
    keys = keyed["keys"]
    proto = _protocol(tmp_path, {p: keyed["pins"][p] for p in ("active", "left")}, passive=("left",))
    port = free_port()
    tap = tmp_path / "tap"
    start = time.monotonic()
    rank0 = _tapped(proto, 0, port, tmp_path / "r0", tap, keys / "active.key")
    store = None
    while store is None and time.monotonic() - start < 120:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                pass
            store = dist.TCPStore("127.0.0.1", port, None, False, timeout=timedelta(seconds=20))
        except (OSError, RuntimeError):
            time.sleep(0.2)
    assert store is not None
    hello = {
        "rank": 1,
        "world_size": 2,
        "party": "left",
        "role": "passive",
        "digest": load_protocol(str(proto)).digest(),
        "pid": 1,
        "host": "intruder",
        "version": __version__,
        "run_id": "0123456789abcdef",
        "identity": keyed["pins"]["left"].split(":")[1],
        "ephemeral": hs.ephemeral_public(hs.ephemeral()).hex(),
    }
    store.compare_set("claim/1", "", json.dumps({"pid": 1, "host": "intruder", "token": "x"}))
    store.set("hb/1", "0")
    store.set("hello/1", json.dumps(hello))
    store.set("auth/1", json.dumps({"sig": {"0": "00" * 64}, "mac": {"0": "00" * 32}}))
    spoke = time.monotonic()  # the bound starts once rank 0 listens and the intruder has spoken
    code, text = _wait({0: rank0})[0]
    assert time.monotonic() - spoke < STARTUP_S + 30
    assert code == 2, text[-2000:]
    assert "rank 1 (passive 'left') failed the handshake: its signature does not verify" in text, text[-2000:]
    assert read_frames(tap / "rank0.frames") == []


def test_local_run_keeps_its_throwaway_keys_out_of_the_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    seeds: list[bytes] = []
    generate = Identity.generate

    def recording() -> Identity:
        ident = generate()
        seeds.append(ident.seed())
        return ident

    monkeypatch.setattr(launcher.Identity, "generate", staticmethod(recording))
    launch(load_checked(str(_protocol(tmp_path))), tmp_path / "out", progress=False)
    assert len(seeds) == 3
    files = _everything_written([tmp_path / "out"])
    assert any(name.endswith("result.json") for name in files)
    for seed in seeds:
        for form in (seed, seed.hex().encode(), b64encode(seed)):
            assert not any(form in data for data in files.values())


# -- squatting and replay ------------------------------------------------------------------


def _store(port: int, timeout: float = 240) -> dist.TCPStore:
    """A client of the rendezvous store on ``port``, as any process that reaches
    the port can open one, once rank 0 listens."""
    end = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                pass
            return dist.TCPStore("127.0.0.1", port, None, False, timeout=timedelta(seconds=20))
        except (OSError, RuntimeError):
            assert time.monotonic() < end, "the rendezvous never listened"
            time.sleep(0.2)


def _stored(tap: Path, rank: int, key: str) -> bytes:
    """The last value rank ``rank`` of a tapped run wrote under ``key``."""
    prefix = key.encode() + b"="
    lines = (tap / f"rank{rank}.store").read_bytes().splitlines()
    values = [line[len(prefix) :] for line in lines if line.startswith(prefix)]
    assert values, f"rank {rank} never wrote {key}"
    return values[-1]


def _all_succeed(done: dict[int, tuple[int, str]]) -> None:
    for r, (code, text) in done.items():
        assert code == 0, f"rank {r}: {text[-3000:]}"


@pytest.mark.timeout(600)  # four interpreters start one after another: 300 s ran out at a load of 18
@pytest.mark.parametrize("order", ["before", "after"])
def test_a_squatter_with_the_wrong_key_cannot_take_the_rank_or_learn_its_holder(
    tmp_path: Path, keyed: dict[str, Any], order: str
):
    """A process started as rank 1 with a key that is not left's, before the real
    rank 1 (which used to be refused as "already claimed") or after it (which
    used to be told the holder's pid and host): its claim does not count, the
    real rank 1 runs and the run completes; the squatter stops naming its own
    ``--key`` and nothing it prints or writes names the real rank's process."""
    keys = keyed["keys"]
    proto = _protocol(tmp_path, keyed["pins"], startup_s=SEQUENTIAL_STARTUP_S)
    wrong, _ = Identity.generate().write(tmp_path / "wrong", "left")
    port = free_port()

    def start(rank: int, key: Path, name: str) -> subprocess.Popen[str]:
        return _tapped(proto, rank, port, tmp_path / name, tmp_path / f"tap-{name}", key)

    procs = {0: start(0, keys / "active.key", "r0")}
    if order == "before":
        procs[2] = start(2, keys / "right.key", "r2")
        squat = _wait({1: start(1, wrong, "squatter")})[1]
        procs[1] = start(1, keys / "left.key", "r1")
    else:
        procs[1] = start(1, keys / "left.key", "r1")
        store = _store(port)
        end = time.monotonic() + 240
        while not store.check(["hello/1"]):  # the real rank 1 holds its rank
            assert time.monotonic() < end and procs[1].poll() is None, "rank 1 never published its hello"
            time.sleep(0.1)
        squat = _wait({1: start(1, wrong, "squatter")})[1]
        procs[2] = start(2, keys / "right.key", "r2")
    done = _wait(procs)
    _all_succeed(done)
    real = procs[1].pid
    assert json.loads((tmp_path / "r0" / "result.json").read_text())["party_pids"]["1"] == real
    code, text = squat
    assert code == 2 and "this rank's identity key" in text and "--key" in text, text[-2000:]
    written = "".join(
        f.read_text(errors="replace") for f in (tmp_path / "squatter").rglob("*") if f.is_file()
    )
    for told in (f"pid {real}", str(real), socket.gethostname(), "already claimed"):
        assert told not in text + written, f"the squatter learned {told!r}: {text[-2000:]}"


def test_a_replayed_claim_of_an_earlier_run_does_not_take_the_rank(tmp_path: Path, keyed: dict[str, Any]):
    """Rank 1's claim from the keyed run (signed with left's pinned key) is put
    back into a later run's store before rank 1 starts: it is not this run's, so
    rank 1 displaces it and the run completes."""
    old_claim = _stored(keyed["tap"], 1, "claim/1")
    port = free_port()
    keys, tap = keyed["keys"], tmp_path / "tap"
    proto = _protocol(tmp_path, keyed["pins"], startup_s=SEQUENTIAL_STARTUP_S)
    procs = {0: _tapped(proto, 0, port, tmp_path / "r0", tap, keys / "active.key")}
    store = _store(port)
    assert store.compare_set("claim/1", "", old_claim) == old_claim
    for r in (1, 2):
        procs[r] = _tapped(proto, r, port, tmp_path / f"r{r}", tap, keys / f"{PARTIES[r]}.key")
    _all_succeed(_wait(procs))


def test_a_replayed_error_note_of_an_earlier_run_does_not_abort(
    tmp_path: Path, keyed: dict[str, Any], flipped: dict[str, Any]
):
    """Rank 0's signed error note from the aborted run (the flipped byte), written
    into a later run's store before its other ranks start, and again and again
    while it runs: the ranks ignore it, saying so, and the run completes. (Written
    only alongside the run, the note could land after a short run's last look at
    the store, and nothing would be shown either way.)"""
    old_note = _stored(flipped["tap"], 0, "err/0")
    assert b"failed authentication" in old_note  # rank 0's genuine report
    port = free_port()
    keys, tap = keyed["keys"], tmp_path / "tap"
    proto = _protocol(tmp_path, keyed["pins"], startup_s=SEQUENTIAL_STARTUP_S)
    procs = {0: _tapped(proto, 0, port, tmp_path / "r0", tap, keys / "active.key")}
    store = _store(port)
    store.set("err/0", old_note)
    for r in (1, 2):
        procs[r] = _tapped(proto, r, port, tmp_path / f"r{r}", tap, keys / f"{PARTIES[r]}.key")
    stop = threading.Event()

    def replay() -> None:
        while not stop.is_set():
            with contextlib.suppress(RuntimeError):  # rank 0 has gone
                store.set("err/0", old_note)
            stop.wait(0.1)

    replayer = threading.Thread(target=replay, daemon=True)
    replayer.start()
    try:
        done = _wait(procs)
    finally:
        stop.set()
        replayer.join(timeout=30)
    _all_succeed(done)
    ignored = "ignoring an error note for rank 0 (active 'active') in the rendezvous store that is not signed"
    assert any(ignored in done[r][1] for r in (1, 2)), done[1][1][-2000:]


def test_a_lone_rank_with_the_wrong_key_says_so(tmp_path: Path, keyed: dict[str, Any]):
    """No rank 0 anywhere and a key that is not left's: the rank names its key as
    the reason (exit 2), and says that the rendezvous did not answer either."""
    proto = _protocol(tmp_path, keyed["pins"], startup_s=2)
    wrong, _ = Identity.generate().write(tmp_path / "wrong", "left")
    code, text = _wait({1: _tapped(proto, 1, free_port(), tmp_path / "r1", tmp_path / "tap", wrong)})[1]
    flat = " ".join(text.split())
    assert code == 2, text[-2000:]
    assert "this rank's identity key" in flat and "start it with --key" in flat, flat
    assert "did not answer within 2 s either; nothing was sent to it" in flat, flat
    assert "could not reach the rendezvous" not in flat and "Traceback" not in flat, flat
