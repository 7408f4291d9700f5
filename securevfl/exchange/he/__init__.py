"""The two-party homomorphic protocol that ``ckks`` and ``paillier`` share.

- :mod:`.scheme`      what a scheme supplies: keys, the peer's public view, the scheme
  with its options, the arithmetic of what the protocol handles in the clear;
- :mod:`.protocol`    the interactive layer between A and each passive party (the
  protocol, its start and its re-drawn shares, described there);
- :mod:`.messages`    the protocol's messages and their payload kinds;
- :mod:`.declaration` what the HE backends declare alike (light: no torch, no scheme);
- :mod:`.roles`       the role objects of a backend made from a scheme;
- :mod:`.bounds`      every encrypted operand brought within the bound a scheme is sized for;
- :mod:`.orthogonal`  the factors of the private start of W_i.

A scheme package (:mod:`securevfl.exchange.ckks`, :mod:`securevfl.exchange.paillier`)
declares its backend with :mod:`.declaration` in its face, implements :mod:`.scheme`
and names its role objects, made with :mod:`.roles`; nothing here imports a scheme.
"""
