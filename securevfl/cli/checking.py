"""``securevfl validate | list``: check protocol files and list the registered
components without running anything. Both read the protocol schema and the
registries' names and declarations alone: neither imports torch, scikit-learn,
pandas, matplotlib or a crypto library (tests/unit/test_light_start.py), so a
check in an editor loop answers at once. A plugin a file names is imported
(where ``--allow-plugin`` allows it) before the file is checked."""

from __future__ import annotations

import argparse
from pathlib import Path

from securevfl.app.comparison import plan as make_plan
from securevfl.app.comparison import read_comparison_file, sources_from_args
from securevfl.app.loader import allowed_modules, load_checked
from securevfl.app.rank_layout import layout_of
from securevfl.attacks import ATTACKS
from securevfl.data.catalog import DATASETS
from securevfl.defenses import DEFENSES
from securevfl.exchange import EXCHANGES
from securevfl.model_kinds import MODELS
from securevfl.sizing import describe, party_sizes
from securevfl.validation import input_widths


def cmd_validate(args: argparse.Namespace) -> int:
    for f in args.files:
        if Path(f).is_file() and read_comparison_file(Path(f)) is not None:
            title, sources, seeds = sources_from_args([f], args.overrides, [])
            runs = make_plan(title, sources, seeds, Path("runs/compare"), allow=args.allow_plugins).runs
            print(f"ok: {f}: comparison '{title}', {len(runs)} runs, every one validated")
            continue
        checked = load_checked(f, args.overrides, allow=allowed_modules(args.allow_plugins))
        proto = checked.protocol
        lay = layout_of(checked)
        print(
            f"ok: {f}: '{proto.name}' backend={proto.exchange.backend} dataset={proto.dataset.name} "
            f"ranks={lay.world_size} ({', '.join(r.label for r in lay.roles)}); "
            + describe(party_sizes(proto, input_widths(proto)))
        )
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    for title, reg in (
        ("exchange backends", EXCHANGES),
        ("defenses", DEFENSES),
        ("attacks", ATTACKS),
        ("datasets", DATASETS),
        ("models", MODELS),
    ):
        names = reg.names() + (["csv"] if reg is DATASETS else [])
        print(f"{title}: {', '.join(names) or '(none yet)'}")
    return 0
