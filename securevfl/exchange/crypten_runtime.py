"""Running CrypTen inside securevfl's process group, safely and metered.

CrypTen normally creates the torch.distributed process group itself from
environment variables (and silently falls back to a single party when they are
missing). securevfl instead starts CrypTen's communicator on the group its
session already set up and checked (world size, roles, protocol digest), with
CrypTen's three sub-groups created in CrypTen's own order:
all ranks (parties + dealer), {0, dealer}, and the MPC parties.

Two changes to CrypTen's communicator, applied per instance:

* **no pickles**: CrypTen ships small objects (dealer requests and replies) with
  ``pickle``; :func:`encode_obj`/:func:`decode_obj` (JSON) replace ``send_obj``/``recv_obj``/
  ``broadcast_obj`` with JSON of a closed set of types, so nothing a peer sends is
  ever unpickled;
* **metering**: every tensor CrypTen moves is written to the rank's ledger as
  ``mpc.<operation>`` records (payload bytes as ring elements; collectives are
  logged per party as "sent to the group" and "received from the group"), and a
  transport failure becomes a :class:`PartyFailure` naming the lost rank.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from securevfl._compat import import_crypten
from securevfl.errors import PartyFailure, ProtocolError
from securevfl.exchange import crypten_pool
from securevfl.runtime.channel import Channel
from securevfl.runtime.ledger import Record

GROUP = -1  # ledger peer for collectives: "the MPC group"
PHASES = {"setup", "psi", "train", "eval"}
MAX_OBJ_BYTES = 1 << 20
MAX_ELEMENTS = 1 << 28


# -- JSON object codec ----------------------------------------------------------------


def encode_obj(obj: Any) -> bytes:
    """Encode a CrypTen control object (str/int/float/bool/None, lists, tuples,
    dicts with str keys, torch.Size) as JSON; anything else is refused."""

    def enc(o: Any) -> Any:
        if o is None or isinstance(o, (bool, int, float, str)):
            return o
        if isinstance(o, torch.Size):
            return {"__t": "size", "v": [int(x) for x in o]}
        if isinstance(o, tuple):
            return {"__t": "tuple", "v": [enc(x) for x in o]}
        if isinstance(o, list):
            return [enc(x) for x in o]
        if isinstance(o, dict) and all(isinstance(k, str) for k in o):
            return {"__t": "dict", "v": {k: enc(v) for k, v in o.items()}}
        raise TypeError(f"securevfl does not send objects of type {type(o).__name__} between parties")

    return json.dumps(enc(obj)).encode()


def decode_obj(raw: bytes) -> Any:
    """Inverse of :func:`encode_obj`; malformed input raises ValueError."""

    def dec(o: Any) -> Any:
        if o is None or isinstance(o, (bool, int, float, str)):
            return o
        if isinstance(o, list):
            return [dec(x) for x in o]
        if isinstance(o, dict):
            kind = o.get("__t")
            if kind == "size" and all(isinstance(x, int) and x >= 0 for x in o["v"]):
                return torch.Size(o["v"])
            if kind == "tuple":
                return tuple(dec(x) for x in o["v"])
            if kind == "dict" and isinstance(o.get("v"), dict):
                return {str(k): dec(v) for k, v in o["v"].items()}
        raise ValueError("malformed object")

    return dec(json.loads(raw.decode()))


# -- communicator set-up --------------------------------------------------------------


def _numel_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class MeteredComm:
    """Wraps a CrypTen DistributedCommunicator instance: JSON objects, ledger
    records, failures named."""

    def __init__(self, inst: Any, channel: Channel, on_failure: Callable[[int, Exception], PartyFailure]):
        self.inst = inst
        self.channel = channel
        self.on_failure = on_failure
        self.rank = channel.rank
        self._orig = {
            name: getattr(inst, name)
            for name in ("send", "recv", "reduce", "all_reduce", "broadcast", "gather", "all_gather")
        }
        inst.send_obj = self.send_obj
        inst.recv_obj = self.recv_obj
        inst.broadcast_obj = self.broadcast_obj
        inst.send = self.send
        inst.recv = self.recv
        inst.reduce = self.reduce
        inst.all_reduce = self.all_reduce
        inst.broadcast = self.broadcast
        inst.gather = self.gather
        inst.all_gather = self.all_gather
        inst.reveal_many = self.reveal_many  # securevfl's addition (exchange.mpc.ops.reveal_to)
        inst.scatter = self._refused("scatter")

    # ledger
    def _log(
        self,
        direction: str,
        sender: int,
        receiver: int,
        tag: str,
        t: torch.Tensor,
        nbytes: int | None = None,
        payload: torch.Tensor | None = None,
    ) -> None:
        ch = self.channel
        ch.ledger.log(
            Record(
                direction,
                ch.phase,
                ch.round,
                sender,
                receiver,
                f"mpc.{tag}",
                tuple(t.shape),
                str(t.dtype).removeprefix("torch."),
                _numel_bytes(t) if nbytes is None else nbytes,
            ),
            payload,
        )

    def _call(self, fn: Callable[..., Any], peer: int, *args: Any, **kw: Any) -> Any:
        try:
            return fn(*args, **kw)
        except (RuntimeError, dist.DistBackendError) as exc:
            raise self.on_failure(peer, exc) from None

    def _refused(self, name: str) -> Callable[..., Any]:
        def f(*args: Any, **kw: Any) -> Any:
            raise ProtocolError(f"CrypTen operation '{name}' is not used by securevfl's MPC exchange")

        return f

    # point to point
    def send(self, tensor: torch.Tensor, dst: int) -> None:
        self._call(self._orig["send"], dst, tensor, dst)
        self._log("sent", self.rank, dst, "send", tensor)

    def recv(self, tensor: torch.Tensor, src: int | None = None) -> torch.Tensor:
        out = self._call(self._orig["recv"], src if src is not None else GROUP, tensor, src)
        self._log("recv", GROUP if src is None else src, self.rank, "recv", out, payload=out)
        return out

    # collectives
    def _parts(self, x: Any) -> list[torch.Tensor]:
        return list(x) if isinstance(x, list) else [x]

    def all_reduce(self, input: Any, op: Any = dist.ReduceOp.SUM, batched: bool = False) -> Any:
        out = self._call(self._orig["all_reduce"], GROUP, input, op=op, batched=batched)
        for t_in, t_out in zip(self._parts(input), self._parts(out), strict=True):
            self._log("sent", self.rank, GROUP, "all_reduce", t_in)
            self._log("recv", GROUP, self.rank, "all_reduce", t_out, payload=t_out)
        return out

    def reduce(self, input: Any, dst: int, op: Any = dist.ReduceOp.SUM, batched: bool = False) -> Any:
        out = self._call(self._orig["reduce"], dst, input, dst, op=op, batched=batched)
        n = self.inst.get_world_size()
        for i, t_in in enumerate(self._parts(input)):
            if self.rank == dst:
                t_out = self._parts(out)[i]
                self._log("recv", GROUP, self.rank, "reveal", t_out, _numel_bytes(t_in) * (n - 1), t_out)
            else:
                self._log("sent", self.rank, dst, "reveal", t_in)
        return out

    def reveal_many(self, shares: list[torch.Tensor], dsts: list[int]) -> list[torch.Tensor | None]:
        """Open shares[j] to rank dsts[j] only, every opening in the same round:
        each party posts all its sends and receives at once (CrypTen's reduce
        would open one destination after the other). Returns, per j, the opened
        value at its destination and None elsewhere; logged like ``reduce``."""
        n = self.inst.get_world_size()
        group = self.inst.main_group
        pending: list[Any] = []
        bufs: dict[int, list[torch.Tensor]] = {}
        sent: list[tuple[int, torch.Tensor]] = []

        def post() -> None:
            for j, (t, dst) in enumerate(zip(shares, dsts, strict=True)):
                if dst == self.rank:
                    bufs[j] = [torch.empty_like(t) for _ in range(n - 1)]
                    srcs = [r for r in range(n) if r != dst]
                    for b, s in zip(bufs[j], srcs, strict=True):
                        pending.append(dist.irecv(b, src=s, group=group))
                else:
                    c = t.contiguous()
                    sent.append((dst, c))
                    pending.append(dist.isend(c, dst=dst, group=group))
            for req in pending:
                req.wait()

        self._call(post, GROUP)
        for dst, c in sent:
            self._log("sent", self.rank, dst, "reveal", c)
        out: list[torch.Tensor | None] = [None] * len(shares)
        for j, parts in bufs.items():
            total = shares[j].clone()
            for p in parts:
                total += p
            out[j] = total
            self._log("recv", GROUP, self.rank, "reveal", total, _numel_bytes(total) * (n - 1), total)
        return out

    def gather(self, tensor: torch.Tensor, dst: int) -> Any:
        out = self._call(self._orig["gather"], dst, tensor, dst)
        if self.rank == dst:
            for src, t in enumerate(out):
                if src != dst:
                    self._log("recv", src, self.rank, "gather", t, payload=t)
        else:
            self._log("sent", self.rank, dst, "gather", tensor)
        return out

    def all_gather(self, tensor: torch.Tensor) -> Any:
        out = self._call(self._orig["all_gather"], GROUP, tensor)
        self._log("sent", self.rank, GROUP, "all_gather", tensor)
        for src, t in enumerate(out):
            if src != self.rank:
                self._log("recv", src, self.rank, "all_gather", t, payload=t)
        return out

    def broadcast(self, input: Any, src: int, group: Any = None, batched: bool = False) -> Any:
        out = self._call(self._orig["broadcast"], src, input, src, group=group, batched=batched)
        size = dist.get_world_size(group) if group is not None else self.inst.get_world_size()
        for t in self._parts(out):
            if self.rank == src:
                self._log("sent", self.rank, GROUP, "broadcast", t, _numel_bytes(t) * (size - 1))
            else:
                self._log("recv", src, self.rank, "broadcast", t, payload=t)
        return out

    # objects: JSON, never pickle
    def send_obj(self, obj: Any, dst: int, group: Any = None) -> None:
        group = self.inst.main_group if group is None else group
        # the phase and round travel with the object so the dealer's ledger
        # attributes its replies to the right training step
        buf = encode_obj({"phase": self.channel.phase, "round": self.channel.round, "obj": obj})
        size = torch.tensor(len(buf), dtype=torch.int64)
        arr = torch.frombuffer(bytearray(buf), dtype=torch.uint8)

        def go() -> None:
            dist.send(size, dst=dst, group=group)
            dist.send(arr, dst=dst, group=group)

        self._call(go, dst)
        self._log("sent", self.rank, dst, "object", arr)

    def recv_obj(self, src: int, group: Any = None) -> Any:
        group = self.inst.main_group if group is None else group
        size = torch.zeros((), dtype=torch.int64)
        self._call(dist.recv, src, size, src=src, group=group)
        n = int(size)
        if not 0 < n <= MAX_OBJ_BYTES:
            raise ProtocolError(f"rank {src} announced a {n}-byte MPC control object")
        arr = torch.empty(n, dtype=torch.uint8)
        self._call(dist.recv, src, arr, src=src, group=group)
        try:
            env = decode_obj(arr.numpy().tobytes())
            phase, rnd = env["phase"], env["round"]
            if phase not in PHASES or not isinstance(rnd, int) or set(env) != {"phase", "round", "obj"}:
                raise ValueError("envelope")
        except (ValueError, UnicodeDecodeError, TypeError, KeyError):
            raise ProtocolError(f"rank {src} sent a malformed MPC control object") from None
        self.channel.phase, self.channel.round = phase, rnd
        self._log("recv", src, self.rank, "object", arr)
        return env["obj"]

    def broadcast_obj(self, obj: Any, src: int, group: Any = None) -> Any:
        raise ProtocolError("securevfl's MPC exchange never broadcasts objects (sizes are agreed)")


def start_crypten(
    channel: Channel,
    world_size: int,
    n_mpc: int,
    *,
    provider: str,
    on_failure: Callable[[int, Exception], PartyFailure],
) -> Any:
    """Bring up CrypTen's communicator on the existing process group.

    ``n_mpc`` MPC parties are ranks 0..n_mpc-1; with ``provider='TTP'`` the dealer
    is rank ``n_mpc`` (= world_size - 1). Every rank must call this at the same
    point, since it creates process sub-groups collectively.
    """
    crypten = import_crypten()
    import crypten.communicator as comm_mod
    from crypten.communicator import DistributedCommunicator as DC

    use_ttp = provider == "TTP"
    assert world_size == n_mpc + (1 if use_ttp else 0)
    crypten.cfg.mpc.provider = provider
    inst = DC.__new__(DC)
    inst.distributed_backend = "gloo"
    inst.rendezvous = "securevfl-session"
    inst.world_size = n_mpc
    inst.rank = channel.rank
    inst.reset_communication_stats()
    inst._name = f"rank{channel.rank}"
    # CrypTen's sub-groups, in CrypTen's order (new_group is collective)
    inst.ttp_group = dist.new_group(list(range(world_size)))
    if world_size > 1:
        inst.ttp_comm_group = dist.new_group([0, world_size - 1])
    inst.main_group = dist.new_group(list(range(n_mpc)))
    inst.ttp_initialized = use_ttp
    MeteredComm(inst, channel, on_failure)
    DC.instance = inst
    comm_mod._init(use_threads=False)  # marks the distributed communicator as in use
    if channel.rank < n_mpc:
        crypten._setup_prng()
        if use_ttp:
            crypten.mpc.provider.ttp_provider.TTPClient._init()
            crypten_pool.install()  # the dealer's offline phase (crypten_pool)
    return crypten


def stop_crypten() -> None:
    """Forget CrypTen's communicator (the session tears down the process group)."""
    crypten = import_crypten()
    from crypten.communicator import DistributedCommunicator as DC

    if crypten.cfg.mpc.provider == "TTP":
        crypten.mpc.provider.ttp_provider.TTPClient.uninit()
        crypten_pool.uninstall()
    DC.instance = None


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


def serve_dealer(channel: Channel, on_failure: Callable[[int, Exception], PartyFailure]) -> int:
    """The trusted dealer's loop: answer rank 0's requests for correlated
    randomness until it says ``terminate``. Requests are validated against a
    whitelist of functions, operations and sizes. Returns the number served."""
    import crypten.communicator as comm
    from crypten.mpc.provider.ttp_provider import TTPServer

    server = TTPServer.__new__(TTPServer)
    server.ttp_group = comm.get().ttp_group
    server.comm_group = comm.get().ttp_comm_group
    server.device = "cpu"
    server._setup_generators()
    me = comm.get().get_ttp_rank()
    served = 0
    while True:
        msg = comm.get().recv_obj(0, server.ttp_group)
        if msg == "terminate":
            return served
        fn, args, device = parse_dealer_request(msg)
        server.device = device or "cpu"
        if fn == "bundle":
            # one broadcast for the whole plan; its size follows from the plan
            comm.get().broadcast(crypten_pool.dealer_bundle(server, args), me, server.comm_group)
            served += len(args)
            continue
        result = getattr(server, fn)(*args)
        comm.get().send_obj(result.size(), 0, server.ttp_group)
        comm.get().broadcast(result, me, server.comm_group)
        served += 1
