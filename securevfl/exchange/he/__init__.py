"""The two-party homomorphic protocol that ``ckks`` and ``paillier`` share.

:mod:`.protocol` runs the interactive layer between A and each passive party with a
scheme's keys; :mod:`.orthogonal` draws the factors of the private start of W_i;
:mod:`.bounds` brings every encrypted operand within the bound a scheme is sized
for. A scheme package (:mod:`securevfl.exchange.ckks`,
:mod:`securevfl.exchange.paillier`) implements the scheme interface and makes its
backend with the protocol's factory; nothing here imports a scheme.
"""
