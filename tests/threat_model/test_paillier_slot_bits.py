"""The key owner's low-bit attack on ``paillier``'s masked products.

Under ``paillier`` the key owner decrypts every product the other party evaluated
for it: P_i decrypts Enc(h'_i W^A + eps) in the forward pass, A decrypts
Enc(dL/dz W^P^T + mu) in the backward pass. It knows its own encrypted operand
(the integers H or G it encrypted) exactly. If the evaluator's mask leaves the
low t bits of a slot bare, every slot is a linear equation mod 2^t in the other
party's encoded weight share X: H X = slot (mod 2^t), one per row of the batch,
and with more rows than unknowns the key owner solves for X mod 2^t and checks
the solution on the spare rows (earlier versions drew masks on a 2^-28 grid
under 2^-44 slots: t = 16, X mod 2^16, i.e. W_i mod 1/16 once the attacker adds
its own share). Consistency mod 2 is implied by consistency mod 2^t, so a
system that is inconsistent mod 2 shows that not a single low bit is bare.

The tests play one training step of the real protocol (:mod:`securevfl.exchange.he.protocol`,
the registered ``paillier`` backend, real keys) between A and one passive party in
two threads over an in-memory channel, take what the attacker received (the
ciphertext blob) and what it holds (its secret key, its own input), and solve.
Ground truth, for scoring only, is the operand the evaluator multiplied by. The
positive control runs the same attack on the same code with the evaluator's masks
cut to the old grid (low 16 bits zero): the attack must then recover all 16 bits.
"""

from __future__ import annotations

import queue
import threading
from typing import Any

import numpy as np
import pytest
import torch

from securevfl.app.loader import load_checked_dict
from securevfl.exchange import EXCHANGES
from securevfl.exchange.base import ExchangeContext
from securevfl.exchange.paillier import PaillierOptions
from securevfl.exchange.paillier.wire import load_blob
from securevfl.runtime.layout import Layout
from tests.support.protocols import load_yaml

pytestmark = pytest.mark.timeout(600)

BATCH, DIM, OUT = 64, 16, 16  # 64 equations per column for 16 unknowns
OLD_GRID_BITS = 16  # the low bits an earlier version's masks left bare


class _Channel:
    """An in-memory point-to-point channel with the calls he/protocol.py makes (a test double)."""

    def __init__(self, rank: int, boxes: dict[tuple[int, int, str], queue.Queue[Any]]):
        self.rank, self.boxes = rank, boxes

    def _box(self, src: int, dst: int, tag: Any) -> queue.Queue[Any]:
        return self.boxes.setdefault((src, dst, tag.name), queue.Queue())

    def send(self, dst: int, tag: Any, tensor: torch.Tensor) -> None:
        self._box(self.rank, dst, tag).put(tensor.detach().clone())

    def recv(self, src: int, tag: Any, *, shape: Any = None, dtype: Any = None, decode: Any = None) -> Any:
        t = self._box(src, self.rank, tag).get(timeout=300)
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


def _cut_to_old_grid(mask: Any) -> Any:
    """The evaluator's mask with its low 16 bits (at the result scale) cleared: the
    grid of an earlier version. Float masks (that version's own) are left as they are."""
    m = np.asarray(mask)
    if m.dtype == object or m.dtype.kind in "iu":
        return (m >> OLD_GRID_BITS) << OLD_GRID_BITS
    return mask


def _record(peer: Any, log: list[dict[str, Any]], old_grid: bool) -> None:
    """Wrap an evaluator's ``matmul``: keep the operand it multiplied by (ground truth)
    and the blob it returned (what the key owner receives)."""
    inner = peer.matmul

    def matmul(blob: bytes, shape: Any, w: Any, mask: Any) -> bytes:
        out = inner(blob, shape, w, _cut_to_old_grid(mask) if old_grid else mask)
        log.append({"in": blob, "w": np.asarray(w), "out": out})
        return bytes(out)

    peer.matmul = matmul


