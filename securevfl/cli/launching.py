"""``securevfl run | compare | predict`` up to the launch: the commands that start
every rank locally read and check their protocol files here first, with the
light modules ``securevfl validate`` uses (the file readable, UTF-8 text, YAML;
for ``run`` also the schema, the registries and its components' options; for
``compare`` every protocol file it names a YAML mapping), so that a malformed
file is refused (exit code 2) in a blink: without importing torch, pandas or a
crypto library (tests/unit/test_light_start.py), and before the ranks' fork
server starts, whose imports would otherwise hold the command's stderr open
until they end (:func:`securevfl.app.rank_server.stop_rank_server`).

Then the fork server starts, importing while this process imports the launching
modules, and the command goes on in :mod:`securevfl.cli.training`, looked up in
:data:`LAUNCHES` as the commands themselves are in :data:`securevfl.cli.COMMANDS`.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from securevfl.app.comparison import sources_from_args
from securevfl.app.loader import OWN, load_protocol, read_protocol_file
from securevfl.app.rank_server import start_rank_server
from securevfl.errors import ConfigError
from securevfl.registry import Registry

#: a launching command's second half: its arguments (and what was checked) in, its exit code out
Launch = Callable[..., int]

#: ``command -> "module:function"``: the launching half of each command, imported once
#: its files are checked
LAUNCHES: Registry[Launch] = Registry("launch")
LAUNCHES.add_path("run", "securevfl.cli.training:launch_run")
LAUNCHES.add_path("compare", "securevfl.cli.training:cmd_compare")
LAUNCHES.add_path("predict", "securevfl.cli.training:cmd_predict")


def _launch(command: str, args: argparse.Namespace, *checked: Any) -> int:
    start_rank_server()  # the ranks' fork server imports while this process does
    return LAUNCHES.get(command)(args, *checked)


def cmd_run(args: argparse.Namespace) -> int:
    # the author's own run: every module the file names is allowed, as api.run allows
    proto = load_protocol(args.file, args.overrides, allow=OWN)
    return _launch("run", args, proto)


def cmd_compare(args: argparse.Namespace) -> int:
    _, sources, _ = sources_from_args(args.files, args.overrides, args.grid)
    for src in sources:  # each run is validated by the comparison's plan, once launched
        if not isinstance(read_protocol_file(src.path), dict):
            raise ConfigError("a protocol file must be a YAML mapping", source=str(src.path))
    return _launch("compare", args)


def cmd_predict(args: argparse.Namespace) -> int:
    return _launch("predict", args)
