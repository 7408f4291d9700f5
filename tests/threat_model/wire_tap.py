"""A transport tap for the wire audits (a test double, never imported by securevfl).

``python -m tests.threat_model.wire_tap ARGS`` runs ``securevfl ARGS`` in this
process with torch.distributed's point-to-point sends and the rendezvous store's
writes wrapped: every frame the rank puts on the wire is appended to
``$TAP_DIR/rank<R>.frames`` (int32 peer, int64 length, raw bytes) and every store
value it writes to ``$TAP_DIR/rank<R>.store``, exactly as they leave the process.
Rank 0 also writes the run summaries it gathers from every rank, as it opened
them, to ``$TAP_DIR/rank0.summaries.json``.
With ``TAP_FLIP=N`` the rank's N-th sent frame (0-based) leaves with one byte
flipped, as an attacker on the link would alter it.
"""

from __future__ import annotations

import json
import os
import struct
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

import securevfl.runtime.session as session_module
from securevfl import cli


def _raw(t: torch.Tensor) -> bytes:
    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def write_party_files(folder: Path) -> None:
    """The tap tests' tiny CSV files: 64 shared IDs, the active party's label and
    two columns for each of 'left' and 'right'."""
    tables: dict[str, tuple[list[str], Any]] = {
        "active": (["label"], lambda i: [i % 2]),
        "left": (["a", "b"], lambda i: [i % 7, i % 5]),
        "right": (["c", "d"], lambda i: [i % 3, i % 11]),
    }
    for party, (cols, values) in tables.items():
        rows = [",".join(map(str, [f"id-{i:03d}", *values(i)])) for i in range(64)]
        (folder / f"{party}.csv").write_text("\n".join([",".join(["id", *cols]), *rows]) + "\n")


def read_frames(path: Path) -> list[tuple[int, bytes]]:
    """(peer, bytes) of every frame recorded in a ``.frames`` file."""
    out, data, i = [], path.read_bytes() if path.exists() else b"", 0
    while i < len(data):
        peer, n = struct.unpack_from("<iq", data, i)
        i += 12
        out.append((peer, data[i : i + n]))
        i += n
    return out


def install(tap: Path, rank: int, flip: int) -> None:
    tap.mkdir(parents=True, exist_ok=True)
    frames = open(tap / f"rank{rank}.frames", "ab")  # noqa: SIM115 (open for the process's life)
    store_log = open(tap / f"rank{rank}.store", "ab")  # noqa: SIM115
    sent = [0]
    orig_send, orig_isend = dist.send, dist.isend

    def outgoing(tensor: torch.Tensor, dst: Any) -> torch.Tensor:
        n = sent[0]
        sent[0] += 1
        if n == flip:
            tensor = tensor.clone()
            flat = tensor.reshape(-1).view(torch.uint8)
            flat[flat.numel() // 2] ^= 0x01
        frames.write(
            struct.pack("<iq", -1 if dst is None else int(dst), tensor.numel() * tensor.element_size())
        )
        frames.write(_raw(tensor))
        frames.flush()
        return tensor

    def send(tensor: torch.Tensor, dst: Any = None, *args: Any, **kw: Any) -> Any:
        return orig_send(outgoing(tensor, dst), dst, *args, **kw)

    def isend(tensor: torch.Tensor, dst: Any = None, *args: Any, **kw: Any) -> Any:
        return orig_isend(outgoing(tensor, dst), dst, *args, **kw)

    dist.send, dist.isend = send, isend
    orig_set, orig_cas = dist.TCPStore.set, dist.TCPStore.compare_set

    def store_set(self: Any, key: str, value: Any) -> Any:
        v = value.encode() if isinstance(value, str) else bytes(value)
        store_log.write(key.encode() + b"=" + v + b"\n")
        store_log.flush()
        return orig_set(self, key, value)

    def store_cas(self: Any, key: str, expected: Any, value: Any) -> Any:
        v = value.encode() if isinstance(value, str) else bytes(value)
        store_log.write(key.encode() + b"=" + v + b"\n")
        store_log.flush()
        return orig_cas(self, key, expected, value)

    dist.TCPStore.set, dist.TCPStore.compare_set = store_set, store_cas
    orig_gather = session_module.gather_summaries

    def gather(*args: Any, **kw: Any) -> Any:
        parts = orig_gather(*args, **kw)
        (tap / f"rank{rank}.summaries.json").write_text(json.dumps(parts))
        return parts

    session_module.gather_summaries = gather


def main() -> int:
    argv = sys.argv[1:]
    rank = int(argv[argv.index("--rank") + 1])
    install(Path(os.environ["TAP_DIR"]), rank, int(os.environ.get("TAP_FLIP", "-1")))
    return cli.main(argv)


if __name__ == "__main__":
    sys.exit(main())
