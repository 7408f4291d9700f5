"""A user's mistake or the machine's limits end a command with exit code 2 and one
paragraph naming the cause, never a traceback: an output folder that cannot be
written, a bad rendezvous address, a table too large to build, a full disk, a
bad ``SECUREVFL_THREADS``. None of them points at a missing
``if __name__ == '__main__':`` guard, which is not their cause.

Where the machine must misbehave (a read-only or full file system), the command
runs in a mount namespace of its own (``unshare``) on a small tmpfs; those
tests are skipped where unprivileged namespaces are not allowed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_cli_errors import assert_clean_user_error, in_process

from tests.support.protocols import PROTOCOLS, ROOT, write_yaml
from tests.support.runs import CliRun

pytestmark = pytest.mark.timeout(300)

GUARD_HINT = "__main__"


def one_paragraph(proc) -> str:
    """The error paragraph (exit 2, no traceback, nothing after it); whitespace-normalized."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr[-3000:]
    err = proc.stderr
    assert err.count("securevfl: error:") == 1, err[-3000:]
    paragraph = err[err.index("securevfl: error:") :].strip()
    assert "\n\n" not in paragraph, paragraph
    assert GUARD_HINT not in err, err[-3000:]
    return " ".join(paragraph.split())


def _namespaces_work() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt 2>/dev/null || exit 1"],
        capture_output=True,
    )
    return probe.returncode == 0


needs_namespaces = pytest.mark.skipif(
    not _namespaces_work(), reason="needs unshare(1) with user and mount namespaces"
)


def in_small_fs(
    mount: Path, options: str, *command: str, timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    """``command`` in a mount namespace where ``mount`` is a fresh tmpfs (``options``:
    its mount options, e.g. ``size=2m`` or ``ro``)."""
    mount.mkdir(parents=True, exist_ok=True)
    script = 'mount -t tmpfs -o "$1" tmpfs "$2" && shift 2 && exec "$@"'
    return subprocess.run(
        ["unshare", "-rm", "sh", "-c", script, "sh", options, str(mount), *command],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


# -- the output folder ---------------------------------------------------------------------------


def test_an_output_folder_under_a_file_is_refused(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    out = tmp_path / "file" / "out"
    proc = in_process(capsys, "run", str(PROTOCOLS / "plain.yaml"), "--out", str(out), "--quiet")
    text = one_paragraph(proc)
    assert f"at '--out': cannot write to the output folder {out}: Not a directory" in text, text


@needs_namespaces
def test_a_read_only_output_folder_is_refused(tmp_path):
    ro = tmp_path / "ro"
    proc = in_small_fs(
        ro, "ro", sys.executable, "-m", "securevfl", "run", str(PROTOCOLS / "plain.yaml"), "--out",
        str(ro / "out"), "--quiet",
    )  # fmt: skip
    text = one_paragraph(proc)
    assert f"at '--out': cannot write to the output folder {ro / 'out'}: Read-only file system" in text, text


DISK_DRIVER = r"""
import json, os, shutil, subprocess, sys
from pathlib import Path

disk, earlier, proto, free = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], int(sys.argv[4])
out = disk / "run"
shutil.copytree(earlier, out)
before = {str(p.relative_to(out)): p.read_bytes() for p in out.rglob("*") if p.is_file()}
filler = disk / "filler"
with open(filler, "wb", buffering=0) as fh:
    try:
        while True:
            fh.write(bytes(4096))
    except OSError:
        pass
os.truncate(filler, max(0, filler.stat().st_size - free))
proc = subprocess.run(
    [sys.executable, "-m", "securevfl", "run", proto, "--out", str(out), "--overwrite", "--quiet"],
    capture_output=True,
    text=True,
)
after = {str(p.relative_to(out)): p.read_bytes() for p in out.rglob("*") if p.is_file()}
print(json.dumps({
    "rc": proc.returncode,
    "stdout": proc.stdout,
    "stderr": proc.stderr,
    "kept": all(after.get(k) == v for k, v in before.items()),
    "staging": [p.name for p in out.glob(".securevfl-staging-*")],
}))
"""


@needs_namespaces
@pytest.mark.parametrize("free_kib", [0, 48])
def test_a_full_disk_keeps_the_earlier_result(small_cli_run: CliRun, tmp_path, free_kib: int):
    """``run --overwrite`` of a finished run on a disk with ``free_kib`` KiB left: no
    room for the launcher's first file (0), or for part of the ranks' files (48).
    Exit 2, one paragraph naming the cause, the earlier result as it was."""
    driver = tmp_path / "driver.py"
    driver.write_text(DISK_DRIVER)
    proc = in_small_fs(
        tmp_path / "disk", "size=2m", sys.executable, str(driver), str(tmp_path / "disk"),
        str(small_cli_run.out), str(small_cli_run.proto), str(free_kib * 1024),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    run = subprocess.CompletedProcess([], report["rc"], report["stdout"], report["stderr"])
    text = one_paragraph(run)
    assert "No space left on device" in text and "free some space or choose another --out" in text, text
    assert report["kept"] and report["staging"] == [], report


# -- the rendezvous address, the rank's environment, the dataset's size ---------------------------


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("tcp://127.0.0.1:99999", "the port is a number from 1 to 65535"),
        ("tcp://127.0.0.1:0", "the port is a number from 1 to 65535"),
        ("tcp://127.0.0.1", "must look like tcp://HOST:PORT"),
        ("127.0.0.1:29500", "must look like tcp://HOST:PORT"),
        ("tcp://0.0.0.0:29500", "0.0.0.0 is not an address rank 0 can be reached at"),
        ("tcp://[::]:29500", ":: is not an address rank 0 can be reached at"),
    ],
)
def test_a_bad_rendezvous_address_is_refused(tmp_path, capsys, address, expected):
    out = tmp_path / "out"
    proc = in_process(
        capsys,
        "party",
        str(PROTOCOLS / "plain.yaml"),
        "--rank",
        "1",
        "--rendezvous",
        address,
        "--out",
        str(out),
    )
    assert_clean_user_error(proc, "at '--rendezvous'", expected)
    assert not out.exists()


@pytest.mark.parametrize("value", ["abc", "0", "-2", "1.5", ""])
def test_a_bad_thread_count_is_refused_before_any_rank_starts(tmp_path, capsys, monkeypatch, value):
    monkeypatch.setenv("SECUREVFL_THREADS", value)
    out = tmp_path / "out"
    proc = in_process(capsys, "run", str(PROTOCOLS / "plain.yaml"), "--out", str(out), "--quiet")
    text = one_paragraph(proc)
    assert f"at 'SECUREVFL_THREADS': SECUREVFL_THREADS={value!r}" in text, text
    assert not out.exists()


def test_a_bad_thread_count_through_the_console(tmp_path):
    """The same as the shell sees it (the case that printed a traceback per rank)."""
    out = tmp_path / "out"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "securevfl",
            "run",
            str(PROTOCOLS / "plain.yaml"),
            "--out",
            str(out),
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "SECUREVFL_THREADS": "abc"},
    )
    assert "SECUREVFL_THREADS='abc'" in one_paragraph(proc)


