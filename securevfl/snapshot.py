"""Typed containers for the state a component saves to a checkpoint (docs/design.md §12).

A component (an exchange role object, a defense) describes what it needs to
continue a run exactly as a :class:`ComponentState`: its tensors, which the file
format stores with ``torch.save`` and reads back with ``weights_only=True``, and
its small scalar settings as plain JSON. Nothing here is pickled and nothing
crosses a party boundary: each rank saves its own components' state only
(securevfl.app.checkpoints writes them).

:func:`capture_attributes` / :func:`restore_attributes` are the default way a
component turns its own attributes into a state: random generators (torch's and
numpy's), tensors, arrays and JSON scalars; modules are left to their owner's
optimizer and model state. A secret stream is kept under a key starting with
:data:`SECRET_STREAM`, so that its key and position can be left out where a
component must not continue the stream (:meth:`ComponentState.without_secret_streams`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from securevfl.csprng import SecretStream
from securevfl.errors import CheckpointError

#: the key prefix of a :class:`~securevfl.csprng.SecretStream`'s state in ``meta``
SECRET_STREAM = "secret_stream."


@dataclass
class ComponentState:
    """One component's resumable state: ``tensors`` (torch tensors, or nested
    lists/dicts of them and of plain numbers) and ``meta`` (JSON values)."""

    tensors: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    def to_parts(self) -> tuple[dict[str, Any], dict[str, Any]]:
        return dict(self.tensors), dict(self.meta)

    @classmethod
    def from_parts(cls, tensors: dict[str, Any] | None, meta: dict[str, Any] | None) -> ComponentState:
        return cls(dict(tensors or {}), dict(meta or {}))

    def without_secret_streams(self) -> ComponentState:
        """This state less every secret stream's key and position: restored, it
        leaves the component's streams as they are (fresh keys), where a full
        restore would rewind them to the saved keys and positions and replay
        their keystream."""
        meta = {k: v for k, v in self.meta.items() if not k.startswith(SECRET_STREAM)}
        return ComponentState(dict(self.tensors), meta)


def _json_ok(value: Any) -> bool:
    """Whether ``value`` comes back from JSON as it is (no tuple turning into a
    list, no integer key into a string)."""
    try:
        return bool(json.loads(json.dumps(value)) == value)
    except (TypeError, ValueError):
        return False


def capture_attributes(obj: object, skip: Iterable[str] = ()) -> ComponentState:
    """The default state of ``obj``: every attribute that is a random generator
    (``torch.Generator``: its state tensor; ``numpy.random.Generator``: its bit
    generator's state; :class:`~securevfl.csprng.SecretStream`: its key and
    position, secret like the noise it draws, kept in the owner's checkpoint only),
    a tensor, a numpy array or a JSON value. Modules,
    optimizers, options and contexts are skipped (their owners save them)."""
    state = ComponentState()
    skipped = set(skip) | {"params", "ctx", "opts", "options"}
    for name, value in vars(obj).items():
        if name in skipped or isinstance(value, torch.nn.Module):
            continue
        if isinstance(value, torch.Generator):
            state.tensors[f"generator.{name}"] = value.get_state()
        elif isinstance(value, SecretStream):
            state.meta[f"{SECRET_STREAM}{name}"] = value.state()
        elif isinstance(value, np.random.Generator):
            state.meta[f"np_generator.{name}"] = value.bit_generator.state
        elif isinstance(value, torch.Tensor):
            state.tensors[f"tensor.{name}"] = value.detach().cpu().clone()
        elif isinstance(value, np.ndarray) and value.dtype != object:
            state.tensors[f"array.{name}"] = torch.from_numpy(np.array(value, copy=True))
        elif isinstance(value, (bool, int, float, str, list, dict)) or value is None:
            if not _json_ok(value):
                continue
            state.meta[f"value.{name}"] = value
    return state


def restore_attributes(obj: object, state: ComponentState, *, owner: str) -> None:
    """Set back what :func:`capture_attributes` captured from an object of the
    same kind. A key naming an attribute ``obj`` does not have is a
    :class:`CheckpointError` naming ``owner`` and the key."""
    have = vars(obj)

    def target(key: str) -> str:
        name = key.split(".", 1)[1]
        if name not in have:
            raise CheckpointError(f"{owner}: the checkpoint holds '{key}', which it does not have")
        return name

    for key, value in state.tensors.items():
        name = target(key)
        current = have[name]
        if key.startswith("generator."):
            current.set_state(value)
        elif key.startswith("array."):
            setattr(obj, name, value.numpy().copy())
        else:
            device = current.device if isinstance(current, torch.Tensor) else torch.device("cpu")
            setattr(obj, name, value.to(device))
    for key, value in state.meta.items():
        name = target(key)
        if key.startswith("np_generator."):
            have[name].bit_generator.state = value
        elif key.startswith(SECRET_STREAM):
            try:
                setattr(obj, name, SecretStream.from_state(value))
            except ValueError as exc:
                raise CheckpointError(f"{owner}: '{key}': {exc}") from None
        else:
            setattr(obj, name, value)
