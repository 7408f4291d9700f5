"""The registry of bottom-model kinds (``model: {kind: ...}``), apart from the
models themselves: the built-in ``mlp`` and ``cnn`` are registered here by path
(:mod:`securevfl.bottoms`), plugins add more (:mod:`securevfl.plugins`). Checking
that a protocol names a known kind imports no model code (and no torch).

A model factory is ``factory(in_features, out, **params) -> torch.nn.Module``
(:mod:`securevfl.models`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from securevfl.registry import Registry

#: ``factory(in_features, out, **params) -> torch.nn.Module``
ModelFactory = Callable[..., Any]
MODELS: Registry[ModelFactory] = Registry("model")

MODELS.add_path("mlp", "securevfl.bottoms:mlp_model")
MODELS.add_path("cnn", "securevfl.bottoms:cnn_model")
