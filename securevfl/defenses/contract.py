"""What a defense's hooks must return (docs/extending.md, "A defense"), checked
where :class:`~securevfl.defenses.base.DefenseStack` calls them.

A defense may be a plugin's: any code. What it returns of the wrong kind would
otherwise fail far from it (a list where the exchange wants a tensor), or worse
not fail at all: a gradient of one row is broadcast by ``h' * g`` over the batch,
so every row would silently train on row 0's gradient; a label outside the
task's classes reaches the loss as an index error. Each is refused here as the
user's :class:`~securevfl.errors.UserCodeError`, naming the defense, its hook and
its party (exit code 2, no traceback). What a plugin's hook raises is the same
error, its own text kept for its owner (``detail``). A built-in defense is
securevfl's own code, held to the contract by its own tests: its exceptions and
outputs pass as they are.

The checks read shapes, dtypes and, for labels once per run, the range of the
class indices: never a value in a message (a failing rank relays its message to
its peers).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from securevfl.errors import SecureVFLError, UserCodeError
from securevfl.usercode import explain

if TYPE_CHECKING:
    from securevfl.defenses.base import Defense


def is_plugin(d: Defense[Any]) -> bool:
    """Whether ``d``'s class is user code (defined outside securevfl)."""
    module = type(d).__module__
    return not (module == "securevfl" or module.startswith("securevfl."))


def entry_path(d: Defense[Any]) -> str | None:
    """The YAML path of ``d``'s entry in its party's ``defenses`` (its first entry by name)."""
    parties = d.ctx.proto.parties
    specs = [("parties.active", parties.active)] + [
        (f"parties.passive[{i}]", p) for i, p in enumerate(parties.passive)
    ]
    for where, spec in specs:
        if spec.name == d.ctx.party:
            j = next((j for j, c in enumerate(spec.defenses) if c.name == d.name), None)
            return None if j is None else f"{where}.defenses[{j}]"
    return None


def broken(d: Defense[Any], hook: str, problem: str, detail: str | None = None) -> UserCodeError:
    return UserCodeError(
        f"defense '{d.name}' of party '{d.ctx.party}': its {hook} hook {problem}",
        path=entry_path(d),
        detail=detail,
    )


def call(d: Defense[Any], hook: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, one of ``d``'s hooks; a plugin's exception as a
    :class:`UserCodeError` naming it."""
    if not is_plugin(d):
        return fn(*args, **kwargs)
    try:
        return fn(*args, **kwargs)
    except SecureVFLError:
        raise
    except Exception as exc:
        raise broken(d, hook, f"raised {type(exc).__name__}", detail=explain(exc)) from None


def _kind(value: object) -> str:
    return type(value).__name__


def tensor_like(d: Defense[Any], hook: str, out: Any, given: torch.Tensor) -> torch.Tensor:
    """``embed``, ``embed_local`` and ``grad``: a floating tensor of the shape of the
    tensor the hook was given (what the exchange and the update multiply it with)."""
    if not is_plugin(d):
        return out
    if not isinstance(out, torch.Tensor):
        raise broken(d, hook, f"returned a {_kind(out)}, not a torch.Tensor")
    if out.shape != given.shape:
        raise broken(
            d,
            hook,
            f"returned shape {tuple(out.shape)} for an input of shape {tuple(given.shape)}: it "
            "must keep the shape (one row per record)",
        )
    if not out.is_floating_point():
        raise broken(d, hook, f"returned {out.dtype}, not a floating-point tensor")
    return out


def labels_like(d: Defense[Any], out: Any, given: torch.Tensor, classes: int | None) -> torch.Tensor:
    """``labels``: one label per record, of the given labels' kind; class indices
    within the task's ``classes`` (a defense may change a label, never invent a class)."""
    if not is_plugin(d):
        return out
    if not isinstance(out, torch.Tensor):
        raise broken(d, "labels", f"returned a {_kind(out)}, not a torch.Tensor")
    if out.shape != given.shape:
        raise broken(
            d, "labels", f"returned shape {tuple(out.shape)} for labels of shape {tuple(given.shape)}"
        )
    if given.is_floating_point():
        if not out.is_floating_point():
            raise broken(d, "labels", f"returned {out.dtype} for real-valued labels ({given.dtype})")
        return out
    if out.is_floating_point() or out.is_complex() or out.dtype == torch.bool:
        raise broken(d, "labels", f"returned {out.dtype}, not integer class indices")
    if classes is not None and out.numel() and (int(out.min()) < 0 or int(out.max()) >= classes):
        raise broken(d, "labels", f"returned a class index outside 0..{classes - 1} (the task's classes)")
    return out


def features_like(d: Defense[Any], out: Any, given: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """``select_features``: (a 2-D array of the given rows, one column name per column)."""
    if not is_plugin(d):
        return out
    if not isinstance(out, tuple) or len(out) != 2:
        raise broken(d, "select_features", f"returned a {_kind(out)}, not (features, column names)")
    x, columns = out
    if not isinstance(x, np.ndarray) or x.ndim != 2 or x.shape[0] != given.shape[0]:
        shape = tuple(x.shape) if isinstance(x, np.ndarray) else _kind(x)
        raise broken(
            d,
            "select_features",
            f"returned features {shape}, not an array of the {given.shape[0]} rows given",
        )
    if (
        not isinstance(columns, list)
        or len(columns) != x.shape[1]
        or not all(isinstance(c, str) for c in columns)
    ):
        raise broken(d, "select_features", f"returned column names that do not name its {x.shape[1]} columns")
    return x, columns


def loss_like(d: Defense[Any], hook: str, out: Any) -> torch.Tensor | None:
    """``local_loss`` and ``top_loss``: None or a one-element floating tensor."""
    if not is_plugin(d):
        return out
    if out is None:
        return None
    if not isinstance(out, torch.Tensor) or out.numel() != 1 or not out.is_floating_point():
        what = f"a tensor of shape {tuple(out.shape)}" if isinstance(out, torch.Tensor) else f"a {_kind(out)}"
        raise broken(d, hook, f"returned {what}, not None or a scalar loss tensor")
    return out
