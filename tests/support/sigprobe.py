"""Imported first by a fork server under test (tests/unit/test_rank_ends.py): writes
the signals the server's interpreter has blocked and ignored as it starts, to the
file ``$SVFL_SIGPROBE`` names."""

from __future__ import annotations

import os
from pathlib import Path

_status = Path("/proc/self/status").read_text().splitlines()
Path(os.environ["SVFL_SIGPROBE"]).write_text(
    "\n".join(line for line in _status if line.startswith(("SigBlk", "SigIgn")))
)
