"""How many parameters each party of a protocol trains, and whether that fits.

Counted at load, before any rank starts, from the shapes of the models the
party builds: the built-in bottom models (``mlp``, ``cnn``), its block W_i of
the interactive layer and the top model, each by the parameter count of its
layers (pure arithmetic: no model is built and torch is not imported, so a
4-billion-parameter layer costs nothing here and ``securevfl validate`` starts
fast; tests/unit/test_sizing.py compares every count with the module
:mod:`securevfl.models` builds). User code is not run here: a model a factory or a plugin builds
(:mod:`securevfl.usercode`) is its owner's, imported only in the owner's own rank
under its policy, so its parameters are not counted here and the party's count is a
lower bound ("at least"); that rank counts the module it built against the same
limits (:mod:`securevfl.model_limits`, :func:`securevfl.models.check_built_size`).

A party trains its bottom model (if it has one) and its part of the interactive
layer: the active party the top model, the bias and every block W_i (under
``plain`` in the clear, under the crypto backends its shares), a passive party
its share of its own W_i under the crypto backends. Training one parameter takes
about :data:`BYTES_PER_PARAMETER` bytes (the weight, its gradient and two moments
of Adam, float32). A party beyond :data:`MAX_PARAMETERS` parameters, or whose
training state alone would not fit this machine's physical memory, is refused
naming the field that makes it so large.

Input widths come from the built-in dataset's columns; for a CSV party whose
columns are not listed the first layer is counted with one input, and the top
model with one output (the classes are known only once the active party has read
its labels), so the count is then a lower bound ("at least").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from securevfl.config import ModelSpec, Protocol
from securevfl.errors import ConfigError
from securevfl.model_limits import BYTES_PER_PARAMETER, gib, over_limit, physical_memory


@dataclass
class PartySize:
    """One party's parameters by component (``path``: the protocol field that sizes
    it) and whether an input width was unknown (the count is then a lower bound)."""

    party: str
    parts: dict[str, int] = field(default_factory=dict)
    lower_bound: bool = False

    @property
    def total(self) -> int:
        return sum(self.parts.values())

    def largest(self) -> str:
        return max(self.parts, key=lambda k: self.parts[k])


def linear_parameters(fan_in: int, fan_out: int, *, bias: bool = True) -> int:
    """A ``torch.nn.Linear(fan_in, fan_out, bias)``'s parameters."""
    return fan_in * fan_out + (fan_out if bias else 0)


def mlp_parameters(sizes: Sequence[int]) -> int:
    """:func:`securevfl.bottoms.mlp`'s parameters: a Linear between each pair of widths."""
    return sum(linear_parameters(a, b) for a, b in pairwise(sizes))


def cnn_parameters(in_features: int, out: int, *, input_shape: Sequence[int], channels: int = 8) -> int:
    """:class:`securevfl.bottoms.CNNBottom`'s parameters: two 3x3 convolutions
    (with bias) and a Linear head over every position."""
    c, h, w = input_shape
    if c * h * w != in_features:
        raise ConfigError(
            f"input_shape {list(input_shape)} holds {c * h * w} values but the party has {in_features} "
            "feature columns"
        )
    convs = (c * channels * 9 + channels) + (channels * channels * 9 + channels)
    return convs + linear_parameters(channels * h * w, out)


def _mlp_bottom(in_features: int, out: int, *, hidden: Sequence[int] = (64,)) -> int:
    return mlp_parameters([in_features, *hidden, out])


#: the parameter count of each built-in bottom model (config.BUILTIN_OPTIONS), by kind
BUILTIN_COUNTS: dict[str, Callable[..., int]] = {"mlp": _mlp_bottom, "cnn": cnn_parameters}


def _builtin_bottom(spec: ModelSpec, width: int) -> int | None:
    """A built-in bottom model's (``mlp``, ``cnn``) parameters as the ranks build
    it; None for one that user code builds (a factory, a model a plugin
    registered), which this process does not run."""
    params: dict[str, Any] | None = spec.builtin_params()
    if params is None or spec.kind not in BUILTIN_COUNTS:
        return None
    return BUILTIN_COUNTS[spec.kind](width, spec.out, **params)


def party_sizes(proto: Protocol, widths: dict[str, int | None]) -> list[PartySize]:
    """Every party's parameters, the active party first. ``widths``: each party's
    number of input columns (None: unknown)."""
    out = proto.interactive.out
    shares = proto.exchange.backend != "plain"
    entries = [("parties.active", proto.parties.active)] + [
        (f"parties.passive[{i}]", p) for i, p in enumerate(proto.parties.passive)
    ]
    sizes = [PartySize(spec.name) for _, spec in entries]
    active = sizes[0]
    blocks = out  # the bias b, the active party's own
    for (path, spec), size in zip(entries, sizes, strict=True):
        if spec.model is None:
            continue
        width = widths.get(spec.name)
        size.lower_bound = width is None and spec.model.kind != "cnn"
        if width is None and spec.model.kind == "cnn" and spec.model.input_shape is not None:
            width = math.prod(spec.model.input_shape)  # a cnn's input is its input_shape
        bottom = _builtin_bottom(spec.model, width or 1)
        if bottom is None:
            size.lower_bound = True
        else:
            size.parts[f"{path}.model"] = bottom
        block = linear_parameters(spec.model.out, out, bias=False)  # W_i (models.build_interactive)
        blocks += block  # W_i: at the active party, in the clear or as its shares
        if shares and size is not active:
            size.parts["interactive.out"] = block  # the passive party's share of its W_i
    classes = 1 if proto.task == "regression" else None
    active.parts["interactive.out"] = blocks
    if proto.top.factory is None:  # models.Top: ReLU, then an mlp to one output a class
        active.parts["top.hidden"] = mlp_parameters([out, *proto.top.hidden, classes or 1])
    # the top model's output layer: one output a class; a factory's top is not counted
    active.lower_bound |= classes is None or proto.top.factory is not None
    return sizes


def check_sizes(
    proto: Protocol, widths: dict[str, int | None], *, source: str | None = None, memory: int | None = None
) -> list[PartySize]:
    """:func:`party_sizes`, refusing a party beyond :data:`MAX_PARAMETERS` or whose
    training state (:data:`BYTES_PER_PARAMETER` a parameter) exceeds ``memory``
    (default: this machine's, :func:`physical_memory`), naming the field of its
    largest component."""
    sizes = party_sizes(proto, widths)
    memory = physical_memory() if memory is None else memory
    for size in sizes:
        n = size.total
        need = n * BYTES_PER_PARAMETER
        limit = over_limit(n, memory)
        if limit is None:
            continue
        at_least = "at least " if size.lower_bound else ""
        part = size.parts[size.largest()]
        share = f", {part:,} of them sized by this field" if part != n else ""
        raise ConfigError(
            f"party '{size.party}' would train {at_least}{n:,} parameters (about {gib(need)} with "
            f"gradients and optimizer state){share}; {limit}: make its layers narrower",
            path=size.largest(),
            source=source,
        )
    return sizes


def describe(sizes: list[PartySize]) -> str:
    """``parameters: 12,345 (active 1,234, left 5,555, right 5,556)`` for ``validate``."""
    total = sum(s.total for s in sizes)
    bound = "at least " if any(s.lower_bound for s in sizes) else ""
    per = ", ".join(f"{s.party} {s.total:,}" for s in sizes)
    return f"parameters: {bound}{total:,} ({per})"
