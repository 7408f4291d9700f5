"""A curious MPC party rebuilds its peer's generator from the openings it receives.

In the ``mpc`` backend's pairwise layout a party opens its own values behind
masks it alone draws from the stream it shares with the dealer: P_1 sends A
h'_1 - u, A sends P_1 dL/dz - g. Those values are small fixed-point numbers, so
the high 32 bits of every opened element are the high half of the mask's
element, up to a carry. Were the stream Mersenne Twister (``torch.Generator``, as
CrypTen draws it, or any MT keystream), the high halves of 937 consecutive mask
elements would give the generator's state (:func:`tests.threat_model.mt19937.clone_from_high_halves`)
and every later draw would follow: P_1 would unmask dL/dz at every later step
(label information), A would unmask h'_1.

The attack plays P_1 with exactly what P_1 receives (its view of a real run: A's
openings) and A with A's (P_1's openings), over every part of every opening, both
signs, every element layout of :data:`~tests.threat_model.mt19937.LAYOUTS`. It
runs twice: on the real code, where every mask is AES-256-CTR keystream, it must
find nothing; on the same run with the weakness put back (every secret stream an
MT19937 keystream, :mod:`tests.threat_model.weak_stream`), it must rebuild the
peer's generator and unmask a later opening exactly, or it guards nothing. Positive
controls without a run check the attack on a ``torch.Generator`` stream drawn as
CrypTen drew it and on the planted keystream.

A mask can be weak without any generator to rebuild: a ring element filled from a
32-bit draw (zero- or sign-extended, shifted into the high half, or repeated in both
halves) leaves the opened x - a with bits fixed or tied to each other, whatever
generator drew it. :func:`weak_bits` tests every opened element's 64 bits: each bit
one half of the time, and every pair of bits agreeing half of the time (a
uniform element of Z_2^64 has 64 independent fair bits, whatever x is). The real
run's openings must pass it; each way of filling a mask from 32 bits
(:data:`tests.threat_model.weak_stream.RING32`, planted under AES keystream, so the
generator attack finds nothing) must fail it.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from securevfl.app.launcher import free_port
from securevfl.csprng import SecretStream
from tests.support.protocols import ROOT, small_digits, write_yaml
from tests.support.runs import run_doc
from tests.threat_model.mt19937 import (
    ELEMENTS,
    HIGH_ELEMENTS,
    LAYOUTS,
    TORCH,
    Clone,
    WordOrder,
    clone_from_high_halves,
    clone_from_ring,
)
from tests.threat_model.weak_stream import RING32, plant_mt_keystream, plant_ring32

pytestmark = pytest.mark.timeout(600)

B, D, OUT = 64, 16, 16  # batch, P_1's embedding width, the interactive layer's output
CHECK = 40  # the fewest elements after the window a clone must predict (it predicts all there are)
STEPS = 6
# a low half this close to 2^32 or 0 leaves the high half in doubt by a carry of the
# opened value x (|x| < 2^22: fixed-point values below 64 in magnitude)
DOUBT = 1 << 22
LOW32 = np.uint64(0xFFFFFFFF)


def _u64(t: torch.Tensor) -> np.ndarray:
    return t.contiguous().reshape(-1).numpy().view(np.uint64)


def clone_mask(v: np.ndarray, layout: WordOrder) -> tuple[Clone, ...]:
    """The generators that may stand behind a mask whose approximation ``v``
    (uint64, the opening negated, off by the small opened value) starts a draw in
    ``layout``, each placed after the first :data:`HIGH_ELEMENTS` elements: every
    clone that predicts all the elements after that window (at least
    :data:`CHECK` of them), each within the opened value's bound of ``v``. An
    element whose high half is in doubt (a carry) is tried both ways; more than
    one clone comes back when the elements after the window cannot tell the ways
    apart (an early doubtful output first shows some 50 elements after the window,
    a late one over 100), and :func:`unmask` tries each."""
    if len(v) < HIGH_ELEMENTS + CHECK:
        return ()
    high = layout.high_halves(v)
    low = v & LOW32
    doubt = (low < DOUBT) | (low >= np.uint64(2**32 - DOUBT))
    other = np.where(low < DOUBT, high - np.uint32(1), high + np.uint32(1)).astype(np.uint32)
    unsure = np.flatnonzero(doubt[:HIGH_ELEMENTS])
    if len(unsure) > 8:
        return ()
    want = v[HIGH_ELEMENTS:]
    clones = []
    for choice in itertools.product((False, True), repeat=len(unsure)):
        h = high.copy()
        picked = unsure[list(choice)]
        h[picked] = other[picked]
        x = (_u64(clone_from_high_halves(h, layout).ring(len(want))) - want).view(np.int64)
        if np.all(np.abs(x) < DOUBT):  # the opened values, were this clone right
            clones.append(clone_from_high_halves(h, layout))
    return tuple(clones)


def hypotheses(opening: torch.Tensor, parts: list[int]) -> list[tuple[str, np.ndarray]]:
    """The masks an opening made of ``parts`` (element counts) may expose: each part
    negated (x - a) or as it is (a - x)."""
    out, at = [], 0
    for n in parts:
        seg = _u64(opening[at : at + n])
        out += [(f"-part@{at}", (-seg.view(np.int64)).view(np.uint64)), (f"+part@{at}", seg)]
        at += n
    return out


@dataclass
class Hit:
    opening: int
    where: str
    layout: WordOrder
    clones: tuple[Clone, ...]  # every generator the opening leaves possible (:func:`clone_mask`)


def attack(opened: list[torch.Tensor], parts_of: Any) -> list[Hit]:
    """Every (opening, part, layout) whose mask a clone predicts."""
    hits = []
    for k, o in enumerate(opened):
        for where, v in hypotheses(o, parts_of(o)):
            for layout in LAYOUTS:
                clones = clone_mask(v, layout)
                if clones:
                    hits.append(Hit(k, where, layout, clones))
    return hits


def unmask(hit: Hit, part: torch.Tensor, horizon: int = 300_000) -> torch.Tensor | None:
    """The value behind a later opening ``part`` (x - a): each of the hit's clones'
    streams searched for the mask a, whose first element must sit where the part's
    high half says. Returns x when every element of it is small, else None."""
    layout = hit.layout
    v = (-_u64(part).view(np.int64)).view(np.uint64)
    first = layout.high_halves(v[:1])[0]
    for clone in hit.clones:
        stream = _u64(clone.ring(horizon))
        high = layout.high_halves(stream)
        for i in np.flatnonzero(np.abs(high.astype(np.int64) - int(first)) <= 1):
            if i + len(v) > len(stream):
                break
            x = (_u64(part) + stream[i : i + len(v)]).view(np.int64)
            if np.all(np.abs(x) < DOUBT):
                return torch.from_numpy(x.copy())
    return None


# a bit statistic of uniform elements is N(0, 1) to within 1/sqrt(n): 2,080 of them per
# view pass 8 together with probability about 1 - 2^-38. Measured: the largest read 5.5 in
# 1,000 simulated views (6,144 elements each) and at most 4.3 in five real runs' views
# (16,496 elements each); a mask of 32 random bits moves one by 78 to 128 (SECURITY.md §6a)
Z_LIMIT = 8.0


def weak_bits(opened: list[torch.Tensor]) -> list[str]:
    """The bits of the opened elements that are not fair and independent: bit i set
    in other than half the elements, or bits i and j agreeing in other than half, by
    more than :data:`Z_LIMIT` standard deviations (z = (2 count - n) / sqrt(n))."""
    v = np.concatenate([_u64(o) for o in opened])
    n = len(v)
    bits = ((v[:, None] >> np.arange(64, dtype=np.uint64)) & np.uint64(1)).astype(np.float64)
    signs = 2.0 * bits - 1.0
    freq = signs.sum(0) / np.sqrt(n)
    pair = (signs.T @ signs) / np.sqrt(n)
    found = [
        f"bit {i} set in {(1 + z / np.sqrt(n)) / 2:.3f} of {n}"
        for i, z in enumerate(freq)
        if abs(z) > Z_LIMIT
    ]
    i, j = np.triu_indices(64, k=1)
    found += [
        f"bits {a} and {b} agree in {(1 + pair[a, b] / np.sqrt(n)) / 2:.3f} of {n}"
        for a, b in zip(i, j, strict=True)
        if abs(pair[a, b]) > Z_LIMIT
    ]
    return found


def bit_z(opened: list[torch.Tensor]) -> float:
    """The largest |z| of :func:`weak_bits`' statistics (the margin measured)."""
    v = np.concatenate([_u64(o) for o in opened])
    signs = 2.0 * ((v[:, None] >> np.arange(64, dtype=np.uint64)) & np.uint64(1)).astype(np.float64) - 1.0
    pair = (signs.T @ signs)[np.triu_indices(64, k=1)]
    return float(max(np.abs(signs.sum(0)).max(), np.abs(pair).max()) / np.sqrt(len(v)))


