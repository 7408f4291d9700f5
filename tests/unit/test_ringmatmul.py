"""The ring product on float64 BLAS (securevfl.exchange.mpc.ringmatmul) against
torch's int64 product, bit for bit: random full-range operands, the extremes,
every inner dimension up to 4096 (the chunk boundaries at 1024, 2048 and 3072
included), strided, transposed, broadcast and batched operands; the Beaver
terms; the kernel choice; the dealer's scope (RingProducts); CUDA left to
CrypTen's own product."""

from __future__ import annotations

import time
import traceback

import pytest
import torch

from securevfl.app.loader import load_protocol_dict
from securevfl.errors import ConfigError
from securevfl.exchange.mpc import ringmatmul as rm
from tests.support.protocols import small_digits

MIN, MAX = -(2**63), 2**63 - 1


@pytest.fixture(autouse=True)
def one_thread():
    """One torch thread, as the ranks run (SECUREVFL_THREADS): on a loaded machine
    two threads stall each small product at OpenMP's barrier."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def ring(shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    return torch.randint(MIN, MAX, shape, generator=g, dtype=torch.long)


def limbs(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return rm.limb_matmul_sum([(x, y)])


def worst(shape: tuple[int, ...], wobble: bool = False) -> torch.Tensor:
    """Ring elements whose three digits all have the largest magnitude the split
    gives (d0 = d1 = -2^21, |d2| = 2^19): every digit product of the low two is
    2^42, the float64
    sums reach the 2^53 bound at an inner dimension of 1024. ``wobble`` moves the
    low digit by 0..6 so the sums also have low bits set."""
    d0 = torch.full(shape, -(2**21), dtype=torch.long)
    if wobble:
        d0 = d0 + torch.arange(shape[-1]).remainder(7)
    return d0 + (-(2**21) << 22) + (-(2**19) << 44)


def test_split_limbs_digits_and_bounds():
    g = torch.Generator().manual_seed(1)
    x = torch.cat(
        [ring((4000,), g), torch.tensor([MIN, MAX, 0, -1, 1, 2**21, -(2**21), 2**43, -(2**63) + 1])]
    )
    x = torch.cat([x, worst((3,))])
    d = [torch.empty(x.shape, dtype=torch.float64) for _ in range(3)]
    rm.split_limbs(x, *d)
    assert all(torch.equal(t, t.round()) for t in d)
    assert d[0].abs().max() <= 2**21 and d[1].abs().max() <= 2**21 and d[2].abs().max() <= 2**19
    back = d[0].long() + (d[1].long() << 22) + (d[2].long() << 44)
    assert torch.equal(back, x)
    w = [torch.empty(3, dtype=torch.float64) for _ in range(3)]
    rm.split_limbs(worst((3,)), *w)
    assert (w[0] == -(2**21)).all() and (w[1] == -(2**21)).all() and (w[2].abs() == 2**19).all()


@pytest.mark.parametrize(
    "shape", [(1, 1, 1), (5, 3, 4), (256, 64, 64), (64, 256, 64), (3, 1000, 7), (2, 3000, 5)]
)
def test_random_full_range(shape):
    m, k, n = shape
    g = torch.Generator().manual_seed(sum(shape))
    for _ in range(3):
        x, y = ring((m, k), g), ring((k, n), g)
        assert torch.equal(limbs(x, y), x @ y)


@pytest.mark.parametrize("k", [1, 2, 1023, 1024, 1025, 2047, 2048, 2049, 3072, 3073, 4096])
@pytest.mark.parametrize("a", [MIN, MAX, 0, -1])
@pytest.mark.parametrize("b", [MIN, MAX, 1])
def test_extremes(k, a, b):
    x = torch.full((3, k), a, dtype=torch.long)
    y = torch.full((k, 2), b, dtype=torch.long)
    x[0, 0], y[-1, 1] = MAX, MIN  # mixed rows and columns
    assert torch.equal(limbs(x, y), x @ y)


@pytest.mark.parametrize("k", [1024, 1025, 2048, 4096])
def test_largest_digit_products(k):
    """At the bound: 1024 products of 2^42 twice over (S_1) is exactly 2^53."""
    x, y = worst((4, k), wobble=True), worst((k, 3)).t().contiguous().t()
    assert torch.equal(limbs(x, y), x @ y)
    assert torch.equal(limbs(worst((2, k)), worst((k, 2))), worst((2, k)) @ worst((k, 2)))


def test_the_chunk_bound_is_needed(monkeypatch):
    """Without the chunking, the same operands at 4096 terms leave float64's exact
    range and the result is wrong: the bound is what makes the kernel exact."""
    x, y = worst((4, 4096), wobble=True), worst((4096, 3), wobble=False)
    y = y + torch.arange(3).remainder(5)  # low bits in y's digits too
    assert torch.equal(limbs(x, y), x @ y)
    monkeypatch.setattr(rm, "CHUNK", 4096)
    assert not torch.equal(limbs(x, y), x @ y)


def test_every_inner_dimension_up_to_4096():
    g = torch.Generator().manual_seed(7)
    x, y = ring((3, 4096), g), ring((4096, 2), g)
    xw, yw = worst((2, 4096), wobble=True), worst((4096, 2))
    for k in range(1, 4097):
        assert torch.equal(limbs(x[:, :k], y[:k]), x[:, :k] @ y[:k]), k
        if k % 64 == 0 or k % 1024 in (1023, 1):
            assert torch.equal(limbs(xw[:, :k], yw[:k]), xw[:, :k] @ yw[:k]), k


def test_strided_transposed_and_expanded_operands():
    g = torch.Generator().manual_seed(11)
    base = ring((64, 300), g)
    cases = [
        (ring((300, 256), g).t(), ring((64, 300), g).t()),  # both transposed
        (base[:, ::3], ring((100, 40), g)[:, 1::2]),  # strided slices
        (base[::2, :100], ring((40, 100), g).t()),
        (ring((1, 50), g).expand(30, 50), ring((50, 1), g).expand(50, 9)),  # stride 0
        (ring((8, 5, 6), g)[:, :, ::2].transpose(-1, -2)[0], ring((5, 4), g)),
    ]
    for x, y in cases:
        assert not (x.is_contiguous() and y.is_contiguous())
        assert torch.equal(limbs(x, y), x @ y)
        assert torch.equal(rm.ring_matmul(x, y), x @ y)


def test_batched_broadcast_and_vectors(monkeypatch):
    monkeypatch.setenv(rm.KERNEL_ENV, "limbs")
    g = torch.Generator().manual_seed(5)
    for xs, ys in [
        ((4, 6, 7), (4, 7, 3)),
        ((4, 6, 7), (7, 3)),
        ((6, 7), (2, 7, 3)),
        ((2, 1, 6, 1100), (3, 1100, 2)),
        ((7,), (7, 3)),
        ((4, 6, 7), (7,)),
        ((7,), (7,)),
        ((5, 0), (0, 4)),
    ]:
        x, y = ring(xs, g), ring(ys, g)
        want = torch.matmul(x, y)
        got = rm.ring_matmul(x, y)
        assert got.shape == want.shape and got.dtype == torch.long
        assert torch.equal(got, want), (xs, ys)


@pytest.mark.parametrize("kernel", rm.KERNELS)
def test_sums_of_products(monkeypatch, kernel):
    """Pairs with different inner dimensions laid end to end, one of them across a
    chunk boundary (900 + 500 = 1400 in two chunks of 700), and pairs whose shapes
    cannot share one product."""
    monkeypatch.setenv(rm.KERNEL_ENV, kernel)
    g = torch.Generator().manual_seed(9)
    pairs = [
        (ring((6, 900), g), ring((900, 4), g)),
        (ring((6, 500), g), ring((500, 4), g).t().contiguous().t()),
    ]
    want = pairs[0][0] @ pairs[0][1] + pairs[1][0] @ pairs[1][1]
    assert torch.equal(rm.ring_matmul_sum(pairs), want)
    assert torch.equal(rm.limb_matmul_sum(pairs), want)
    mixed = [(ring((6, 5), g), ring((5, 4), g)), (ring((2, 6, 3), g), ring((3, 4), g))]
    assert torch.equal(rm.ring_matmul_sum(mixed), mixed[0][0] @ mixed[0][1] + mixed[1][0] @ mixed[1][1])


@pytest.mark.parametrize("kernel", rm.KERNELS)
@pytest.mark.parametrize("first", [True, False])
@pytest.mark.parametrize(
    "shapes", [((256, 64), (64, 64)), ((64, 256), (256, 64)), ((256, 64), (64, 64), "t")]
)
def test_beaver_terms_match_the_three_products(monkeypatch, kernel, first, shapes):
    """eps b + a delta (+ eps delta at the first party) as CrypTen's beaver.matmul
    computes it, for the step's products (dL/dz W^T: a transposed operand)."""
    monkeypatch.setenv(rm.KERNEL_ENV, kernel)
    g = torch.Generator().manual_seed(13)
    sx, sy = shapes[0], shapes[1]
    eps, a = ring(sx, g), ring(sx, g)
    delta, b = ring(sy, g), ring(sy, g)
    if len(shapes) == 3:
        delta, b = delta.t(), b.t()
    want = eps.matmul(b) + a.matmul(delta)
    if first:
        want = want + eps.matmul(delta)
    assert torch.equal(rm.beaver_terms(eps, delta, a, b, first=first), want)


