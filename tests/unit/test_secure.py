"""The secure channel's parts without processes (SECURITY.md §4a): key files and pins,
the handshake's key schedule, and sealed links refusing forged, replayed,
reordered, truncated and misdirected frames."""

from __future__ import annotations

import copy
import os
import stat
from pathlib import Path

import pytest
import torch

from securevfl.app.loader import load_checked_dict, load_protocol_dict
from securevfl.app.rank_layout import layout_of
from securevfl.components import CheckedProtocol
from securevfl.errors import ConfigError, ProtocolError, SecurityWarning
from securevfl.runtime.claims import pins_of, pins_required
from securevfl.runtime.ledger import Ledger, merge_summaries
from securevfl.runtime.notes import open_note, sign_note
from securevfl.runtime.secure import handshake as hs
from securevfl.runtime.secure.frames import FramePool
from securevfl.runtime.secure.keys import (
    HELPER_RANKS,
    Identity,
    fingerprint,
    key_string,
    matches,
    pin_instructions,
    read_public,
    verify,
)
from securevfl.runtime.secure.link import TAG_BYTES, Link, Links, sealed_size
from securevfl.runtime.session import Session
from tests.support.protocols import load_yaml, small_digits
from tests.support.runs import cli

SEED = bytes(range(32))


# -- identities and key files ---------------------------------------------------------


def test_keygen_files_secret_is_owner_only_and_never_overwritten(tmp_path: Path):
    ident = Identity.from_seed(SEED)
    secret, public = ident.write(tmp_path, "left")
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert read_public(public) == ident.public
    assert Identity.load(secret).public == ident.public
    with pytest.raises(ConfigError, match="refusing to overwrite"):
        Identity.generate().write(tmp_path, "left")
    assert Identity.load(secret).public == ident.public  # untouched
    os.chmod(secret, 0o644)
    with pytest.raises(ConfigError, match="may be read by others"):
        Identity.load(secret)


def test_load_refuses_what_is_not_an_ed25519_key(tmp_path: Path):
    f = tmp_path / "x.key"
    f.write_text("not a key")
    os.chmod(f, 0o600)
    with pytest.raises(ConfigError, match="not a securevfl secret key file"):
        Identity.load(f)


def test_pins_match_key_string_or_fingerprint_only():
    a, b = Identity.from_seed(SEED), Identity.from_seed(bytes(32))
    assert matches(key_string(a.public), a.public)
    assert matches(fingerprint(a.public), a.public)
    assert not matches(key_string(a.public), b.public)
    assert not matches(fingerprint(a.public), b.public)
    assert not matches("ed25519:" + "0" * 63, a.public)  # malformed pin
    assert "Identity(sha256:" in repr(a) and SEED.hex() not in repr(a)


def test_signatures_verify_with_the_signer_only():
    a, b = Identity.from_seed(SEED), Identity.from_seed(bytes(32))
    sig = a.sign(b"m")
    assert verify(a.public, sig, b"m")
    assert not verify(b.public, sig, b"m")
    assert not verify(a.public, sig, b"n")
    assert not verify(a.public, b"\0" * 64, b"m")


# -- handshake key schedule ------------------------------------------------------------


def _pair(hello_a: bytes = b"hello-a", hello_b: bytes = b"hello-b", digest: str = "d" * 16):
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

    ea, eb = X25519PrivateKey.from_private_bytes(SEED), X25519PrivateKey.from_private_bytes(bytes(31) + b"\1")
    t = hs.transcript(digest, 0, hello_a, 1, hello_b)
    prk_a = hs.pair_secret(ea, hs.ephemeral_public(eb), t)
    prk_b = hs.pair_secret(eb, hs.ephemeral_public(ea), t)
    return t, prk_a, prk_b