@pytest.mark.parametrize("rows", ["10000000000", "1e10"])
def test_a_synthetic_table_too_large_to_build_is_refused(tmp_path, capsys, rows):
    doc = {
        "name": "huge",
        "dataset": {"name": "synthetic"},
        "parties": {"passive": [{"name": "p", "columns": {"index": [0, 2]}, "model": {"out": 4}}]},
    }
    f = write_yaml(tmp_path / "p.yaml", doc)
    f.write_text(f.read_text().replace("name: synthetic", f"name: synthetic\n  synthetic: {{rows: {rows}}}"))
    out = tmp_path / "out"
    proc = in_process(capsys, "run", str(f), "--out", str(out), "--quiet")
    assert "at 'dataset.synthetic.rows'" in one_paragraph(proc)
    assert not out.exists()


# -- the key file --------------------------------------------------------------------------------


def test_a_public_key_file_given_as_key_says_so(tmp_path, capsys):
    """``--key left.pub`` (the file to send to the protocol's keeper) is refused as
    a public key file, pointing at left.key; not with a chmod of the .pub file."""
    assert in_process(capsys, "keygen", "--party", "left", "--out", str(tmp_path)).returncode == 0
    pub = tmp_path / "left.pub"
    proc = in_process(
        capsys, "party", str(PROTOCOLS / "plain.yaml"), "--rank", "1", "--rendezvous", "tcp://127.0.0.1:29500",
        "--key", str(pub), "--out", str(tmp_path / "out"),
    )  # fmt: skip
    assert_clean_user_error(proc, "at '--key'", f"{pub} is a public key file", "left.key")
    assert "chmod" not in proc.stderr


def test_a_plugin_attack_scoring_a_word_exits_2_and_writes_no_such_score(tmp_path):
    """A plugin attack whose score is no number ('ap': 'high') ends the run with one
    paragraph naming the attack, its hook and the adversary; result.json stays strict
    JSON without the attack's entry (the comparison table would fail on it)."""
    from tests.support.protocols import small_digits

    (tmp_path / "word_attack.py").write_text(
        "from securevfl.plugins import Attack, AttackOptions, register_attack\n\n"
        "@register_attack\n"
        "class Word(Attack[AttackOptions]):\n"
        "    name = 'word_score'\n"
        "    def run(self, view):\n"
        "        return {'used': {}}\n"
        "    def score(self, guess, world):\n"
        "        return {'ap': 'high'}\n"
    )
    doc = small_digits(epochs=1, max_steps=2)
    doc["plugins"] = ["word_attack"]
    doc["attacks"] = [{"name": "word_score"}]
    proto = write_yaml(tmp_path / "p.yaml", doc)
    proc = subprocess.run(
        [sys.executable, "-m", "securevfl", "run", str(proto), "--out", str(tmp_path / "run"), "--quiet"],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=ROOT,
    )
    text = one_paragraph(proc)
    assert (
        "attack 'word_score' (result key 'word_score', adversary 'active'): its score hook returned 'ap' as "
        "a str, not a number" in text
    ), text

    def refuse(token: str) -> None:
        raise ValueError(token)

    result = json.loads((tmp_path / "run" / "result.json").read_text(), parse_constant=refuse)
    assert result["attacks"] == {}
