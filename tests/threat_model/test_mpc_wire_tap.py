"""CrypTen's traffic on the wire (SECURITY.md §4a): a keyed ``mpc`` run of
real ``securevfl party`` processes (two passive parties, the active party and
the pinned TTP dealer) through a tap (:mod:`tests.threat_model.mpc_tap`) that
records every frame each rank puts on the wire and every CrypTen plaintext its
communicator hands to the sealed transport:

* no CrypTen plaintext (share, masked opening, stream key, dealer bundle, control
  object) and no value the run opened appears on the wire; every CrypTen frame
  crossed sealed, 16 bytes longer than its plaintext;
* one flipped byte in a CrypTen frame aborts the run, the receiver naming the
  sender and the stream.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch

from securevfl.app.launcher import free_port
from securevfl.runtime.ledger import SEAL_BYTES
from securevfl.runtime.secure.keys import Identity
from tests.support.protocols import ROOT, write_yaml
from tests.threat_model.wire_tap import read_frames, write_party_files

pytestmark = pytest.mark.timeout(400)

RANKS = ("active", "left", "right", "dealer")


def _protocol(folder: Path, pins: dict[str, str]) -> Path:
    write_party_files(folder)
    model = {"kind": "mlp", "hidden": [4], "out": 4}
    doc: dict[str, Any] = {
        "name": "mpc-wiretap",
        "dataset": {"name": "csv"},
        "parties": {
            "active": {
                "name": "active",
                "source": {"path": str(folder / "active.csv"), "label_column": "label"},
                "key": pins["active"],
            },
            "passive": [
                {"name": p, "source": {"path": str(folder / f"{p}.csv")}, "model": model, "key": pins[p]}
                for p in ("left", "right")
            ],
        },
        "exchange": {"backend": "mpc"},
        "interactive": {"out": 4},
        "training": {"epochs": 1, "batch_size": 16},
        "runtime": {"startup_timeout_s": 30.0, "dump_views": True},
        "security": {"require_pinned_keys": True, "helper_keys": {"dealer": pins["dealer"]}},
    }
    return write_yaml(folder / "mpc.yaml", doc)


def _run(root: Path, out: str, flip: int = -1, flip_rank: int = -1) -> dict[int, tuple[int, str]]:
    keys, proto, port = root / "keys", root / "mpc.yaml", free_port()
    procs = {}
    for r, name in enumerate(RANKS):
        args = [sys.executable, "-m", "tests.threat_model.mpc_tap", "party", str(proto), "--rank", str(r)]
        args += ["--rendezvous", f"tcp://127.0.0.1:{port}", "--out", str(root / out / f"r{r}"), "--quiet"]
        args += ["--key", str(keys / f"{name}.key")]
        env = {**os.environ, "TAP_DIR": str(root / out / "tap")}
        env["TAP_FLIP_CRYPTEN"] = str(flip if r == flip_rank else -1)
        procs[r] = subprocess.Popen(
            args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env
        )
    done = {}
    for r, p in procs.items():
        try:
            so, se = p.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            p.kill()
            so, se = p.communicate()
        done[r] = (p.returncode, so + se)
    return done


@pytest.fixture(scope="module")
def keyed_mpc(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Pinned keys for the three parties and the dealer, and one tapped run."""
    root = tmp_path_factory.mktemp("mpc-tap")
    for name in RANKS:
        Identity.generate().write(root / "keys", name)
    pins = {n: (root / "keys" / f"{n}.pub").read_text().split()[0] for n in RANKS}
    _protocol(root, pins)
    done = _run(root, "run")
    for r, (code, text) in done.items():
        assert code == 0, f"rank {r}: {text[-3000:]}"
    return root / "run"


def _chunks(raw: bytes) -> list[bytes]:
    """Pieces of a plaintext to look for on the wire: its first, middle and last
    16 bytes (8 for an 8-byte frame); low-entropy pieces (sizes, zeros) would
    match ciphertext by chance and are not searched for."""
    width = 16 if len(raw) >= 16 else 8
    if len(raw) < width:
        return []
    mid = (len(raw) - width) // 2
    pieces = {raw[:width], raw[mid : mid + width], raw[-width:]}
    return [p for p in pieces if len(set(p)) >= 6]


def test_crypten_frames_cross_sealed_and_nothing_in_the_clear(keyed_mpc: Path):
    tap = keyed_mpc / "tap"
    wires = {r: read_frames(tap / f"rank{r}.frames") for r in range(4)}
    plains = {r: read_frames(tap / f"rank{r}.plain") for r in range(4)}
    # every rank, the dealer included, moved CrypTen frames; the dealer sent each
    # MPC party its 32-byte stream key
    assert all(plains[r] for r in range(4))
    assert sorted(p for p, raw in plains[3] if len(raw) == 32)[:3] == [0, 1, 2]
    # each CrypTen plaintext left as one frame to the same peer, 16 bytes longer
    for r in range(4):
        on_wire = Counter((p, len(f)) for p, f in wires[r])
        need = Counter((p, len(raw) + SEAL_BYTES) for p, raw in plains[r])
        assert not need - on_wire, f"rank {r}: CrypTen frames missing from the wire"
    everything = b"".join(f for r in range(4) for _, f in wires[r])
    searched = 0
    for r in range(4):
        for _, raw in plains[r]:
            for piece in _chunks(raw):
                searched += 1
                assert piece not in everything, f"rank {r} put a CrypTen plaintext on the wire"
    assert searched > 100
    # what the run opened (z at A, the dealer's bundle at rank 0, dL/dh at each
    # passive party) never crossed in the clear either
    opened = 0
    for r in range(3):
        view = torch.load(keyed_mpc / f"r{r}" / "ranks" / f"rank{r}.view.pt", weights_only=False)
        for tag, msgs in view["received"].items():
            if not tag.startswith("mpc."):
                continue
            for _, t in msgs:
                for piece in _chunks(t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()):
                    opened += 1
                    assert piece not in everything, f"an opened '{tag}' value of rank {r} on the wire"
    assert opened > 10


def test_flipped_crypten_byte_aborts_naming_the_sender(keyed_mpc: Path):
    """Rank 1 flips one byte of its fourth CrypTen frame (during training's
    openings): the receiver refuses it, naming rank 1 and the stream, and the run
    stops without a result."""
    root = keyed_mpc.parent
    done = _run(root, "flip", flip=3, flip_rank=1)
    named = [
        r
        for r, (code, text) in done.items()
        if code == 2 and "rank 1 (passive 'left') sent a frame that failed authentication" in text
    ]
    assert named, {r: text[-1500:] for r, (_, text) in done.items()}
    assert "stream 'crypten'" in done[named[0]][1]
    assert all(code != 0 for code, _ in done.values())
    assert not (root / "flip" / "r0" / "result.json").exists()
