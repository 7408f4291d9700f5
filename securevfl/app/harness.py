"""Run a protocol's attacks after training (docs/design.md §6).

The local launcher calls :func:`run_attacks` once every rank has finished. Each
rank has saved its view (``ranks/rank<R>.view.pt``: what it received plus what it
legitimately holds itself). For every attack listed in the protocol the harness

1. loads the adversary's view (the active party, or the passive party the attack
   names),
2. adds the attack's declared prior knowledge (:meth:`Attack.knowledge`, e.g. the
   raw features of some training rows), and nothing else,
3. runs the attack on that view, and
4. scores its guess against the ground truth held in the other parties' views.

Results go to ``result.json["attacks"][key]`` (key = the attack's ``label`` or its
name; ``name#j`` when a name repeats) as ``{adversary, victim?, <metrics>, ap,
used}``; ``ap`` is the attack performance in [0, 1] (higher = stronger attacker)
that the defense capability score uses.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from securevfl.app.threads import rank_threads
from securevfl.attacks import ATTACKS
from securevfl.attacks.base import View, World, plain_label
from securevfl.components import CheckedProtocol, Components
from securevfl.defenses.base import replaced_warning
from securevfl.errors import ConfigError, SecureVFLError, SecurityWarning, UserCodeError
from securevfl.records import OwnView
from securevfl.report.result import read_result, write_result
from securevfl.runtime.layout import Layout
from securevfl.usercode import explain

#: What a saved view may hold besides tensors and builtins: plain numpy arrays. Views are
#: loaded with ``weights_only=True``, so a tampered file cannot run code in the launcher.
_VIEW_GLOBALS = [
    np._core.multiarray._reconstruct,  # type: ignore[attr-defined]
    np.ndarray,
    np.dtype,
    *{type(np.dtype(c)) for c in ("bool", "int32", "int64", "float32", "float64", "<U1")},
]


def load_world(checked: CheckedProtocol, layout: Layout, out_dir: Path) -> World:
    """Every non-helper rank's saved view (``layout``: the run's rank layout)."""
    views: dict[str, View] = {}
    for role in layout.roles:
        if role.kind == "helper":
            continue
        path = Path(out_dir) / "ranks" / f"rank{role.rank}.view.pt"
        if not path.is_file():
            raise ConfigError(f"no saved view for rank {role.rank} ({role.party}) at {path}", path="attacks")
        with torch.serialization.safe_globals(_VIEW_GLOBALS):  # tensors and numpy arrays only
            blob = torch.load(path, weights_only=True)
        views[role.party] = View(role.rank, role.party, blob["received"], OwnView(blob["own"]))
    return World(checked.protocol, checked.components, layout, views, Path(out_dir))


def attack_keys(components: Components) -> list[str]:
    """Result keys, one per listed attack: its label, else its name (``name#j``
    for the j-th entry when several unlabeled entries share a name)."""
    attacks = components.attacks
    labels = [getattr(a.options, "label", None) for a in attacks]
    unlabeled = [a.name for a, label in zip(attacks, labels, strict=True) if not label]
    keys = []
    for j, (a, label) in enumerate(zip(attacks, labels, strict=True)):
        if label and not plain_label(str(label)):  # an attack whose own options model skips the check
            raise ConfigError(
                f"{label!r} is not a plain name (it names attacks/<label>.npz)", path=f"attacks[{j}]"
            )
        keys.append(label if label else (a.name if unlabeled.count(a.name) == 1 else f"{a.name}#{j}"))
    if len(set(keys)) != len(keys):
        raise ConfigError(f"attack result keys repeat: {keys}", path="attacks")
    return keys


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (np.floating, float)):
        return None if math.isnan(float(x)) else float(x)
    if isinstance(x, (np.integer,)):
        return int(x)
    return x


def run_attacks(checked: CheckedProtocol, layout: Layout, out_dir: Path) -> dict[str, Any]:
    """Run every attack of ``checked`` on the views saved under ``out_dir`` (its ranks
    laid out as ``layout``) and merge the results into ``out_dir/result.json``;
    returns the attacks' entries."""
    t0 = time.perf_counter()
    world = load_world(checked, layout, out_dir)
    threads = torch.get_num_threads()
    torch.set_num_threads(rank_threads())  # as the ranks do
    try:
        results = _run_all(world)
    finally:
        torch.set_num_threads(threads)
    result = read_result(Path(out_dir))
    update: dict[str, Any] = {
        "attacks": {**result.attacks, **results},
        "phase_s": {**result.phase_s, "attacks": round(time.perf_counter() - t0, 4)},
    }
    replaced = {e["attack"]: e["replaced_builtin"] for e in results.values() if "replaced_builtin" in e}
    if replaced:
        update["replaced_builtins"] = {**result.replaced_builtins, "attacks": replaced}
    write_result(Path(out_dir), result.model_copy(update=update))
    return results