def test_both_ends_derive_the_same_direction_keys_and_confirmations():
    t, prk_a, prk_b = _pair()
    assert prk_a == prk_b
    assert hs.stream_key(prk_a, "channel", 0, 1) == hs.stream_key(prk_b, "channel", 0, 1)
    # per direction and per stream keys differ
    keys = {hs.stream_key(prk_a, s, x, y) for s in ("channel", "crypten") for x, y in ((0, 1), (1, 0))}
    assert len(keys) == 4
    tag = hs.confirm_tag(prk_a, t, 0, 1)
    assert hs.confirm_ok(prk_b, t, 0, 1, tag)
    assert not hs.confirm_ok(prk_b, t, 1, 0, tag)


def test_transcript_binds_hellos_and_digest():
    t, prk, _ = _pair()
    for other in (_pair(hello_a=b"hello-A"), _pair(hello_b=b"hello-B"), _pair(digest="e" * 16)):
        assert other[0] != t and other[1] != prk
    with pytest.raises(ValueError):
        hs.transcript("d", 1, b"", 0, b"")


def test_low_order_ephemeral_is_refused():
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

    with pytest.raises(ValueError):
        hs.pair_secret(X25519PrivateKey.from_private_bytes(SEED), bytes(32), b"t" * 32)


# -- sealed links ---------------------------------------------------------------------------


def _links(stream: str = "channel") -> tuple[Link, Link]:
    _, prk, _ = _pair()
    a = Link(0, 1, stream, hs.stream_key(prk, stream, 0, 1), hs.stream_key(prk, stream, 1, 0), "rank 1 (B)")
    b = Link(1, 0, stream, hs.stream_key(prk, stream, 1, 0), hs.stream_key(prk, stream, 0, 1), "rank 0 (A)")
    return a, b


def test_link_round_trips_bytes_and_tensors():
    a, b = _links()
    assert b.open(a.seal(b"abc")) == b"abc"
    for t in (
        torch.randn(5, 3),
        torch.arange(7, dtype=torch.int64),
        torch.tensor([True, False]),
        torch.zeros(0),
    ):
        frame = a.seal_tensor(t)
        assert frame.dtype == torch.uint8 and frame.numel() == sealed_size(t.numel() * t.element_size())
        out = b.open_tensor(frame, torch.empty_like(t))
        assert torch.equal(out, t)
    assert (a.sent, b.received) == (5, 5)
    assert TAG_BYTES == 16


def test_frame_hides_the_plaintext():
    a, _ = _links()
    t = torch.randn(64, 16)
    frame = a.seal_tensor(t).numpy().tobytes()
    plain = t.numpy().tobytes()
    assert all(plain[i : i + 16] not in frame for i in range(0, len(plain), 64))


@pytest.mark.parametrize("attack", ["flip", "replay", "reorder", "truncate", "reflect", "other_stream"])
def test_tampered_frames_are_refused_naming_the_peer(attack: str):
    a, b = _links()
    f1, f2 = bytearray(a.seal(b"first frame")), a.seal(b"second frame")
    if attack == "flip":
        f1[3] ^= 0x01
        bad = bytes(f1)
    elif attack == "replay":
        assert b.open(bytes(f1)) == b"first frame"
        bad = bytes(f1)
    elif attack == "reorder":
        bad = f2
    elif attack == "truncate":
        bad = bytes(f1[:-1])
    elif attack == "reflect":  # A's own frame handed back to A
        with pytest.raises(ProtocolError, match=r"rank 1 \(B\) sent a frame that failed authentication"):
            a.open(bytes(f1))
        return
    else:
        bad = _links("crypten")[0].seal(b"first frame")
    with pytest.raises(ProtocolError, match=r"rank 0 \(A\) sent a frame that failed authentication"):
        b.open(bad)
    with pytest.raises(ProtocolError, match="failed earlier"):
        b.open(f2)


