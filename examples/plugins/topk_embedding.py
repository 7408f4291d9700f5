"""A plugin defense: top-k sparsification of the released embedding (passive side).

Each passive party that lists ``{name: topk_embedding, params: {k: 4}}`` keeps the
``k`` largest-magnitude coordinates of each row of its bottom model's output h and
zeroes the rest before h' enters the exchange; the gradient reaches its bottom
model through the kept coordinates only. Sparsifying what a party shares is an
old compression step of federated learning that doubles as a representation
defense: fewer released values per record leave less for a decoder to work with.

What it protects: it caps what h' (and so z = sum_i h'_i W_i under ``mpc``, or
z_i under ``ckks``/``paillier``) carries about a record's features at ``k``
values and their positions, so attacks that decode features or properties of
them from what the active party learns have less signal (examples/plugins
measures one, ``ink_probe``). What it does not: it is no formal guarantee
(no epsilon; ``k`` values still carry a lot, and the positions themselves leak);
it does nothing for the labels (a passive party's gradient-based label inference
is unchanged), nothing against the passive party itself, and nothing about which
records are aligned. It costs accuracy when ``k`` is small against the width.

The defense is deterministic: it draws no randomness (a defense that adds noise
draws it from ``self.ctx.noise_stream(...)``, never from torch or numpy).
"""

from __future__ import annotations

import torch
from pydantic import Field

from securevfl.plugins import Defense, DefenseOptions, register_defense


def topk_rows(h: torch.Tensor, k: int) -> torch.Tensor:
    """``h`` with all but the ``k`` largest-magnitude entries of each row set to 0
    (differentiable: the gradient flows through the kept entries)."""
    k = min(k, h.shape[1])
    keep = torch.zeros_like(h, dtype=torch.bool).scatter_(1, h.abs().topk(k, dim=1).indices, True)
    return torch.where(keep, h, torch.zeros_like(h))


class TopKOptions(DefenseOptions):
    k: int = Field(default=4, ge=1, description="coordinates of each embedding row released (the rest are 0)")


@register_defense
class TopKEmbedding(Defense[TopKOptions]):
    name = "topk_embedding"
    sides = frozenset({"passive"})
    options = TopKOptions

    def embed(self, h: torch.Tensor, *, train: bool) -> torch.Tensor:
        return topk_rows(h, self.params.k)

    def embed_local(self, h: torch.Tensor) -> torch.Tensor:
        return topk_rows(h, self.params.k)  # no noise: a FedBCD local step sees the same map

