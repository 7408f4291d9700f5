"""The ledger: one record per message a rank sent or received.

Each record holds round (training step, or -1 outside training), phase, sender,
receiver, tag, shape, dtype and payload bytes. Bytes per step are summed over
``sent`` records of the training phase, so each message counts once. The wire
audit tests and the attacks' views read the same records.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

HEADER_BYTES = 12 * 8  # fixed frame header preceding every payload (int64[12])


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


@dataclass
class Ledger:
    """Per-rank message log, plus (optionally) the tensors this rank received:
    the adversary's view for attacks run at this rank."""

    rank: int
    record_views: bool = True
    records: list[Record] = field(default_factory=list)
    received: dict[str, list[tuple[int, torch.Tensor]]] = field(default_factory=lambda: defaultdict(list))

    def log(self, rec: Record, payload: torch.Tensor | None = None) -> None:
        self.records.append(rec)
        if payload is not None and rec.direction == "recv" and self.record_views:
            self.received[rec.tag].append((rec.round, payload.detach().clone()))

    def write_jsonl(self, path: Path) -> None:
        with open(path, "w") as fh:
            for r in self.records:
                fh.write(json.dumps(asdict(r)) + "\n")

    def summary(self) -> dict[str, Any]:
        """Aggregate of this rank's *sent* messages by phase and by
        (sender, receiver, tag); merged across ranks by :func:`merge_summaries`."""
        by_key: dict[str, dict[str, int]] = defaultdict(lambda: {"messages": 0, "bytes": 0})
        for r in self.records:
            if r.direction != "sent":
                continue
            key = f"{r.phase}|{r.sender}|{r.receiver}|{r.tag}"
            by_key[key]["messages"] += 1
            by_key[key]["bytes"] += r.bytes
        return {"sent": dict(by_key)}


def merge_summaries(parts: list[dict[str, Any]], n_train_steps: int) -> dict[str, Any]:
    """Combine per-rank summaries into the run's ledger summary."""
    rows: dict[str, dict[str, int]] = {}
    for p in parts:
        for key, v in p.get("sent", {}).items():
            acc = rows.setdefault(key, {"messages": 0, "bytes": 0})
            acc["messages"] += int(v["messages"])
            acc["bytes"] += int(v["bytes"])
    by_phase: dict[str, dict[str, int]] = {}
    flows = []
    for key, v in sorted(rows.items()):
        phase, s, r, tag = key.split("|")
        ph = by_phase.setdefault(phase, {"messages": 0, "bytes": 0})
        ph["messages"] += v["messages"]
        ph["bytes"] += v["bytes"]
        flows.append({"phase": phase, "sender": int(s), "receiver": int(r), "tag": tag, **v})
    train = by_phase.get("train", {"messages": 0, "bytes": 0})
    return {
        "by_phase": by_phase,
        "flows": flows,
        "train_steps": n_train_steps,
        "bytes_per_step": train["bytes"] / n_train_steps if n_train_steps else 0.0,
        "messages_per_step": train["messages"] / n_train_steps if n_train_steps else 0.0,
        "header_bytes_per_message": HEADER_BYTES,
    }
