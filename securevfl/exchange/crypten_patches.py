"""Every place securevfl replaces part of CrypTen 0.4.1, and why no seam serves there.

securevfl runs CrypTen through the seams CrypTen has: its configuration
(``crypten.cfg.temp_override`` sets the tuple provider for one run and puts the old
value back, :mod:`securevfl.exchange.crypten_runtime`), its communicator interface
(:class:`~securevfl.exchange.crypten_comm.FramedCommunicator` is a
``crypten.communicator.Communicator``), its provider interface
(:class:`~securevfl.exchange.crypten_pool.SecretTTP` is a ``TupleProvider``) and its
table of PRG streams, ``crypten.generators`` (:mod:`securevfl.exchange.crypten_rng`).
Five things have no seam. Each is replaced here and nowhere else, and each
replacement first checks that CrypTen still has, at that place, what 0.4.1 has
there (:class:`CryptenChanged` otherwise, before anything is touched), so a CrypTen
that moved its internals stops a run instead of leaving a path unreplaced
(tests/unit/test_crypten_patches.py):

1. **The draw functions** (:func:`install`). CrypTen draws every share, mask and
   tuple through ``generate_random_ring_element`` and ``generate_kbit_random_tensor``
   of ``crypten.common.rng``, which four more modules import by name
   (:data:`IMPORTERS`), from ``torch.Generator`` (Mersenne Twister) objects. They are
   replaced in all five modules by :func:`~securevfl.exchange.crypten_rng.ring_element`
   and :func:`~securevfl.exchange.crypten_rng.kbit_tensor`, which draw from a
   :class:`~securevfl.csprng.SecretStream` and refuse anything else
   (:class:`~securevfl.exchange.crypten_rng.NotASecretStream`). Before replacing, every
   loaded CrypTen module is searched for CrypTen's own functions: one held anywhere
   :data:`IMPORTERS` does not name stops the install.
2. **Autograd dropout's mask** (:func:`install`). ``AutogradDropout`` and
   ``AutogradFeatureDropout`` (``crypten/gradients.py``; ``crypten.nn.Dropout``,
   ``Dropout2d`` and ``CrypTensor.dropout`` on a tensor that requires a gradient)
   call ``torch.rand(generator=crypten.generators["global"][device])``, which takes a
   ``torch.Generator`` only. Their ``forward`` is replaced by the same computation
   with the uniforms drawn from the ``global`` secret stream (53-bit uniforms,
   :meth:`SecretStream.uniform`). The mask keeps CrypTen's semantics: every MPC
   party holds the same ``global`` stream and draws the same mask, a public value
   that multiplies the shares; it hides nothing and reveals nothing about the data.
3. **DPSplitModel's plaintext draws** (:func:`install`). ``crypten.nn.privacy.DPSplitModel``
   draws its noise at ``noise_src`` with ``torch.randn`` and its randomized response on
   plaintext targets with ``Tensor.bernoulli`` (torch's global Mersenne Twister).
   Both are refused by name; the same model draws both from secret streams when the
   noise is made in MPC (no ``noise_src``: ``crypten.randn``) and the targets are
   encrypted before the loss (``crypten.bernoulli``).
4. **The provider table** (:func:`use_provider`). ``crypten.mpc.get_default_provider``
   looks the provider up in the module's private dict ``__SUPPORTED_PROVIDERS``; CrypTen
   has no function to register one, so securevfl's ``TTP`` provider goes into that
   dict for a run and CrypTen's comes back after it.
5. **The communicator slot** (:func:`use_communicator`). ``crypten.communicator.get()``
   returns ``DistributedCommunicator.instance`` once the default process group is up;
   CrypTen fills that slot only in its own ``initialize``, which makes its own process
   group from environment variables. securevfl puts its communicator there for a run
   and checks that CrypTen then returns it.

Every other random draw in CrypTen 0.4.1 is listed, with what becomes of it, in
tests/unit/test_crypten_patches.py (``CRYPTEN_DRAWS``), which reads CrypTen's source
and fails on a draw the list does not hold: the MT19937 generators of
``crypten._setup_prng`` and of CrypTen's TTP client and server are never made by
securevfl (securevfl agrees its own keys, :func:`securevfl.exchange.crypten_rng.agree_streams`,
and runs its own dealer), and a draw from one is refused by the replaced draw
functions; CrypTen's layers initialise their plaintext parameters as ``torch.nn``
does, at each party before ``encrypt()`` (a party's own plaintext model initialisation,
docs/design.md §13; securevfl's ``mpc`` backend initialises its shared weights at the
dealer instead).

Patches 1-3 are process-wide and never undone: once a process imported CrypTen
through securevfl no Mersenne Twister path is left. Patches 4 and 5 last one run and
return what undoes them.
"""

