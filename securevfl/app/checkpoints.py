"""The on-disk format of a rank's checkpoints and of its final model (docs/design.md §12).

Each rank writes its own state only, under its own folder of the output folder::

    OUT/ranks/rank<R>/checkpoints/epoch-<k>/   after every ``training.checkpoint_every`` epochs
    OUT/ranks/rank<R>/model/                   once, at the end of the run

Both are *state folders*: tensor files (``<name>.pt``, written with
``torch.save`` and read back with ``torch.load(weights_only=True)``, so loading
runs no pickled code), JSON files (``<name>.json``) and ``manifest.json``, which
names every other file with its SHA-256, the protocol digest, the run, the rank,
its role and party, the epoch and the step. A folder is written under a
temporary name and renamed into place, manifest last, so a folder that exists
under its final name is complete; one whose manifest or any file does not verify
is refused (:class:`~securevfl.errors.CheckpointError`, exit code 2) with the
rank, the file or field and the reason, never silently skipped. A state folder is
its owner's alone: mode 0700, every file in it 0600 (a checkpoint holds the
party's noise keys, and either kind its weight shares).

What goes into the files is the party's business (securevfl.parties.state);
this module only writes, lists and verifies them.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import re
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from securevfl.config_errors import format_loc
from securevfl.errors import CheckpointError
from securevfl.private_files import open_private, private_dir, write_private

FORMAT = 2  # 2: defenses keep secret-stream keys (csprng), not integer noise seeds
MANIFEST = "manifest.json"
CHECKPOINTS = "checkpoints"
MODEL = "model"
_EPOCH_DIR = re.compile(r"^epoch-(\d+)$")
_FILE_NAME = re.compile(r"^[A-Za-z0-9_-]+\.(pt|json)$")
_CHUNK = 1 << 20

Kind = Literal["checkpoint", "model"]


class Manifest(BaseModel):
    """What a state folder holds and for which run and rank it was written."""

    model_config = ConfigDict(extra="forbid", strict=True)
    format: int = Field(ge=1)
    kind: Kind
    protocol_digest: str
    run_id: str
    rank: int = Field(ge=0)
    role: str
    party: str
    epoch: int = Field(ge=0, description="epochs completed when it was written")
    step: int = Field(ge=0, description="training steps completed when it was written")
    files: dict[str, str] = Field(description="file name -> SHA-256 (hex) of its bytes")


@dataclass
class SavedState:
    """A verified state folder: its manifest, its tensor files (by name, without
    ``.pt``) and its JSON files (by name, without ``.json``)."""

    path: Path
    manifest: Manifest
    tensors: dict[str, Any]
    docs: dict[str, Any]


def rank_dir(out: Path, rank: int) -> Path:
    """``OUT/ranks/rank<R>``: where rank R keeps its checkpoints and final model."""
    return Path(out) / "ranks" / f"rank{rank}"


def checkpoint_dir(out: Path, rank: int, epoch: int) -> Path:
    return rank_dir(out, rank) / CHECKPOINTS / f"epoch-{epoch}"


def model_dir(out: Path, rank: int) -> Path:
    return rank_dir(out, rank) / MODEL


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_tensors(obj: Any, path: Path) -> None:
    """``torch.save`` through a file this process opens, its owner's alone (mode
    0600, :func:`securevfl.private_files.open_private`): every tensor file a rank
    writes holds its shares, its model or what it received. A write that fails (a
    full disk) raises the OSError naming ``path``, where ``torch.save(obj, path)``
    raises a RuntimeError from its C++ writer ("unexpected pos ...")."""
    try:
        with open_private(path) as fh:
            torch.save(obj, fh)
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, str(path)) from None


def write_state(
    dest: Path,
    *,
    tensors: dict[str, Any],
    docs: dict[str, Any],
    kind: Kind,
    protocol_digest: str,
    run_id: str,
    rank: int,
    role: str,
    party: str,
    epoch: int,
    step: int,
) -> Manifest:
    """Write a state folder at ``dest`` atomically: every file into a temporary
    folder beside it, then the manifest, then one rename. A folder already at
    ``dest`` (an older run's, or an interrupted one's) is replaced. The folder is
    the owner's alone (mode 0700, every file 0600): a checkpoint holds the party's
    noise keys and weight shares (SECURITY.md, "Checkpoints and saved models")."""
    dest = Path(dest)
    private_dir(dest.parent)  # OUT/ranks/rank<R>[/checkpoints]
    tmp = dest.parent / f".tmp-{dest.name}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    private_dir(tmp)
    files: dict[str, str] = {}
    for name, obj in tensors.items():
        f = tmp / f"{name}.pt"
        save_tensors(obj, f)
        files[f.name] = file_digest(f)
    for name, doc in docs.items():
        f = tmp / f"{name}.json"
        write_private(f, json.dumps(doc, indent=1, sort_keys=True))
        files[f.name] = file_digest(f)
    for name in files:
        _check_name(name)
        _fsync(tmp / name)
    manifest = Manifest(
        format=FORMAT,
        kind=kind,
        protocol_digest=protocol_digest,
        run_id=run_id,
        rank=rank,
        role=role,
        party=party,
        epoch=epoch,
        step=step,
        files=files,
    )
    write_private(tmp / MANIFEST, manifest.model_dump_json(indent=1))
    _fsync(tmp / MANIFEST)
    old = dest.parent / f".old-{dest.name}-{os.getpid()}"
    if dest.exists():
        os.replace(dest, old)
    os.replace(tmp, dest)
    _fsync(dest.parent)
    if old.exists():
        shutil.rmtree(old)
    return manifest


def _check_name(name: str) -> None:
    if not _FILE_NAME.match(name):
        raise ValueError(f"state file name {name!r} (letters, digits, '_' and '-', then .pt or .json)")


def _where(path: Path, rank: int) -> str:
    """A state file named relative to the rank's own folder: peers may read the
    message, so it carries no absolute path of this host."""
    parts = path.parts
    for i in range(len(parts) - 1, -1, -1):
        if parts[i] == f"rank{rank}":
            return "/".join(parts[i:])
    return path.name


#: What a reader checks a saved protocol digest against: the digest itself (equal or
#: refused), or a protocol's :meth:`~securevfl.config.Protocol.digest_mismatch` (which
#: also accepts the digest an older, compatible securevfl wrote, and says why not).
DigestCheck = str | Callable[[str], str | None]


def digest_check(saved: str, want: DigestCheck | None) -> str | None:
    """Why the saved digest ``saved`` is refused under ``want``; None when it is not."""
    if want is None:
        return None
    if isinstance(want, str):
        return None if saved == want else f"expected {want!r}: written for a different protocol"
    return want(saved)


def read_manifest(path: Path, *, rank: int, kind: Kind, protocol_digest: DigestCheck | None) -> Manifest:
    """The manifest of the state folder ``path``, checked against what this rank
    expects: its kind, its rank and (when given) the protocol digest."""
    f = Path(path) / MANIFEST
    who = f"rank {rank}"
    if not f.is_file():
        raise CheckpointError(f"{who}: {_where(f, rank)} is missing (the folder is not a complete {kind})")
    try:
        manifest = Manifest.model_validate_json(f.read_bytes())
    except ValidationError as exc:
        e = exc.errors()[0]
        raise CheckpointError(
            f"{who}: {_where(f, rank)} is corrupted: field '{format_loc(tuple(e['loc']))}': {e['msg']}"
        ) from None
    checks: list[tuple[str, object, object, str]] = [
        ("format", manifest.format, FORMAT, "written by another version of securevfl"),
        ("kind", manifest.kind, kind, f"not a {kind}"),
        ("rank", manifest.rank, rank, "written by another rank"),
    ]
    for field, got, want, why in checks:
        if got != want:
            raise CheckpointError(
                f"{who}: {_where(f, rank)}: field '{field}' is {got!r}, expected {want!r} ({why})"
            )
    why_not = digest_check(manifest.protocol_digest, protocol_digest)
    if why_not is not None:
        raise CheckpointError(
            f"{who}: {_where(f, rank)}: field 'protocol_digest' is {manifest.protocol_digest!r} ({why_not})"
        )
    for name in manifest.files:
        if not _FILE_NAME.match(name):
            raise CheckpointError(f"{who}: {_where(f, rank)}: field 'files' names {name!r}, not a state file")
    return manifest


def verify_files(path: Path, manifest: Manifest, *, rank: int) -> None:
    """Every file the manifest names exists and has its recorded SHA-256."""
    for name, digest in sorted(manifest.files.items()):
        f = Path(path) / name
        if not f.is_file():
            raise CheckpointError(f"rank {rank}: {_where(f, rank)} is missing (named in its manifest)")
        if file_digest(f) != digest:
            raise CheckpointError(
                f"rank {rank}: {_where(f, rank)} does not match the SHA-256 in its manifest "
                "(the file was changed or corrupted)"
            )


def read_state(path: Path, *, rank: int, kind: Kind, protocol_digest: DigestCheck | None) -> SavedState:
    """Verify and load a state folder: manifest, every file's digest, then the
    tensors (``weights_only``: no code runs) and the JSON documents."""
    path = Path(path)
    manifest = read_manifest(path, rank=rank, kind=kind, protocol_digest=protocol_digest)
    verify_files(path, manifest, rank=rank)
    tensors: dict[str, Any] = {}
    docs: dict[str, Any] = {}
    for name in manifest.files:
        f = path / name
        stem = name.rsplit(".", 1)[0]
        try:
            if name.endswith(".pt"):
                tensors[stem] = torch.load(f, map_location="cpu", weights_only=True)
            else:
                docs[stem] = json.loads(f.read_text())
        except Exception as exc:  # verified bytes that still do not load: a writer's bug or forgery
            raise CheckpointError(f"rank {rank}: {_where(f, rank)} cannot be loaded: {_why(exc)}") from None
    return SavedState(path, manifest, tensors, docs)


# torch's advice around a refused weights-only load, which must not reach the user:
# securevfl never loads a state file with weights_only=False
_TORCH_ADVICE = (
    "Weights only load failed",
    "(1)",
    "(2)",
    "In PyTorch",
    "Please file an issue",
    "Check the documentation",
)


def _why(exc: Exception) -> str:
    """Why a state file did not load, in one line. A weights-only refusal (an
    object that is not a tensor or a plain container: a forged file) keeps
    torch's reason and drops its advice to load the file with
    ``weights_only=False``, which would run the code in it."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc))
    if isinstance(exc, pickle.UnpicklingError):
        marker = "WeightsUnpickler error:"
        if marker in text:
            reason = text.split(marker, 1)[1].strip()
        else:
            lines = [ln.strip() for ln in text.splitlines()]
            reason = next((ln for ln in lines if ln and not ln.startswith(_TORCH_ADVICE)), "not tensors")
        reason = reason.split(". ", 1)[0].splitlines()[0].rstrip(".") if reason else "not tensors"
        return (
            f"it holds something other than tensors ({reason}); securevfl writes tensors only, so the "
            "file was changed after it was written"
        )
    return next((ln.strip() for ln in text.splitlines() if ln.strip()), type(exc).__name__)


