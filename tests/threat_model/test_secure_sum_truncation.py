"""The merged correlated sensitivity never goes through a wrap-prone truncation.

``crdp`` with ``delta_scope: merged_secure`` computes ``Delta_CS_p`` of the
parties' summed match counts in CrypTen (:mod:`securevfl.privacy.secure_sum`).
Were any step a fixed-point product or a division by a public value, CrypTen
would divide it back in shares: with two parties each divides its own share
(local truncation), which is off by about 2^48 when the shares wrap past 2^63
as signed integers, an event of probability about |x| / 2^64 per element for
uniform shares; over a run's counts, a silent, rare error in the noise scale.

Uniform shares rarely wrap, so the test plants the wrap: before every
truncation CrypTen is asked to make, the two parties re-share the value so that
rank 0's share is -2^63 (a valid sharing of the same secret: the one a uniform
share hits with probability |x| / 2^64). Against that, the in-MPC
``Delta_CS_p`` of real WDBC match counts must equal Eq. 30 computed in the
clear, and no truncation may be asked for at all: a step that truncates (say,
computing on the weights M / l as Eq. 30 is written) is corrupted by the
planted wrap and fails the test. The positive control shows the plant corrupting
an ordinary fixed-point product.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.datasets import load_breast_cancer

from securevfl.privacy.correlated import distributed_cs, match_counts, quantile_codes

N, COLS = 40, 10


def _codes() -> np.ndarray:
    return quantile_codes(load_breast_cancer().data[:N, : 2 * COLS], 10)


def _plant_wraps() -> list[int]:
    """Wrap CrypTen's truncation so that every call first moves rank 0's share of
    the value to -2^63 (rank 1's by the opposite amount); returns the call counter."""
    import crypten.communicator as cc
    from crypten.mpc.primitives.arithmetic import ArithmeticSharedTensor

    calls = [0]
    original = ArithmeticSharedTensor.div_

    def div_(self, y):  # type: ignore[no-untyped-def]
        exact = isinstance(y, int) or (isinstance(y, float) and float(y).is_integer())
        if exact or (torch.is_tensor(y) and not y.is_floating_point()):
            calls[0] += 1
            c = cc.get()
            if c.get_rank() == 0:
                shift = torch.full_like(self.share, -(2**63)) - self.share  # modulo 2^64
                c.send(shift, 1)
                self.share = self.share + shift
            else:
                shift = c.recv(torch.empty_like(self.share), 0)
                self.share = self.share - shift
        return original(self, y)

    ArithmeticSharedTensor.div_ = div_
    return calls


def _worker(rank: int, world: int, rdv: str, out_dir: str) -> None:
    import torch.distributed as dist

    from securevfl.exchange.crypten_runtime import serve_dealer, start_crypten, stop_crypten
    from securevfl.privacy.secure_sum import secure_correlated_sensitivity
    from securevfl.runtime.channel import Channel
    from securevfl.runtime.ledger import Ledger

    dist.init_process_group("gloo", init_method=f"file://{rdv}", rank=rank, world_size=world)
    n_mpc = world - 1
    ch = Channel(rank, {r: f"rank{r}" for r in range(world)}, Ledger(rank))
    crypten = start_crypten(ch, world, n_mpc, provider="TTP", on_failure=ch.comm_failure)
    if rank == n_mpc:
        serve_dealer(ch, ch.comm_failure)
        stop_crypten()
        dist.destroy_process_group()
        return
    calls = _plant_wraps()
    x = crypten.cryptensor(torch.tensor([1.5, -2.0, 3.0]), src=0)
    y = crypten.cryptensor(torch.tensor([2.0, 2.0, 0.5]), src=1)
    product = (x * y).get_plain_text()  # the positive control: one truncation, at the wrap
    planted = calls[0]
    mine = _codes()[:, rank * COLS : (rank + 1) * COLS]
    counts = torch.as_tensor(match_counts(mine), dtype=torch.float32)
    cs = secure_correlated_sensitivity(
        crypten, counts, N, sources=list(range(n_mpc)), n_features=2 * COLS, w0=0.4, s=2.0
    )
    import crypten.communicator as comm

    if rank == 0:
        c = comm.get()
        c.send_obj("terminate", c.get_ttp_rank(), c.ttp_group)
    stop_crypten()
    np.savez(
        os.path.join(out_dir, f"rank{rank}.npz"),
        cs=np.array([cs]),
        calls=np.array([calls[0] - planted]),
        control=np.array([planted]),
        product=product.numpy(),
    )
    dist.destroy_process_group()


@pytest.mark.slow  # three fresh interpreters importing CrypTen
@pytest.mark.timeout(300)
def test_merged_sensitivity_is_exact_with_shares_at_the_wrap(tmp_path: Path):
    import torch.multiprocessing as mp

    world = 3  # two MPC parties (local truncation) and the dealer
    mp.spawn(_worker, args=(world, str(tmp_path / "rdv"), str(tmp_path)), nprocs=world, join=True)
    expected = distributed_cs(match_counts(_codes()) / (2.0 * COLS), 0.4, s=2.0)
    assert expected > 2.0  # correlated records: the maximum is not the self term alone
    for r in range(world - 1):
        got = np.load(tmp_path / f"rank{r}.npz")
        # the control: the plant turned a fixed-point product into garbage (about 2^48 / 2^16 off)
        assert got["control"][0] == 1
        assert np.abs(got["product"] - np.array([3.0, -4.0, 1.5])).max() > 2**30
        assert got["cs"][0] == pytest.approx(expected, rel=1e-12), (r, got["calls"][0])
        assert got["calls"][0] == 0  # nothing asked CrypTen to truncate
