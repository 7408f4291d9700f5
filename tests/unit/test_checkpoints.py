"""The checkpoint format (securevfl.app.checkpoints), the start-up agreement on
the checkpoint to resume from (securevfl.runtime.resume.agree_checkpoint), the
default component state (securevfl.snapshot) and --resume's output folder."""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from securevfl.app.checkpoints import (
    Manifest,
    check_one_run,
    checkpoint_dir,
    file_digest,
    list_checkpoints,
    load_model,
    model_dir,
    read_state,
    write_state,
)
from securevfl.app.launcher import launch
from securevfl.app.loader import load_checked_dict, load_protocol_dict
from securevfl.app.outdir import OutputFolder, resume_folder
from securevfl.errors import CheckpointError, ConfigError
from securevfl.runtime.admission import Hello
from securevfl.runtime.resume import agree_checkpoint
from securevfl.snapshot import capture_attributes, restore_attributes
from tests.support.protocols import small_digits

DIGEST = "0123456789abcdef"


def _write(
    dest: Path, *, rank: int = 1, epoch: int = 2, kind: str = "checkpoint", run: str = "run-a"
) -> Manifest:
    return write_state(
        dest,
        tensors={
            "models": {"bottom": {"w": torch.arange(6.0).reshape(2, 3)}},
            "rng": {"torch": torch.get_rng_state()},
        },
        docs={"loop": {"epoch": epoch, "history": [{"epoch": 1, "loss": 0.5}]}},
        kind=kind,  # type: ignore[arg-type]
        protocol_digest=DIGEST,
        run_id=run,
        rank=rank,
        role="passive",
        party="left",
        epoch=epoch,
        step=24,
    )


def test_state_folder_round_trip_with_a_digest_per_file(tmp_path: Path) -> None:
    dest = checkpoint_dir(tmp_path, 1, 2)
    manifest = _write(dest)
    assert dest == tmp_path / "ranks" / "rank1" / "checkpoints" / "epoch-2"
    assert sorted(p.name for p in dest.iterdir()) == ["loop.json", "manifest.json", "models.pt", "rng.pt"]
    assert set(manifest.files) == {"loop.json", "models.pt", "rng.pt"}
    assert all(len(d) == 64 for d in manifest.files.values())
    saved = read_state(dest, rank=1, kind="checkpoint", protocol_digest=DIGEST)
    assert saved.manifest == manifest
    assert torch.equal(saved.tensors["models"]["bottom"]["w"], torch.arange(6.0).reshape(2, 3))
    assert saved.docs["loop"]["history"] == [{"epoch": 1, "loss": 0.5}]
    # no temporary folder is left beside it
    assert [p.name for p in dest.parent.iterdir()] == ["epoch-2"]


def test_a_state_folder_is_its_owners_alone_whatever_the_umask(tmp_path: Path) -> None:
    """A checkpoint holds the party's noise keys (party.json, defenses.json) and its
    weight shares: the folder is 0700 and every file 0600, as the channel's secret
    key files are, even under a umask that lets everyone read."""
    old = os.umask(0)
    try:
        for kind, dest in (("checkpoint", checkpoint_dir(tmp_path, 1, 2)), ("model", model_dir(tmp_path, 1))):
            _write(dest, kind=kind)
            _write(dest, kind=kind, epoch=3)  # a rewrite too
            assert stat.S_IMODE(dest.stat().st_mode) == 0o700, kind
            modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in dest.iterdir()}
            assert set(modes) == {"loop.json", "manifest.json", "models.pt", "rng.pt"}
            assert set(modes.values()) == {0o600}, (kind, modes)
    finally:
        os.umask(old)


def test_rewriting_a_state_folder_replaces_it_whole(tmp_path: Path) -> None:
    dest = tmp_path / "ranks" / "rank1" / "model"
    _write(dest, kind="model")
    (dest / "stray.pt").write_bytes(b"old")
    _write(dest, kind="model", epoch=3)
    assert not (dest / "stray.pt").exists()
    assert load_model(tmp_path, 1, protocol_digest=DIGEST).manifest.epoch == 3


