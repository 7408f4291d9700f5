"""CrypTen's randomness from secret streams (securevfl.exchange.crypten_rng) and the
dealer's tuples drawn from them (crypten_pool.SecretTTP, crypten_dealer.SecretDealer).

The seam: every CrypTen module that draws ring elements or k-bit tensors gets the
stream-backed functions, which refuse a torch.Generator by name; the keys of
CrypTen's four streams are agreed over the framed communicator (threads and
in-memory queues here, as in test_crypten_comm) without their bytes entering the
ledger; and for every kind of tuple the dealer's answer and the parties' own draws
from the streams they share with it add up to a correct tuple."""

from __future__ import annotations

import sys
from typing import Any

import pytest
import torch

from securevfl.csprng import SecretStream
from securevfl.exchange import crypten_patches, crypten_rng, truncation
from securevfl.exchange.crypten_api import ArithmeticSharedTensor, count_wraps, crypten
from securevfl.exchange.crypten_dealer import SecretDealer
from securevfl.exchange.crypten_pool import Init, PairStep, SecretTTP, Triple, Trunc, Wraps, dealer_bundle
from tests.unit.test_crypten_comm import _comms, _each

LR = (104858, 29)


@pytest.fixture(autouse=True)
def _seam():
    crypten_patches.install()
    yield
    crypten_rng.clear_generators()


def test_every_crypten_importer_draws_from_a_stream_and_refuses_torch_generators():
    """No loaded CrypTen module keeps CrypTen's own draw functions under their names."""
    ours = {
        "generate_random_ring_element": crypten_rng.ring_element,
        "generate_kbit_random_tensor": crypten_rng.kbit_tensor,
    }
    seen = 0
    for name, module in list(sys.modules.items()):
        if name.split(".")[0] != "crypten" or module is None:
            continue
        for attr, fn in ours.items():
            if hasattr(module, attr):
                assert getattr(module, attr) is fn, f"{name}.{attr}"
                seen += 1
    assert seen == sum(len(attrs) for attrs in crypten_patches.IMPORTERS.values())
    key = bytes(range(32))
    got = sys.modules["crypten.mpc.primitives.arithmetic"].generate_random_ring_element(
        torch.Size([3, 4]), generator=SecretStream(key)
    )
    assert torch.equal(got, SecretStream(key).ring((3, 4)))
    bits = crypten_rng.kbit_tensor((1000,), bitlength=1, generator=SecretStream(key))
    assert set(bits.unique().tolist()) == {0, 1}
    g = torch.Generator().manual_seed(5)
    for fn in (crypten_rng.ring_element, crypten_rng.kbit_tensor):
        with pytest.raises(crypten_rng.NotASecretStream, match=r"torch\._C\.Generator|torch\.Generator"):
            fn((2,), generator=g)
    # CrypTen's own fallback (no generator) is its local stream: none before the keys are agreed
    with pytest.raises(crypten_rng.NotASecretStream, match="local"):
        crypten_rng.ring_element((2,))


def test_prg_keys_are_agreed_as_crypten_pairs_its_seeds_and_never_kept():
    """prev at rank r is next at rank r - 1; global is rank 0's; local is each rank's
    own; a zero sharing (CrypTen's PRZS) from the agreed streams sums to zero."""
    hub, comms = _comms(3)
    streams = _each(comms, crypten_rng.agree_streams)
    key = {(r, name): s.state()["key"] for r, st in enumerate(streams) for name, s in st.items()}
    for r in range(3):
        assert key[(r, "prev")] == key[((r - 1) % 3, "next")]
        assert key[(r, "global")] == key[(0, "global")]
        assert key[(r, "local")] not in {key[(q, n)] for q in range(3) for n in ("prev", "next", "global")}
    assert len({key[(r, "next")] for r in range(3)}) == 3
    # rank 0 sent rank 1 its next key then the global key; rank 2 the global key
    assert sorted((s, d, n) for s, d, n in hub.log) == [
        (0, 1, 32),
        (0, 1, 32),
        (0, 2, 32),
        (1, 2, 32),
        (2, 0, 32),
    ]
    for c in comms:
        recs = [r for r in c.channel.ledger.records if r.tag == "mpc.key"]
        assert recs and all(r.bytes == 32 for r in recs)
        assert "mpc.key" not in c.channel.ledger.received  # the bytes are not kept
    zero = sum((s["prev"].ring((50,)) - s["next"].ring((50,))) for s in streams)
    assert torch.equal(zero, torch.zeros(50, dtype=torch.long))


def test_two_parties_share_prev_and_next_crosswise():
    _, comms = _comms(2)
    a, b = _each(comms, crypten_rng.agree_streams)
    assert a["next"].state()["key"] == b["prev"].state()["key"]
    assert b["next"].state()["key"] == a["prev"].state()["key"]


def test_the_dealer_key_goes_to_its_party_alone():
    hub, comms = _comms(2, world=3)

    def go(c: Any) -> Any:
        if c.rank == 2:
            return crypten_rng.dealer_keys(c)
        return crypten_rng.client_key(c)

    s0, s1, dealer = _each(comms, go)
    assert [s.state()["key"] for s in dealer] == [s0.state()["key"], s1.state()["key"]]
    assert s0.state()["key"] != s1.state()["key"]
    assert sorted(hub.log) == [(2, 0, 32), (2, 1, 32)]


