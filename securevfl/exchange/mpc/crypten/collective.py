"""The pure parts of a collective: CrypTen's groups as sets of ranks, many tensors
as one flat frame and back, and the reduction a receiver makes of the shares it
gets (:mod:`.communicator` runs the exchanges)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from securevfl.errors import ProtocolError

REDUCE_OPS: dict[Any, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    dist.ReduceOp.SUM: torch.Tensor.add_,
    dist.ReduceOp.BXOR: torch.Tensor.bitwise_xor_,
}


@dataclass(frozen=True)
class RankSet:
    """One of CrypTen's communication groups, as the ranks it contains."""

    name: str
    ranks: tuple[int, ...]


def flat_cat(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """One contiguous CPU tensor of every part's elements, in order (one frame)."""
    if len(parts) == 1:
        return parts[0].detach().reshape(-1).contiguous().cpu()
    dtypes = {p.dtype for p in parts}
    if len(dtypes) != 1:
        raise ProtocolError(f"CrypTen batched operation over mixed dtypes {sorted(map(str, dtypes))}")
    return torch.cat([p.detach().reshape(-1).cpu() for p in parts])


def split_like(flat: torch.Tensor, like: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Inverse of :func:`flat_cat`: views of ``flat`` shaped as ``like``, on their devices."""
    out, at = [], 0
    for t in like:
        n = t.numel()
        out.append(flat[at : at + n].reshape(t.shape).to(t.device))
        at += n
    return out


def combine(own: torch.Tensor, others: Sequence[torch.Tensor], op: Any) -> torch.Tensor:
    """``own`` reduced with ``others`` (in the given order) by SUM (ring addition,
    wrapping modulo 2^64 as CrypTen's shares do) or BXOR."""
    fn = REDUCE_OPS.get(op)
    if fn is None:
        raise ProtocolError(f"CrypTen reduction {op} is not used by securevfl's MPC exchange")
    total = own.clone()
    for t in others:
        fn(total, t)
    return total
