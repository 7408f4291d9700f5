"""A user's module whose code does not end the way a rank's work does (the tests of
tests/e2e/test_user_code_ends.py copy it beside their protocol files as
``hostile.py``): a factory that leaves a thread running, blocks, ends its process
or starts processes of its own; a defense whose embedding hook blocks; and, as a
plugin, an import that ends every rank at once.

What a factory does comes from its ``params`` (``mode``). In ``$SVFL_HOSTILE_MARKS``
(a folder) the factory and the hook write ``<mode>-<pid>`` as they begin what they do,
holding the wall time then, or the pids of the processes they start."""

from __future__ import annotations

import multiprocessing as mp
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch
from torch import nn

from securevfl.defenses.base import DEFENSES, Defense, DefenseOptions

MARKS = os.environ.get("SVFL_HOSTILE_MARKS")


def mark(what: str, text: str | None = None) -> None:
    if MARKS:
        Path(MARKS, f"{what}-{os.getpid()}").write_text(text if text is not None else repr(time.time()))


if os.environ.get("SVFL_HOSTILE_EXIT_ON_IMPORT") and mp.current_process().name.startswith("securevfl-rank"):
    os._exit(0)  # a plugin whose import ends every rank, "successfully"


def bottom(in_features: int, out: int, *, mode: str = "plain") -> nn.Module:
    if mode != "children":
        mark(mode)
    if mode == "thread":  # a thread that never ends, not a daemon
        threading.Thread(target=threading.Event().wait, name="user-poller").start()
    elif mode == "sleep":
        time.sleep(600)
    elif mode == "exit":
        os._exit(7)
    elif mode == "children":  # a child, and a grandchild orphaned by its parent at once
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        sh = subprocess.Popen(
            ["sh", "-c", f"'{sys.executable}' -c 'import time; time.sleep(600)' >/dev/null 2>&1 & echo $!"],
            stdout=subprocess.PIPE,
            text=True,
        )
        orphan = int(sh.communicate()[0])
        mark(mode, f"{child.pid} {orphan}")
    return nn.Sequential(nn.Linear(in_features, out), nn.Tanh())


@DEFENSES.register("test_blocking_embed")
class BlockingEmbed(Defense[DefenseOptions]):
    """Blocks in its embedding hook at the first training step."""

    name = "test_blocking_embed"
    sides = frozenset({"passive"})

    def embed(self, h: torch.Tensor, *, train: bool) -> torch.Tensor:
        if train:
            mark("embed")
            time.sleep(600)
        return h