def one_step(old_grid: bool = False) -> dict[str, Any]:
    """One training step of the registered ``paillier`` backend between A (rank 0) and
    one passive party (rank 1), each in its own thread; returns both role objects,
    the inputs and every product each evaluator made."""
    doc = load_yaml("paillier.yaml")
    doc["parties"]["passive"] = doc["parties"]["passive"][:1]
    doc["parties"]["passive"][0]["model"]["out"] = DIM
    doc["interactive"] = {"out": OUT}
    doc["training"]["batch_size"] = BATCH
    checked = load_checked_dict(doc)
    options = PaillierOptions(threads=1, precompute=False)
    layout = Layout.from_protocol(checked.protocol, [])
    backend = EXCHANGES.get("paillier")
    boxes: dict[tuple[int, int, str], queue.Queue[Any]] = {}
    rng = np.random.default_rng(0)  # the step's inputs (public test data)
    h = torch.from_numpy(rng.normal(0.0, 1.0, size=(BATCH, DIM)))
    g = torch.from_numpy(rng.normal(0.0, 0.05, size=(BATCH, OUT)))
    made: dict[str, Any] = {"forward": [], "backward": [], "h": h.numpy(), "g": g.numpy()}
    errors: list[BaseException] = []

    def ctx(rank: int) -> ExchangeContext:
        ch = _Channel(rank, boxes)
        return ExchangeContext(ch, layout, rank, checked, options, [DIM], torch.device("cpu"))

    def active() -> None:
        try:
            a = backend.active(ctx(0))
            made["A"] = a
            _record(a.peer[0], made["forward"], old_grid)
            a.forward(BATCH, train=True)
            a.backward(g.float())
        except BaseException as exc:  # re-raised in the test's thread
            errors.append(exc)

    def passive() -> None:
        try:
            p = backend.passive(ctx(1))
            made["P"] = p
            _record(p.peer, made["backward"], old_grid)
            p.forward(h.float(), train=True)
            p.backward()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=f) for f in (active, passive)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=500)
    if errors:
        raise errors[0]
    return made


# -- the attacker's side: its own decryption, unpacking and algebra (no product code) ------


