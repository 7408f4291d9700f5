"""The key owner's side of ``ckks``: key generation, the public part it sends,
encryption of its own operand and flooded decryption of the masked results.

Threat model (SECURITY.md, ``ckks``; the argument is in the package docstring):
semi-honest parties; the secret key never leaves this object.
:meth:`CkksKey.public` serializes the TenSEAL context made public (parameters and
public key, no secret or relinearization key) and the power-of-two rotation plus
conjugation keys; a received context that carries a secret key is refused by the
peer. Fresh ciphertexts are symmetric (secret-key) encryptions stored with a seed
for their uniform half.

Every decryption is flooded (:meth:`CkksKey.decrypt`): what this party decrypts
leaves it (P_i's z-share, A's masked dL/dh) or becomes a share that shapes later
messages (A's dW^A), and a CKKS decryption carries the error e of the key
owner's secret key and encryption randomness, which with the ciphertext reveals
the key (Li and Micciancio, Eurocrypt 2021). Before decrypting, the key owner
adds to the ciphertext a fresh Gaussian of flood_sigma on every real slot
coordinate, encoded to an integer polynomial and added exactly in the ring, so
the decryption m + e + noise is decoded (and rounded to float64) only after the
noise is in. Each key pair answers at most max_decryptions ciphertexts, the
number the flooding is sized for.

Guards (the values the flooding and exact decryption are sized for): before
encrypting, every row of an operand of ``matmul`` and every column of one of
``tmatmul`` must have l2 norm <= 2^value_norm_bits; after decrypting, every slot
must lie below the exact-decryption limit (past it, the result may have wrapped
around the output modulus). Either failure raises :class:`Diverged` naming the
value and the bound, before anything derived from it leaves this party; the norm
or value that passed it goes to the owner's ``detail`` only. The protocol
(:mod:`securevfl.exchange.he`) bounds its operands before encrypting them
(:mod:`securevfl.exchange.bounds`), so a healthy run never meets the first guard.
"""

from __future__ import annotations

import numpy as np

