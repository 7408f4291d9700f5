"""Writes criteo_tiny.tsv: 300 synthetic records in the Criteo Display Advertising
TSV format (label, I1..I13, C1..C26; empty fields for missing values), for the
loader's tests (docs/methods/dravl.md §4.4: CI has no network, so no real Criteo rows).

The click depends on I1, I3 (passive side) and C14 (active side), so a split model
trained on the two files has something to learn. Run from the repository root:
``python tests/data/make_criteo_tiny.py``."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def main(n: int = 300, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    vocab = [[f"{rng.integers(0, 2**32):08x}" for _ in range(6)] for _ in range(26)]
    lines = []
    for _ in range(n):
        dense = rng.poisson(lam=[3, 20, 1, 5, 800, 40, 2, 10, 60, 1, 2, 1, 6]).astype(int)
        dense[1] -= 2  # I2 can be negative
        cats = [vocab[j][min(5, int(rng.geometric(0.45)) - 1)] for j in range(26)]
        c14 = 2.0 if cats[13] == vocab[13][0] else -1.0
        logit = 2.0 * (np.log1p(dense[0]) - 1.2) - 1.5 * (np.log1p(dense[2]) - 0.6) + c14
        label = int(rng.random() < 1 / (1 + np.exp(-logit)))
        fields = [str(label), *[str(v) for v in dense], *cats]
        for j in range(1, 40):  # about 8 % missing values, as in Criteo
            if rng.random() < 0.08:
                fields[j] = ""
        lines.append("\t".join(fields))
    (Path(__file__).parent / "criteo_tiny.tsv").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
