"""The two-party HE protocol (:mod:`securevfl.exchange.he.protocol`) between A and one passive
party, each in its own thread over an in-memory channel: the registered backend's
role objects with real keys and real ciphertexts, driven step by step with inputs
the test chooses (a test double for the transport only).

Every step records what each side holds and receives: A's weight share at its
forward (``a_share``) and the z it gets back (``z``), P_i's share at its backward
(``p_share``) and the dL/dh'_i it gets back (``grad``); ``a_share0``/``p_share0``
are the shares the roles were built with, before any message. Shares are float64
as each side's arithmetic reports them; :meth:`PairRun.weights` adds the exact
shares for the W_i of a step (``paillier``'s shares are integers far wider than a
float64 mantissa).
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from securevfl.app.loader import load_checked_dict
from securevfl.exchange import EXCHANGES
from securevfl.exchange.base import ExchangeContext
from securevfl.runtime.layout import Layout
from tests.support.protocols import load_yaml


class PeerGone(RuntimeError):
    """The other thread failed; this one stops waiting for it."""


class MemoryChannel:
    """An in-memory point-to-point channel with the calls he/protocol.py makes (a test double).
    A receive gives up when the other side has failed (``failed`` set)."""

    def __init__(
        self, rank: int, boxes: dict[tuple[int, int, str], queue.Queue[Any]], failed: threading.Event
    ):
        self.rank, self.boxes, self.failed = rank, boxes, failed
        self.lock = threading.Lock()

    def _box(self, src: int, dst: int, tag: Any) -> queue.Queue[Any]:
        with self.lock:
            return self.boxes.setdefault((src, dst, tag.name), queue.Queue())

    def send(self, dst: int, tag: Any, tensor: torch.Tensor) -> None:
        self._box(self.rank, dst, tag).put(tensor.detach().clone())

    def recv(self, src: int, tag: Any, *, shape: Any = None, dtype: Any = None, decode: Any = None) -> Any:
        box = self._box(src, self.rank, tag)
        for _ in range(3000):
            try:
                t = box.get(timeout=0.2)
                break
            except queue.Empty:
                if self.failed.is_set():
                    raise PeerGone(f"rank {src} failed") from None
        else:
            raise TimeoutError(f"nothing from rank {src} ({tag.name}) in 600 s")
        if dtype is not None:
            assert t.dtype == dtype, (tag.name, t.dtype, dtype)
        if shape is not None:
            fits = all(e is None or e == s for e, s in zip(shape, t.shape, strict=True))
            assert len(shape) == t.dim() and fits, (tag.name, tuple(t.shape), shape)
        return t

    def send_bytes(self, dst: int, tag: Any, data: bytes) -> None:
        self.send(dst, tag, torch.frombuffer(bytearray(data), dtype=torch.uint8))

    def recv_bytes(self, src: int, tag: Any, *, max_len: int | None = None) -> bytes:
        return bytes(self.recv(src, tag).numpy().tobytes())


@dataclass
class PairRun:
    """What each side held and received over the steps (module docstring)."""

    a_share0: np.ndarray | None = None
    p_share0: np.ndarray | None = None
    a_share: list[np.ndarray] = field(default_factory=list)
    z: list[np.ndarray] = field(default_factory=list)
    p_share: list[np.ndarray] = field(default_factory=list)
    grad: list[np.ndarray] = field(default_factory=list)
    roles: dict[str, Any] = field(default_factory=dict)
    errors: dict[str, BaseException] = field(default_factory=dict)
    exact: dict[str, list[Any]] = field(default_factory=lambda: {"A": [], "P": [], "A0": [], "P0": []})

    def weights(self, t: int) -> np.ndarray:
        """W_i during step t (A's share at its forward plus P_i's at its backward, added
        exactly in the scheme's arithmetic): what z and dL/dh'_i of step t multiply."""
        return self._sum(self.exact["A"][t], self.exact["P"][t])

    def start(self) -> np.ndarray:
        """W_i^0: the two shares the roles were built with, added exactly."""
        return self._sum(self.exact["A0"][0], self.exact["P0"][0])

    def _sum(self, a: Any, p: Any) -> np.ndarray:
        return np.asarray(self.roles["A"].ar.to_float(a + p), dtype=np.float64)


def protocol(backend: str, batch: int, dim: int, out: int) -> Any:
    """The shipped ``<backend>.yaml`` cut to one passive party with a ``dim``-wide
    embedding, an ``out``-wide interactive layer and batches of ``batch`` rows."""
    doc = load_yaml(f"{backend}.yaml")
    doc["parties"]["passive"] = doc["parties"]["passive"][:1]
    doc["parties"]["passive"][0]["model"]["out"] = dim
    doc["interactive"] = {"out": out}
    doc["training"]["batch_size"] = batch
    return load_checked_dict(doc)


def run_pair(
    backend: str,
    options: Any,
    hs: list[np.ndarray],
    gs: list[np.ndarray],
    *,
    train: bool = True,
) -> PairRun:
    """Run len(hs) steps of the registered ``backend`` between A (rank 0) and one
    passive party (rank 1): P_i sends hs[t] (B x d), A gets z and, when training,
    sends dL/dz = gs[t] (B x o) back. The thread that fails keeps its exception in
    ``errors`` (the other stops waiting); nothing is raised here."""
    b, d = hs[0].shape
    o = gs[0].shape[1]
    checked = protocol(backend, b, d, o)
    layout = Layout.from_protocol(checked.protocol, [])
    be = EXCHANGES.get(backend)
    boxes: dict[tuple[int, int, str], queue.Queue[Any]] = {}
    failed = threading.Event()
    run = PairRun()

    def ctx(rank: int) -> ExchangeContext:
        ch = MemoryChannel(rank, boxes, failed)
        return ExchangeContext(ch, layout, rank, checked, options, [d], torch.device("cpu"))

    def active() -> None:
        try:
            a = be.active(ctx(0))
            run.roles["A"] = a
            run.a_share0 = a.ar.to_float(a.w[0].w).copy()
            run.exact["A0"].append(a.w[0].w.copy())
            for t in range(len(hs)):
                run.a_share.append(a.ar.to_float(a.w[0].w).copy())
                run.exact["A"].append(a.w[0].w.copy())
                run.z.append(a.forward(b, train=train).double().numpy())
                if train:
                    a.backward(torch.from_numpy(gs[t]).float())
        except BaseException as exc:  # kept for the test; the other side stops waiting
            run.errors["A"] = exc
            failed.set()

    def passive() -> None:
        try:
            p = be.passive(ctx(1))
            run.roles["P"] = p
            run.p_share0 = p.ar.to_float(p.w.w).copy()
            run.exact["P0"].append(p.w.w.copy())
            for h in hs:
                p.forward(torch.from_numpy(h).float(), train=train)
                if train:
                    run.p_share.append(p.ar.to_float(p.w.w).copy())
                    run.exact["P"].append(p.w.w.copy())
                    run.grad.append(p.backward().double().numpy())
        except BaseException as exc:
            run.errors["P"] = exc
            failed.set()

    threads = [threading.Thread(target=f, daemon=True) for f in (active, passive)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=900)
    return run