# -- positive controls, no run ---------------------------------------------------------------------


def test_positive_control_recovers_a_torch_generator_stream():
    """A party draws its masks as CrypTen drew them (torch.Generator, 64-bit seed from
    os.urandom): 312 opened values of x - a with x = 0 predict the rest of a, the
    next mask b, and so the share W_A behind the opening W_A - b."""
    g = torch.Generator().manual_seed(int.from_bytes(os.urandom(8), "big") - 2**63)
    a = torch.randint(-(2**63), 2**63 - 1, (B, D), generator=g, dtype=torch.long)
    b = torch.randint(-(2**63), 2**63 - 1, (D, OUT), generator=g, dtype=torch.long)
    w_a = (torch.randn(D, OUT) * 2**16).long()
    opening = torch.cat([(0 - a).reshape(-1), (w_a - b).reshape(-1)])
    clone = clone_from_ring(-opening[:ELEMENTS])
    rest = clone.ring(B * D - ELEMENTS + D * OUT)
    b_pred = rest[-D * OUT :].reshape(D, OUT)
    assert torch.equal(opening[B * D :].reshape(D, OUT) + b_pred, w_a)


def _small(shape: tuple[int, ...], scale: float, seed: int) -> torch.Tensor:
    """Fixed-point values (16 fractional bits) of about ``scale`` in magnitude."""
    return (torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * scale * 2**16).long()


