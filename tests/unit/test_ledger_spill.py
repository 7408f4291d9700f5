"""The ledger keeps received tensors bounded: past its byte cap they go to spill
a raw spill file under the run's ranks/ folder (no pickle) and come back,
in order, memory-mapped. Its message records likewise, past their count cap."""

from __future__ import annotations

import json

import torch

from securevfl.runtime.ledger import Ledger, Record


def _rec(tag: str, rnd: int, t: torch.Tensor) -> Record:
    return Record("recv", "train", rnd, 1, 0, tag, tuple(t.shape), "float32", t.numel() * 4)


def test_received_tensors_spill_past_the_cap_and_come_back_in_order(tmp_path):
    ledger = Ledger(0, spill_dir=tmp_path, spill_bytes=1000)
    sent = []
    for i in range(12):
        t = torch.full((100,), float(i))  # 400 bytes each: a spill every third tensor
        tag = "embedding" if i % 2 == 0 else "embedding_grad"
        sent.append((tag, i, t))
        ledger.log(_rec(tag, i, t), t)
        assert ledger.held_bytes <= 1000
    assert len(ledger.spilled) == 12 and ledger.held_bytes == 0  # the twelfth tensor tipped the last spill
    assert ledger.spill_path == tmp_path / "rank0.received.bin"
    assert ledger.spill_path.stat().st_size == 12 * 400
    view = ledger.received_view()
    for tag in ("embedding", "embedding_grad"):
        expected = [(i, t) for g, i, t in sent if g == tag]
        assert [r for r, _ in view[tag]] == [i for i, _ in expected]
        assert all(torch.equal(a, b) for (_, a), (_, b) in zip(view[tag], expected, strict=True))
    ledger.drop_spill()
    assert not list(tmp_path.iterdir())


def test_a_ledger_that_records_no_views_keeps_no_tensor(tmp_path):
    ledger = Ledger(0, record_views=False, spill_dir=tmp_path, spill_bytes=10)
    t = torch.ones(100)
    for i in range(5):
        ledger.log(_rec("embedding", i, t), t)
    assert ledger.received_view() == {} and ledger.held_bytes == 0
    assert len(ledger.records) == 5 and not list(tmp_path.iterdir())


def _msg(i: int) -> Record:
    kind = "sent" if i % 3 else "recv"
    return Record(kind, "train", i, 0, 1, f"t{i % 2}", (2, i), "float32", 8 * i, 8 * i + 16)


def test_message_records_spill_past_the_cap_and_come_back_in_order(tmp_path):
    """However long the run, a rank holds at most spill_records message records:
    the rest are on disk, the summary is kept as they come, and the ledger file
    holds every record in order."""
    stale = tmp_path / "rank0.ledger.part"
    stale.write_text("left by an interrupted run\n")
    spilled = Ledger(0, record_views=False, spill_dir=tmp_path, spill_records=4)
    held = Ledger(0, record_views=False)  # no spill folder: everything in memory
    for i in range(1, 11):
        spilled.log(_msg(i))
        held.log(_msg(i))
        assert len(spilled.records) < 4
    assert spilled.spilled_records == 8 and len(spilled.records) == 2
    assert list(spilled.all_records()) == held.records == [_msg(i) for i in range(1, 11)]
    assert spilled.summary() == held.summary()
    sent = held.summary()["sent"]
    assert sum(v["messages"] for v in sent.values()) == 7  # i % 3 != 0 of 1..10
    assert sum(v["bytes"] for v in sent.values()) == 8 * sum(i for i in range(1, 11) if i % 3)
    # a checkpoint's records go first, in the file and the summary alike
    old = [_msg(100), _msg(101)]
    spilled.prepend(old)
    held.prepend(old)
    assert list(spilled.all_records()) == held.records == [*old, *(_msg(i) for i in range(1, 11))]
    assert spilled.summary() == held.summary()
    spilled.write_jsonl(tmp_path / "rank0.ledger.jsonl")
    lines = (tmp_path / "rank0.ledger.jsonl").read_text().splitlines()
    assert [json.loads(x)["round"] for x in lines] == [100, 101, *range(1, 11)]
    assert not stale.exists()  # moved into the ledger file
