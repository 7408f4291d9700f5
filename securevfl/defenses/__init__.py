"""Defenses: one small class per mechanism, registered by name in DEFENSES,
applied as an ordered stack per party at the hook points of docs/design.md §5. A
defense is generic in its options model and gets the options validated at load
(:mod:`securevfl.components`); a defense that depends on what another party runs
asks :meth:`~securevfl.components.Components.options` for that party's typed
options. Larger defenses are packages of small modules (``crdp/``, ``hashvfl/``).

Importing this package registers every built-in defense by where it lives
(:meth:`~securevfl.registry.Registry.add_path`); a defense's module is imported
on its first lookup, so a process loads the defenses its protocol runs and no
others. The face itself imports nothing heavy: the defense interface is
:mod:`securevfl.defenses.base`."""

from securevfl.defenses.names import DEFENSES

DEFENSES.add_path("crdp", "securevfl.defenses.crdp.defense:Crdp")
DEFENSES.add_path("dravl", "securevfl.defenses.dravl:Dravl")
DEFENSES.add_path("gaussian_noise", "securevfl.defenses.dravl:GaussianNoise")
DEFENSES.add_path("embedding_dp", "securevfl.defenses.vfl_afe:EmbeddingDP")
DEFENSES.add_path("hashvfl", "securevfl.defenses.hashvfl.passive:HashVFL")
DEFENSES.add_path("hashvfl_consistency", "securevfl.defenses.hashvfl.consistency:HashVFLConsistency")
DEFENSES.add_path("label_dp", "securevfl.defenses.label_dp:LabelDP")

__all__ = ["DEFENSES"]