def test_positive_control_high_halves_of_a_torch_generator_stream():
    """Masks drawn as CrypTen drew them behind non-zero fixed-point values (the
    one-sided openings): the attack rebuilds the generator from the first opening
    and unmasks the next."""
    g = torch.Generator().manual_seed(int.from_bytes(os.urandom(8), "big") - 2**63)
    draw = lambda: torch.randint(-(2**63), 2**63 - 1, (B, OUT), generator=g, dtype=torch.long)  # noqa: E731
    g1, g2 = draw(), draw()
    x1, x2 = _small((B, OUT), 8.0, 1), _small((B, OUT), 6.0, 2)
    hits = attack([(x1 - g1).reshape(-1)], lambda o: [o.numel()])
    assert [h.layout for h in hits] == [TORCH] and hits[0].where == "-part@0"
    assert torch.equal(unmask(hits[0], (x2 - g2).reshape(-1)), x2.reshape(-1))


def test_positive_control_high_halves_of_the_planted_keystream(monkeypatch: pytest.MonkeyPatch):
    """The planted weakness itself (an MT19937 keystream under SecretStream):
    ``ring`` draws from it as the dealer's streams do, and the attack rebuilds it."""
    monkeypatch.setattr(SecretStream, "_seek", SecretStream._seek)  # undone after the test
    plant_mt_keystream()
    s = SecretStream.fresh()
    s.ring((5,))  # somewhere in the stream
    g1, g2 = s.ring((B, OUT)), s.ring((D, OUT))
    x1, x2 = _small((B, OUT), 4.0, 3), _small((D, OUT), 4.0, 4)
    hits = attack([(x1 - g1).reshape(-1)], lambda o: [o.numel()])
    assert hits and hits[0].layout.high_first is False
    assert torch.equal(unmask(hits[0], (x2 - g2).reshape(-1)), x2.reshape(-1))


@pytest.mark.parametrize("way", [None, *RING32], ids=["aes", *RING32])
def test_masks_holding_32_random_bits_are_caught(way: str | None, monkeypatch: pytest.MonkeyPatch):
    """Backward openings dL/dz - g of :data:`STEPS` steps, each g a secret stream's
    ring elements: with 64 random bits (AES keystream) every bit of the openings is
    fair; with 32 (planted) :func:`weak_bits` names the bits, while the generator
    attack, which only looks for Mersenne Twister, rebuilds nothing."""
    monkeypatch.setattr(SecretStream, "ring", SecretStream.ring)  # undone after the test
    if way is not None:
        plant_ring32(way)
    s = SecretStream.fresh()
    opened = [(_small((B, OUT), 4.0, 10 + k) - s.ring((B, OUT))).reshape(-1) for k in range(STEPS)]
    assert not attack(opened[:2], lambda o: [o.numel()])  # no generator to rebuild either way
    found = weak_bits(opened)
    if way is None:
        assert not found, f"64-bit masks read as weak: {found[:5]}"
    else:
        assert found, f"masks holding 32 random bits ({way}) passed the bit test"


# -- a real run, and the same run with the weakness planted ----------------------------------------


def _doc() -> dict[str, Any]:
    doc = small_digits(epochs=1, batch_size=B, max_steps=STEPS)
    doc["parties"]["passive"] = [
        {"name": "left", "columns": {"glob": "px_*"}, "model": {"kind": "mlp", "hidden": [16], "out": D}}
    ]
    doc["interactive"] = {"out": OUT}
    doc["exchange"] = {"backend": "mpc"}
    doc["runtime"] = {"dump_views": True, "startup_timeout_s": 180}
    return doc


@dataclass
class Run:
    planted: bool
    folders: dict[int, Path]  # each rank's output folder

    def view(self, rank: int) -> dict[str, Any]:
        return torch.load(self.folders[rank] / "ranks" / f"rank{rank}.view.pt", weights_only=False)

    def openings(self, rank: int) -> list[torch.Tensor]:
        return [t.reshape(-1) for _, t in self.view(rank)["received"]["mpc.open"]]