from securevfl.csprng import SecretStream
from securevfl.errors import ConfigError, Diverged, ProtocolError
from securevfl.exchange.ckks._tenseal import sa
from securevfl.exchange.ckks.counters import OpCounter
from securevfl.exchange.ckks.kernels import Ring
from securevfl.exchange.ckks.packing import standard_layout
from securevfl.exchange.ckks.params import CkksOptions, context, flood_sigma, mask_limit
from securevfl.exchange.ckks.wire import SealIO, check_level, frame, pack_public, unframe
from securevfl.exchange.he import BOTH_OPS, MATMUL, TMATMUL, HEKey


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
        self._evaluator = sa.Evaluator(sc)
        qs = tuple(int(q.value()) for q in sc.key_context_data().parms().coeff_modulus())
        #: the flooding's standard deviation per real slot coordinate (value units)
        self.flood_sigma = flood_sigma(opts, qs)
        self.limit = mask_limit(opts)
        self.value_bound = 2.0**opts.value_norm_bits
        self.decryptions = 0  # ciphertexts decrypted so far (at most opts.max_decryptions)
        self._flood = SecretStream.fresh()  # the flooding noise: this party's secret

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
        self._guard(x, ops)
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
        if self.decryptions + len(cts) > self.opts.max_decryptions:
            raise ConfigError(
                f"this party's CKKS key pair has decrypted {self.decryptions} ciphertexts, and "
                f"{len(cts)} more would pass max_decryptions = {self.opts.max_decryptions}, the number "
                "the decryption flooding is sized for; resume the run from its last checkpoint (a "
                "resumed run exchanges fresh keys) or raise max_decryptions (wider flooding)",
                path="exchange.params.max_decryptions",
            )
        self.decryptions += len(cts)
        arr = np.empty((len(cts), self.ring.slots), dtype=np.complex128)
        pt = sa.Plaintext()
        for j, c in enumerate(cts):
            self._add_flooding(c)  # the flooding: m + e + noise is what gets decoded and leaves
            self._decryptor.decrypt(c, pt)
            arr[j] = np.asarray(self.ring.encoder.decode_complex(pt))
            self.ops.decrypt += 1
        self._check_range(arr, shape)
        return layout.unpack(arr)

    def _add_flooding(self, ct: object) -> None:
        """Flooding (IND-CPA-D; package docstring), at the key owner, on the
        decryption before it is decoded and before the caller adds its own share and
        sends the value: fresh Gaussian noise of flood_sigma on every real slot
        coordinate, encoded to an integer polynomial n of i.i.d. coefficients of
        flood_sigma Delta / sqrt(N / 2) (the canonical embedding is sqrt(N / 2) times
        an isometry). It is added to c0, (c0 + n) + c1 s = m + e + n, which is the
        decrypted polynomial plus n exactly (SEAL's Python API adds plaintexts only to
        ciphertexts), so the key-dependent error e is never decoded alone."""
        slots = self.ring.slots
        g = self._flood.normal_np((2, slots)) * self.flood_sigma
        noise = self.ring.encode(g[0] + 1j * g[1], ct.parms_id(), self.scale)  # type: ignore[attr-defined]
        self._evaluator.add_plain_inplace(ct, noise)
        self.ops.add += 1

    def _check_range(self, arr: np.ndarray, shape: tuple[int, int]) -> None:
        """Every decoded slot (data and padding, real and imaginary) lies below the
        exact-decryption limit. The guards keep every value of a result below it, so
        one at or past it means the operands escaped them and the result may have
        wrapped around the output modulus (a wrap moves some slot by at least twice
        the limit): it is discarded before anything derived from it is sent."""
        top = float(max(np.abs(arr.real).max(initial=0.0), np.abs(arr.imag).max(initial=0.0)))
        if top >= self.limit:
            raise Diverged(
                f"a decrypted CKKS result ({shape[0]}x{shape[1]}) holds a value above {self.limit:.3g}, "
                "the limit under which decryption on the output primes is exact: the result may have "
                "wrapped and is discarded (the operands outgrew the bounds the parameters are sized "
                "for; lower training.lr or interactive.lr)",
                detail=f"the largest decrypted value was {top:.4g}",
            )

    def _guard(self, x: np.ndarray, ops: frozenset[str]) -> None:
        """The operand bound the products are sized for (module docstring): rows of an
        operand of ``matmul``, columns of one of ``tmatmul``, l2 norm <= 2^value_norm_bits.
        In the protocol (:mod:`securevfl.exchange.he`) P_i encrypts its embedding h'_i
        for ``matmul`` only and A encrypts dL/dz for both."""
        what = "dL/dz" if TMATMUL in ops else "the embedding h'_i"
        for axis, op, part in ((1, MATMUL, "row"), (0, TMATMUL, "column")):
            if op not in ops or x.size == 0:
                continue
            norms = np.sqrt((x * x).sum(axis=axis))
            i = int(np.argmax(norms))
            if norms[i] > self.value_bound:
                raise Diverged(
                    f"{what} ({x.shape[0]}x{x.shape[1]}) has a {part} of l2 norm above "
                    f"2^{self.opts.value_norm_bits} = {self.value_bound:g} "
                    "(exchange.params.value_norm_bits): the CKKS products are sized for operands "
                    "within it (exact decryption, flooding)",
                    detail=f"{part} {i} has l2 norm {norms[i]:.4g}",
                )

    def decrypt_slots(self, ct: object) -> np.ndarray:
        """Every slot of one ciphertext, unflooded: the owner's own view, for audits
        of what it can read; nothing it returns may leave this party."""
        pt = sa.Plaintext()
        self._decryptor.decrypt(ct, pt)
        self.ops.decrypt += 1
        return np.asarray(self.ring.encoder.decode_complex(pt))