def owner_view(key: Any, received: bytes, sent: bytes, own_input: np.ndarray) -> tuple[np.ndarray, ...]:
    """What the key owner reads: the exact slot integers of a result blob it received
    (B x m, decrypted with its secret key, unpacked from the blob's header), its own
    input as the integers it encrypted (at its blob's scale, from the float32 values
    the party computed on), and the evaluator's operand scale (result scale minus its own)."""
    (res,) = load_blob(received, key.n, key.n2, "attacker")
    own = next(s for s in load_blob(sent, key.n, key.n2, "attacker") if s.layout == res.layout)
    mine = np.rint(np.ldexp(own_input.astype(np.float32).astype(np.float64), own.scale)).astype(np.int64)
    s, slots, n = res.slot_bits, res.slots, int(key.n)
    bias = sum(1 << (i * s + s - 1) for i in range(slots))
    vals = []
    for m in key.decrypt_ints(res.cts):
        t = int(m)
        t = (t - n if t > n // 2 else t) + bias
        vals.append([((t >> (i * s)) & ((1 << s) - 1)) - (1 << (s - 1)) for i in range(slots)])
    rows, cols = res.rows, res.cols
    blocks = -(-rows // slots)  # ``cols`` layout: consecutive rows of one column per ciphertext
    y = np.array(vals, dtype=object).reshape(cols, blocks * slots).T[:rows]
    return y, mine, np.int64(res.scale - own.scale)


def solve_mod_2k(a: list[list[int]], y: list[int], k: int) -> list[int] | None:
    """x with a x = y (mod 2^k) by elimination on odd pivots, checked on every row;
    None when the rows contradict each other (or no odd pivot exists)."""
    mod = (1 << k) - 1
    rows = [[v & mod for v in r] + [t & mod] for r, t in zip(a, y, strict=True)]
    n = len(a[0])
    at = 0
    for c in range(n):
        p = next((i for i in range(at, len(rows)) if rows[i][c] & 1), None)
        if p is None:
            return None
        rows[at], rows[p] = rows[p], rows[at]
        inv = pow(rows[at][c], -1, mod + 1)
        rows[at] = [(v * inv) & mod for v in rows[at]]
        for i in range(len(rows)):
            f = rows[i][c]
            if i != at and f:
                rows[i] = [(vi - f * vr) & mod for vi, vr in zip(rows[i], rows[at], strict=True)]
        at += 1
    if any(rows[i][n] for i in range(at, len(rows))):
        return None
    return [rows[c][n] for c in range(n)]


def attack(own_ints: np.ndarray, slots: np.ndarray, k: int) -> list[list[int] | None]:
    """Per result column j: X[:, j] mod 2^k from own_ints @ X[:, j] = slots[:, j]."""
    a = [[int(v) for v in row] for row in own_ints]
    return [solve_mod_2k(a, [int(v) for v in slots[:, j]], k) for j in range(slots.shape[1])]


def truth(w: np.ndarray, frac: int) -> np.ndarray:
    """The evaluator's operand as the integers it multiplied by (float operands of an
    earlier version are encoded at 2^-frac as its kernel did)."""
    if w.dtype.kind == "f":
        return np.rint(np.ldexp(w, frac)).astype(np.int64).astype(object)
    return w.astype(object)


def recovered_bits(own_ints: np.ndarray, slots: np.ndarray, w: np.ndarray, frac: int) -> int:
    """How many low bits of the evaluator's whole operand the key owner recovers: 16
    (the old grid), or 0 when even the system mod 2 is inconsistent for every column."""
    x = truth(w, frac)
    for k in (OLD_GRID_BITS, 1):
        sols = attack(own_ints, slots, k)
        if all(s is not None for s in sols):
            got = np.array(sols, dtype=object).T  # (unknowns, columns)
            assert ((x - got) % (1 << k) == 0).all(), "a consistent solution that is not the operand"
            return k
    return 0


def forward_attack(made: dict[str, Any]) -> int:
    """P_i, holding its key and h, against Enc(h W^A + eps) from A."""
    p, (prod,) = made["P"], made["forward"]
    slots, h_ints, frac = owner_view(p.key, prod["out"], prod["in"], made["h"])
    return recovered_bits(h_ints, slots, prod["w"], int(frac))


def backward_attack(made: dict[str, Any]) -> int:
    """A, holding its key and dL/dz, against Enc(dL/dz W^P^T + mu) from P_i."""
    a, prods = made["A"], made["backward"]
    prod = prods[0]  # the first backward product is g W^P^T + mu (then h^T g - R)
    slots, g_ints, frac = owner_view(a.key, prod["out"], prod["in"], made["g"])
    return recovered_bits(g_ints, slots, prod["w"], int(frac))


@pytest.fixture(scope="module")
def step() -> dict[str, Any]:
    return one_step()


@pytest.fixture(scope="module")
def old_grid_step() -> dict[str, Any]:
    return one_step(old_grid=True)


def test_positive_control_the_attack_recovers_16_bits_from_old_grid_masks(old_grid_step):
    """Masks with their low 16 bits cleared, as an earlier version drew them: each
    key owner recovers the other's encoded weight share mod 2^16, every entry."""
    assert forward_attack(old_grid_step) == OLD_GRID_BITS
    assert backward_attack(old_grid_step) == OLD_GRID_BITS


def test_p_i_recovers_no_bit_of_a_share_from_the_forward_product(step):
    bits = forward_attack(step)
    assert bits == 0, f"P_i recovered A's encoded weight share mod 2^{bits} from Enc(h W^A + eps)"


def test_a_recovers_no_bit_of_p_i_share_from_the_backward_product(step):
    bits = backward_attack(step)
    assert bits == 0, f"A recovered P_i's encoded weight share mod 2^{bits} from Enc(g W^P^T + mu)"
