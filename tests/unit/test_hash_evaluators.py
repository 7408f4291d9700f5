"""The white-box HashVFL evaluators' pure functions (docs/methods/hashvfl.md §2.9, §5.5, §5.6,
§8.2 items 10 and 18): the rebuilt server function, the pre-Sign value, targeted
PGD (the no-flip property below the radius, a float-embedding positive control,
the code-perturbation asymmetry at omega = 1), the Table VI enumeration on a case
computed by hand, flag rates, and the load-time refusal of code_detection."""

from __future__ import annotations

import pytest
import torch

from securevfl.app.loader import load_protocol_dict
from securevfl.attacks.code_detection import all_codes, flag_rates, hamming_pm1, table_vi, to_pred_distance
from securevfl.attacks.server import ServerModel
from securevfl.attacks.targeted_pgd import bn_eval, pick_rows, presign_values, targeted_pgd
from securevfl.errors import UnsupportedCombination
from securevfl.models import Top
from securevfl.privacy import hashing
from tests.support.protocols import small_digits


def _server(d: int = 4, classes: int = 5, hidden: int = 16, seed: int = 0) -> ServerModel:
    torch.manual_seed(seed)
    from securevfl.config import TopSpec

    top = Top(TopSpec(hidden=[]), hidden, classes)
    blocks = [torch.randn(hidden, d), torch.randn(hidden, d)]
    return ServerModel(top.eval(), torch.randn(hidden), blocks)


def test_server_model_is_the_concatenated_first_layer_then_top():
    s = _server()
    a, b = torch.randn(7, 4), torch.randn(7, 4)
    w = torch.cat(s.blocks, 1)  # out x (d_1 + d_2): the paper's Linear(N d, 16)
    ref = s.top(torch.cat([a, b], 1) @ w.T + s.bias)
    assert torch.allclose(s([a, b]), ref, atol=1e-5)
    with pytest.raises(ValueError, match="2 interactive blocks"):
        s([a])


def test_server_model_adds_the_active_partys_own_part_per_row():
    s = _server()
    off = torch.randn(10, 16)
    s2 = ServerModel(s.top, s.bias, s.blocks, off)
    a, b = torch.randn(3, 4), torch.randn(3, 4)
    rows = torch.tensor([1, 5, 9])
    ref = s.top(a @ s.blocks[0].T + b @ s.blocks[1].T + off[rows] + s.bias)
    assert torch.allclose(s2([a, b], rows), ref, atol=1e-6)
    with pytest.raises(ValueError, match="test rows"):
        s2([a, b])


def test_bn_eval_matches_batchnorm1d_in_eval_mode():
    torch.manual_seed(1)
    bn = torch.nn.BatchNorm1d(4)
    bn.train()
    for _ in range(5):
        bn(torch.randn(32, 4) * 3 + 1)
    with torch.no_grad():
        bn.weight.mul_(1.7)
        bn.bias.add_(0.3)
    bn.eval()
    h = torch.randn(9, 4)
    assert torch.allclose(bn_eval(h, bn.state_dict()), bn(h).detach(), atol=1e-6)


def test_presign_values_sign_is_the_hash_for_each_profile():
    torch.manual_seed(2)
    bn = torch.nn.BatchNorm1d(4)
    bn(torch.randn(64, 4) * 2)
    bn.eval()
    h = torch.randn(30, 4).exp()  # skewed units
    st = {k: v.detach() for k, v in bn.state_dict().items()}
    u = bn(h).detach()
    # faithful: Sign(BN_eval(h))
    v = presign_values(h, [st], batchnorm=True)
    assert torch.equal(hashing.sign(v), hashing.sign(u))
    # no BN: Sign(h)
    assert torch.equal(presign_values(h, [], batchnorm=False), h)
    # median, batch: Sign(u - column median of u): exactly half +1 per bit (30 distinct rows)
    vb = presign_values(
        h, [st, {"running": torch.zeros(4)}], batchnorm=True, balance="median", balance_eval="batch"
    )
    assert torch.equal(hashing.sign(vb), hashing.median_sign_ste(u, hashing.column_median(u)))
    assert torch.equal((hashing.sign(vb) > 0).sum(0), torch.full((4,), 15))
    # median, running: Sign(u - BN_eval(running median))
    m = torch.tensor([0.5, 1.0, 1.5, 2.0])
    vr = presign_values(h, [st, {"running": m}], batchnorm=True, balance="median", balance_eval="running")
    assert torch.allclose(vr, u - bn(m[None]).detach()[0], atol=1e-6)


