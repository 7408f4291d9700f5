"""The randomness rule (docs/design.md §13, SECURITY.md "Randomness and masking").

Secret randomness (shares, triples, masks, weight-share initialisation, every DP
and defense noise) comes from :mod:`securevfl.csprng` alone. This test reads every
module of the package and fails on any draw from a non-cryptographic generator
(``torch.Generator`` and torch's samplers, ``numpy.random``, ``random``, the
seeded helpers of :mod:`securevfl.seeding`) and on any direct use of OS entropy
(``secrets``, ``os.urandom``) outside the allowlists below, each entry with the
reason it protects nothing secret (reproducibility randomness: data splits,
batch order, model initialisation, public class codes, benchmark inputs, the
attacker's own randomness) or why OS entropy is drawn directly there. One place
draws a secret through torch's generator on purpose: a private model
initialisation runs a model's own initialisation code with the generator in a
state drawn whole from a secret stream (:data:`KEYED`, and its own tests).
"""

from __future__ import annotations

import ast
import fnmatch
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "securevfl"

#: (module path relative to the package's parent, enclosing function or "*") -> why a
#: non-cryptographic generator is right there. Nothing listed here touches a secret.
REPRODUCIBLE: dict[tuple[str, str], str] = {
    ("securevfl/seeding.py", "*"): "the reproducibility helpers themselves (named seeds for splits, "
    "batch order and model initialisation; never handed a secret)",
    ("securevfl/schedule.py", "train_batches"): "batch order: a public function of the shared seed",
    ("securevfl/parties/common.py", "*"): "the train/test split: a public function of the shared seed",
    ("securevfl/data/splits.py", "*"): "dataset splits and the synthetic data generator's values",
    ("securevfl/data/party_data.py", "*"): "row order of a party's own data (public to that party)",
    ("securevfl/models.py", "*"): "model initialisation under a named seed (plaintext models)",
    ("securevfl/parties/state.py", "*"): "saving/restoring torch's and numpy's global generators "
    "(model initialisation, dropout) in a party's checkpoint",
    ("securevfl/snapshot.py", "*"): "type checks when a component's generator states are checkpointed",
    ("securevfl/privacy/hashing.py", "random_codes"): "HashVFL class codes: every party derives them "
    "from the shared seed by design (docs/methods/hashvfl.md); public",
    ("securevfl/privacy/hashing.py", "balanced_codes"): "HashVFL class codes (public, shared seed)",
    ("securevfl/defenses/hashvfl/consistency.py", "*"): "HashVFL class codes (public, shared seed)",
    ("securevfl/privacy/dcor.py", "*"): "the permutation baseline of a distance-correlation metric "
    "(a report figure; releases nothing)",
    ("securevfl/defenses/dravl.py", "_EvalProbe.*"): "the evaluation probe's metric permutations",
    ("securevfl/defenses/dravl.py", "Dravl.reconstructor"): "the reconstructor's initialisation "
    "(a plaintext model of the party)",
    ("securevfl/defenses/_afe.py", "fcm"): "fuzzy c-means initialisation on the party's own "
    "gradients (an algorithm's start point; releases nothing)",
    ("securevfl/exchange/ckks/floor.py", "*"): "benchmark inputs of the CKKS floor (public)",
    ("securevfl/exchange/paillier/profile.py", "*"): "benchmark inputs of the Paillier profile (public)",
    ("securevfl/privacy/audit.py", "audit_mechanism"): "the auditor's canary direction: public by "
    "design (the canaries are known to the distinguisher); the noise the audited hook adds comes from "
    "the defense copy's own fresh SecretStream",
    ("securevfl/attacks/*", "*"): "the attacker's own randomness (decoders, shadow models, "
    "augmentations): it protects nothing",
}

#: where torch's generator draws a secret because its whole state was drawn from a
#: SecretStream just before (never a seed), and why that is sound
KEYED: dict[tuple[str, str], str] = {
    ("securevfl/private_init.py", "*"): "private model initialisation: all 624 words of the Mersenne "
    "Twister come from the owner's SecretStream (no seed to search), and its outputs, the initial "
    "weights, never leave the owner's rank (tests/unit/test_private_init.py)",
}

