"""The mpc backend's pure parts: the JSON object codec that replaces CrypTen's
pickles, the dealer's request whitelist, and load-time refusals."""

from __future__ import annotations

import pickle

import pytest
import torch

from securevfl.app.loader import load_checked_dict, load_protocol_dict
from securevfl.errors import ConfigError, CryptoParameterError
from securevfl.exchange.mpc.crypten.runtime import decode_obj, encode_obj
from tests.support.protocols import small_digits


def _mpc(**params):
    doc = small_digits()
    doc["exchange"] = {"backend": "mpc", "params": params}
    return doc


@pytest.mark.parametrize(
    "obj",
    [
        "terminate",
        {
            "function": "additive",
            "device": None,
            "args": (torch.Size([4, 3]), torch.Size([3, 2]), "matmul"),
            "kwargs": {},
        },
        torch.Size([128, 16]),
        [1, 2.5, None, True, "x", (1, (2, 3))],
    ],
)
def test_codec_round_trip(obj):
    back = decode_obj(encode_obj(obj))
    assert back == obj
    assert type(back) is type(obj)


def test_codec_refuses_other_types():
    with pytest.raises(TypeError):
        encode_obj(torch.zeros(2))
    with pytest.raises(TypeError):
        encode_obj({1: "non-string key"})


@pytest.mark.parametrize(
    "raw",
    [pickle.dumps({"function": "additive"}), b'{"__t": "size", "v": [-1]}', b"\xff\xfe", b'{"__t": 5}'],
)
def test_codec_rejects_malformed_and_pickles(raw):
    with pytest.raises((ValueError, UnicodeDecodeError)):
        decode_obj(raw)


def test_tfp_refused_without_insecure_flag():
    with pytest.raises(CryptoParameterError) as exc:
        load_protocol_dict(_mpc(provider="TFP"))
    assert "exchange.params.provider" in str(exc.value)
    assert "insecure" in str(exc.value)


def test_tfp_allowed_with_flag_warns_and_has_no_dealer():
    from securevfl.app.rank_layout import layout_of

    with pytest.warns(UserWarning, match="TFP"):
        checked = load_checked_dict(_mpc(provider="TFP", insecure=True))
    assert [r.kind for r in layout_of(checked).roles] == ["active", "passive", "passive"]


def test_ttp_default_adds_a_dealer_rank():
    from securevfl.app.rank_layout import layout_of

    lay = layout_of(load_checked_dict(_mpc()))
    assert [r.kind for r in lay.roles] == ["active", "passive", "passive", "helper"]
    assert lay.roles[-1].party == "dealer" and lay.world_size == 4


def test_unknown_mpc_option_names_path():
    with pytest.raises(ConfigError, match=r"exchange\.params\.providr"):
        load_protocol_dict(_mpc(providr="TTP"))


def test_mpc_result_records_insecure_provider():
    from securevfl.exchange.mpc import Mpc, MpcOptions

    info = Mpc.result_info(MpcOptions(provider="TFP", insecure=True))
    assert info["insecure"] is True and "warning" in info
    assert Mpc.result_info(MpcOptions())["insecure"] is False


def test_dealer_accepts_the_requests_crypten_makes():
    from securevfl.exchange.mpc.crypten.runtime import parse_dealer_request

    s0, s1 = torch.Size([128, 16]), torch.Size([16, 16])
    assert parse_dealer_request(
        {"function": "additive", "device": "cpu", "args": (s0, s1, "matmul"), "kwargs": {}}
    ) == ("additive", [s0, s1, "matmul"], "cpu")
    assert (
        parse_dealer_request({"function": "wraps", "device": None, "args": (s0,), "kwargs": {}})[0] == "wraps"
    )


@pytest.mark.parametrize(
    "msg",
    [
        {"function": "__init__", "device": None, "args": (), "kwargs": {}},
        {
            "function": "additive",
            "device": None,
            "args": (torch.Size([2]), torch.Size([2]), "exp"),
            "kwargs": {},
        },
        {"function": "square", "device": None, "args": (torch.Size([1 << 20, 1 << 20]),), "kwargs": {}},
        {"function": "square", "device": "tpu", "args": (torch.Size([2]),), "kwargs": {}},
        {"function": "square", "device": None, "args": ([2, 2],), "kwargs": {}},
        {
            "function": "additive",
            "device": None,
            "args": (torch.Size([2]), torch.Size([2]), "mul"),
            "kwargs": {"stride": 2},
        },
        "not a mapping",
    ],
)
def test_dealer_refuses_other_requests(msg):
    from securevfl.errors import ProtocolError
    from securevfl.exchange.mpc.crypten.runtime import parse_dealer_request

    with pytest.raises(ProtocolError, match="invalid dealer request"):
        parse_dealer_request(msg)
