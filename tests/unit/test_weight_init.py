"""``exchange.params.weight_init`` of the crypto backends.

``seeded`` gives the active party W_i^0 exactly (it follows from the public seed),
so it is refused without ``insecure: true``, warned about with it, and recorded in
result.json as insecure, under every backend that offers it. The default,
``private``, starts from a W_i^0 that no party knows (tests/unit/test_he_start.py,
tests/threat_model/test_he_initial_shares.py).
"""

from __future__ import annotations

from typing import Any

import pytest

from securevfl.app.loader import load_protocol_dict
from securevfl.errors import CryptoParameterError, SecurityWarning
from securevfl.exchange import EXCHANGES
from tests.support.protocols import small_digits

BACKENDS = ["mpc", "ckks", "paillier"]


def _doc(backend: str, **params: Any) -> dict[str, Any]:
    if backend == "ckks":
        pytest.importorskip("tenseal")
    doc = small_digits(batch_size=64)
    doc["exchange"] = {"backend": backend, "params": params}
    return doc


@pytest.mark.parametrize("backend", BACKENDS)
def test_seeded_is_refused_without_insecure(backend):
    with pytest.raises(CryptoParameterError) as info:
        load_protocol_dict(_doc(backend, weight_init="seeded"))
    assert info.value.path == "exchange.params.weight_init"
    assert "insecure: true" in str(info.value) and "W_i^0" in str(info.value)


@pytest.mark.parametrize("backend", BACKENDS)
def test_seeded_with_insecure_warns_and_is_recorded(backend):
    with pytest.warns(SecurityWarning, match="weight_init: seeded"):
        proto = load_protocol_dict(_doc(backend, weight_init="seeded", insecure=True))
    be = EXCHANGES.get(backend)
    info = be.result_info(be.options.model_validate(proto.exchange.params))
    assert info["insecure"] is True and "weight_init: seeded" in info["warning"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_default_start_is_not_insecure(backend):
    proto = load_protocol_dict(_doc(backend))
    be = EXCHANGES.get(backend)
    opts = be.options.model_validate(proto.exchange.params)
    assert be.result_info(opts)["insecure"] is False
    assert opts.weight_init == "private"
