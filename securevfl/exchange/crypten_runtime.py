"""Running CrypTen inside securevfl's session: its communicator, and the dealer.

CrypTen normally creates the torch.distributed process group itself from
environment variables (and silently falls back to a single party when they are
missing), runs its collectives as gloo collectives on three process sub-groups
and ships small objects with ``pickle``. securevfl instead installs its own
CrypTen communicator, :class:`~securevfl.exchange.crypten_comm.FramedCommunicator`,
on the session it already set up and checked (world size, roles, protocol
digest): every CrypTen byte is a point-to-point frame through one transport,
collectives are exchanges of shares, control objects are JSON of a closed set
of types (nothing a peer sends is ever unpickled), every tensor is metered into
the rank's ledger as ``mpc.<operation>`` records and a transport failure
becomes a :class:`PartyFailure` naming the peer (see :mod:`.crypten_comm`).

This module starts and stops CrypTen on that communicator and runs the trusted
dealer's loop, which validates every request against a whitelist. Starting
CrypTen here also makes every random draw of it come from secret streams
(:mod:`securevfl.exchange.crypten_rng`): the MPC parties agree 256-bit keys for
CrypTen's PRG streams in place of ``crypten._setup_prng``'s 64-bit seeds, the
dealer sends each MPC party a 256-bit key for its tuple stream, and securevfl's
own tuple provider (:class:`~securevfl.exchange.crypten_pool.SecretTTP`) and
dealer (:class:`~securevfl.exchange.crypten_dealer.SecretDealer`) take the place
of CrypTen's ``TrustedThirdParty`` and ``TTPServer``.

A run's CrypTen settings last the run: the provider is set with CrypTen's own
``cfg.temp_override``, and the communicator and the ``TTP`` provider go where
CrypTen looks them up (:mod:`securevfl.exchange.crypten_patches`, which holds every
part of CrypTen securevfl replaces); :func:`stop_crypten` undoes all three, in
reverse order, and forgets the run's streams.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

import torch

import securevfl.exchange.crypten_patches as crypten_patches
import securevfl.exchange.crypten_pool as crypten_pool
import securevfl.exchange.crypten_rng as crypten_rng
from securevfl.errors import PartyFailure, ProtocolError
from securevfl.exchange.crypten_api import comm as crypten_comm_module
from securevfl.exchange.crypten_api import crypten
from securevfl.exchange.crypten_comm import (
    FramedCommunicator,
    FrameTransport,
    decode_obj,
    encode_obj,
    transport_for,
)
from securevfl.exchange.crypten_dealer import SecretDealer
from securevfl.runtime.channel import Channel

__all__ = [
    "decode_obj",
    "encode_obj",
    "parse_dealer_request",
    "serve_dealer",
    "start_crypten",
    "stop_crypten",
]

MAX_ELEMENTS = 1 << 28

#: what undoes the running CrypTen session's settings (CrypTen's own state is one per
#: process: its configuration, communicator and provider table are module globals)
_running: list[ExitStack] = []


def start_crypten(
    channel: Channel,
    world_size: int,
    n_mpc: int,
    *,
    provider: str,
    on_failure: Callable[[int, Exception], PartyFailure],
    transport: FrameTransport | None = None,
) -> Any:
    """Bring up CrypTen with a :class:`FramedCommunicator` over ``transport``
    (default :func:`transport_for`: frames sealed on the session's links).

    ``n_mpc`` MPC parties are ranks 0..n_mpc-1; with ``provider='TTP'`` the dealer
    is rank ``n_mpc`` (= world_size - 1). Every rank must call this at the same
    point: the MPC parties agree the keys of CrypTen's PRG streams here and receive
    the dealer's key, which the dealer sends at the start of :func:`serve_dealer`.
    No process sub-group is created. A session still running in this process is
    stopped first.
    """
    use_ttp = provider == "TTP"
    assert world_size == n_mpc + (1 if use_ttp else 0)
    stop_crypten()
    crypten_patches.install()
    undo = ExitStack()
    try:
        undo.enter_context(crypten.cfg.temp_override({"mpc.provider": provider}))
        comm = FramedCommunicator(transport or transport_for(channel), channel, n_mpc, world_size, on_failure)
        undo.callback(crypten_patches.use_communicator(comm))
        undo.callback(crypten_rng.clear_generators)
        if channel.rank < n_mpc:
            crypten_rng.agree_streams(comm)  # prev/next keys to neighbours, the global key from rank 0
            if use_ttp:
                _, restore = crypten_pool.install(crypten_rng.client_key(comm))
                undo.callback(restore)
    except BaseException:
        undo.close()
        raise
    _running.append(undo)
    return crypten


def stop_crypten() -> None:
    """Forget CrypTen's provider, streams and communicator and put its configuration
    back (the session tears down the process group). Does nothing when no session runs."""
    while _running:
        _running.pop().close()


# -- the dealer -----------------------------------------------------------------------

DEALER_FUNCTIONS = {"additive", "square", "binary", "wraps", "B2A", "bundle"}
DEALER_OPS = {"mul", "matmul"}


def _size(x: Any) -> torch.Size:
    if not isinstance(x, torch.Size) or len(x) > 8 or math.prod(x) > MAX_ELEMENTS:
        raise ValueError("bad size")
    return x


def parse_dealer_request(msg: Any) -> tuple[str, list[Any], str | None]:
    """Validate a dealer request from rank 0: a whitelisted function, a whitelisted
    torch operation for triples, sizes within bounds, no keyword arguments. A
    ``bundle`` (the offline phase, :mod:`crypten_pool`) carries a list of triple and
    wraps items, each checked the same way."""
    try:
        fn = msg["function"]
        if fn not in DEALER_FUNCTIONS:
            raise ValueError(f"function {fn!r}")
        args = list(msg["args"])
        if msg["kwargs"]:
            raise ValueError("keyword arguments")
        device = msg["device"]
        if device is not None and not (isinstance(device, str) and device.split(":")[0] in ("cpu", "cuda")):
            raise ValueError(f"device {device!r}")
        if fn == "bundle":
            if len(args) != 1 or device is not None:
                raise ValueError("bundle arguments")
            args = crypten_pool.parse_bundle(args[0])
        elif fn == "additive":
            if len(args) != 3 or args[2] not in DEALER_OPS:
                raise ValueError("operation")
            args = [_size(args[0]), _size(args[1]), args[2]]
        elif fn == "binary":
            if len(args) != 2:
                raise ValueError("arguments")
            args = [_size(args[0]), _size(args[1])]
        else:
            if len(args) != 1:
                raise ValueError("arguments")
            args = [_size(args[0])]
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise ProtocolError(f"rank 0 sent an invalid dealer request ({exc})") from None
    return fn, args, device


def serve_dealer(
    channel: Channel,
    on_failure: Callable[[int, Exception], PartyFailure],
    matmul: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = torch.matmul,
) -> int:
    """The trusted dealer's loop: answer rank 0's requests for correlated
    randomness until it says ``terminate``, computing every triple's product with
    ``matmul`` (:class:`SecretDealer`). Requests are validated against a whitelist
    of functions, operations and sizes. Returns the number served."""
    c = crypten_comm_module.get()
    assert isinstance(c, FramedCommunicator)
    server = SecretDealer(crypten_rng.dealer_keys(c), matmul=matmul)
    me = c.get_ttp_rank()
    served = 0
    while True:
        msg = c.recv_obj(0, c.ttp_group)
        if msg == "terminate":
            return served
        fn, args, _device = parse_dealer_request(msg)
        if fn == "bundle":
            # one broadcast for the whole plan; its size follows from the plan
            c.broadcast(crypten_pool.dealer_bundle(server, args), me, c.ttp_comm_group)
            served += len(args)
            continue
        # the shares are computed on the CPU; rank 0 moves its own to its device
        result = getattr(server, fn)(*args)
        c.send_obj(result.size(), 0, c.ttp_group)
        c.broadcast(result, me, c.ttp_comm_group)
        served += 1