#: where OS entropy is drawn directly instead of through a secret stream, and why
OS_ENTROPY: dict[tuple[str, str], str] = {
    ("securevfl/csprng.py", "*"): "the secret streams' 256-bit keys",
    ("securevfl/runtime/session.py", "*"): "run identifiers (public)",
    ("securevfl/runtime/claims.py", "claim_record"): "claim tokens (public nonces)",
    ("securevfl/runtime/rendezvous.py", "Rendezvous.publish_nonce"): "the run nonce claims and notes are "
    "bound to (public, must be fresh)",
    ("securevfl/exchange/paillier/obfuscation.py", "*"): "Paillier obfuscators r^n mod n^2 "
    "(big integers below n from `secrets`, the OS CSPRNG)",
}

TORCH_SAMPLERS = {
    "Generator",
    "manual_seed",
    "seed",
    "rand",
    "randn",
    "randint",
    "randperm",
    "rand_like",
    "randn_like",
    "randint_like",
    "normal",
    "bernoulli",
    "multinomial",
    "poisson",
    "random",
    "fork_rng",
    "set_rng_state",
    "get_rng_state",
}
INPLACE_SAMPLERS = {
    "normal_",
    "uniform_",
    "random_",
    "bernoulli_",
    "exponential_",
    "geometric_",
    "cauchy_",
    "log_normal_",
}
SEEDING_HELPERS = {"generator", "seeded"}


@dataclass(frozen=True)
class Draw:
    module: str
    function: str
    line: int
    what: str
    kind: str  # "reproducible" (a non-cryptographic generator) or "os" (direct OS entropy)

    def where(self) -> str:
        return f"{self.module}:{self.line} in {self.function}: {self.what}"


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


class _Scanner(ast.NodeVisitor):
    def __init__(self, module: str):
        self.module = module
        self.stack: list[str] = []
        self.found: list[Draw] = []
        self.aliases: dict[str, str] = {}  # local name -> what it stands for

    def _add(self, node: ast.AST, what: str, kind: str = "reproducible") -> None:
        fn = ".".join(self.stack) or "<module>"
        self.found.append(Draw(self.module, fn, getattr(node, "lineno", 0), what, kind))

    # scopes (annotations name types, they draw nothing: not visited)
    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self.stack.append(node.name)
        for child in [*node.decorator_list, *node.args.defaults, *node.args.kw_defaults, *node.body]:
            if child is not None:
                self.visit(child)
        self.stack.pop()

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self.visit(node.value)

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.stack.append(node.name)
        self.generic_visit(node)
        self.stack.pop()

    # imports
    def visit_Import(self, node: ast.Import) -> None:
        for a in node.names:
            local = a.asname or a.name.split(".")[0]
            self.aliases[local] = a.name if a.asname else a.name.split(".")[0]
            if a.name == "random" or a.name.startswith("numpy.random"):
                self._add(node, f"import {a.name}")

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        mod = node.module or ""
        for a in node.names:
            local = a.asname or a.name
            self.aliases[local] = f"{mod}.{a.name}"
            if mod == "random" or mod.startswith("numpy.random") or (mod == "numpy" and a.name == "random"):
                self._add(node, f"from {mod} import {a.name}")
            elif mod == "torch" and a.name in TORCH_SAMPLERS:
                self._add(node, f"from torch import {a.name}")
            elif mod == "secrets" or (mod == "os" and a.name == "urandom"):
                self._add(node, f"from {mod} import {a.name}", "os")

    # uses
    def visit_Attribute(self, node: ast.Attribute) -> None:
        name = _dotted(node)
        if name is not None:
            head, _, rest = name.partition(".")
            full = f"{self.aliases.get(head, head)}.{rest}" if rest else self.aliases.get(head, head)
            if full.startswith(("numpy.random.", "np.random.")) or full == "numpy.random":
                self._add(node, name)
                return
            if full.startswith("random.") and self.aliases.get(head) == "random":
                self._add(node, name)
                return
            if full.startswith(("torch.random.", "torch.cuda.manual_seed")):
                self._add(node, name)
                return
            if full.startswith("torch.") and full.count(".") == 1 and full.split(".")[1] in TORCH_SAMPLERS:
                self._add(node, name)
                return
            if full.startswith("secrets.") or full == "os.urandom":
                self._add(node, name, "os")
                return
        if node.attr in INPLACE_SAMPLERS:
            self._add(node, f".{node.attr}")
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if (
            isinstance(func, ast.Name)
            and func.id in SEEDING_HELPERS
            and self.aliases.get(func.id, "").startswith("securevfl.seeding.")
        ):
            self._add(node, f"{func.id}(...)")
        self.generic_visit(node)