def _planted_run(root: Path) -> Run:
    """The three ranks as ``securevfl party`` processes, each with every secret
    stream an MT19937 keystream (:func:`tests.threat_model.weak_stream.plant_mt_keystream`)."""
    proto, port = write_yaml(root / "mpc.yaml", _doc()), free_port()
    folders = {r: root / f"host{r}" for r in range(3)}
    procs = {}
    for r, out in folders.items():
        args = [sys.executable, "-m", "tests.threat_model.weak_stream", "party", str(proto), "--rank", str(r)]
        args += ["--rendezvous", f"tcp://127.0.0.1:{port}", "--out", str(out), "--quiet"]
        procs[r] = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    for r, p in procs.items():
        try:
            so, se = p.communicate(timeout=500)
        except subprocess.TimeoutExpired:
            p.kill()
            so, se = p.communicate()
        assert p.returncode == 0, f"rank {r}: {(so + se)[-3000:]}"
    return Run(True, folders)


@pytest.fixture(scope="module", params=["real", pytest.param("planted", marks=pytest.mark.slow)])
def mpc_run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Run:
    root = tmp_path_factory.mktemp(f"mpc-prng-{request.param}")
    if request.param == "planted":
        return _planted_run(root)
    result = run_doc(_doc(), root)
    assert result["backend"] == "mpc" and result["world_size"] == 3
    return Run(False, dict.fromkeys(range(3), root))


def _parts(o: torch.Tensor) -> list[int]:
    """An opening's parts: a training step's backward opening is dL/dz - g alone
    (B x OUT); a forward one (training or evaluation, B' rows) h' - u then W - v."""
    rows, rem = divmod(o.numel() - D * OUT, D)
    return [o.numel()] if o.numel() == B * OUT or rem or rows < 1 else [rows * D, D * OUT]


def test_p1_cannot_rebuild_a_generator_from_the_openings_it_receives(mpc_run: Run):
    """P_1's view: A's openings, in training W_A - v_A (D x OUT) forward and
    dL/dz - g (B x OUT, g A's alone) backward, and the evaluation's. If a mask
    continues as a clone predicts, P_1 unmasks dL/dz of the last training step."""
    opened = mpc_run.openings(1)
    backward = [o for o in opened if o.numel() == B * OUT]
    assert len(opened) >= 2 * STEPS and len(backward) == STEPS
    hits = attack(opened, _parts)
    if not mpc_run.planted:
        assert not hits, f"P_1 rebuilt A's generator from {len(hits)} opening parts ({hits[0]})"
        return
    # the weakness put back: the attack must work, or it guards nothing
    assert hits, "with an MT19937 keystream planted, the attack rebuilt no generator"
    first = next(h for h in hits if opened[h.opening].numel() == B * OUT)
    dz = unmask(first, backward[-1])
    assert dz is not None, "the clone did not unmask A's last dL/dz"
    assert dz.abs().max() > 0 and dz.abs().max() < 2**16  # |dL/dz| < 1 at 16 fractional bits


def test_a_cannot_rebuild_p1s_generator_from_the_openings_it_receives(mpc_run: Run):
    """A's view: P_1's openings, h'_1 - u (u P_1's alone) and W_1 - v_1 forward, one
    per training step, and the evaluation's. If a mask continues as a clone
    predicts, A unmasks P_1's embeddings: checked against what P_1 sent."""
    opened = mpc_run.openings(0)
    forward = [o for o in opened if o.numel() == B * D + D * OUT]
    assert len(forward) >= STEPS
    hits = attack(opened, _parts)
    if not mpc_run.planted:
        assert not hits, f"A rebuilt P_1's generator from {len(hits)} opening parts ({hits[0]})"
        return
    assert hits, "with an MT19937 keystream planted, the attack rebuilt no generator"
    first = min(hits, key=lambda h: h.opening)
    h_last = unmask(first, forward[STEPS - 1][: B * D])
    assert h_last is not None, "the clone did not unmask P_1's last training embedding"
    sent = dict(mpc_run.view(1)["own"]["embeddings"])
    truth = sent[STEPS - 1].double().reshape(-1)
    assert torch.allclose(h_last.double() / 2**16, truth, atol=2**-15)


def test_every_opening_holds_64_random_bits(mpc_run: Run):
    """Both parties' views: every element either receives is uniform on Z_2^64 when
    its mask is (the generator under the planted run is Mersenne Twister, whose
    outputs are fair bits too: that weakness is the tests' above)."""
    for rank in (0, 1):
        opened = mpc_run.openings(rank)
        found = weak_bits(opened)
        assert not found, f"rank {rank} receives openings with weak bits: {found[:5]}"
