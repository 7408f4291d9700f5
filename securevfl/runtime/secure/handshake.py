"""The start-up handshake's cryptography, as pure functions (SECURITY.md §4a).

SIGMA-style mutual authentication (Krawczyk, CRYPTO 2003; the "sign and MAC"
shape TLS 1.3 uses for mutual authentication, RFC 8446 §4.4), run between every
pair of ranks through the rendezvous store, whose values are all public:

1. every rank draws an ephemeral X25519 key and publishes its hello, which now
   carries its long-term Ed25519 public key and its ephemeral public key;
2. for each pair (a, b), a < b, the transcript hash is
   ``T = SHA-256(DOMAIN | protocol digest | a | hello_a | b | hello_b)`` over the
   exact hello bytes both read from the store (so it binds the protocol digest,
   both ranks, both identities and both ephemerals);
3. the pair's secret is ``prk = HKDF-Extract(salt=T, X25519(e_a, E_b))``;
4. each side sends the other an authenticator: an Ed25519 signature with its
   identity key over ``auth_message(T, sender, receiver)`` and an HMAC-SHA256 of
   the same message under a key-confirmation key expanded from ``prk``
   (proving it holds the ephemeral secret behind the hello);
5. a side accepts the peer only if the peer's identity key is the pinned one, its
   signature verifies, and its MAC does; then per-direction, per-stream
   AES-256-GCM keys are ``HKDF-Expand(prk, "key" | stream | sender | receiver)``.

Ephemeral and derived secrets stay in the process; nothing secret is published.
"""

from __future__ import annotations

import hashlib
import hmac

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDFExpand

DOMAIN = b"securevfl handshake v1"
KEY_BYTES = 32


def ephemeral() -> X25519PrivateKey:
    return X25519PrivateKey.generate()


def ephemeral_public(e: X25519PrivateKey) -> bytes:
    return e.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def _frame(*parts: bytes) -> bytes:
    """Length-prefixed concatenation (no two different inputs give one string)."""
    return b"".join(len(p).to_bytes(4, "big") + p for p in parts)


def transcript(digest: str, a: int, hello_a: bytes, b: int, hello_b: bytes) -> bytes:
    """The pair's transcript hash; ``a < b`` and the hellos as published."""
    if a >= b:
        raise ValueError("transcript(a, ..., b, ...) needs a < b")
    return hashlib.sha256(
        _frame(DOMAIN, digest.encode(), str(a).encode(), hello_a, str(b).encode(), hello_b)
    ).digest()


def pair_secret(mine: X25519PrivateKey, peer_public: bytes, transcript_hash: bytes) -> bytes:
    """HKDF-Extract(salt = transcript hash, ikm = X25519 shared secret).

    Raises ValueError on a low-order peer key (an all-zero shared secret)."""
    shared = mine.exchange(X25519PublicKey.from_public_bytes(peer_public))
    return hmac.new(transcript_hash, shared, hashlib.sha256).digest()


def _expand(prk: bytes, info: bytes) -> bytes:
    return HKDFExpand(algorithm=hashes.SHA256(), length=KEY_BYTES, info=DOMAIN + b" " + info).derive(prk)


def auth_message(transcript_hash: bytes, sender: int, receiver: int) -> bytes:
    """What ``sender`` signs and MACs for ``receiver``."""
    return _frame(DOMAIN, b"auth", transcript_hash, str(sender).encode(), str(receiver).encode())


def confirm_tag(prk: bytes, transcript_hash: bytes, sender: int, receiver: int) -> bytes:
    """Key confirmation: HMAC-SHA256 of the auth message under a key expanded
    from the pair secret for this direction."""
    k = _expand(prk, f"confirm {sender}->{receiver}".encode())
    return hmac.new(k, auth_message(transcript_hash, sender, receiver), hashlib.sha256).digest()


def confirm_ok(prk: bytes, transcript_hash: bytes, sender: int, receiver: int, tag: bytes) -> bool:
    return hmac.compare_digest(confirm_tag(prk, transcript_hash, sender, receiver), tag)


def stream_key(prk: bytes, stream: str, sender: int, receiver: int) -> bytes:
    """The AES-256-GCM key for frames ``sender -> receiver`` on ``stream``."""
    if " " in stream or not stream:
        raise ValueError(f"bad stream name {stream!r}")
    return _expand(prk, f"key {stream} {sender}->{receiver}".encode())


def session_hash(digest: str, nonce: bytes, hellos: list[bytes]) -> bytes:
    """The run's session hash: the protocol digest, rank 0's run nonce and every
    rank's hello as published, in rank order. Each hello carries a fresh
    ephemeral key, so no two runs share it, and only ranks that read the same
    hellos (the verifier's own fresh one included) agree on it."""
    return hashlib.sha256(_frame(DOMAIN, b"session", digest.encode(), nonce, *hellos)).digest()


def note_message(binding: bytes, rank: int, kind: str, body: bytes) -> bytes:
    """What a rank signs when it publishes a value in the store for its peers,
    bound to the run, the writer's rank and the value's kind. ``binding`` is
    rank 0's run nonce for what is written before every hello is in (a claim, a
    hello) and the :func:`session_hash` for what is written after (an error
    note, a heartbeat, a done flag): a value signed in an earlier run does not
    verify in a later one."""
    return _frame(DOMAIN, b"note", binding, str(rank).encode(), kind.encode(), body)