def scan_source(module: str, source: str) -> list[Draw]:
    s = _Scanner(module)
    s.visit(ast.parse(source))
    return s.found


def scan_package() -> list[Draw]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = path.relative_to(PACKAGE.parent).as_posix()
        out += scan_source(module, path.read_text())
    return out


def _listed(d: Draw, table: dict[tuple[str, str], str]) -> tuple[str, str] | None:
    for mod, fn in table:
        if fnmatch.fnmatch(d.module, mod) and (fn == "*" or fnmatch.fnmatch(d.function, fn)):
            return (mod, fn)
    return None


@pytest.fixture(scope="module")
def draws() -> list[Draw]:
    return scan_package()


def test_no_secret_draw_outside_the_cryptographic_generator(draws):
    unlisted = [
        d
        for d in draws
        if d.kind == "reproducible" and _listed(d, REPRODUCIBLE) is None and _listed(d, KEYED) is None
    ]
    assert not unlisted, (
        "non-cryptographic randomness outside the allowlist (secret randomness must come from "
        "securevfl.csprng; if this draw protects nothing, list it with the reason):\n"
        + "\n".join(d.where() for d in unlisted)
    )


def test_os_entropy_is_drawn_directly_only_where_listed(draws):
    unlisted = [d for d in draws if d.kind == "os" and _listed(d, OS_ENTROPY) is None]
    assert not unlisted, "direct OS entropy outside the allowlist:\n" + "\n".join(d.where() for d in unlisted)


def test_every_allowlist_entry_is_still_needed(draws):
    for table, kind in ((REPRODUCIBLE, "reproducible"), (KEYED, "reproducible"), (OS_ENTROPY, "os")):
        used = {_listed(d, table) for d in draws if d.kind == kind}
        stale = [k for k in table if k not in used]
        assert not stale, f"allowlist entries that match nothing (remove them): {stale}"


MT_IN_A_SECRET_MODULE = """
import torch

class PairRole:
    def _init_weight(self, shape):
        g = torch.Generator().manual_seed(5)
        return torch.randn(shape, generator=g)
"""

NUMPY_MASK = """
import numpy as np

def mask(shape):
    return np.random.default_rng().uniform(-1, 1, size=shape)
"""

IMPORTED_SAMPLERS = """
from random import getrandbits
from torch import randint
from securevfl.seeding import generator

def noise(seed, n):
    return randint(0, 2, (n,), generator=generator(seed, "x")), getrandbits(8)
"""


@pytest.mark.parametrize(
    ("module", "source", "expect"),
    [
        ("securevfl/exchange/mpc/pairwise.py", MT_IN_A_SECRET_MODULE, {"torch.Generator", "torch.randn"}),
        ("securevfl/exchange/he/protocol.py", NUMPY_MASK, {"np.random.default_rng"}),
        (
            "securevfl/defenses/label_dp.py",
            IMPORTED_SAMPLERS,
            {"from random import getrandbits", "from torch import randint", "generator(...)"},
        ),
    ],
)
def test_the_rule_catches_a_planted_draw(module, source, expect):
    found = scan_source(module, source)
    assert expect <= {d.what for d in found}
    assert all(_listed(d, REPRODUCIBLE) is None for d in found)


def test_a_listed_module_is_not_a_blanket_pass():
    # the HashVFL codes entry covers its code functions only, not a noise function beside them
    found = scan_source(
        "securevfl/privacy/hashing.py", "import torch\ndef flip(n):\n    return torch.rand(n)\n"
    )
    assert [_listed(d, REPRODUCIBLE) for d in found] == [None]