def test_pair_keys_reach_each_peer():
    _, comms = _comms(3)

    def go(c: Any) -> Any:
        return crypten_rng.pair_keys(c, [1, 2] if c.rank == 0 else [0], send=c.rank == 0)

    a, p1, p2 = _each(comms, go)
    assert a[1].state()["key"] == p1[0].state()["key"] and a[2].state()["key"] == p2[0].state()["key"]
    assert a[1].state()["key"] != a[2].state()["key"]


# -- the dealer's tuples against the parties' draws --------------------------------------------


def _keys(n: int) -> list[bytes]:
    return [bytes([i + 1]) * 32 for i in range(n)]


def _party_entries(plan: list[Any], n: int, c0: torch.Tensor) -> list[list[Any]]:
    """Every party's pooled entries for ``plan``, as SecretTTP.prefetch builds them."""
    out = []
    for rank, key in enumerate(_keys(n)):
        ttp = SecretTTP(SecretStream(key))
        at, entries = 0, []
        for it in plan:
            m = it.received
            held = rank in it.holders(n)
            entries.append(ttp._entry(it, rank, c0[at : at + m] if rank == 0 else None) if held else None)
            at += m
        out.append(entries)
    return out


def _plain(x: Any) -> torch.Tensor:
    return x.share if isinstance(x, ArithmeticSharedTensor) else x


def test_every_bundle_item_reconstructs_from_the_dealer_and_the_parties():
    n = 3
    plan = [
        Triple((4, 3), (3, 2)),
        Triple((4, 3), (4, 3), "mul"),
        Triple((4, 3), (3, 2), "matmul", 2),
        Wraps((7,)),
        Trunc((9,), 16, *LR),
        Trunc((5,), 16, *LR, 1),
        Init((64, 64), 16),
        Init((256, 64), 16, 2),
        PairStep(6, 4, 3, 1),
    ]
    dealer = SecretDealer([SecretStream(k) for k in _keys(n)], own=SecretStream.from_seed(7, "dealer"))
    c0 = dealer_bundle(dealer, plan)
    entries = _party_entries(plan, n, c0)
    for j, it in enumerate(plan):
        held = [e[j] for e in entries if e[j] is not None]
        assert len(held) == len(it.holders(n))
        if isinstance(it, Triple):
            a, b, c = (sum(_plain(e[i]) for e in held) for i in range(3))
            assert torch.equal(c, a.matmul(b) if it.op == "matmul" else a * b)
        elif isinstance(it, PairStep):
            (a_part,) = [x for x in held if x.u is None]  # rank 0: g whole
            (p_part,) = [x for x in held if x.g is None]  # rank i: u whole
            u, v, g = p_part.u, a_part.v + p_part.v, a_part.g
            c, e, f = (a_part[k] + p_part[k] for k in (3, 4, 5))
            assert torch.equal(c, u @ v) and torch.equal(e, g @ v.t()) and torch.equal(f, u.t() @ g)
        elif isinstance(it, Wraps):
            assert torch.equal(sum(_plain(e[1]) for e in held), count_wraps([_plain(e[0]) for e in held]))
        elif isinstance(it, Trunc):
            r = sum(e.r for e in held)
            want = torch.stack(list(truncation.material(r, 16, *LR)))
            assert torch.equal(sum(torch.stack(list(e.material)) for e in held), want)
        else:
            w = sum(held).double() / 2**16
            assert float(w.std()) == pytest.approx(it.std, rel=5 / (2 * w.numel()) ** 0.5)
            assert float(w.mean()) == pytest.approx(0.0, abs=4 * it.std / w.numel() ** 0.5)
            # each share alone is a uniform ring element, not a Gaussian half of W^0
            assert all(float(h.double().abs().mean()) > 2**60 for h in held)


def test_on_demand_tuples_reconstruct():
    """square, binary and B2A (CrypTen's on-demand functions): the dealer's rank-0
    share and the other parties' draws, in the order SecretTTP draws them."""
    n = 3
    dealer = SecretDealer([SecretStream(k) for k in _keys(n)])
    size = torch.Size([6])
    parties = [SecretStream(k) for k in _keys(n)]
    r2_0 = dealer.square(size)
    r = [p.ring(size) for p in parties]
    r2 = [r2_0] + [p.ring(size) for p in parties[1:]]
    assert torch.equal(sum(r2), sum(r) * sum(r))
    c_0 = dealer.binary(size, size)
    a = [p.ring(size) for p in parties]
    b = [p.ring(size) for p in parties]
    c = [c_0] + [p.ring(size) for p in parties[1:]]

    def xor(ts: list[torch.Tensor]) -> torch.Tensor:
        out = ts[0]
        for t in ts[1:]:
            out = out ^ t
        return out

    assert torch.equal(xor(c), xor(a) & xor(b))
    ra_0 = dealer.B2A(size)
    rb = [p.kbits(tuple(size), 1) for p in parties]
    ra = [ra_0] + [p.ring(size) for p in parties[1:]]
    assert torch.equal(sum(ra), xor(rb))


def test_crypten_generators_hold_the_agreed_streams():
    _, (only,) = _comms(1)
    streams = crypten_rng.agree_streams(only)
    for name in crypten_rng.GENERATOR_NAMES:
        assert crypten.generators[name][torch.device("cpu")] is streams[name]
    share = ArithmeticSharedTensor.PRZS(torch.Size([4])).share  # CrypTen's zero sharing, one party
    assert torch.equal(share, torch.zeros(4, dtype=torch.long))
