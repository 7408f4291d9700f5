"""``crdp``: CRDP-FL, vertically federated learning with correlated differential
privacy (docs/methods/crdp-fl.md; Zhao et al., Electronics 2022).

Threat model (docs/methods/crdp-fl.md §1): the other organisations are honest-but-curious and
try to infer records from what an organisation releases during training. The
organisation itself sees its raw rows (central DP at organisation level; the
paper's "LDP" label is wrong, §6 item 8).

Mapping onto securevfl's split model: an organisation is a passive party; the
paper's released intermediate ``Phi_k = h_k(D_k; theta_k)`` is the party's
bottom-model output ``h``, and what crosses the wire is ``h' = h + Lap(b)`` with
``b = Delta / eps3`` per element on every training step (Algorithm 5, line 9).
Under ``mpc``/``ckks``/``paillier`` that noisy ``h'`` is additionally hidden
inside the secure interactive layer. Before training, :meth:`select_features`
runs Algorithm 1 on the party's training rows (stability selection, the DP
Pearson filter with ``eps1``, the MCD-raised threshold, the exponential-mechanism
feature optimisation with ``eps2``) and keeps the chosen columns for train and
test alike. Pure math: :mod:`securevfl.privacy.correlated`,
:mod:`securevfl.privacy.feature_selection`.

Faithful defaults reproduce the paper's choices; ``variant: fixed`` (or the
individual options) switch to docs/methods/crdp-fl.md's fixes: ``pearson: strict`` (global
sensitivity 2, eps1 split over the pairs), ``delta_u: strict`` (the utility's real
sensitivity), ``sensitivity: clipped`` (each coordinate of ``h`` clipped, so the
record sensitivity ``s`` holds).

``delta_scope`` says whose columns ``Delta_CS_p`` (the noise scale) is computed
on: ``own`` (default) the party's kept columns alone; ``merged_secure`` the
merged data of every crdp party's kept columns (docs/methods/crdp-fl.md §2.5(f), Eq. 30), via the
defense's collective set-up step: match counts are additive over disjoint
column sets, so the parties secret-share their count matrices in CrypTen, the
threshold and the max row sum are taken in MPC, and only the scalar is opened
(docs/methods/crdp-fl.md §7.3; :mod:`securevfl.privacy.secure_sum`). It needs the ``mpc``
backend (CrypTen and its TTP dealer are already up there) and is refused at load
under any other backend.

The package: :mod:`.options`, :mod:`.defense` (the registered ``crdp``),
:mod:`.accounting` (its releases, pure) and :mod:`.collective` (the merged
sensitivity step).
"""

from securevfl.defenses.crdp.defense import Crdp
from securevfl.defenses.crdp.options import CrdpOptions

__all__ = ["Crdp", "CrdpOptions"]
