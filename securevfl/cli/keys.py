"""``securevfl keygen``: a party's long-term identity key pair."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from securevfl.errors import SecureVFLError
from securevfl.runtime.secure.keys import Identity, fingerprint, pin_instructions


def cmd_keygen(args: argparse.Namespace) -> int:
    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]{0,31}", args.party):
        raise SecureVFLError(f"--party {args.party!r}: a party name is a letter then letters, digits, _ or -")
    identity = Identity.generate()
    secret, public = identity.write(Path(args.out), args.party)
    print(f"wrote {secret} (secret key: keep it; mode 0600)")
    print(f"wrote {public}")
    print(f"fingerprint: {fingerprint(identity.public)}")
    for line in pin_instructions(args.party, identity.public):
        print(line)
    return 0
