"""``plain``: no protection. P_i sends h'_i; A holds every W_i and computes z.

What each party learns (docs/design.md §4, SECURITY.md §2): A learns every h'_i
and z; P_i learns dL/dh'_i. This is the baseline every other backend is measured
against, and the setting in which feature-reconstruction attacks are strongest.

It is the one backend with FedBCD rounds (``training.local_steps``): A holds every
W_i in the clear, so it can recompute z from a round's embeddings alone. Under the
backends that share or encrypt W_i each local step would be an interactive round.

This face is the declaration alone (:mod:`securevfl.exchange.spec`); the role
objects, with torch, are :mod:`.roles`.
"""

from __future__ import annotations

from securevfl.exchange.spec import ExchangeBackend


class Plain(ExchangeBackend):
    """No protection: P_i sends h'_i, A holds every W_i (:mod:`.roles`)."""

    name = "plain"
    roles = "securevfl.exchange.plain.roles:PlainRoles"
    capabilities = frozenset({"active_sees_embeddings", "cuda", "local_steps"})
    description = "no protection: h'_i sent in the clear (baseline)"
