"""The messages of the two-party HE protocol (:mod:`securevfl.exchange.he.protocol`),
registered with their payload kinds: ciphertexts and public keys as bytes, masked
plaintext matrices as float64 or int64 limbs. No secret key is ever one of them."""

from __future__ import annotations

import torch

from securevfl.runtime.messages import BYTES, FLOATS, register_tag

HE_PUBLIC = register_tag("he_public", BYTES, "public HE context/key of the sender (no secret key)")
HE_ENC_H = register_tag("he_enc_h", BYTES, "P_i -> A: Enc_P(h'_i)")
HE_ENC_ZMASK = register_tag("he_enc_zmask", BYTES, "A -> P_i: Enc_P(h'_i W^A + eps)")
#: plaintext matrices: float64 (``ckks``) or exact integers as int64 limbs (``paillier``); the
#: receiver names the one its scheme uses (:class:`ShareArith`)
PLAIN = FLOATS | {torch.int64}
HE_ZSHARE = register_tag("he_zshare", PLAIN, "P_i -> A: h'_i W_i + eps (masked)")
HE_ENC_G = register_tag("he_enc_g", BYTES, "A -> P_i: Enc_A(dL/dz)")
HE_ENC_GH = register_tag("he_enc_gh", BYTES, "P_i -> A: Enc_A(g W^P^T + mu)")
HE_ENC_GW = register_tag("he_enc_gw", BYTES, "P_i -> A: Enc_A(h^T g - R)")
HE_GH_MASKED = register_tag("he_gh_masked", PLAIN, "A -> P_i: g W_i^T + mu (masked)")
HE_RESHARE = register_tag("he_reshare", PLAIN, "P_i -> A: W^P - U, U P_i's fresh share (re-drawn share)")
HE_START_ENC = register_tag(
    "he_start_enc", BYTES, "P_i -> A: start of W_i: Enc_P(G_P^T), P_i's Gaussian factor"
)
HE_START_MASKED = register_tag(
    "he_start_masked", BYTES, "A -> P_i: start of W_i: Enc_P(G_P^T R_A^T + eps), R_A A's Haar factor"
)


MAX_PUBLIC_BYTES = 512 << 20
