"""CRDP-FL's options (docs/methods/crdp-fl.md Table 1 and its [GAP] defaults)."""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import Field, field_validator

from securevfl.defenses.base import DefenseOptions


class CrdpOptions(DefenseOptions):
    """CRDP-FL's parameters (docs/methods/crdp-fl.md Table 1 and its [GAP] defaults)."""

    variant: Literal["faithful", "fixed"] = "faithful"
    eps1: float = Field(1.0, gt=0, description="Pearson-filter budget (inf: no noise)")
    eps2: float = Field(1.0, gt=0, description="exponential-mechanism budget (inf: argmax)")
    eps3: float = Field(1.0, gt=0, description="communication budget per release (inf: no noise)")
    theta: float = Field(0.5, ge=0, le=1, description="stability threshold on S_i")
    theta_per: float = Field(0.9, ge=0, le=1, description="Pearson redundancy threshold")
    w0: float = Field(0.4, ge=0, le=1, description="initial correlation threshold")
    b: float = Field(0.5, gt=0, le=1, description="candidate size as a share of beta")
    m: int = Field(10, ge=1, description="number of candidate feature sets")
    q: int = Field(10, ge=2, description="quantile bins for record correlation")
    n_subsets: int = Field(5, ge=1)
    subsets: Literal["shards", "subsamples"] = "shards"
    base_selector: Literal["pca_leverage"] = "pca_leverage"
    pca_variance: float = Field(0.9, gt=0, le=1)
    beta_includes_unimportant: bool = True
    mcd_parts: int = Field(1, ge=1, description="column parts the MCD averages over")
    utility: Literal["difference", "ratio"] = "difference"
    pearson: Literal["paper", "strict"] | None = None
    delta_u: Literal["paper", "strict"] | None = None
    sensitivity: Literal["unit", "clipped"] | None = None
    clip: float = Field(1.0, gt=0, description="coordinate clip of h when sensitivity is clipped")
    noise: Literal["correlated", "count", "plain"] = "correlated"
    feature_selection: bool = True
    noise_at_eval: bool = False
    delta_scope: Literal["own", "merged_secure"] = Field(
        "own",
        description="Delta_CS_p on the party's own kept columns, or on every crdp party's merged "
        "kept columns, computed in CrypTen MPC (mpc backend only)",
    )

    @field_validator("eps1", "eps2", "eps3", mode="before")
    @classmethod
    def _null_is_infinite(cls, v: Any) -> Any:
        """A protocol writes "no noise" as ``null`` (non-finite numbers are refused at
        load); internally it is eps = inf."""
        return math.inf if v is None else v

    def resolved(self, name: str) -> str:
        """A flaw option's value: as given, else the variant's choice."""
        value = getattr(self, name)
        if value is not None:
            return value
        fixed = {"pearson": "strict", "delta_u": "strict", "sensitivity": "clipped"}
        faithful = {"pearson": "paper", "delta_u": "paper", "sensitivity": "unit"}
        return (fixed if self.variant == "fixed" else faithful)[name]
