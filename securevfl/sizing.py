"""How many parameters each party of a protocol trains, and whether that fits.

Counted at load, before any rank starts, by building every model the party
builds on PyTorch's ``meta`` device (shapes without storage: a 4-billion-parameter
layer costs nothing here) with the same builders the ranks use
(:mod:`securevfl.models`), so any bottom-model kind is counted as it will be built.
User code is not run here: a model a factory or a plugin builds
(:mod:`securevfl.usercode`) is its owner's, imported only in the owner's own rank
under its policy, so its parameters are not counted and the party's count is a
lower bound ("at least").

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
import os
from dataclasses import dataclass, field

import torch

from securevfl.config import ModelSpec, Protocol
from securevfl.errors import ConfigError
from securevfl.models import MODELS, build_interactive, build_top

MAX_PARAMETERS = 1 << 31
"""The most parameters one party trains (2,147,483,648: 8 GiB of float32
weights, about 32 GiB to train): the stated limit, on any machine."""
BYTES_PER_PARAMETER = 16


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


def _count(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def _builtin_bottom(spec: ModelSpec, width: int) -> torch.nn.Module | None:
    """A built-in bottom model (``mlp``, ``cnn``) as the ranks build it, on the
    device in effect; None for one that user code builds (a factory, a model a
    plugin registered), which this process does not run."""
    params = spec.builtin_params()
    if params is None or spec.kind not in MODELS:
        return None
    return MODELS.get(spec.kind)(width, spec.out, **params)


def physical_memory() -> int | None:
    """This machine's physical memory in bytes (None where the OS does not say)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def party_sizes(proto: Protocol, widths: dict[str, int | None]) -> list[PartySize]:
    """Every party's parameters, the active party first. ``widths``: each party's
    number of input columns (None: unknown)."""
    seed = proto.training.seed
    out = proto.interactive.out
    shares = proto.exchange.backend != "plain"
    entries = [("parties.active", proto.parties.active)] + [
        (f"parties.passive[{i}]", p) for i, p in enumerate(proto.parties.passive)
    ]
    sizes = [PartySize(spec.name) for _, spec in entries]
    active = sizes[0]
    blocks = out  # the bias b, the active party's own
    with torch.device("meta"):
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
                size.parts[f"{path}.model"] = _count(bottom)
            block = _count(build_interactive(spec.model.out, out, seed=seed, party=spec.name))
            blocks += block  # W_i: at the active party, in the clear or as its shares
            if shares and size is not active:
                size.parts["interactive.out"] = block  # the passive party's share of its W_i
        classes = 1 if proto.task == "regression" else None
        active.parts["interactive.out"] = blocks
        if proto.top.factory is None:
            active.parts["top.hidden"] = _count(build_top(proto.top, out, classes or 1, seed=seed))
    # the top model's output layer: one output a class; a factory's top is not counted
    active.lower_bound |= classes is None or proto.top.factory is not None
    return sizes


def _gib(n: int) -> str:
    return f"{n / (1 << 30):,.1f} GiB"


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
        if n > MAX_PARAMETERS:
            limit = f"a party trains at most {MAX_PARAMETERS:,} parameters"
        elif memory is not None and need > memory:
            limit = f"this machine has {_gib(memory)} of memory"
        else:
            continue
        at_least = "at least " if size.lower_bound else ""
        part = size.parts[size.largest()]
        share = f", {part:,} of them sized by this field" if part != n else ""
        raise ConfigError(
            f"party '{size.party}' would train {at_least}{n:,} parameters (about {_gib(need)} with "
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