def test_tensor_frame_of_the_wrong_size_is_refused_before_anything_is_opened():
    a, b = _links()
    frame = a.seal_tensor(torch.randn(4))
    out = torch.full((4,), 7.0)
    with pytest.raises(ProtocolError, match=r"rank 0 \(A\) sent a frame .*31 bytes where 32 were expected"):
        b.open_tensor(frame[:-1], out)
    assert torch.equal(out, torch.full((4,), 7.0))  # nothing was decrypted into it
    # a pooled receive buffer sized for another tensor is refused the same way
    c, d = _links()
    bigger = d.frame_for(torch.empty(5))
    bigger[: frame.numel()] = c.seal_tensor(torch.randn(4))
    with pytest.raises(ProtocolError, match="36 bytes where 32 were expected"):
        d.open_tensor(bigger, out)
    assert torch.equal(out, torch.full((4,), 7.0))
    with pytest.raises(ProtocolError, match="failed earlier"):
        d.open_tensor(bigger[:32], out)


@pytest.mark.parametrize("where", ["payload", "tag"])
def test_a_frame_that_fails_authentication_leaves_no_plaintext_behind(where: str):
    """OpenSSL decrypts into the receive buffer before it checks the tag: after a
    refusal neither the caller's tensor nor the frame holds anything of the
    (unauthenticated) plaintext."""
    a, b = _links()
    t = torch.arange(1, 65, dtype=torch.int64) * 0x0101010101
    frame = a.seal_tensor(t)
    frame[0 if where == "payload" else -1] ^= 0x01  # altered in flight
    out = torch.full_like(t, -1)
    with pytest.raises(ProtocolError, match=r"rank 0 \(A\) sent a frame that failed authentication"):
        b.open_tensor(frame, out)
    assert not out.any() and not frame.any()
    plain = t.numpy().tobytes()
    assert plain[8:] not in out.numpy().tobytes() + frame.numpy().tobytes()


# -- frame buffers ----------------------------------------------------------------------


def test_frame_pool_hands_a_buffer_out_once_until_it_is_given_back():
    pool = FramePool()
    a, b = pool.take(100), pool.take(100)
    assert a.dtype == torch.uint8 and a.numel() == 100
    assert a.data_ptr() != b.data_ptr() and pool.outstanding == 2
    pool.give(a)
    c = pool.take(100)
    assert c is a and (pool.allocated, pool.reused) == (2, 1)
    d = pool.take(100)  # b and c are out: a fresh one, sharing no memory with them
    assert d.data_ptr() not in (b.data_ptr(), c.data_ptr()) and pool.allocated == 3
    assert pool.take(50).numel() == 50  # sizes are pooled apart
    pool.give(c)
    with pytest.raises(ValueError, match="given back twice"):
        pool.give(c)
    with pytest.raises(ValueError, match="not out of this pool"):
        pool.give(torch.empty(100, dtype=torch.uint8))
    with pytest.raises(ValueError, match="not out of this pool"):
        pool.give(b[:50])  # a view is not the buffer


def test_frame_pool_keeps_at_most_its_bound_and_forgets_lost_buffers():
    pool = FramePool(max_free_bytes=150)
    a, b = pool.take(100), pool.take(100)
    pool.give(a)
    pool.give(b)  # over the bound: dropped, not kept
    assert pool.free_bytes == 100
    assert pool.take(100) is a and pool.take(100) is not b
    lost = pool.take(10)
    n = pool.outstanding
    del lost  # never given back (a failed send): collected, no longer out
    assert pool.outstanding == n - 1


def test_sealed_frames_reuse_buffers_only_once_released():
    """A frame still in flight is never handed out again: a second frame of the
    same size gets its own buffer and the first frame's bytes stay as sealed;
    once released, the next frame of that size reuses the buffer."""
    a, b = _links()
    x, y = torch.randn(64, 8), torch.randn(64, 8)
    f1 = a.seal_tensor(x)
    sent1 = f1.clone()
    f2 = a.seal_tensor(y)
    assert f2.data_ptr() != f1.data_ptr() and torch.equal(f1, sent1)
    # the receiver's buffers: one per frame in flight, reused once opened
    r1, r2 = b.frame_for(x), b.frame_for(y)
    assert r1.data_ptr() != r2.data_ptr()
    r1.copy_(f1)
    r2.copy_(f2)
    assert torch.equal(b.open_tensor(r1, torch.empty_like(x)), x)
    assert torch.equal(b.open_tensor(r2, torch.empty_like(y)), y)
    a.release(f1)
    b.release(r1)
    z = torch.randn(64, 8)
    f3 = a.seal_tensor(z)
    assert f3 is f1 and not torch.equal(f3, sent1)
    r3 = b.frame_for(z)
    assert r3 is r1
    r3.copy_(f3)
    assert torch.equal(b.open_tensor(r3, torch.empty_like(z)), z)
    # a replayed old frame, even in a reused buffer, still fails as a replay
    r3.copy_(sent1)
    with pytest.raises(ProtocolError, match=r"rank 0 \(A\) sent a frame that failed authentication"):
        b.open_tensor(r3, torch.empty_like(z))
    a.release(f2)
    with pytest.raises(ValueError, match="given back twice"):
        a.release(f2)