from __future__ import annotations

import inspect
import logging
import sys
from collections.abc import Callable
from types import FunctionType, ModuleType
from typing import Any, TypeVar

import torch

from securevfl.csprng import SecretStream
from securevfl.errors import ProtocolError, SecureVFLError
from securevfl.exchange.crypten_api import Communicator, DistributedCommunicator, crypten, gradients
from securevfl.exchange.crypten_api import comm as crypten_comm
from securevfl.exchange.crypten_api import mpc as crypten_mpc
from securevfl.exchange.crypten_api import privacy as crypten_privacy
from securevfl.exchange.crypten_rng import NotASecretStream, kbit_tensor, ring_element

__all__ = [
    "DRAWS",
    "IMPORTERS",
    "CryptenChanged",
    "dropout_forward",
    "feature_dropout_forward",
    "install",
    "provider",
    "public_mask",
    "refuse_noise_from_src",
    "use_communicator",
    "use_provider",
]

log = logging.getLogger(__name__)

#: CrypTen's draw functions (module ``crypten.common.rng``) and their replacements
DRAWS: dict[str, Callable[..., Any]] = {
    "generate_random_ring_element": ring_element,
    "generate_kbit_random_tensor": kbit_tensor,
}
_BOTH = ("generate_random_ring_element", "generate_kbit_random_tensor")
#: CrypTen modules that hold the draw functions under their own names, and which
IMPORTERS: dict[str, tuple[str, ...]] = {
    "crypten.common.rng": _BOTH,
    "crypten.mpc.primitives.arithmetic": ("generate_random_ring_element",),
    "crypten.mpc.primitives.binary": ("generate_kbit_random_tensor",),
    "crypten.mpc.provider.ttp_provider": _BOTH,
    "crypten.mpc.provider.tfp_provider": _BOTH,
}
#: the draw functions' parameters in CrypTen 0.4.1
DRAW_PARAMETERS = {
    "generate_random_ring_element": ("size", "ring_size", "generator", "kwargs"),
    "generate_kbit_random_tensor": ("size", "bitlength", "generator", "kwargs"),
}
#: the autograd functions whose forward draws a dropout mask, by CrypTen's registered name
DROPOUTS = ("dropout", "_feature_dropout")
DROPOUT_PARAMETERS = ("ctx", "input", "p", "training", "inplace")
PROVIDER_TABLE = "__SUPPORTED_PROVIDERS"
_F = TypeVar("_F", bound=Callable[..., Any])


class CryptenChanged(SecureVFLError):
    """The installed CrypTen differs from 0.4.1 where securevfl replaces part of it."""

    def __init__(self, what: str):
        super().__init__(
            f"CrypTen {getattr(crypten, '__version__', '?')} differs from the CrypTen 0.4.1 securevfl "
            f"was written for: {what}; securevfl refuses to run CrypTen with a part it cannot secure"
        )


# -- checks --------------------------------------------------------------------------------


def _parameters(fn: Any) -> tuple[str, ...]:
    return tuple(inspect.signature(fn).parameters)


def _is_crypten_draw(obj: Any, name: str) -> bool:
    """``obj`` is CrypTen's own draw function ``name`` (not securevfl's)."""
    return (
        isinstance(obj, FunctionType) and obj.__module__ == "crypten.common.rng" and obj.__qualname__ == name
    )


def _crypten_modules() -> list[tuple[str, ModuleType]]:
    return [
        (n, m)
        for n, m in list(sys.modules.items())
        if m is not None and (n == "crypten" or n.startswith("crypten."))
    ]


def _check_draws() -> None:
    """Every module of :data:`IMPORTERS` holds CrypTen's draw function (or ours) with
    0.4.1's parameters, and no other loaded CrypTen module holds CrypTen's."""
    for name, attrs in IMPORTERS.items():
        module = sys.modules.get(name)
        if module is None:
            raise CryptenChanged(f"module {name} is not loaded")
        for attr in attrs:
            held = getattr(module, attr, None)
            if held is DRAWS[attr]:
                continue
            if held is None:
                raise CryptenChanged(f"{name} has no {attr}")
            if not _is_crypten_draw(held, attr):
                raise CryptenChanged(f"{name}.{attr} is {held!r}, not crypten.common.rng.{attr}")
            if _parameters(held) != DRAW_PARAMETERS[attr]:
                raise CryptenChanged(f"crypten.common.rng.{attr} takes {_parameters(held)}")
    for name, module in _crypten_modules():
        for key, value in list(vars(module).items()):
            for attr in DRAWS:
                if _is_crypten_draw(value, attr) and key not in IMPORTERS.get(name, ()):
                    raise CryptenChanged(
                        f"{name}.{key} holds crypten.common.rng.{attr}, a draw securevfl would not replace"
                    )


