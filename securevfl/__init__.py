"""securevfl: secure vertical federated learning.

Parties hold different columns of the same rows and train one split model, each as
its own OS process. The embedding exchange is pluggable (``plain`` here; secret
sharing and homomorphic backends plug into the same seam), and defenses and attacks
are registered by name. See README.md and SECURITY.md.
"""

__version__ = "0.1.0"
