"""The split model in one process, built with the seeds every rank uses, and
the ranks' saved parameters, to hold a run's results against."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def training_rows(proto, data_dir: Path) -> tuple[list[Any], Any, int]:
    """Each passive party's training features and the labels, as the launcher
    derives them on a built-in dataset in which every party holds every ID (so the
    PSI order, sorted IDs, is the file order): (x per passive party, y, classes)."""
    import torch

    from securevfl.data.partition import party_source
    from securevfl.data.party_data import load_party_data, split_indices
    from securevfl.seeding import generator

    act = load_party_data(party_source(proto, "active", data_dir), "active", is_active=True)
    xs = [
        load_party_data(party_source(proto, p.name, data_dir), p.name, is_active=False)
        for p in proto.parties.passive
    ]
    assert all(x.ids == sorted(act.ids) for x in xs)
    seed = proto.training.seed
    train_idx, _ = split_indices(len(act.ids), proto.dataset.test_fraction, generator(seed, "split"))
    x_train = [torch.as_tensor(x.x[train_idx]) for x in xs]
    return x_train, torch.as_tensor(act.y[train_idx]), len(act.classes)


class ReferenceSplit:
    """The split model in one process, built with the seeds every rank uses:
    bottoms, interactive blocks W_i, bias and top model; ``logits(hs)`` is A's
    ``top(sum_i h_i W_i^T + b)`` in its order of operations."""

    def __init__(self, proto, xs: list[Any], classes: int):
        from securevfl.models import build_bias, build_bottom, build_interactive, build_top

        tr, out = proto.training, proto.interactive.out
        passive = proto.parties.passive
        self.proto = proto
        self.bottoms = [
            build_bottom(p.model, x.shape[1], seed=tr.seed, party=p.name)
            for p, x in zip(passive, xs, strict=True)
        ]
        self.blocks = [build_interactive(p.model.out, out, seed=tr.seed, party=p.name) for p in passive]
        self.bias = build_bias(out)
        self.top = build_top(proto.top, out, classes, seed=tr.seed)

    def logits(self, hs: list[Any]) -> Any:
        z = hs[0] @ self.blocks[0].weight.T
        for h, blk in zip(hs[1:], self.blocks[1:], strict=True):
            z = z + h @ blk.weight.T
        return self.top(z + self.bias)

    def state(self) -> dict[str, Any]:
        """Parameters under the names the ranks' ``state.pt`` files use (see
        :func:`split_state`)."""
        state = {f"top.{k}": v for k, v in self.top.state_dict().items()} | {"bias": self.bias.detach()}
        for p, b, blk in zip(self.proto.parties.passive, self.bottoms, self.blocks, strict=True):
            state |= {f"{p.name}.bottom.{k}": v for k, v in b.state_dict().items()}
            state[f"interactive.{p.name}"] = blk.weight.detach()
        return state


def split_state(out: Path, proto) -> dict[str, Any]:
    """Every rank's final parameters of a run, passive ones prefixed by the party."""
    import torch

    state = dict(torch.load(out / "ranks" / "rank0.state.pt", weights_only=True))
    for r, p in enumerate(proto.parties.passive, start=1):
        s = torch.load(out / "ranks" / f"rank{r}.state.pt", weights_only=True)
        state |= {f"{p.name}.{k}": v for k, v in s.items()}
    return state