def _dropout_classes() -> list[type]:
    out = []
    for name in DROPOUTS:
        cls = gradients.get_grad_fn(name)
        if cls is None:
            raise CryptenChanged(f"no autograd function is registered as {name!r}")
        forward = vars(cls).get("forward")
        fn = getattr(forward, "__func__", None)
        if getattr(fn, "_securevfl", False):
            out.append(cls)
            continue
        if not isinstance(forward, staticmethod) or fn is None:
            raise CryptenChanged(f"{cls.__qualname__}.forward is not a static method")
        if _parameters(fn) != DROPOUT_PARAMETERS:
            raise CryptenChanged(f"{cls.__qualname__}.forward takes {_parameters(fn)}")
        if not {"generators", "rand"} <= set(fn.__code__.co_names):
            raise CryptenChanged(
                f"{cls.__qualname__}.forward no longer draws torch.rand from crypten.generators"
            )
        out.append(cls)
    return out


def _dp_split_class() -> type:
    cls = getattr(crypten_privacy, "DPSplitModel", None)
    if cls is None:
        raise CryptenChanged("crypten.nn.privacy has no DPSplitModel")
    for attr, params in (
        ("_generate_noise_from_src", ("self", "size")),
        ("_process_targets", ("self", "targets")),
    ):
        fn = vars(cls).get(attr)
        if not isinstance(fn, FunctionType):
            raise CryptenChanged(f"DPSplitModel has no method {attr}")
        if not getattr(fn, "_securevfl", False) and _parameters(fn) != params:
            raise CryptenChanged(f"DPSplitModel.{attr} takes {_parameters(fn)}")
    return cls


# -- 2. dropout masks from the global secret stream ------------------------------------------


def _global_stream(device: Any) -> SecretStream:
    stream = crypten.generators["global"].get(device)
    if stream is None:
        raise NotASecretStream(
            "CrypTen's dropout drew its mask before securevfl agreed its secret streams "
            f"(crypten.generators['global'] holds nothing for {device})"
        )
    if not isinstance(stream, SecretStream):
        raise NotASecretStream(
            f"CrypTen's dropout asked for its mask from a {type(stream).__module__}."
            f"{type(stream).__qualname__} (crypten.generators['global']); securevfl draws every "
            "CrypTen mask from a SecretStream (AES-256-CTR), never from torch.Generator (Mersenne Twister)"
        )
    return stream


def public_mask(size: Any, p: float, device: Any) -> torch.Tensor:
    """A dropout mask: 1.0 where a uniform of the ``global`` stream exceeds ``p``,
    else 0.0 (float32). Every MPC party draws the same one."""
    u = _global_stream(device).uniform(tuple(size))
    return (u > p).to(dtype=torch.float)


def _mark(fn: _F) -> _F:
    """Tag a replacement, so that a second :func:`install` sees it is in place."""
    fn._securevfl = True  # type: ignore[attr-defined]
    return fn


@_mark
def dropout_forward(
    ctx: Any, input: Any, p: float = 0.5, training: bool = True, inplace: bool = False
) -> Any:
    """``AutogradDropout.forward`` of CrypTen 0.4.1 with its mask from :func:`public_mask`."""
    if training and inplace:
        log.warning("CrypTen dropout does not support inplace computation during training.")
    if not training:
        return input if inplace else input.clone()
    mask = public_mask(input.size(), p, input.device).to(input.device)
    result = input.mul_(mask.div(1.0 - p)) if inplace else input.mul(mask.div(1.0 - p))
    ctx.save_multiple_for_backward([mask, p])
    return result


@_mark
def feature_dropout_forward(
    ctx: Any, input: Any, p: float = 0.5, training: bool = True, inplace: bool = False
) -> Any:
    """``AutogradFeatureDropout.forward`` of CrypTen 0.4.1 (one mask value per
    channel of each sample) with its mask from :func:`public_mask`."""
    if training and inplace:
        log.warning("CrypTen _feature_dropout does not support inplace computation during training.")
    if not training:
        return input if inplace else input.clone()
    mask = public_mask(input.size()[0:2], p, input.device)
    for i in range(2, input.dim()):
        mask = mask.unsqueeze(i)
    mask, _ = torch.broadcast_tensors(mask, input.data)
    result = input.mul_(mask.div(1.0 - p)) if inplace else input.mul(mask.div(1.0 - p))
    ctx.save_multiple_for_backward([mask, p])
    return result


