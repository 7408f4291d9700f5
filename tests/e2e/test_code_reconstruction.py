"""docs/methods/hashvfl.md §8.2 item 17 over a real launcher run: inverting individual records'
continuous pre-Sign values (the upper bound of §5.2 [C], ``mode: sample``) gets
clearly closer to the images than inverting the class codes A received (the
paper's attack), on the same hashed digits run. Every metric of §5.3 agrees."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.test_hashvfl_runs import _hashed
from tests.support.protocols import small_digits
from tests.support.runs import run_doc

SHAPE = [8, 4]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_continuous_inversion_beats_class_code_inversion(tmp_path: Path) -> None:
    """16-bit codes (the paper's security setting), 5 epochs, seed 0. Measured:
    class codes SSIM 0.328, DCOR 0.561, KLD 0.849; continuous, attack seeds 0 / 1:
    SSIM 0.458 / 0.423, DCOR 0.683 / 0.667, KLD 0.568 / 0.597 (at d = 4: 0.049
    against 0.115 / 0.120). Both stay below the average training image's SSIM
    (0.53-0.60) with these inversion settings (docs/attacks.md)."""
    doc = _hashed(small_digits(epochs=5, batch_size=64), bits=16)
    doc["attacks"] = [
        {"name": "code_reconstruction", "params": {"image_shape": SHAPE}},
        {"name": "code_reconstruction", "params": {"image_shape": SHAPE, "mode": "sample", "label": "upper"}},
    ]
    att = run_doc(doc, tmp_path)["attacks"]
    codes, upper = att["code_reconstruction"], att["upper"]
    assert codes["binary_codes"] is True
    assert upper["n_records"] == 20 and upper["used"]["input"].startswith("declared prior")
    print({k: (round(codes[k], 3), round(upper[k], 3)) for k in ("ssim", "dcor", "kld")})
    assert upper["ssim"] > codes["ssim"] + 0.05
    assert upper["dcor"] > codes["dcor"]
    assert upper["kld"] < codes["kld"]
