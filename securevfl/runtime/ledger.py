"""The ledger: one record per message a rank sent or received.

Each record holds round (training step, or -1 outside training), phase, sender,
receiver, tag, shape, dtype and payload bytes. Bytes per step are summed over
``sent`` records of the training phase, so each message counts once. The wire
audit tests and the attacks' views read the same records.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from securevfl.private_files import open_private

HEADER_BYTES = 12 * 8  # fixed frame header preceding every payload (int64[12])
SEAL_BYTES = 16  # the AEAD tag each sealed frame adds (a message: header frame + payload frame)


@dataclass(frozen=True)
class Record:
    direction: str  # "sent" | "recv"
    phase: str
    round: int
    sender: int
    receiver: int
    tag: str
    shape: tuple[int, ...]
    dtype: str
    bytes: int
    sealed: int | None = (
        None  # bytes on the wire, sealed frames of header and payload (None: not sealed here)
    )


SPILL_BYTES = 256 << 20  # received tensors held in memory before they go to disk
SPILL_RECORDS = 1 << 16  # message records held in memory before they go to disk (~13 MiB)


@dataclass(frozen=True)
class Spilled:
    """Where one spilled tensor lies in the spill file: raw bytes, no pickle."""

    tag: str
    round: int
    dtype: str  # numpy dtype name
    shape: tuple[int, ...]
    offset: int
    nbytes: int


@dataclass
class Ledger:
    """Per-rank message log, plus (optionally) the tensors this rank received:
    the adversary's view for attacks run at this rank.

    With a ``spill_dir``, received tensors stay in memory only up to
    ``spill_bytes``; beyond that their raw bytes are appended, in arrival order,
    to ``spill_dir/rank<R>.received.bin`` (the index stays here) and
    :meth:`received_view` maps them back read-only. Message records likewise:
    past ``spill_records`` of them they are appended as JSON lines to
    ``spill_dir/rank<R>.ledger.part`` (:meth:`write_jsonl` moves them into the
    ledger file), and :meth:`summary` is kept as they come, so a rank's memory
    stays bounded however many epochs it runs. Nothing is pickled or unpickled."""

    rank: int
    record_views: bool = True
    spill_dir: Path | None = None
    spill_bytes: int = SPILL_BYTES
    spill_records: int = SPILL_RECORDS
    records: list[Record] = field(default_factory=list)  # those not spilled yet, in order
    spilled_records: int = 0
    _sent: dict[str, dict[str, int]] = field(default_factory=dict)  # summary(): sent records by key
    received: dict[str, list[tuple[int, torch.Tensor]]] = field(default_factory=lambda: defaultdict(list))
    spilled: list[Spilled] = field(default_factory=list)
    held_bytes: int = 0
    # the sealed links' CPU seconds, frames and sealed bytes per phase (runtime.secure.link.Meter)
    channel: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def spill_path(self) -> Path | None:
        return None if self.spill_dir is None else self.spill_dir / f"rank{self.rank}.received.bin"

    @property
    def records_path(self) -> Path | None:
        return None if self.spill_dir is None else self.spill_dir / f"rank{self.rank}.ledger.part"

    def log(self, rec: Record, payload: torch.Tensor | None = None) -> None:
        self.records.append(rec)
        self._count(rec)
        if self.spill_dir is not None and len(self.records) >= self.spill_records:
            self._spill_records()
        if payload is not None and rec.direction == "recv" and self.record_views:
            kept = payload.detach().clone()
            self.received[rec.tag].append((rec.round, kept))
            self.held_bytes += kept.numel() * kept.element_size()
            if self.spill_dir is not None and self.held_bytes > self.spill_bytes:
                self._spill()

    def _spill(self) -> None:
        """Append what is held in memory to the spill file, in arrival order per tag."""
        path = self.spill_path
        assert path is not None
        offset = self.spilled[-1].offset + self.spilled[-1].nbytes if self.spilled else 0
        with open(path, "ab") as fh:
            for tag, items in self.received.items():
                for rnd, t in items:
                    arr = t.contiguous().numpy()
                    fh.write(arr.tobytes())
                    self.spilled.append(
                        Spilled(tag, rnd, arr.dtype.name, tuple(arr.shape), offset, arr.nbytes)
                    )
                    offset += arr.nbytes
        self.received.clear()
        self.held_bytes = 0

    def received_view(self) -> dict[str, list[tuple[int, torch.Tensor]]]:
        """Every recorded received tensor by tag, in arrival order: the spilled
        ones mapped read-only from the spill file, then those still in memory."""
        out: dict[str, list[tuple[int, torch.Tensor]]] = defaultdict(list)
        if self.spilled and self.spill_path is not None:
            mm = np.memmap(self.spill_path, dtype=np.uint8, mode="c")  # copy-on-write: file stays as is
            for s in self.spilled:
                arr = mm[s.offset : s.offset + s.nbytes].view(np.dtype(s.dtype)).reshape(s.shape)
                out[s.tag].append((s.round, torch.from_numpy(np.asarray(arr))))
        for tag, items in self.received.items():
            out[tag].extend(items)
        return dict(out)

    def drop_spill(self) -> None:
        """Remove the spill file (once the view it holds has been saved)."""
        if self.spill_path is not None:
            self.spill_path.unlink(missing_ok=True)

    def _count(self, rec: Record) -> None:
        if rec.direction != "sent":
            return
        key = f"{rec.phase}|{rec.sender}|{rec.receiver}|{rec.tag}"
        acc = self._sent.setdefault(key, {"messages": 0, "bytes": 0, "sealed_bytes": 0})
        acc["messages"] += 1
        acc["bytes"] += rec.bytes
        acc["sealed_bytes"] += rec.sealed or 0

    def _spill_records(self) -> None:
        """Append the records held in memory to :attr:`records_path`, in order."""
        path = self.records_path
        assert path is not None
        with open_private(path, append=bool(self.spilled_records)) as fh:  # never after a stale file
            fh.write(_lines(self.records))
        self.spilled_records += len(self.records)
        self.records.clear()

    def all_records(self) -> Iterator[Record]:
        """Every record of this rank, in order: the spilled ones read back, then
        those in memory."""
        path = self.records_path
        if self.spilled_records and path is not None:
            with open(path) as fh:
                for line in fh:
                    doc = json.loads(line)
                    yield Record(**{**doc, "shape": tuple(doc["shape"])})
        yield from self.records

    def prepend(self, old: list[Record]) -> None:
        """Put records of an earlier part of the run (a checkpoint's) before this
        rank's own, in the ledger file and the summary."""
        if self.spilled_records:
            mine = list(self.all_records())
            assert self.records_path is not None
            self.records_path.unlink()
            self.spilled_records = 0
            self.records = [*old, *mine]
        else:
            self.records[:0] = old
        for r in old:
            self._count(r)
        if self.spill_dir is not None and len(self.records) >= self.spill_records:
            self._spill_records()

    def write_jsonl(self, path: Path) -> None:
        """Write every record, in order, as JSON lines to ``path`` (the spilled ones
        move there; the spill file is gone after)."""
        part = self.records_path
        if self.spilled_records and part is not None:
            os.replace(part, path)
        with open_private(path, append=bool(self.spilled_records and part is not None)) as fh:
            fh.write(_lines(self.records))

    def summary(self) -> dict[str, Any]:
        """Aggregate of this rank's *sent* messages by phase and by
        (sender, receiver, tag); merged across ranks by :func:`merge_summaries`."""
        sent = {k: dict(v) for k, v in self._sent.items()}
        return {"sent": sent, "channel": {k: dict(v) for k, v in self.channel.items()}}


def _lines(records: list[Record]) -> bytes:
    """Records as JSON lines (a rank's ledger file, its owner's alone)."""
    return "".join(json.dumps(asdict(r)) + "\n" for r in records).encode()


def merge_summaries(parts: list[dict[str, Any]], n_train_steps: int) -> dict[str, Any]:
    """Combine per-rank summaries into the run's ledger summary."""
    rows: dict[str, dict[str, int]] = {}
    cpu: dict[str, dict[str, float]] = {}  # phase -> the sealed links' totals over all ranks
    for p in parts:
        for key, v in p.get("sent", {}).items():
            acc = rows.setdefault(key, {"messages": 0, "bytes": 0, "sealed_bytes": 0})
            acc["messages"] += int(v["messages"])
            acc["bytes"] += int(v["bytes"])
            acc["sealed_bytes"] += int(v.get("sealed_bytes", 0))
        for phase, v in p.get("channel", {}).items():
            c = cpu.setdefault(phase, {"seal_cpu_s": 0.0, "open_cpu_s": 0.0, "frames": 0, "sealed_bytes": 0})
            for k in c:
                c[k] += v.get(k, 0)
    by_phase: dict[str, dict[str, int]] = {}
    flows = []
    for key, v in sorted(rows.items()):
        phase, s, r, tag = key.split("|")
        ph = by_phase.setdefault(phase, {"messages": 0, "bytes": 0, "sealed_bytes": 0})
        ph["messages"] += v["messages"]
        ph["bytes"] += v["bytes"]
        ph["sealed_bytes"] += v["sealed_bytes"]
        flows.append({"phase": phase, "sender": int(s), "receiver": int(r), "tag": tag, **v})
    train = by_phase.get("train", {"messages": 0, "bytes": 0, "sealed_bytes": 0})
    ch = cpu.get("train", {})
    per = 1 / n_train_steps if n_train_steps else 0.0
    return {
        "by_phase": by_phase,
        "flows": flows,
        "train_steps": n_train_steps,
        "bytes_per_step": train["bytes"] / n_train_steps if n_train_steps else 0.0,
        "messages_per_step": train["messages"] / n_train_steps if n_train_steps else 0.0,
        "header_bytes_per_message": HEADER_BYTES,
        # the secure channel (SECURITY.md §4a): bytes on the wire (headers and AEAD tags
        # included) and CPU seconds sealing and opening, all ranks together
        # every sealed frame of the training phase (the channel's and, under mpc, CrypTen's)
        "sealed_bytes_per_step": ch.get("sealed_bytes", 0) * per,
        "channel_frames_per_step": ch.get("frames", 0) * per,
        "channel_cpu_s_per_step": (ch.get("seal_cpu_s", 0.0) + ch.get("open_cpu_s", 0.0)) * per,
        "channel": {k: {kk: round(vv, 6) for kk, vv in v.items()} for k, v in cpu.items()},
    }
