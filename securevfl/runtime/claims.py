"""Claims of ranks at the rendezvous, and the pins they are judged by.

Every rank claims its rank in rank 0's store with an atomic compare-and-set
before it publishes anything under it. A claim is signed with the claimant's
identity key over the run nonce, and counts only when it verifies for this run
with the key pinned for the rank (with any key, where none is pinned). A claim
that does not count (a process with the wrong key, a forgery, a claim replayed
from an earlier run) is displaced by the real rank; one that counts refuses a
second process started with the same ``--rank``, naming the holder. A process
whose own key is not the pinned one claims nothing: it leaves a claim that does
not count, so that its peers can name the key it presented, and learns nothing
about the rank's holder (:func:`present`).

Which ranks must present a pinned key: :func:`pins_required` (SECURITY.md §4a).
"""

from __future__ import annotations

import os
import secrets
import socket
import time
import warnings

import torch.distributed as dist
from pydantic import BaseModel, ConfigDict, ValidationError

from securevfl.config import Protocol
from securevfl.errors import ConfigError, PartyFailure, SecureVFLError, SecurityWarning
from securevfl.runtime.layout import Layout, Role
from securevfl.runtime.seat import Seat
from securevfl.runtime.secure import handshake as hs
from securevfl.runtime.secure import keys
from securevfl.runtime.secure.keys import Identity

# a rank whose own key is not the pinned one tries this long to tell the rendezvous
# which key it presented (so that its peers can name it), then stops
PRESENT_S = 10.0


def pins_required(setting: bool | str, spans_hosts: str | None) -> bool:
    """Whether every rank must present a pinned key: ``security.require_pinned_keys``
    ``true`` always, ``false`` never, ``auto`` when the run spans hosts
    (``spans_hosts`` says why it does, None when it does not)."""
    if setting == "auto":
        return spans_hosts is not None
    return bool(setting)


def pins_of(proto: Protocol, layout: Layout, *, spans_hosts: str | None = None) -> dict[int, str]:
    """The identity each rank must present, by rank: a party's ``key`` under its
    entry, a helper's under ``security.helper_keys``. A rank without a pin is a
    ConfigError where :func:`pins_required` says pins are required; a run across
    hosts whose protocol opts out (``require_pinned_keys: false``) goes on with a
    :class:`SecurityWarning` naming the ranks nobody authenticates."""
    by_party = {p.name: p.key for p in [proto.parties.active, *proto.parties.passive]}
    pins: dict[int, str] = {}
    missing: list[Role] = []
    for role in layout.roles:
        pin = (
            proto.security.helper_keys.get(role.party) if role.kind == "helper" else by_party.get(role.party)
        )
        if pin is not None:
            pins[role.rank] = pin
        else:
            missing.append(role)
    if not missing:
        return pins
    setting = proto.security.require_pinned_keys
    first = missing[0]
    path = f"security.helper_keys.{first.party}" if first.kind == "helper" else "parties"
    labels = ", ".join(f"{role.label} (rank {role.rank})" for role in missing)
    if setting is True:
        raise ConfigError(
            f"no key is pinned for {first.label} (rank {first.rank}); security.require_pinned_keys is on",
            path=path,
        )
    if pins_required(setting, spans_hosts):
        raise ConfigError(
            f"this run spans hosts ({spans_hosts}), so every rank must present a pinned key, and no key "
            f"is pinned for {labels}: pin each (key: ed25519:... under a party's entry, a helper's under "
            "security.helper_keys; securevfl keygen prints it), or set security.require_pinned_keys: "
            "false to run with unauthenticated ranks",
            path=path,
        )
    if spans_hosts is not None:
        warnings.warn(
            SecurityWarning(
                f"security.require_pinned_keys is false and this run spans hosts ({spans_hosts}): {labels} "
                "present keys nobody pinned, so nothing authenticates them: anyone who reaches the "
                "rendezvous can take their place and read and alter what the other ranks send them"
            ),
            stacklevel=2,
        )
    return pins


class Claim(BaseModel):
    """Who holds a rank. ``token`` makes each claim unique; ``sig`` is the
    claimant's signature over :meth:`body`, bound to the run nonce."""

    model_config = ConfigDict(extra="forbid")
    pid: int
    host: str
    token: str
    identity: str = ""  # the claimant's Ed25519 public key, hex
    sig: str = ""

    def body(self) -> bytes:
        return f"{self.pid} {self.host} {self.token} {self.identity}".encode()


def claim_record(identity: Identity, nonce: bytes, rank: int) -> str:
    """This process's claim of ``rank``, signed over the run nonce."""
    mine = Claim(
        pid=os.getpid(), host=socket.gethostname(), token=secrets.token_hex(8), identity=identity.public.hex()
    )
    sig = identity.sign(hs.note_message(nonce, rank, "claim", mine.body()))
    return mine.model_copy(update={"sig": sig.hex()}).model_dump_json()


