"""Attack a finished run again, on the views its ranks saved (``securevfl attack RUN``;
docs/attacks.md, "Attacking a finished run").

A run saves each rank's view (``ranks/rank<R>.view.pt``: what the rank received and what it
holds itself) when its protocol lists attacks or sets ``runtime.dump_views``. This module
rebuilds the run's protocol from the active party's saved model (checked against its digest),
imports the caller's own modules given as ``--plugin`` (allowed as ``--allow-plugin`` allows
them: by name, by path, by pinned digest), puts the requested attack in place of the
protocol's own, validates it as a protocol's attack is validated at load, and runs it through
the same harness as an attack listed in the protocol: on the adversary's view alone, with its
declared prior knowledge, scored against the others' views. Views load with
``weights_only=True`` (tensors and plain numpy arrays only), so a tampered file cannot run
code. The result goes to ``RUN/attacks/<key>.json``; the run's ``result.json`` stays as the
run wrote it (a comparison's cache holds it to its digest).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from securevfl.app.harness import attack_keys, attack_results, load_world
from securevfl.app.loader import OWN, load_checked_dict
from securevfl.app.model_io import saved_protocol
from securevfl.app.rank_layout import layout_of
from securevfl.components import CheckedProtocol
from securevfl.errors import ConfigError, UserCodeError
from securevfl.private_files import write_private
from securevfl.usercode import FLAG, allowance_module, policy_of

#: where a rerun attack's entry is written, inside the run's folder
RESULTS_DIR = "attacks"


#: where a mistake in ``--plugin`` is named
PLUGIN_FLAG = "--plugin"


def import_given_plugins(plugins: Sequence[str], beside: Path | None) -> None:
    """Import the modules the caller gave as ``--plugin``, in this process only, so
    that the components they register are known when the run's protocol is checked.
    Each is allowed as ``--allow-plugin`` allows a module (:func:`~securevfl.usercode.policy_of`):
    an installed module by its name (looked up on the Python path alone, never beside
    the run or its protocol file), a file or package folder by its path, and
    ``NAME=sha256:HEX``, ``NAME.py`` beside the protocol file the run was loaded
    from (``beside``), run only if its source has that digest. Nothing else is
    imported for them, and a mistake is a UserCodeError naming ``--plugin``."""
    try:
        code = policy_of(plugins, str(beside) if beside is not None else None)
        for text in plugins:
            module = allowance_module(text)
            code.import_module(module, what=f"plugin '{text}'", path=PLUGIN_FLAG)
    except UserCodeError as exc:
        # the policy's own words name the flag of `securevfl party`; this command's is --plugin
        message = exc.message.replace(FLAG, PLUGIN_FLAG)
        raise UserCodeError(message, path=PLUGIN_FLAG, detail=exc.detail) from None


def attack_protocol(
    run_dir: Path, name: str, params: dict[str, Any], plugins: Sequence[str]
) -> CheckedProtocol:
    """The run's protocol with ``name`` (options ``params``) as its one attack;
    ``plugins``: modules of the caller's own that register it (``--plugin``,
    :func:`import_given_plugins`), imported before the protocol is checked.

    The attacks the run's protocol listed are replaced before any component is
    resolved, so one this process cannot resolve (a class the caller registered for
    the run's own call through :mod:`securevfl.api`, or a plugin not given now) does
    not stop another attack from running again. That is sound: the saved protocol is
    vouched for by its digest (:func:`~securevfl.app.model_io.saved_protocol`), read
    whole, not by resolving its components; the attack entries changed nothing in
    training but which views were saved, and the views are checked to be there; the
    attack rerun is resolved and validated as any protocol's attack is, and the rest
    of the protocol (defenses, models, plugins) is checked as at load, its own
    modules allowed as the run's (the local launcher's rule) and nothing else
    imported for the attacks it no longer lists."""
    saved = saved_protocol(run_dir)
    import_given_plugins(plugins, saved.beside)
    doc = copy.deepcopy(saved.doc)
    doc["attacks"] = [{"name": name, "params": dict(params)}]
    runtime = doc.setdefault("runtime", {})
    runtime["dump_views"] = True  # the views were saved; an attack needs nothing more of the run
    training = doc.setdefault("training", {})
    training.pop("checkpoint_every", None)
    return load_checked_dict(doc, source=f"{run_dir} (--attack {name})", allow=OWN, beside=saved.beside)


def attack_run(
    run_dir: Path, name: str, params: dict[str, Any] | None = None, plugins: list[str] | None = None
) -> tuple[str, dict[str, Any], Path]:
    """Run attack ``name`` on the finished run in ``run_dir``; return its result key, its
    entry (as ``result.json["attacks"]`` would hold it) and the file it was written to."""
    run_dir = Path(run_dir)
    if not (run_dir / "result.json").is_file():
        raise ConfigError(f"{run_dir} holds no result.json: not the output folder of a finished run")
    checked = attack_protocol(run_dir, name, params or {}, [str(p) for p in plugins or []])
    layout = layout_of(checked)
    missing = [
        r.rank
        for r in layout.roles
        if r.kind != "helper" and not (run_dir / "ranks" / f"rank{r.rank}.view.pt").is_file()
    ]
    if missing:
        raise ConfigError(
            f"{run_dir} holds no saved view for rank(s) {', '.join(map(str, missing))}: a run saves its "
            "views only when its protocol lists attacks or sets runtime.dump_views: true; run it again "
            "with --set runtime.dump_views=true",
            path="--attack",
        )
    world = load_world(checked, layout, run_dir)
    (key,) = attack_keys(checked.components)
    (spec,) = checked.components.attacks
    entry = attack_results(world)[key]
    path = run_dir / RESULTS_DIR / f"{key}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_private(path, json.dumps({"attack": spec.name, "params": params or {}, **entry}, indent=1))
    return key, entry, path
