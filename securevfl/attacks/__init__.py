"""Attacks on an adversary's view (what its rank received plus its own data,
a typed :class:`~securevfl.records.OwnView` read by field), registered by name
in ATTACKS. Importing this package registers every built-in attack by where it
lives (:meth:`~securevfl.registry.Registry.add_path`): an attack's module (and
the scikit-learn models it trains) is imported on its first lookup, which is
only in a process whose protocol runs it. :mod:`securevfl.app.harness` runs
them after training. The face itself imports nothing heavy: the attack
interface is :mod:`securevfl.attacks.base`."""

from securevfl.attacks.names import ATTACKS

ATTACKS.add_path("code_detection", "securevfl.attacks.code_detection:CodeDetection")
ATTACKS.add_path("code_reconstruction", "securevfl.attacks.code_reconstruction:CodeReconstruction")
ATTACKS.add_path("feature_reconstruction", "securevfl.attacks.feature_reconstruction:FeatureReconstruction")
ATTACKS.add_path("gradient_clusters", "securevfl.attacks.gradient_clusters:GradientClusters")
ATTACKS.add_path("label_direction", "securevfl.attacks.label_inference:LabelDirection")
ATTACKS.add_path("label_norm", "securevfl.attacks.label_inference:LabelNorm")
ATTACKS.add_path("membership_inference", "securevfl.attacks.membership:MembershipInference")
ATTACKS.add_path("model_completion", "securevfl.attacks.label_inference:ModelCompletion")
ATTACKS.add_path("online_reconstruction", "securevfl.attacks.online_reconstruction:OnlineReconstruction")
ATTACKS.add_path("targeted_pgd", "securevfl.attacks.targeted_pgd:TargetedPGD")

__all__ = ["ATTACKS"]