def list_checkpoints(out: Path, rank: int, *, protocol_digest: DigestCheck) -> dict[int, Manifest]:
    """Rank R's complete checkpoints by epoch, every one verified (manifest and
    file digests). Temporary folders of an interrupted write are not listed; a
    folder under a final name that does not verify is an error, not skipped."""
    root = rank_dir(out, rank) / CHECKPOINTS
    found: dict[int, Manifest] = {}
    if not root.is_dir():
        return found
    for d in sorted(root.iterdir()):
        m = _EPOCH_DIR.match(d.name)
        if m is None or not d.is_dir():
            continue
        manifest = read_manifest(d, rank=rank, kind="checkpoint", protocol_digest=protocol_digest)
        if manifest.epoch != int(m.group(1)):
            raise CheckpointError(
                f"rank {rank}: {_where(d / MANIFEST, rank)}: field 'epoch' is {manifest.epoch}, "
                f"but the folder is {d.name}"
            )
        verify_files(d, manifest, rank=rank)
        found[manifest.epoch] = manifest
    return found


def check_one_run(out: Path, ranks: Iterable[int], *, protocol_digest: DigestCheck) -> None:
    """Before a local ``--resume`` starts any rank: the party ranks' checkpoints in
    ``out`` (one launcher sees every rank's folder) must hold an epoch of one and
    the same run. Checkpoints of two runs mixed in one folder (copied together by
    hand, say) are refused naming each rank's run ID. Anything else wrong with a
    rank's checkpoints is left to that rank, which reports it at start-up."""
    held: dict[int, dict[int, str]] = {}
    for r in ranks:
        try:
            found = list_checkpoints(out, r, protocol_digest=protocol_digest)
        except CheckpointError:
            return
        held[r] = {e: m.run_id for e, m in found.items()}
    runs = {run for h in held.values() for run in h.values()}
    if len(runs) < 2 or not all(held.values()):
        return
    common = set.intersection(*({(e, run) for e, run in h.items()} for h in held.values()))
    if common:
        return
    listed = "; ".join(
        f"rank {r}: " + ", ".join(f"epoch {e} of run {run}" for e, run in sorted(h.items()))
        for r, h in held.items()
    )
    raise CheckpointError(
        f"the checkpoints in {out} come from {len(runs)} different runs (their run IDs differ: {listed}): "
        "every rank must resume from a checkpoint of the same run"
    )


def load_model(run_dir: Path, rank: int, *, protocol_digest: DigestCheck | None = None) -> SavedState:
    """Rank R's final model from a finished run's output folder, verified (and,
    with ``protocol_digest``, checked to belong to that protocol)."""
    return read_state(model_dir(run_dir, rank), rank=rank, kind="model", protocol_digest=protocol_digest)
