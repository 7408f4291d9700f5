"""The two-party homomorphic protocol that ``ckks`` and ``paillier`` share.

- :mod:`.scheme`      what a scheme supplies: keys, the peer's public view, the scheme
  with its options, the arithmetic of what the protocol handles in the clear;
- :mod:`.protocol`    the interactive layer between A and each passive party (the
  protocol, its start and its re-drawn shares, described there);
- :mod:`.messages`    the protocol's messages and their payload kinds;
- :mod:`.backend`     an exchange backend made from a scheme;
- :mod:`.bounds`      every encrypted operand brought within the bound a scheme is sized for;
- :mod:`.orthogonal`  the factors of the private start of W_i.

A scheme package (:mod:`securevfl.exchange.ckks`, :mod:`securevfl.exchange.paillier`)
implements :mod:`.scheme` and makes its backend with :mod:`.backend`; nothing here
imports a scheme.
"""