def test_links_are_per_stream_and_only_to_authenticated_peers():
    _, prk, _ = _pair()
    links = Links(0, [1], lambda p, s: (hs.stream_key(prk, s, 0, p), hs.stream_key(prk, s, p, 0)), str)
    assert links.link(1) is links.link(1, "channel")
    assert links.link(1, "crypten") is not links.link(1)
    assert links.link(1).pool is links.link(1, "crypten").pool is links.pool  # one rank, one pool
    with pytest.raises(ProtocolError, match="no authenticated link to rank 2"):
        links.link(2)


def test_meter_counts_per_phase_into_the_ledger_summary():
    a, b = _links()
    ledger = Ledger(0)
    a.meter.by_phase = ledger.channel
    a.meter.phase_of = lambda: "train"
    b.open_tensor(a.seal_tensor(torch.zeros(10)), torch.empty(10))
    row = ledger.summary()["channel"]["train"]
    assert row["frames"] == 1 and row["sealed_bytes"] == 40 + 16 and row["seal_cpu_s"] >= 0
    merged = merge_summaries([ledger.summary()], 1)
    assert merged["channel_frames_per_step"] == 1


# -- protocol pins ------------------------------------------------------------------------


def test_protocol_pins_validated_and_required_when_asked():
    doc = small_digits()
    base = load_protocol_dict(copy.deepcopy(doc)).digest()
    pub = key_string(Identity.from_seed(SEED).public)
    doc2 = copy.deepcopy(doc)
    doc2["parties"]["passive"][0]["key"] = pub
    pinned = load_protocol_dict(doc2)
    assert pinned.parties.passive[0].key == pub and pinned.digest() != base
    explicit = copy.deepcopy(doc)
    explicit["parties"]["active"]["key"] = None
    explicit["security"] = {"require_pinned_keys": "auto"}
    assert load_protocol_dict(explicit).digest() == base  # defaults leave the digest as it was
    opted_out = copy.deepcopy(doc)
    opted_out["security"] = {"require_pinned_keys": False}
    assert load_protocol_dict(opted_out).digest() != base  # every rank must agree on the opt-out
    bad = copy.deepcopy(doc)
    bad["parties"]["passive"][0]["key"] = "ed25519:xyz"
    with pytest.raises(ConfigError, match=r"parties\.passive\[0\]\.key"):
        load_protocol_dict(bad)
    req = copy.deepcopy(doc2)
    req["security"] = {"require_pinned_keys": True}
    with pytest.raises(ConfigError, match="require_pinned_keys is on but parties"):
        load_protocol_dict(req)


@pytest.mark.parametrize(
    ("setting", "spans", "required"),
    [("auto", None, False), ("auto", "why", True), (True, None, True), (False, "why", False)],
)
def test_pinned_keys_are_required_by_default_when_a_run_spans_hosts(setting, spans, required):
    assert pins_required(setting, spans) is required


def _unpinned(**security: object) -> CheckedProtocol:
    doc = small_digits()
    doc["parties"]["passive"][0]["key"] = key_string(Identity.from_seed(SEED).public)
    if security:
        doc["security"] = security
    return load_checked_dict(doc)