def test_a_flipped_byte_in_a_tensor_file_is_refused_naming_rank_and_file(tmp_path: Path) -> None:
    dest = checkpoint_dir(tmp_path, 1, 2)
    _write(dest)
    f = dest / "models.pt"
    raw = bytearray(f.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    f.write_bytes(bytes(raw))
    with pytest.raises(
        CheckpointError, match=r"rank 1: rank1/checkpoints/epoch-2/models\.pt does not match the SHA-256"
    ):
        read_state(dest, rank=1, kind="checkpoint", protocol_digest=DIGEST)
    with pytest.raises(CheckpointError, match=r"models\.pt"):
        list_checkpoints(tmp_path, 1, protocol_digest=DIGEST)


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda m: m.pop("run_id"), "field 'run_id'"),
        (lambda m: m.update(step="24"), "field 'step'"),
        (
            lambda m: m.update(protocol_digest="ffffffffffffffff"),
            "field 'protocol_digest'.*different protocol",
        ),
        (lambda m: m.update(rank=2), "field 'rank' is 2, expected 1"),
        (lambda m: m.update(kind="model"), "field 'kind'"),
        (lambda m: m["files"].update({"../x.pt": "0" * 64}), "field 'files'"),
        (lambda m: m["files"].update({"extra.pt": "0" * 64}), r"extra\.pt is missing"),
    ],
)
def test_a_bad_manifest_is_refused_naming_the_field(tmp_path: Path, mutate: Any, expected: str) -> None:
    dest = checkpoint_dir(tmp_path, 1, 2)
    _write(dest)
    m = json.loads((dest / "manifest.json").read_text())
    mutate(m)
    (dest / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(CheckpointError, match=f"rank 1: .*{expected}"):
        list_checkpoints(tmp_path, 1, protocol_digest=DIGEST)


def test_a_manifest_that_is_not_json_is_refused(tmp_path: Path) -> None:
    dest = checkpoint_dir(tmp_path, 1, 2)
    _write(dest)
    (dest / "manifest.json").write_text('{"format": 1, "kind": "checkp')
    with pytest.raises(CheckpointError, match=r"rank1/checkpoints/epoch-2/manifest\.json is corrupted"):
        read_state(dest, rank=1, kind="checkpoint", protocol_digest=DIGEST)


def test_listing_skips_temporary_folders_and_checks_the_epoch(tmp_path: Path) -> None:
    _write(checkpoint_dir(tmp_path, 1, 1), epoch=1)
    _write(checkpoint_dir(tmp_path, 1, 2), epoch=2)
    # an interrupted write: files but never renamed into place
    tmp = checkpoint_dir(tmp_path, 1, 3).parent / ".tmp-epoch-3-123"
    tmp.mkdir()
    (tmp / "models.pt").write_bytes(b"partial")
    found = list_checkpoints(tmp_path, 1, protocol_digest=DIGEST)
    assert sorted(found) == [1, 2] and found[2].run_id == "run-a"
    assert list_checkpoints(tmp_path, 0, protocol_digest=DIGEST) == {}
    # a folder renamed by hand is not trusted
    checkpoint_dir(tmp_path, 1, 2).rename(checkpoint_dir(tmp_path, 1, 5))
    with pytest.raises(CheckpointError, match="field 'epoch' is 2, but the folder is epoch-5"):
        list_checkpoints(tmp_path, 1, protocol_digest=DIGEST)


def test_load_model_reads_the_final_model_folder(tmp_path: Path) -> None:
    _write(model_dir(tmp_path, 0), rank=0, kind="model")
    saved = load_model(tmp_path, 0)
    assert saved.manifest.kind == "model" and saved.manifest.party == "left"
    with pytest.raises(CheckpointError, match=r"rank 1: rank1/model/manifest\.json is missing"):
        load_model(tmp_path, 1)


# -- the start-up agreement ------------------------------------------------------------


def hello(
    rank: int, checkpoints: dict[int, str] | None, role: str = "passive", error: str | None = None
) -> Hello:
    return Hello(
        rank=rank,
        world_size=4,
        party=f"p{rank}",
        role=role,
        digest=DIGEST,
        pid=1,
        host="h",
        version="0",
        run_id=f"fresh{rank}",
        identity="00" * 32,  # the authenticated hello's keys (not read by the agreement)
        ephemeral="00" * 32,
        checkpoints=checkpoints,
        checkpoint_error=error,
    )


def who(r: int) -> str:
    return f"rank {r} (p{r})"


def test_ranks_resume_from_the_newest_epoch_every_party_rank_holds() -> None:
    hs = {
        0: hello(0, {1: "a", 2: "a"}, role="active"),
        1: hello(1, {1: "a", 2: "a", 3: "a"}),  # killed the others before they wrote epoch 3
        2: hello(2, {1: "a", 2: "a", 3: "a"}),
        3: hello(3, {}, role="helper"),  # a dealer keeps no checkpoints
    }
    assert agree_checkpoint(hs, who) == (2, "a")
    fresh = {r: hello(r, None) for r in range(3)}
    assert agree_checkpoint(fresh, who) == (None, "fresh0")


def test_ranks_with_no_checkpoint_in_common_are_refused_naming_them() -> None:
    hs = {0: hello(0, {2: "a"}, role="active"), 1: hello(1, {1: "a"}), 2: hello(2, {2: "b"})}
    with pytest.raises(
        CheckpointError,
        match=r"field 'checkpoints'.*rank 0 \(p0\) holds epochs \[2\]; rank 1 \(p1\) holds epochs \[1\]",
    ):
        agree_checkpoint(hs, who)
    # the same epoch from another run does not count
    hs = {0: hello(0, {1: "a"}, role="active"), 1: hello(1, {1: "b"})}
    with pytest.raises(CheckpointError, match="same run and epoch"):
        agree_checkpoint(hs, who)


def test_a_rank_without_resume_or_with_a_bad_checkpoint_stops_every_rank() -> None:
    hs = {0: hello(0, {1: "a"}, role="active"), 1: hello(1, None)}
    with pytest.raises(CheckpointError, match=r"rank 1 \(p1\) was started without --resume"):
        agree_checkpoint(hs, who)
    bad = "rank 1: rank1/checkpoints/epoch-1/models.pt does not match the SHA-256 in its manifest"
    hs = {0: hello(0, {1: "a"}, role="active"), 1: hello(1, {}, error=bad)}
    with pytest.raises(CheckpointError, match=r"rank 1: rank1/checkpoints/epoch-1/models\.pt"):
        agree_checkpoint(hs, who)


# -- a component's default state ---------------------------------------------------------


class _Noisy:
    def __init__(self) -> None:
        self.params = "options are not state"
        self.gen = torch.Generator().manual_seed(7)
        self.rng = np.random.default_rng(3)
        self.steps = 0
        self.scale = 1.5
        self.counts = np.array([1, 2, 3])
        self.history = [0.5, 0.25]
        self.pairs = (1, 2)  # a tuple does not survive JSON: left out
        self.layer = torch.nn.Linear(2, 2)  # modules are saved by their owner

    def draw(self) -> tuple[torch.Tensor, np.ndarray]:
        self.steps += 1
        return torch.randn(3, generator=self.gen), self.rng.normal(size=2)


def test_generators_continue_their_streams_after_a_restore() -> None:
    a = _Noisy()
    a.draw()
    state = capture_attributes(a)
    assert set(state.tensors) == {"generator.gen", "array.counts"}
    assert set(state.meta) == {"np_generator.rng", "value.steps", "value.scale", "value.history"}
    expected = a.draw()
    b = _Noisy()
    b.counts = np.zeros(3, dtype=np.int64)
    restore_attributes(b, state, owner="test")
    assert b.steps == 1 and np.array_equal(b.counts, [1, 2, 3])
    got = b.draw()
    assert torch.equal(got[0], expected[0]) and np.array_equal(got[1], expected[1])
    state.meta["value.gone"] = 1
    with pytest.raises(CheckpointError, match=r"test: the checkpoint holds 'value\.gone'"):
        restore_attributes(b, state, owner="test")


# -- --resume's output folder ------------------------------------------------------------


def test_resume_needs_a_checkpoint_and_an_unfinished_run(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"--resume.*holds no checkpoint"):
        resume_folder(tmp_path, overwrite=False, ranks=range(3))
    _write(checkpoint_dir(tmp_path, 1, 1), epoch=1)
    (tmp_path / "ranks" / "rank1.error.json").write_text("{}")
    folder = resume_folder(tmp_path, overwrite=False, ranks=range(3))
    assert folder.path == tmp_path and not folder.staged  # written in place, nothing staged
    with pytest.raises(ConfigError, match="--overwrite"):
        resume_folder(tmp_path, overwrite=True, ranks=range(3))
    (tmp_path / "result.json").write_text("{}")
    with pytest.raises(ConfigError, match="has finished"):
        resume_folder(tmp_path, overwrite=False, ranks=range(3))


def test_overwriting_a_run_removes_its_old_checkpoints(tmp_path: Path) -> None:
    _write(checkpoint_dir(tmp_path, 1, 3), epoch=3, run="old")
    (tmp_path / "result.json").write_text("{}")
    (tmp_path / "notes.txt").write_text("mine")
    folder = OutputFolder.open(tmp_path, overwrite=True)
    _write(checkpoint_dir(folder.path, 1, 1), epoch=1, run="new")
    folder.commit()
    found = list_checkpoints(tmp_path, 1, protocol_digest=DIGEST)
    assert {e: m.run_id for e, m in found.items()} == {1: "new"}
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_checkpoint_every_is_typed_off_by_default_and_refused_with_attacks() -> None:
    assert load_protocol_dict(small_digits()).training.checkpoint_every is None
    assert load_protocol_dict(small_digits(checkpoint_every=2)).training.checkpoint_every == 2
    with pytest.raises(ConfigError, match=r"training\.checkpoint_every"):
        load_protocol_dict(small_digits(checkpoint_every=0))
    doc = small_digits(checkpoint_every=1)
    doc["attacks"] = [{"name": "label_norm"}]
    with pytest.raises(ConfigError, match=r"training\.checkpoint_every.*views recorded for attacks"):
        load_protocol_dict(doc)


def _checkpoints_of(out: Path, proto: Any, runs: dict[int, str], epoch: int = 1) -> None:
    for rank, run in runs.items():
        write_state(
            checkpoint_dir(out, rank, epoch),
            tensors={"models": {"w": torch.zeros(2)}},
            docs={"loop": {"epoch": epoch}},
            kind="checkpoint",
            protocol_digest=proto.digest(),
            run_id=run,
            rank=rank,
            role="active" if rank == 0 else "passive",
            party="p",
            epoch=epoch,
            step=3,
        )


def test_checkpoints_of_two_runs_mixed_are_refused_naming_the_run_ids(tmp_path: Path) -> None:
    """A local --resume in a folder whose ranks hold checkpoints of different runs
    (rank 2's copied from another run) is refused before any rank starts, saying
    that the run IDs differ."""
    checked = load_checked_dict(small_digits())
    _checkpoints_of(tmp_path, checked.protocol, {0: "run-a1", 1: "run-a1", 2: "run-b2"})
    with pytest.raises(CheckpointError) as info:
        launch(checked, tmp_path, progress=False, resume=True)
    text = str(info.value)
    assert "come from 2 different runs (their run IDs differ" in text, text
    assert "rank 1: epoch 1 of run run-a1; rank 2: epoch 1 of run run-b2" in text, text
    assert not (tmp_path / "ranks" / "launcher_pids.json").exists()  # no rank started
    # one run: nothing to say here (the ranks agree at start-up)
    check_one_run(tmp_path, [0, 1], protocol_digest=checked.protocol.digest())


def test_a_forged_state_file_does_not_advise_loading_it_unsafely(tmp_path: Path) -> None:
    """A tensor file replaced by a pickle that would run code, with its manifest
    digest forged to match: refused naming the file, without torch's advice to
    load it with weights_only=False."""
    dest = checkpoint_dir(tmp_path, 1, 2)
    _write(dest)

    class Payload:
        def __reduce__(self) -> tuple[Any, ...]:
            return (print, ("this would have run",))

    f = dest / "models.pt"
    torch.save({"x": Payload()}, f)
    manifest = json.loads((dest / "manifest.json").read_text())
    manifest["files"]["models.pt"] = file_digest(f)
    (dest / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError) as info:
        read_state(dest, rank=1, kind="checkpoint", protocol_digest=DIGEST)
    text = str(info.value)
    assert text.startswith("rank 1: rank1/checkpoints/epoch-2/models.pt cannot be loaded: it holds something")
    assert "(Unsupported global: GLOBAL print was not an allowed global by default)" in text, text
    assert "changed after it was written" in text
    assert "weights_only" not in text and "trusted source" not in text, text


def test_a_checkpoint_an_older_securevfl_wrote_is_read_and_an_incompatible_one_refused(tmp_path):
    """Saved digests are checked by the protocol: one written before the schema
    version is accepted when it matches, one of another schema is refused as
    incompatible, naming the field."""
    proto = load_protocol_dict(small_digits())
    for name, digest, refused in [
        ("older", proto.legacy_digest(), None),
        ("now", proto.digest(), None),
        ("newer", "v99-" + proto.digest()[-16:], "protocol schema v99, incompatible"),
        ("edited", load_protocol_dict(small_digits(epochs=7)).digest(), "different protocol"),
    ]:
        dest = tmp_path / name
        write_state(
            dest,
            tensors={"models": {"w": torch.zeros(2)}},
            docs={"loop": {"epoch": 1}},
            kind="checkpoint",
            protocol_digest=digest,
            run_id="run-a",
            rank=1,
            role="passive",
            party="left",
            epoch=1,
            step=3,
        )
        if refused is None:
            assert read_state(dest, rank=1, kind="checkpoint", protocol_digest=proto.digest_mismatch)
        else:
            with pytest.raises(CheckpointError, match=f"field 'protocol_digest'.*{refused}"):
                read_state(dest, rank=1, kind="checkpoint", protocol_digest=proto.digest_mismatch)


def test_ranks_of_incompatible_securevfl_versions_are_told_apart_from_a_changed_protocol() -> None:
    """Two ranks whose protocol digests carry different schema versions run
    incompatible securevfl versions, and the start-up says so; the same version
    with another digest is another protocol, as before."""
    from types import SimpleNamespace

    from securevfl.runtime.admission import check_hellos

    proto = load_protocol_dict(small_digits())
    layout = SimpleNamespace(
        world_size=2,
        roles=[SimpleNamespace(party="p0", kind="active"), SimpleNamespace(party="p1", kind="passive")],
    )
    seat = SimpleNamespace(layout=layout, who=lambda r: f"rank {r}")

    def announced(rank: int, digest: str) -> Hello:
        role = "active" if rank == 0 else "passive"
        return hello(rank, None, role).model_copy(update={"world_size": 2, "digest": digest})

    me = announced(0, proto.digest())
    for other, said in [
        (proto.legacy_digest(), "protocol schema (v1) is incompatible with this rank's (v2)"),
        ("v3-" + proto.digest()[-16:], "protocol schema (v3) is incompatible"),
        (load_protocol_dict(small_digits(epochs=7)).digest(), "runs a different protocol"),
    ]:
        with pytest.raises(ConfigError, match=re.escape(said)):
            check_hellos(seat, {0: me, 1: announced(1, other)}, me)  # type: ignore[arg-type]
