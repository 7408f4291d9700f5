"""Resume agreement: the checkpoint every party rank of a ``--resume`` run goes
on from, agreed at start-up from what each rank's hello offers.

A pure function of the hellos, so every rank reaches the same answer (or raises
the same :class:`~securevfl.errors.CheckpointError`) without another message.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

from pydantic import BaseModel, ConfigDict

from securevfl.errors import CheckpointError


class ResumeOffer(BaseModel):
    """What a rank started with ``--resume`` brings to the handshake: its complete,
    verified checkpoints (epoch -> run id), or the error that makes them unusable."""

    model_config = ConfigDict(extra="forbid")
    checkpoints: dict[int, str]
    error: str | None = None


class CheckpointOffer(Protocol):
    """What the agreement reads of a rank's hello."""

    role: str
    run_id: str
    checkpoints: dict[int, str] | None  # None: the rank was started without --resume
    checkpoint_error: str | None


def agree_checkpoint(
    hellos: Mapping[int, CheckpointOffer], who: Callable[[int], str]
) -> tuple[int | None, str]:
    """The checkpoint every party rank resumes from: the newest epoch that every
    party rank holds from the same run (helper ranks keep no checkpoints). Returns
    (epoch or None for a fresh run, the run id). A rank that cannot offer its
    checkpoints, ranks that were not all started with ``--resume``, or ranks with
    no checkpoint in common: a CheckpointError naming the rank and the reason,
    raised alike at every rank."""
    ranks = sorted(hellos)
    for r in ranks:
        if hellos[r].checkpoint_error is not None:
            raise CheckpointError(str(hellos[r].checkpoint_error))
    resuming = [r for r in ranks if hellos[r].checkpoints is not None]
    if not resuming:
        return None, hellos[ranks[0]].run_id
    fresh = [r for r in ranks if hellos[r].checkpoints is None]
    if fresh:
        raise CheckpointError(
            f"{who(fresh[0])} was started without --resume while {who(resuming[0])} resumes: "
            "start every rank with --resume, or none"
        )
    held = {r: hellos[r].checkpoints or {} for r in ranks if hellos[r].role != "helper"}
    common = set.intersection(*({(e, run) for e, run in h.items()} for h in held.values()))
    if not common:
        listed = "; ".join(f"{who(r)} holds epochs {sorted(h) or 'none'}" for r, h in held.items())
        raise CheckpointError(
            "no checkpoint of the same run and epoch is held by every rank (field 'checkpoints': "
            f"{listed}): every rank must resume from the same checkpoint"
        )
    epoch, run_id = max(common)
    return epoch, run_id