def test_kernel_choice(monkeypatch):
    monkeypatch.setenv(rm.KERNEL_ENV, "limbs")
    assert rm.kernel() == "limbs"
    monkeypatch.setenv(rm.KERNEL_ENV, "INT64")
    assert rm.kernel() == "int64"
    monkeypatch.setenv(rm.KERNEL_ENV, "float")
    with pytest.raises(ConfigError, match="SECUREVFL_RING_KERNEL='float'"):
        rm.kernel()
    doc = small_digits()
    doc["exchange"] = {"backend": "mpc"}
    with pytest.raises(ConfigError, match="SECUREVFL_RING_KERNEL"):
        load_protocol_dict(doc)  # refused when the protocol is loaded, before any rank starts
    monkeypatch.delenv(rm.KERNEL_ENV)
    assert rm.choose_kernel() in rm.KERNELS
    assert rm.kernel() in rm.KERNELS
    x, _ = rm._probe_operands(8, 8, 8)
    assert x.unique().numel() == 64 and (x < 0).any() and (x > 2**62).any()  # full range, no generator


def test_the_kernel_probe_times_cpu_not_waiting():
    """Every rank probes the kernels at the same moment of its start-up: time spent
    descheduled (here, asleep) must not count against the kernel being timed."""
    calls = []

    def sleepy() -> None:
        calls.append(1)
        time.sleep(0.02)

    assert rm._timed(sleepy, repeats=3) < 0.005
    assert len(calls) == 4  # one warm-up, then the timed repeats


