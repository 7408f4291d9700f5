"""peak_rss_mib reports the calling process's own peak, not its parent's."""

from __future__ import annotations

import multiprocessing as mp

import numpy as np

from securevfl.timing import peak_rss_mib


def _child_peak(q) -> None:
    q.put(peak_rss_mib())


def test_a_spawned_process_reports_its_own_peak_not_its_parents():
    big = np.ones(400 << 17)  # 400 MiB of float64, touched
    assert big.sum() > 0
    parent = peak_rss_mib()
    assert parent > 400
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_child_peak, args=(q,))
    p.start()
    child = q.get(timeout=120)
    p.join(timeout=60)
    assert 5 < child < parent - 300, (child, parent)
