"""The wire tap plus CrypTen's plaintexts (a test double, never imported by securevfl).

``python -m tests.threat_model.mpc_tap ARGS`` runs ``securevfl ARGS`` like
:mod:`tests.threat_model.wire_tap` (every frame the rank puts on the wire in
``$TAP_DIR/rank<R>.frames``) and also records, in ``$TAP_DIR/rank<R>.plain``
(same format), every CrypTen frame's plaintext as the communicator hands it to
the sealed transport: the shares, the dealer's seeds and bundles and the
control objects, before sealing. With ``TAP_FLIP_CRYPTEN=N`` the rank's N-th
CrypTen frame (0-based) leaves with one byte flipped.
"""

from __future__ import annotations

import os
import struct
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

import securevfl.exchange.mpc.crypten.frames as crypten_frames
from securevfl import cli
from tests.threat_model import wire_tap


def install(tap: Path, rank: int, flip: int) -> None:
    wire_tap.install(tap, rank, -1)
    plain = open(tap / f"rank{rank}.plain", "ab")  # noqa: SIM115 (open for the process's life)
    orig_post = crypten_frames.SealedFrames.post_send

    def post_send(self: Any, peer: int, tensor: torch.Tensor) -> Any:
        raw = tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        plain.write(struct.pack("<iq", peer, len(raw)) + raw)
        plain.flush()
        return orig_post(self, peer, tensor)

    crypten_frames.SealedFrames.post_send = post_send  # type: ignore[method-assign]
    sent = [0]
    tapped_isend = dist.isend  # wire_tap's: records the frame as it leaves

    def isend(tensor: torch.Tensor, dst: Any = None, *args: Any, **kw: Any) -> Any:
        if kw.get("tag") == crypten_frames.CRYPTEN_TAG:
            if sent[0] == flip:
                tensor = tensor.clone()
                flat = tensor.reshape(-1).view(torch.uint8)
                flat[flat.numel() // 2] ^= 0x01
            sent[0] += 1
        return tapped_isend(tensor, dst, *args, **kw)

    dist.isend = isend


def main() -> int:
    argv = sys.argv[1:]
    rank = int(argv[argv.index("--rank") + 1])
    install(Path(os.environ["TAP_DIR"]), rank, int(os.environ.get("TAP_FLIP_CRYPTEN", "-1")))
    return cli.main(argv)


if __name__ == "__main__":
    sys.exit(main())