def _run_all(world: World) -> dict[str, Any]:
    results: dict[str, Any] = {}
    attacks = world.components.attacks
    for i, (spec, key) in enumerate(zip(attacks, attack_keys(world.components), strict=True)):
        attack = spec.cls(spec.options, key=key)  # options validated at load
        hook = _Hooks(f"attack '{spec.name}' (result key '{key}')", f"attacks[{i}]")
        t0 = time.perf_counter()
        adversary = hook.call("adversary_party", attack.adversary_party, world)
        if adversary not in world.views:
            raise hook.error("adversary_party", f"returned {adversary!r}, not a party of the run")
        hook.what = f"attack '{spec.name}' (result key '{key}', adversary '{adversary}')"
        own = world.views[adversary]
        prior = hook.call("knowledge", attack.knowledge, world)
        view = View(own.rank, own.party, own.received, own.own, prior=prior)
        guess = hook.call("run", attack.run, view)
        if not isinstance(guess, dict):
            raise hook.error("run", f"returned a {type(guess).__name__}, not a dict (the guess)")
        scores = hook.call("score", attack.score, guess, world)
        entry = {"attack": spec.name, "adversary": adversary, **_checked_scores(scores, hook)}
        entry["used"] = guess.get("used", {})
        replaced = ATTACKS.replaced(spec.name)
        if replaced is not None:
            entry["replaced_builtin"] = replaced
            said = replaced_warning(None, "attack", spec.name, replaced)
            warnings.warn(SecurityWarning(said), stacklevel=2)
        entry["seconds"] = time.perf_counter() - t0
        results[key] = _jsonable(entry)
    return results


#: the metrics the comparison table reads as numbers: the attack's performance and its chance level
NUMERIC_SCORES = ("ap", "chance")


class _Hooks:
    """Calls into one attack's own code (a plugin's, any code), so that what it
    raises or returns wrong is the user's :class:`UserCodeError` naming the attack,
    its hook and the adversary, exit code 2, before anything is written."""

    def __init__(self, what: str, path: str):
        self.what, self.path = what, path

    def error(self, hook: str, problem: str, detail: str | None = None) -> UserCodeError:
        return UserCodeError(f"{self.what}: its {hook} hook {problem}", path=self.path, detail=detail)

    def call(self, hook: str, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except SecureVFLError:
            raise
        except Exception as exc:
            raise self.error(hook, f"raised {type(exc).__name__}", detail=explain(exc)) from None


def _checked_scores(scores: Any, hook: _Hooks) -> dict[str, Any]:
    """An attack's ``score`` output: a mapping of metric names whose ``ap`` and
    ``chance`` (when given) are real numbers (NaN allowed: written as null), never
    a string or an infinity the table cannot place."""
    if not isinstance(scores, dict):
        raise hook.error("score", f"returned a {type(scores).__name__}, not a dict of metrics")
    for name in NUMERIC_SCORES:
        value = scores.get(name)
        if value is None:
            continue
        number = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
        if not number:
            raise hook.error("score", f"returned '{name}' as a {type(value).__name__}, not a number")
        if math.isinf(float(value)):
            raise hook.error("score", f"returned '{name}' = {float(value)}, not a finite number")
    return scores


def attack_results(world: World) -> dict[str, Any]:
    """Every attack of the protocol of ``world`` run on it, by result key, without
    writing anything (``securevfl attack``: :mod:`securevfl.app.attack_run`)."""
    return _run_all(world)
