"""CrypTen, imported once with securevfl's shim in place, for the modules that use it.

Every securevfl module that calls into CrypTen takes what it needs from here, at
the top of the module. CrypTen 0.4.1 must not be imported before
:func:`securevfl._compat.install_crypten_shim` has run (its module code imports a
torch module that torch 2.x removed), which is why the CrypTen imports below come
after that call rather than first in the file.

Only the ``mpc`` backend's modules import this module (and, through their options,
the CRDP defense); securevfl's registries load those by name on first use, so a
process that runs no MPC never imports CrypTen (tests/unit/test_registry.py). The
defenses' collective steps still call :func:`securevfl._compat.import_crypten`.
"""

from __future__ import annotations

from securevfl._compat import install_crypten_shim

install_crypten_shim()

# CrypTen from here on (E402: after the shim, on purpose)
import crypten  # noqa: E402
import crypten.communicator as comm  # noqa: E402
import crypten.gradients as gradients  # noqa: E402
import crypten.mpc as mpc  # noqa: E402
import crypten.nn.privacy as privacy  # noqa: E402
from crypten.common.util import count_wraps, torch_cat  # noqa: E402
from crypten.communicator import Communicator, DistributedCommunicator  # noqa: E402
from crypten.cuda import CUDALongTensor  # noqa: E402
from crypten.mpc.primitives import ArithmeticSharedTensor, BinarySharedTensor  # noqa: E402
from crypten.mpc.provider.provider import TupleProvider  # noqa: E402

__all__ = [
    "ArithmeticSharedTensor",
    "BinarySharedTensor",
    "CUDALongTensor",
    "Communicator",
    "DistributedCommunicator",
    "TupleProvider",
    "comm",
    "count_wraps",
    "crypten",
    "gradients",
    "mpc",
    "privacy",
    "torch_cat",
]
