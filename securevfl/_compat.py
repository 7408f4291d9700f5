"""Compatibility shim that lets CrypTen 0.4.1 import on torch 2.x.

CrypTen 0.4.1 (its last release) imports ``torch.onnx._internal.registration`` at
module load, for its ONNX model converter; torch 2.x no longer has that module. We
register an empty stand-in module *before* ``import crypten``. Only CrypTen's
``from_pytorch``/``from_onnx`` converters would touch it; securevfl builds MPC
computations from CrypTen tensors directly and never calls those converters, so
MPC tensors, autograd, ``crypten.nn`` and multiprocess runs work unchanged.

securevfl's modules take CrypTen from :mod:`securevfl.exchange.mpc.crypten.api`, which
installs the shim before its imports; :func:`import_crypten` is for the rest
(``securevfl doctor``, the defenses' collective steps).
"""

from __future__ import annotations

import sys
import types
from typing import Any

_SHIM_NAME = "torch.onnx._internal.registration"


def install_crypten_shim() -> None:
    """Register the stand-in module if torch does not provide the real one."""
    if _SHIM_NAME in sys.modules:
        return
    try:
        __import__(_SHIM_NAME)
    except ImportError:
        stub = types.ModuleType(_SHIM_NAME)
        stub.__doc__ = "securevfl stand-in: CrypTen's ONNX converter is not used."
        stub.registry = None  # type: ignore[attr-defined]
        sys.modules[_SHIM_NAME] = stub


def import_crypten() -> Any:
    """Import and return the ``crypten`` module with the shim in place."""
    install_crypten_shim()
    # Local on purpose: the shim must be in sys.modules before CrypTen's module code
    # runs, and importing CrypTen (heavy, with module-level set-up of its own) is paid
    # only by processes that use the mpc backend or its collectives.
    import crypten

    return crypten
