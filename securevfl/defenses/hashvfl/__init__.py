"""HashVFL (docs/methods/hashvfl.md; Qiu et al., arXiv:2212.00325): passive parties send only
+-1 hash codes of their bottom-model output, and the active party pulls every
party's code toward a pre-defined code of the sample's class.

Two registered defenses, because the two halves need different things from the
exchange backend:

* ``hashvfl`` (passive): BatchNorm1d(d) -> Sign with a straight-through gradient
  (docs/methods/hashvfl.md §2.2-2.4), plus the optional DP add-on (§2.10). ``balance: median``
  (our fix for §7 item 5, not in the paper) thresholds each unit at its median
  instead of at 0, so that every bit is balanced whatever the unit's
  distribution. It only changes what the passive party computes and sends, so it
  runs under every backend. The ablations of docs/methods/hashvfl.md §8.1 are options of it too:
  ``batchnorm: false`` (w/o BN), ``quantization_weight`` (GreedyHash's
  ||V - Sign(V)||_3 as the party's local loss) and ``send: continuous`` (the
  official code's w/o-consistency arm, which sends V: not a hashed system).
* ``hashvfl_consistency`` (active): the consistency loss to the class codes
  (§2.5-2.6) and the abnormal-input detector (§2.9). Both read the codes h'_i,
  so it requires ``active_sees_embeddings`` (``plain``); under ``mpc``/``ckks``/
  ``paillier`` it is refused at load (the loss and the detector would have to be
  computed inside the secure computation, which no backend offers yet).

Threat model (docs/methods/hashvfl.md §1.2): honest-but-curious parties; the hash limits what
the active party (the paper's server, co-located with the label owner) learns
about a passive party's continuous features to d bits per sample per pass. It
does not protect the returned gradient, which carries -o_y/(N B d), a label
signal (§7 item 2), and the codes themselves encode the class (§7 item 3).

Mapping onto securevfl's split model: the paper's server top model is
Linear(N d, 16) -> ReLU -> Linear(16, C) over the concatenated codes. In
securevfl A computes z = sum_i h'_i W_i + b, which is exactly
concat(h'_1..h'_N) @ [W_1; ...; W_N] + b, i.e. the first Linear with
``interactive.out: 16``; the top model (``top.hidden: []``) is ReLU -> Linear(16, C).
The code length d is each passive party's ``model.out``.

The package: :mod:`.options` (both options models), :mod:`.passive` (``hashvfl``),
:mod:`.balance` (bit-balance statistics and the running median),
:mod:`.consistency` (``hashvfl_consistency``) and :mod:`.detector` (the
detector's math and running record). The pure code math is
:mod:`securevfl.privacy.hashing`.
"""

from securevfl.defenses.hashvfl.consistency import HashVFLConsistency
from securevfl.defenses.hashvfl.options import ConsistencyOptions, HashOptions
from securevfl.defenses.hashvfl.passive import HashVFL, MedianThreshold

__all__ = ["ConsistencyOptions", "HashOptions", "HashVFL", "HashVFLConsistency", "MedianThreshold"]
