"""``securevfl criteo``: split a Criteo TSV into the parties' CSV files."""

from __future__ import annotations

import argparse
from pathlib import Path

import yaml

from securevfl.data.criteo import criteo_paths, criteo_protocol, split_criteo


def cmd_criteo(args: argparse.Namespace) -> int:
    paths = criteo_paths(args.out)
    doc = criteo_protocol(paths, top_k=args.top_k, source=args.file)  # checks top_k before writing
    split_criteo(args.file, args.out, max_rows=args.max_rows)
    proto = Path(args.out) / "protocol.yaml"
    proto.write_text(yaml.safe_dump(doc, sort_keys=False))
    for p in (*paths.values(), proto):
        print(f"wrote {p}")
    return 0