def signed_claim(seat: Seat, rank: int, raw: bytes) -> Claim | None:
    """The claim ``raw`` holds if it is signed for this run by the key it names."""
    try:
        claim = Claim.model_validate_json(raw)
        pub, sig = bytes.fromhex(claim.identity), bytes.fromhex(claim.sig)
    except (ValidationError, ValueError):
        return None
    signed = keys.verify(pub, sig, hs.note_message(seat.nonce, rank, "claim", claim.body()))
    return claim if signed else None


def counting_claim(seat: Seat, rank: int, raw: bytes) -> Claim | None:
    """The claim ``raw`` holds if it counts for ``rank`` in this run: signed over
    this run's nonce with the key pinned for the rank (with any key, where none
    is pinned)."""
    claim = signed_claim(seat, rank, raw)
    pin = seat.pins.get(rank)
    if claim is None or (pin is not None and not keys.matches(pin, bytes.fromhex(claim.identity))):
        return None
    return claim


def claim_rank(seat: Seat, store: dist.TCPStore, deadline: float) -> None:
    """Claim this rank with an atomic compare-and-set, displacing a claim that
    does not count. A rank held by a claim that counts is a ``ConfigError``
    naming the process holding it; this process then writes nothing more to the
    store (its error report stays local), so the run of the first claimant goes
    on."""
    rz = seat.rendezvous
    raw = claim_record(seat.identity, seat.nonce, seat.rank)
    key = f"claim/{seat.rank}"
    expected: str | bytes = ""
    try:
        while True:
            # the held value goes back as bytes (it may not be UTF-8); torch accepts both
            held = store.compare_set(key, expected, raw)  # type: ignore[arg-type]
            if held == raw.encode():
                return
            if expected and held == expected:  # the claim being displaced vanished meanwhile
                expected = ""
                continue
            owner = counting_claim(seat, seat.rank, held)
            if owner is not None:
                pinned = "the pinned key" if seat.rank in seat.pins else "a key nobody pinned"
                raise ConfigError(
                    f"rank {seat.rank} is already claimed by another process (pid {owner.pid} on host "
                    f"{owner.host}) at the rendezvous {rz.host}:{rz.port}; its claim is signed with "
                    f"key {keys.short(bytes.fromhex(owner.identity))}, {pinned}: start each rank exactly "
                    "once per run",
                    path="--rank",
                )
            if time.monotonic() > deadline:
                raise PartyFailure(
                    f"start-up timed out after {rz.timeout_s:g} s: rank {seat.rank} could "
                    "not be claimed, claims that do not count kept replacing this rank's in the "
                    "rendezvous store (someone is writing into it)",
                    rank=None,
                )
            expected = held  # a claim that does not count: displace it
    except RuntimeError as exc:
        raise rz.lost(exc) from exc


def own_key_refusal(seat: Seat) -> str | None:
    """Why this rank may not take part (its identity key is not the one pinned
    for it), or None. Checked before anything is sent to the rendezvous."""
    pin = seat.pins.get(seat.rank)
    if pin is None or keys.matches(pin, seat.identity.public):
        return None
    return (
        f"this rank's identity key ({keys.short(seat.identity.public)}) is not the key the protocol "
        f"pins for {seat.role.label} ({pin[:23]}...): start it with --key naming that party's secret "
        "key file"
    )


def present(seat: Seat, refusal: str, until: float) -> ConfigError:
    """This rank's key is not the pinned one. Until ``until``, try to leave a
    claim signed with it at the rendezvous (one that does not count: the rank's
    party can still take the rank, and its peers name this key if the party
    never comes); then the refusal, saying whether the rendezvous answered.
    Nothing is read from the store but the run nonce, so this process learns
    nothing about the rank's holder. Rank 0 hosts the rendezvous and with the
    wrong key hosts nothing."""
    if seat.rank == 0:
        return ConfigError(refusal, path="--key")
    rz = seat.rendezvous
    window = max(until - time.monotonic(), 0.0)
    try:
        store = rz.connect(until)
        nonce = rz.read_nonce(store, until)
        store.compare_set(f"claim/{seat.rank}", "", claim_record(seat.identity, nonce, seat.rank))
    except (SecureVFLError, RuntimeError):
        return ConfigError(
            f"{refusal} (the rendezvous at {rz.host}:{rz.port} did not answer within "
            f"{window:.0f} s either; nothing was sent to it)",
            path="--key",
        )
    return ConfigError(
        f"{refusal} (the rendezvous at {rz.host}:{rz.port} was reached; its other ranks wait "
        "for the pinned key until their start-up deadline)",
        path="--key",
    )