# -- 3. DPSplitModel's torch draws refused -------------------------------------------------------


@_mark
def refuse_noise_from_src(self: Any, size: Any) -> Any:
    raise NotASecretStream(
        "CrypTen's DPSplitModel draws its noise at noise_src with torch.randn (torch's global "
        "Mersenne Twister); securevfl refuses it: leave noise_src unset so the noise is drawn in "
        "MPC from secret streams (crypten.randn)"
    )


def _refusing_plain_rr(process_targets: Callable[..., Any]) -> Callable[..., Any]:
    @_mark
    def process_targets_(self: Any, targets: Any) -> Any:
        if self.rr_prob is not None and not crypten.is_encrypted_tensor(targets):
            raise NotASecretStream(
                "CrypTen's DPSplitModel flips plaintext targets with Tensor.bernoulli (torch's global "
                "Mersenne Twister); securevfl refuses it: encrypt the targets first, so the flips are "
                "drawn in MPC from secret streams (crypten.bernoulli)"
            )
        return process_targets(self, targets)

    process_targets_.__wrapped__ = process_targets  # type: ignore[attr-defined]
    return process_targets_


# -- install -------------------------------------------------------------------------------------


def install() -> None:
    """Patches 1-3 (module docstring), after checking every place they touch.
    Idempotent; never undone."""
    _check_draws()
    dropouts = _dropout_classes()
    dp_split = _dp_split_class()
    for name, attrs in IMPORTERS.items():
        for attr in attrs:
            setattr(sys.modules[name], attr, DRAWS[attr])
    for cls, forward in zip(dropouts, (dropout_forward, feature_dropout_forward), strict=True):
        cls.forward = staticmethod(forward)  # type: ignore[attr-defined]
    dp_split._generate_noise_from_src = refuse_noise_from_src  # type: ignore[attr-defined]
    if not getattr(vars(dp_split)["_process_targets"], "_securevfl", False):
        dp_split._process_targets = _refusing_plain_rr(vars(dp_split)["_process_targets"])  # type: ignore[attr-defined]


# -- 4. the provider table -----------------------------------------------------------------------


def _providers() -> dict[str, Any]:
    table = vars(crypten_mpc).get(PROVIDER_TABLE)
    if not isinstance(table, dict) or "TTP" not in table:
        raise CryptenChanged(f"crypten.mpc has no provider table {PROVIDER_TABLE} with a TTP entry")
    lookup = crypten_mpc.get_default_provider
    if lookup.__globals__ is not vars(crypten_mpc) or PROVIDER_TABLE not in lookup.__code__.co_names:
        raise CryptenChanged(f"crypten.mpc.get_default_provider no longer reads {PROVIDER_TABLE}")
    return table


def provider(name: str) -> Any:
    """The provider CrypTen serves under ``name``."""
    return _providers()[name]


def use_provider(name: str, replacement: Any) -> Callable[[], None]:
    """Serve ``replacement`` as CrypTen's provider ``name``; returns what puts the
    previous one back."""
    table = _providers()
    if name not in table:
        raise CryptenChanged(f"CrypTen has no provider {name!r}")
    previous = table[name]
    table[name] = replacement

    def restore() -> None:
        if _providers()[name] is replacement:
            _providers()[name] = previous

    return restore


# -- 5. the communicator slot --------------------------------------------------------------------


def use_communicator(communicator: Communicator) -> Callable[[], None]:
    """Make ``communicator`` the one ``crypten.communicator.get()`` returns; returns
    what empties the slot. Refuses (and leaves the slot empty) if CrypTen would not
    return it: CrypTen's in-process thread mode is on, or no default process group
    exists."""
    if "instance" not in vars(DistributedCommunicator):
        raise CryptenChanged("DistributedCommunicator has no instance slot")
    DistributedCommunicator.instance = communicator
    if not crypten_comm.is_initialized() or crypten_comm.get() is not communicator:
        DistributedCommunicator.instance = None
        raise ProtocolError(
            "CrypTen does not use securevfl's communicator (crypten.communicator.get() returns "
            "another: CrypTen's in-process thread mode is on, or torch.distributed has no default "
            "process group)"
        )

    def release() -> None:
        if DistributedCommunicator.instance is communicator:
            DistributedCommunicator.instance = None

    return release
