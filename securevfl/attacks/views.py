"""Row identity: map what a party received to the records it belongs to.

Every party derives the same batch schedule (securevfl.schedule): training
step t's batch is a list of positions into the training rows, and evaluation walks
the test rows in order. A party's own view logs that schedule as ``forwards``
(phase, round, rows), one entry per exchange forward, so the n-th tensor it got
belongs to the rows of the n-th forward. These helpers turn the per-forward
tensors into per-record tables: the latest tensor seen for each training row, and
the tensors of the final evaluation pass for each test row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from securevfl.data.layout import FeatureLayout
from securevfl.errors import ConfigError, ProtocolError
from securevfl.exchange import EXCHANGES
from securevfl.parties.state import PreprocessState
from securevfl.runtime.messages import EMBEDDING


@dataclass
class RowTable:
    """One tensor per record: ``train[i]`` belongs to training row i (valid where
    ``train_seen[i]``), ``test[j]`` to test row j (from the final evaluation)."""

    train: torch.Tensor
    train_seen: np.ndarray
    test: torch.Tensor
    test_seen: np.ndarray


def final_eval_round(forwards: list[dict[str, Any]]) -> int | None:
    rounds = [f["round"] for f in forwards if f["phase"] == "eval"]
    return max(rounds) if rounds else None


def per_row(
    forwards: list[dict[str, Any]], tensors: list[torch.Tensor], n_train: int, n_test: int
) -> RowTable:
    """Latest training-phase tensor per training row; final-evaluation tensor per
    test row. ``tensors[k]`` is what the party got at ``forwards[k]``."""
    if len(forwards) != len(tensors):
        raise ProtocolError(f"view holds {len(tensors)} tensors for {len(forwards)} forwards")
    if not tensors:
        raise ProtocolError("the view holds no tensors (was runtime.record_views off?)")
    d = tensors[0].shape[1:]
    train = torch.zeros((n_train, *d))
    test = torch.zeros((n_test, *d))
    seen_tr = np.zeros(n_train, dtype=bool)
    seen_te = np.zeros(n_test, dtype=bool)
    last_eval = final_eval_round(forwards)
    for f, t in zip(forwards, tensors, strict=True):
        rows = np.asarray(f["rows"])
        if t.shape[0] != len(rows):
            raise ProtocolError(
                f"forward {f['phase']}/{f['round']}: {t.shape[0]} rows for {len(rows)} positions"
            )
        if f["phase"] == "train":
            train[rows] = t.float()
            seen_tr[rows] = True
        elif f["round"] == last_eval:
            test[rows] = t.float()
            seen_te[rows] = True
    return RowTable(train, seen_tr, test, seen_te)


def received_per_forward(
    received: list[tuple[int, torch.Tensor]], forwards: list[dict[str, Any]], n_peers: int, peer: int
) -> list[torch.Tensor]:
    """Split a tag's received tensors (arrival order, every peer interleaved) into
    the rows of passive peer ``peer`` for each forward: the active party receives
    one message per peer per forward, or per FedBCD round holding the round's
    batches in order, peers in rank order (securevfl.exchange.plain)."""
    if len(received) % n_peers:
        raise ProtocolError(f"{len(received)} received embeddings do not split over {n_peers} peers")
    mine = [t for k, (_, t) in enumerate(received) if k % n_peers == peer]
    sizes = [len(f["rows"]) for f in forwards]
    rows = sum(len(t) for t in mine)
    if rows != sum(sizes):
        raise ProtocolError(
            f"the view holds {rows} received embedding rows from peer {peer}; "
            f"its {len(forwards)} forwards cover {sum(sizes)}"
        )
    return list(torch.cat(mine).split(sizes)) if mine else []


def steps_per_row(forwards: list[dict[str, Any]], tensors: list[torch.Tensor], n_train: int):
    """Every training-phase tensor per training row: a list (one per row) of the
    row's tensors over the steps it appeared in."""
    out: list[list[torch.Tensor]] = [[] for _ in range(n_train)]
    for f, t in zip(forwards, tensors, strict=False):
        if f["phase"] != "train":
            continue
        for r, v in zip(np.asarray(f["rows"]), t, strict=True):
            out[int(r)].append(v)
    return out


def active_source(proto: Any, requested: str) -> str:
    """What A can decode of a victim: ``embedding`` (its h'_i, only under a backend
    with ``active_sees_embeddings``) or ``z``; ``auto`` picks the former where it
    exists. Asking for an embedding the backend never shows A is a ConfigError."""
    caps = EXCHANGES.get(proto.exchange.backend).capabilities
    if requested == "auto":
        return "embedding" if "active_sees_embeddings" in caps else "z"
    if requested == "embedding" and "active_sees_embeddings" not in caps:
        raise ConfigError(
            f"source 'embedding': backend '{proto.exchange.backend}' never shows A an embedding",
            path="attacks.params.source",
        )
    return requested


def active_tensors(view: Any, prior: dict[str, Any]) -> tuple[list[torch.Tensor], str]:
    """A's tensor per exchange forward, for ``prior["source"]`` from
    :func:`active_source`: the received embeddings of the victim (``prior``'s
    ``victim``, ``victim_index`` of ``n_peers``), or the z A recorded. Also says which."""
    if prior["source"] == "embedding":
        tensors = received_per_forward(
            view.received.get(EMBEDDING.name, []),
            view.own.forwards,
            prior["n_peers"],
            prior["victim_index"],
        )
        return tensors, f"ledger '{EMBEDDING.name}' from {prior['victim']} (h'_i)"
    return view.own.z, "revealed z at A (own record of each exchange forward)"


def own_layout(own: Any, party: str) -> FeatureLayout | None:
    """The input layout of a party's bottom model, rebuilt from the fitted
    preprocessing in its own view (``own.preprocess``), for a factory that takes
    it; None when the view holds none."""
    doc = getattr(own, "preprocess", None)
    return None if doc is None else PreprocessState.model_validate(doc).layout(party)
