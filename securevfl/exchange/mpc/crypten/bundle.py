"""A ``bundle`` request on the wire: rank 0 asks the dealer for a whole offline plan
as a list of items' wire forms (:meth:`.items.Triple.to_wire` and its kin); the dealer
validates the list here before it draws anything (:func:`.runtime.serve_dealer`)."""

from __future__ import annotations

from typing import Any

import torch

from securevfl.exchange.mpc.crypten.items import Init, Item, PairStep, Triple, Trunc, Wraps, plan_elements

MAX_BUNDLE_ITEMS = 4096
MAX_PAIR = 1024  # the highest MPC rank a pair item may name (the dealer checks its own world)
MAX_BUNDLE_ELEMENTS = 1 << 26  # 512 MiB of ring elements: far above any plan securevfl makes
MAX_SCALE = 1 << 31  # |scale| of a truncation's second result (truncation.mul_shift's exact range)


def _int(x: Any, lo: int, hi: int, what: str) -> int:
    if type(x) is not int or not lo <= x <= hi:
        raise ValueError(f"bundle {what}")
    return x


def _checked(item: Item) -> Item:
    if isinstance(item, Triple):
        try:
            _ = item.out
        except ValueError:
            raise ValueError("bundle item shapes") from None
    return item


def parse_bundle(args: Any, max_elements: int = MAX_BUNDLE_ELEMENTS) -> list[Item]:
    """Validate a bundle request's item list (from rank 0, at the dealer): additive
    triples for ``mul``/``matmul``, pair triples, wraps pairs, truncation material
    and weight initialisations, bounded sizes, parameters and count. Raises
    ValueError, which the dealer turns into a ProtocolError."""
    if not isinstance(args, list) or not 0 < len(args) <= MAX_BUNDLE_ITEMS:
        raise ValueError("bundle size")
    items: list[Item] = []
    for a in args:
        if not isinstance(a, list) or not a:
            raise ValueError("bundle item")
        sizes = [s for s in a[1:] if isinstance(s, torch.Size)]
        if any(len(s) > 8 or any(x < 0 for x in s) for s in sizes):
            raise ValueError("bundle item size")
        if a[0] == "additive" and len(a) == 4 and len(sizes) == 2 and a[3] in ("mul", "matmul"):
            item: Item = Triple(tuple(a[1]), tuple(a[2]), a[3])
        elif a[0] == "pair" and len(a) == 4 and len(sizes) == 2:
            item = Triple(tuple(a[2]), tuple(a[3]), "matmul", _int(a[1], 1, MAX_PAIR, "pair rank"))
        elif a[0] == "wraps" and len(a) == 2 and len(sizes) == 1:
            item = Wraps(tuple(a[1]))
        elif a[0] == "trunc" and len(a) == 6 and len(sizes) == 1 and isinstance(a[2], torch.Size):
            item = Trunc(
                tuple(a[2]),
                _int(a[3], 1, 62, "truncation bits"),
                _int(a[4], -MAX_SCALE + 1, MAX_SCALE - 1, "truncation scale"),
                _int(a[5], 0, 63, "truncation shift"),
                _int(a[1], 0, MAX_PAIR, "pair rank"),
            )
        elif a[0] == "step" and len(a) == 5:
            b, d, o = (_int(x, 1, MAX_BUNDLE_ELEMENTS, "step shape") for x in a[2:])
            item = PairStep(b, d, o, _int(a[1], 1, MAX_PAIR, "pair rank"))
        elif a[0] == "init" and len(a) == 4 and len(sizes) == 1 and isinstance(a[2], torch.Size):
            if len(a[2]) != 2 or a[2][0] < 1:
                raise ValueError("bundle init shape")
            item = Init(tuple(a[2]), _int(a[3], 0, 32, "init bits"), _int(a[1], 0, MAX_PAIR, "pair rank"))
        else:
            raise ValueError("bundle item kind")
        items.append(_checked(item))
    if plan_elements(items) > max_elements:
        raise ValueError("bundle too large")
    return items
