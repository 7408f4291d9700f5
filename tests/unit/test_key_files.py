"""Key files that are not files: ``--key`` (and ``Identity.load``) read a regular
file of key size and refuse anything else at once, naming ``--key``: a symbolic
link to ``/dev/zero`` is not read without end, a named pipe is not waited on, a
folder, a socket or a huge file are refused; a link to a real key file works."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from securevfl.app.party_args import check_key_file
from securevfl.errors import ConfigError
from securevfl.runtime.secure.keys import Identity

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(60)


def _hostile(tmp_path: Path, kind: str) -> Path:
    path = tmp_path / f"{kind}.key"
    if kind == "dev_zero":
        path.symlink_to("/dev/zero")
    elif kind == "fifo":
        os.mkfifo(path, 0o600)
    elif kind == "folder":
        path.mkdir(mode=0o700)
    elif kind == "socket":
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(path))
        sock.close()
    elif kind == "huge":
        with open(path, "wb") as fh:
            fh.truncate(1 << 30)  # a sparse gigabyte
        path.chmod(0o600)
    return path


KINDS = {
    "dev_zero": "is a character device, not a file",
    "fifo": "is a named pipe (FIFO), not a file",
    "folder": "is a folder, not a file",
    "socket": "is a socket, not a file",
    "huge": "holds 1,073,741,824 bytes",
}


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("reader", [Identity.load, check_key_file], ids=["load", "check"])
def test_a_key_that_is_not_a_regular_file_of_key_size_is_refused_at_once(tmp_path, kind, reader):
    path = _hostile(tmp_path, kind)
    t0 = time.monotonic()
    with pytest.raises(ConfigError) as info:
        reader(path)
    assert time.monotonic() - t0 < 2
    assert info.value.path == "--key"
    assert f"the key file {path} {KINDS[kind]}" in str(info.value)


def test_a_symbolic_link_to_a_key_file_is_read(tmp_path):
    ident = Identity.generate()
    secret, _ = ident.write(tmp_path / "keys", "left")
    link = tmp_path / "mounted.key"
    link.symlink_to(secret)
    check_key_file(link)
    assert Identity.load(link).public == ident.public


@pytest.mark.parametrize("kind", ["dev_zero", "fifo"])
def test_party_with_such_a_key_exits_2_without_waiting(tmp_path, kind):
    path = _hostile(tmp_path, kind)
    t0 = time.monotonic()
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "securevfl", "party", str(ROOT / "protocols" / "plain.yaml")),
            *("--rank", "1", "--rendezvous", "tcp://127.0.0.1:29555", "--key", str(path)),
            *("--out", str(tmp_path / "out")),
        ],
        capture_output=True,
        text=True,
        timeout=50,
        cwd=ROOT,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert time.monotonic() - t0 < 50
    err = " ".join(proc.stderr.split())
    assert "Traceback" not in proc.stderr and "at '--key'" in err and KINDS[kind] in err, err
