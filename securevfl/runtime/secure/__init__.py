"""The secure channel (SECURITY.md §4a): party identities, the start-up handshake and
sealed per-peer links.

* :mod:`.keys`: long-term Ed25519 identities, key files, key strings and
  fingerprints, and the pins a protocol declares;
* :mod:`.handshake`: the SIGMA-style authenticated key exchange run through the
  rendezvous store (pure functions: transcript, signatures, key schedule);
* :mod:`.link`: :class:`Link`, one peer and one stream, sealing and opening
  frames with AES-256-GCM under per-direction keys and sequence numbers,
  and :class:`Links`, every peer's links for one rank.

Primitives come from ``cryptography`` (OpenSSL); nothing here invents one.
"""