def _toy_attack(d: int = 4, n: int = 200, seed: int = 3):
    s = _server(d=d, seed=seed)
    other = hashing.sign(torch.randn(n, d))
    v = torch.randn(n, d)

    def f(sub: torch.Tensor) -> torch.Tensor:
        return s([other, sub])

    return f, v


@pytest.mark.parametrize("eta", [0.1, 1.0, 5.0])
def test_pgd_below_the_smallest_presign_magnitude_changes_nothing(eta: float):
    """docs/methods/hashvfl.md §8.2 item 18: |phi| < min |v~| per record -> same codes, same
    predictions, 0% ASR, however large the step; a larger radius does flip bits."""
    f, v = _toy_attack()
    target = 0
    clean = hashing.sign(v)
    pred0 = f(clean).argmax(1)
    radius = 0.99 * v.abs().min(1, keepdim=True).values
    adv = targeted_pgd(f, v, target, omega=radius, eta=eta, iterations=30, binary=True)
    assert torch.equal(adv, clean)
    pred = f(adv).argmax(1)
    assert torch.equal(pred, pred0)
    assert float(((pred == target) & (pred0 != target)).float().sum()) == 0
    # control: a radius above every |v~| lets the attack flip bits and win records
    big = targeted_pgd(f, v, target, omega=float(v.abs().max()) + 1, eta=eta, iterations=30, binary=True)
    assert (big != clean).any()
    assert int((f(big).argmax(1) == target).sum()) > int((pred0 == target).sum())


def test_pgd_on_float_embeddings_with_a_large_radius_reaches_the_target():
    """Positive control (no hashing): with a large radius the targeted attack
    moves nearly every record to y_t = 0, which no record is predicted as before.
    (The attacker's 16 units span the server's 16 hidden units here; with a random
    top some class can still be out of reach: class 2 of this toy tops out at 49%.)"""
    f, v = _toy_attack(d=16)
    target = 0
    pred0 = f(v).argmax(1)
    adv = targeted_pgd(f, v, target, omega=10.0, eta=0.5, iterations=40, binary=False)
    assert int((pred0 == target).sum()) == 0
    assert float((f(adv).argmax(1) == target).float().mean()) >= 0.95
    assert float((adv - v).abs().max()) <= 10.0 + 1e-5


def test_pgd_respects_the_radius_and_code_mode_cannot_flip_plus_one_at_omega_one():
    """x_M stays within omega of x_0; perturbing the +-1 code itself with omega = 1,
    a +1 bit stays +1 (x in [0, 2], Sign(0) = +1) while a -1 bit may reach 0 -> +1."""
    f, v = _toy_attack()
    code = hashing.sign(v)
    adv = targeted_pgd(f, code, 0, omega=1.0, eta=1.0, iterations=10, binary=True)
    assert bool((adv[code > 0] == 1).all())
    assert bool((adv[code < 0] == 1).any())  # some -1 bits were pushed to 0 -> +1


def test_pick_rows_excludes_the_target_and_is_seeded():
    y = torch.arange(50) % 5
    rows = pick_rows(y.numpy(), 0, 20, seed=4)
    assert len(rows) == 20 and len(set(rows.tolist())) == 20 and (y.numpy()[rows] != 0).all()
    assert (rows == pick_rows(y.numpy(), 0, 20, seed=4)).all()
    assert len(pick_rows(y.numpy(), 0, 1000, seed=4)) == 40  # all non-target rows