def test_the_kernel_probe_stops_timing_a_kernel_that_has_lost():
    calls = []

    def slow() -> None:
        calls.append(1)
        sum(range(20_000))  # CPU work, well above the bound below

    assert rm._timed(slow, repeats=3, above=1e-9) > 1e-9
    assert len(calls) == 2  # the warm-up and one timed call


def test_ring_products_scope_routes_cpu_int64_products_only(monkeypatch):
    monkeypatch.setenv(rm.KERNEL_ENV, "limbs")
    calls = []
    real = rm.ring_matmul

    def spy(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        calls.append((tuple(x.shape), tuple(y.shape)))
        return real(x, y)

    monkeypatch.setattr(rm, "ring_matmul", spy)
    g = torch.Generator().manual_seed(17)
    x, y = ring((5, 6), g), ring((6, 3), g)
    f = torch.randn(5, 6, dtype=torch.float64)
    with rm.RingProducts():
        outs = [torch.matmul(x, y), x @ y, x.matmul(y), torch.mm(x, y), x.mm(y)]
        ff = f @ f.t()  # floats pass through
        s = x + 1  # so does everything else
    assert len(calls) == 5 and all(c == ((5, 6), (6, 3)) for c in calls)
    assert all(torch.equal(o, x @ y) for o in outs)
    assert ff.dtype == torch.float64 and torch.equal(s, x + 1)
    x @ y  # outside the scope: torch's own
    assert len(calls) == 5


@pytest.mark.parametrize("kernel", rm.KERNELS)
def test_dealer_bundles_are_the_same_on_either_kernel(monkeypatch, kernel):
    """The dealer's c_0 for joint (its ``additive``), pair triples (pair_c0) and a
    pair's step tuples (pair_step_c0), computed with the ring kernel the dealer is
    given, and inside the RingProducts scope, equal the int64 ones."""
    from securevfl.csprng import SecretStream
    from securevfl.exchange.mpc.crypten.dealer import SecretDealer, dealer_bundle
    from securevfl.exchange.mpc.crypten.items import PairStep, Triple

    def dealer(**kw):
        keys = [bytes([k]) * 32 for k in (3, 4, 5)]
        return SecretDealer([SecretStream(k) for k in keys], own=SecretStream(bytes([6]) * 32), **kw)

    plan = [
        Triple((256, 64), (64, 64)),
        Triple((64, 256), (256, 64), "matmul", 1),
        Triple((7, 3), (3, 5)),
        PairStep(256, 64, 32, 2),
    ]
    want = dealer_bundle(dealer(), plan)
    monkeypatch.setenv(rm.KERNEL_ENV, kernel)
    assert torch.equal(dealer_bundle(dealer(matmul=rm.ring_matmul), plan), want)
    with rm.RingProducts():
        got = dealer_bundle(dealer(), plan)
    assert torch.equal(got, want)


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@cuda
@pytest.mark.cuda
def test_cuda_shares_keep_cryptens_product(monkeypatch):
    """CrypTen's CUDALongTensor shares: beaver_terms, ring_matmul and the dealer's
    scope leave the product to CrypTen's own CUDA limb kernel, and it equals the
    CPU int64 product."""
    from securevfl._compat import import_crypten

    import_crypten()
    from crypten.cuda import CUDALongTensor

    calls = []
    real = rm.limb_matmul_sum
    monkeypatch.setattr(
        rm,
        "limb_matmul_sum",
        lambda pairs: calls.append("".join(traceback.format_stack(limit=8))) or real(pairs),
    )
    monkeypatch.setenv(rm.KERNEL_ENV, "limbs")
    g = torch.Generator().manual_seed(19)
    eps, a, delta, b = ring((256, 64), g), ring((256, 64), g), ring((64, 64), g), ring((64, 64), g)
    want = eps @ b + a @ delta + eps @ delta
    on = [CUDALongTensor(t.cuda()) for t in (eps, delta, a, b)]
    got = rm.beaver_terms(*on, first=True)
    assert isinstance(got, CUDALongTensor)
    assert torch.equal(got.cpu(), want)
    eps_b = eps @ b  # the CPU reference, outside the dealer's scope (where it would take the kernel)
    assert torch.equal(rm.ring_matmul(on[0], on[3]).cpu(), eps_b)
    with rm.RingProducts():
        assert torch.equal(torch.matmul(on[0], on[3]).cpu(), eps_b)
    assert calls == [], "\n".join(calls)