def test_a_rank_across_hosts_needs_every_key_pinned_unless_the_protocol_opts_out(tmp_path: Path):
    """With the default (``auto``), a rendezvous that is not a loopback address
    refuses a protocol that leaves ranks unpinned, naming them; on loopback it
    does not; an explicit ``false`` goes on across hosts with a warning naming
    the risk; the local launcher's own pins are never second-guessed."""
    checked = _unpinned()
    proto = checked.protocol
    layout = layout_of(checked)
    with pytest.raises(
        ConfigError, match=r"spans hosts \(the rendezvous 10\.9\.8\.7 is not a loopback"
    ) as err:
        Session(proto, layout, 1, "tcp://10.9.8.7:29500", tmp_path)
    assert "no key is pinned for active 'active' (rank 0), passive 'right' (rank 2)" in str(err.value)
    assert "passive 'left'" not in str(err.value)  # its key is pinned
    assert "require_pinned_keys: false" in str(err.value)
    assert set(Session(proto, layout, 1, "tcp://127.0.0.1:29500", tmp_path).seat.pins) == {1}
    launcher_pins = {r: key_string(Identity.generate().public) for r in range(3)}
    assert (
        Session(proto, layout, 1, "tcp://10.9.8.7:1", tmp_path, pins=launcher_pins).seat.pins == launcher_pins
    )
    opted_out = _unpinned(require_pinned_keys=False)
    with pytest.warns(SecurityWarning, match="anyone who reaches the rendezvous can take their place") as w:
        Session(opted_out.protocol, layout_of(opted_out), 1, "tcp://10.9.8.7:29500", tmp_path)
    assert "active 'active' (rank 0), passive 'right' (rank 2) present keys nobody pinned" in str(
        w[0].message
    )
    # ranks reporting different hosts make a loopback run span hosts too (checked once the hellos are in)
    with pytest.raises(ConfigError, match=r"spans hosts \(its ranks run on hosts a, b\)"):
        pins_of(proto, layout, spans_hosts="its ranks run on hosts a, b")


def test_store_notes_verify_only_for_their_run_rank_and_kind():
    """A signed store value opens only with the signer's key, for the run
    (nonce or session hash), rank and kind it was signed for: a note of an
    earlier run, or one moved to another rank or kind, does not verify."""
    me, other = Identity.from_seed(SEED), Identity.from_seed(bytes(32))
    run1, run2 = hs.session_hash("d", b"n1", [b"h0", b"h1"]), hs.session_hash("d", b"n1", [b"h0", b"h1'"])
    raw = sign_note(me, run1, 1, "error", '{"x": 1}').encode()
    assert open_note(raw, me.public, run1, 1, "error") == '{"x": 1}'
    assert open_note(raw, me.public, run2, 1, "error") is None  # a later run: replay refused
    assert open_note(raw, me.public, run1, 2, "error") is None
    assert open_note(raw, me.public, run1, 1, "done") is None
    assert open_note(raw, other.public, run1, 1, "error") is None
    assert open_note(b"not json", me.public, run1, 1, "error") is None
    assert run1 != hs.session_hash("d", b"n2", [b"h0", b"h1"])  # the nonce alone changes the session


def test_keygen_names_where_a_helper_key_is_pinned(tmp_path: Path):
    """``keygen --party dealer`` points at ``security.helper_keys``, a party's key at
    the party's entry; the helper names are those the backends add."""
    pub = Identity.from_seed(SEED).public
    assert pin_instructions("left", pub) == [
        "pin it in the protocol file, under the entry of 'left':",
        f"    key: {key_string(pub)}",
    ]
    assert "security.helper_keys" in pin_instructions("dealer", pub)[0]
    assert pin_instructions("dealer", pub)[1] == f'    helper_keys: {{dealer: "{key_string(pub)}"}}'
    mpc = load_yaml("mpc.yaml")
    helpers = {r.party for r in layout_of(load_checked_dict(mpc)).helpers}
    assert helpers and helpers <= HELPER_RANKS
    made = cli("keygen", "--party", "dealer", "--out", str(tmp_path))
    assert made.returncode == 0, made.stderr
    assert "under security.helper_keys" in made.stdout and "entry of 'dealer'" not in made.stdout