def test_hamming_and_all_codes():
    codes = all_codes(3)
    assert codes.shape == (8, 3) and len({tuple(r) for r in codes.tolist()}) == 8
    assert bool(((codes == 1) | (codes == -1)).all())
    assert codes[0].tolist() == [-1, -1, -1] and codes[5].tolist() == [1, -1, 1]
    a = torch.tensor([1.0, -1, 1, 1])
    b = torch.tensor([-1.0, -1, -1, 1])
    assert float(hamming_pm1(a, b)) == 2
    x, y = hashing.sign(torch.randn(50, 6)), hashing.sign(torch.randn(50, 6))
    assert torch.equal(hamming_pm1(x, y), hashing.hamming(x, y))


def _by_b_sum(pair: list[torch.Tensor]) -> torch.Tensor:
    """Toy server: class 0 if B's bits sum >= 0, else class 1 (A ignored)."""
    b = pair[1]
    return torch.stack([b.sum(1), -b.sum(1) - 0.5], 1)


def test_table_vi_on_a_case_computed_by_hand():
    """o_0 = [1, 1], o_1 = [-1, -1], B enumerated over 4 codes.
    Class 0: B sums -2, 0, 0, 2 -> predictions 1, 0, 0, 0; correct Ham to A = 1, 1, 0
    (mean 2/3), wrong Ham 2. Class 1: only B = [-1, -1] is predicted 1 (Ham 0);
    wrong Ham 1, 1, 2 (mean 4/3)."""
    codes = torch.tensor([[1.0, 1.0], [-1.0, -1.0]])
    t = table_vi(_by_b_sum, codes, fixed=0)
    c0, c1 = t["per_class"]
    assert c0["correct"] == pytest.approx(2 / 3) and c0["wrong"] == 2.0
    assert (c0["n_correct"], c0["n_wrong"]) == (3, 1)
    assert c1["correct"] == 0.0 and c1["wrong"] == pytest.approx(4 / 3)
    assert t["average"]["correct"] == pytest.approx(1 / 3)
    assert t["average"]["wrong"] == pytest.approx(5 / 3)
    assert t["pooled"]["correct"] == pytest.approx(0.5) and t["pooled"]["wrong"] == pytest.approx(1.5)
    # fixed = 1: A is the second argument, so the toy server now reads A, the fixed code:
    # class 0 (A = [1, 1]) always predicted 0 -> no wrong group ('-'), class 1 always 1
    t1 = table_vi(_by_b_sum, codes, fixed=1)
    assert t1["per_class"][0]["wrong"] is None and t1["per_class"][0]["n_correct"] == 4
    assert t1["per_class"][1]["wrong"] is None
    assert t1["average"]["wrong"] is None and t1["average"]["correct"] == pytest.approx(1.0)


def test_flag_rates_and_the_o_n_detector():
    dist = torch.tensor([0.0, 1, 2, 2, 4])
    assert flag_rates(dist, [0, 1, 2, 3, 4]) == pytest.approx([0.8, 0.6, 0.2, 0.2, 0.0])
    o = torch.tensor([[1.0, 1, 1, 1]])
    a = torch.tensor([[1.0, 1, 1, -1]])
    b = torch.tensor([[-1.0, -1, -1, 1]])
    assert to_pred_distance([a, b], o).tolist() == [3.0]  # max(Ham(a, o) = 1, Ham(b, o) = 3)


def test_code_detection_is_refused_at_load_without_codes():
    doc = small_digits()
    doc["attacks"] = [{"name": "code_detection"}]
    with pytest.raises(UnsupportedCombination, match="float embeddings") as exc:
        load_protocol_dict(doc)
    assert exc.value.path == "attacks[0]"
    doc["attacks"] = [{"name": "targeted_pgd", "params": {"party": "right"}}]
    load_protocol_dict(doc)  # PGD needs no hashing: the paper's "Base" column
