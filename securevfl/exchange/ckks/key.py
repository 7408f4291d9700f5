"""The key owner's side of ``ckks``: key generation, the public part it sends,
encryption of its own operand and decryption of the masked results.

Threat model (SECURITY.md, ``ckks``): semi-honest parties; the secret key never
leaves this object. :meth:`CkksKey.public` serializes the TenSEAL context made
public (parameters and public key, no secret or relinearization key) and the
power-of-two rotation plus conjugation keys; a received context that carries a
secret key is refused by the peer. Fresh ciphertexts are symmetric
(secret-key) encryptions stored with a seed for their uniform half (~160 KB per
ciphertext at the defaults). What this party decrypts is either its declared
output or a value masked by the other party (see
:mod:`securevfl.exchange.ckks.peer`).
"""

from __future__ import annotations

import numpy as np

from securevfl.errors import ProtocolError
from securevfl.exchange.ckks._tenseal import sa
from securevfl.exchange.ckks.counters import OpCounter
from securevfl.exchange.ckks.kernels import Ring
from securevfl.exchange.ckks.packing import standard_layout
from securevfl.exchange.ckks.params import CkksOptions, context
from securevfl.exchange.ckks.wire import SealIO, check_level, frame, pack_public, unframe
from securevfl.exchange.he import BOTH_OPS, TMATMUL, HEKey


class CkksKey(HEKey):
    """A CKKS key pair, held by its owner only."""

    def __init__(self, opts: CkksOptions):
        self.opts = opts
        self.ops = OpCounter()
        self.ctx = context(opts)
        sc = self.ctx.seal_context().data
        self.io = SealIO(sc, self.ops)
        self.ring = Ring(sc, self.ops)
        self._public: bytes | None = None
        self.scale = 2.0**opts.global_scale_bits
        self._encryptor = sa.Encryptor(sc, self.ctx.public_key().data, self.ctx.secret_key().data)
        self._decryptor = sa.Decryptor(sc, self.ctx.secret_key().data)

    def public(self) -> bytes:
        """The TenSEAL context made public (parameters and public key; no secret or
        relinearization key) and power-of-two rotation plus conjugation keys, which
        SEAL serializes with a seed for their uniform halves (half the size of
        TenSEAL's own Galois-key serialization)."""
        if self._public is None:
            pub = self.ctx.copy()
            pub.make_context_public()
            ctx_bytes = pub.serialize(
                save_public_key=True, save_secret_key=False, save_galois_keys=False, save_relin_keys=False
            )
            keygen = sa.KeyGenerator(self.io.sc, self.ctx.secret_key().data)
            self._public = pack_public(ctx_bytes, self.io.dump(keygen.create_galois_keys()))
        return self._public

    def encrypt(self, x: np.ndarray, *, ops: frozenset[str] = BOTH_OPS) -> bytes:
        """One packing (:func:`standard_layout`) serves the products ``ops`` names
        (an operand of ``matmul`` only may be cut in row chunks sooner)."""
        x = np.asarray(x, dtype=np.float64)
        if x.ndim != 2 or not np.isfinite(x).all():
            raise ValueError("ckks encrypt: expects a finite 2-D matrix")
        layout = standard_layout(x.shape[0], x.shape[1], self.ring.slots, tmatmul=TMATMUL in ops)
        cts = []
        for row in layout.pack(x, self.ring.slots):
            pt = self.ring.encode(row, self.ring.in_level, self.scale)
            cts.append(self.io.dump(self.encrypt_plaintext(pt)))
        return frame(layout, cts)

    def encrypt_plaintext(self, pt: object) -> object:
        """One symmetric (secret-key) encryption, serialized with a seed for its
        uniform half (half the size of a public-key encryption)."""
        self.ops.encrypt += 1
        return self._encryptor.encrypt_symmetric(pt)

    def decrypt(self, blob: bytes, shape: tuple[int, int]) -> np.ndarray:
        what = "ckks result from the peer"
        try:
            layout, cts = unframe(blob, self.io, what)
            if (layout.rows, layout.cols) != tuple(shape):
                raise ValueError(f"{what}: holds a {layout.rows}x{layout.cols} matrix, expected {shape}")
            check_level(cts, [self.ring.out_level, self.ring.in_level], self.scale, what)
        except ValueError as exc:
            raise ProtocolError(str(exc)) from None
        arr = np.empty((len(cts), self.ring.slots), dtype=np.complex128)
        pt = sa.Plaintext()
        for j, c in enumerate(cts):
            self._decryptor.decrypt(c, pt)
            arr[j] = np.asarray(self.ring.encoder.decode_complex(pt))
            self.ops.decrypt += 1
        return layout.unpack(arr)

    def decrypt_slots(self, ct: object) -> np.ndarray:
        """Every slot of one ciphertext (for audits of what the owner can read)."""
        pt = sa.Plaintext()
        self._decryptor.decrypt(ct, pt)
        self.ops.decrypt += 1
        return np.asarray(self.ring.encoder.decode_complex(pt))
