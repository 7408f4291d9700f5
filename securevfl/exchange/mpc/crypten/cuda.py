"""CrypTen's CUDA shares through securevfl's communicator.

On CUDA CrypTen keeps a share as a ``CUDALongTensor``, a wrapper (not a torch.Tensor)
whose int64 CUDA tensor is its ``data``. The communicator moves that tensor (frames are
CPU bytes either way) and hands results back in the wrapper type it was given, as
CrypTen's own communicator does; plain tensors pass through untouched. Duck-typed, so
this module needs no CrypTen import."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from securevfl.exchange.mpc.crypten.collective import RankSet


def _raw(x: Any, seen: list[type]) -> Any:
    if x is None or isinstance(x, (torch.Tensor, int, float, str, RankSet)):
        return x
    if isinstance(x, (list, tuple)):
        return type(x)(_raw(v, seen) for v in x)
    data = getattr(x, "data", None)
    if isinstance(data, torch.Tensor) and hasattr(x, "tensor"):
        seen.append(type(x))
        return data
    return x


def _wrap(x: Any, cls: type) -> Any:
    if isinstance(x, torch.Tensor):
        return cls(x)
    if isinstance(x, list):
        return [_wrap(v, cls) for v in x]
    if isinstance(x, tuple):
        return tuple(_wrap(v, cls) for v in x)
    return x


def cuda_shares(method: Callable[..., Any]) -> Callable[..., Any]:
    """Let a communicator method take and return CrypTen's CUDA share wrappers."""

    @functools.wraps(method)
    def call(self: Any, *args: Any, **kw: Any) -> Any:
        seen: list[type] = []
        args = tuple(_raw(a, seen) for a in args)
        kw = {k: _raw(v, seen) for k, v in kw.items()}
        out = method(self, *args, **kw)
        return _wrap(out, seen[0]) if seen else out

    return call
