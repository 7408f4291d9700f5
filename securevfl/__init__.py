"""securevfl: secure vertical federated learning.

Parties hold different columns of the same rows and train one split model, each as
its own OS process. The interactive layer's exchange is one seam with four backends
registered by name (:mod:`securevfl.exchange`): ``plain`` (in the clear), ``mpc``
(CrypTen secret sharing with a trusted dealer), ``ckks`` and ``paillier`` (two-party
homomorphic encryption). Defenses and attacks are registered by name too. See
README.md, SECURITY.md and docs/design.md.
"""

__version__ = "0.1.0"
