"""The load-time checks of ``paillier`` and what a run's result records about its
parameters; read by the declaration (:class:`securevfl.exchange.paillier.Paillier`),
so, like it, this imports neither torch nor the Paillier arithmetic."""

from __future__ import annotations

from typing import Any

from securevfl.config import ModelSpec, Protocol
from securevfl.errors import ConfigError, CryptoParameterError
from securevfl.exchange.paillier.options import MIN_DISTANCE_BITS, MIN_KEY_BITS, PaillierOptions, Params


def _embed_dims(proto: Protocol) -> list[int]:
    return [(p.model or ModelSpec()).out for p in proto.parties.passive]


def params_for(proto: Protocol, options: PaillierOptions, dims: list[int] | None = None) -> Params:
    """The parameters of a run of this protocol (its batch, embedding and output sizes)."""
    return Params.of(options, proto.training.batch_size, dims or _embed_dims(proto), proto.interactive.out)


def check(proto: Protocol, options: PaillierOptions) -> None:
    """Refuse, at load, parameters below the security floors (CryptoParameterError:
    key size, statistical distance, the run's length) and sizes a slot or a plaintext
    cannot carry (ConfigError), naming the field of ``exchange.params``."""
    o = options
    prm = params_for(proto, o)

    def bad(field: str, why: str, crypto: bool = False) -> ConfigError:
        kind = CryptoParameterError if crypto else ConfigError
        return kind(why, path=f"exchange.params.{field}")

    if o.key_bits < MIN_KEY_BITS:
        raise bad(
            "key_bits",
            f"key_bits={o.key_bits} is below the {MIN_KEY_BITS}-bit floor: a Paillier modulus "
            "is broken by factoring it, and moduli under 2048 bits give less than 112-bit "
            "security (NIST SP 800-57; 3072 bits for 128-bit)",
            crypto=True,
        )
    if o.distance_bits < MIN_DISTANCE_BITS:
        raise bad(
            "distance_bits",
            f"distance_bits={o.distance_bits} is below {MIN_DISTANCE_BITS}: the masks and "
            f"obfuscators of a whole run must stay within statistical distance 2^-{MIN_DISTANCE_BITS} "
            "of ideal ones",
            crypto=True,
        )
    steps = proto.training.max_steps
    if steps is not None and steps > o.run_steps:
        raise bad(
            "run_steps",
            f"training.max_steps={steps} exceeds run_steps={o.run_steps}: the statistical bound "
            f"of the masks covers {o.run_steps} passes through the interactive layer (training "
            "steps, evaluation and prediction batches); raise run_steps",
            crypto=True,
        )
    if o.value_bits + max(o.precision_bits, o.shared_precision_bits) > 62:
        raise bad(
            "precision_bits",
            "value_bits + precision_bits and + shared_precision_bits must be at most 62 (int64)",
        )
    if o.scalar_bits + o.scalar_precision_bits > 62:
        raise bad("scalar_precision_bits", "scalar_bits + scalar_precision_bits must be at most 62 (int64)")
    b, dims, out = proto.training.batch_size, _embed_dims(proto), proto.interactive.out
    nbits = o.key_bits
    for terms, share, op, what in (
        (max(dims), True, prm.share + 1, "Enc(h'_i) times A's weight share"),
        (out, True, prm.share, "Enc(dL/dz) times P_i's weight share"),
        (b, False, prm.v, "Enc(dL/dz) times h'_i (the weight gradient)"),
    ):
        m = prm.mask_bits(terms, prm.hidden_bits(share), prm.fxs)
        need = prm.slot_need(terms, op, prm.fxs, m)
        if o.slot_bits is not None and o.slot_bits < need:
            raise bad(
                "slot_bits",
                f"slot_bits={o.slot_bits} could overflow: {what} sums {terms} products (batch_size "
                f"{b}, embedding and interactive sizes) of values below 2^{o.value_bits} and "
                f"operands below 2^{op} at 2^-{prm.Fs}, plus a {m}-bit mask: at least {need} bits",
            )
        slot = o.slot_bits or need
        if slot > nbits - 1:
            raise bad(
                "slot_bits" if o.slot_bits else "key_bits",
                f"a {slot}-bit slot ({what}) does not fit a {nbits}-bit plaintext",
            )


def describe(options: PaillierOptions) -> dict[str, Any]:
    """The security figures a run's result records."""
    return {
        "security_bits": 128 if options.key_bits >= 3072 else 112,
        "statistical_distance_bits": options.distance_bits,
        "statistical_run_steps": options.run_steps,
        # P_i clips every row of h'_i, and A scales dL/dz, to this l2 norm before encrypting
        "encrypted_row_norm_bound": 2.0**options.value_bits,
    }
