"""Re-audit a finished run's DP mechanisms from its saved models, without retraining
(``securevfl audit RUN``; docs/privacy.md, "The audit").

Every party rank's defense stack is rebuilt from the run's protocol and its saved model
(``OUT/ranks/rank<R>/model``) as a prediction rebuilds it: its trained state back, its secret
streams under fresh noise keys (never the run's, and never a pinned ``privacy.noise_seed``'s).
The plan is the run's (its steps and training rows, from ``result.json``), an assumed
boundary's released scale is the power-of-two bucket the party saved with its model
(``audit.json``), and :func:`~securevfl.privacy.audit.audit_stack` audits each mechanism.
The local launcher's user holds every rank's folder, as ``securevfl predict`` assumes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from securevfl import jsonfile
from securevfl.app.checkpoints import load_model
from securevfl.app.model_io import run_protocol
from securevfl.app.rank_layout import layout_of
from securevfl.csprng import SecretStream
from securevfl.defenses.base import build_stack
from securevfl.errors import CheckpointError, ConfigError
from securevfl.parties.state import join_components
from securevfl.privacy.audit import AuditRecord, audit_stack
from securevfl.privacy.step_budget import plan_for
from securevfl.report.result import RESULT_FILE


@dataclass(frozen=True)
class PartyAudit:
    party: str
    records: list[AuditRecord]


def _result(run_dir: Path) -> dict[str, Any]:
    if not run_dir.is_dir():
        raise ConfigError(f"{run_dir} is not a folder (securevfl audit reads a finished run's output folder)")
    path = run_dir / RESULT_FILE
    try:
        doc = jsonfile.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(
            f"{run_dir} holds no {RESULT_FILE}: not the output folder of a finished run"
        ) from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path} cannot be read as JSON ({exc})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("train_steps"), int):
        raise ConfigError(f"{path}: field 'train_steps' is missing: not a run's result")
    return doc


def audit_run(
    run_dir: Path, *, trials: int | None = None, confidence: float | None = None
) -> list[PartyAudit]:
    """Audit every party's mechanisms of the finished run in ``run_dir`` (module docstring);
    ``trials`` / ``confidence`` default to the run's ``privacy.audit``."""
    run_dir = Path(run_dir)
    result = _result(run_dir)
    checked = run_protocol(run_dir)
    proto = checked.protocol
    opts = proto.privacy.audit
    trials = opts.trials if trials is None else trials
    confidence = opts.confidence if confidence is None else confidence
    if trials < 4:
        raise ConfigError(f"--trials must be at least 4, got {trials}", path="--trials")
    if not 0 < confidence < 1:
        raise ConfigError(f"--confidence must lie in (0, 1), got {confidence}", path="--confidence")
    n_train = (result.get("rows") or {}).get("train")
    if not isinstance(n_train, int):
        raise ConfigError(f"{run_dir / RESULT_FILE}: field 'rows.train' is missing")
    plan = plan_for(int(result["train_steps"]), n_train, proto.training)
    layout = layout_of(checked)
    out = []
    for role in layout.roles:
        if role.kind == "helper":
            continue
        spec = proto.parties.active if role.kind == "active" else proto.parties.passive[role.index]
        if not spec.defenses:
            continue
        saved = load_model(run_dir, role.rank, protocol_digest=proto.digest_mismatch)
        fresh = [SecretStream.fresh().state() for _ in spec.defenses]  # never the run's keys
        stack = build_stack(proto, checked.components, spec.name, role.kind, spec.defenses, noise_keys=fresh)
        try:
            states = join_components(saved.tensors.get("defenses", []), saved.docs.get("defenses", []))
            stack.restore_trained(states)
            models = saved.tensors.get("models", {})
            for m, sd in zip(stack.modules(), models.get("defense_modules", []), strict=False):
                m.load_state_dict(sd)
        except (KeyError, TypeError, ValueError, RuntimeError) as exc:
            raise CheckpointError(f"rank {role.rank}: its saved defense state is malformed ({exc})") from None
        if not stack.mechanisms(plan):
            continue
        released = (saved.docs.get("audit") or {}).get("released_scale") or {}
        records = audit_stack(
            stack, plan, delta=proto.privacy.delta, trials=trials, confidence=confidence, released=released
        )
        out.append(PartyAudit(spec.name, records))
    return out


def _eps(v: float) -> str:
    return "inf" if v == float("inf") else f"{v:.3f}"


def audit_table(audits: list[PartyAudit]) -> list[str]:
    """One line per record: party, mechanism, basis, claim, eps claimed per release, eps lower,
    method, trials, verdict."""
    head = ("party", "mechanism", "basis", "claim", "eps/release", "eps lower", "method", "trials", "verdict")
    rows = [
        (
            a.party,
            r.mechanism,
            r.basis,
            r.claim,
            _eps(r.per_release),
            _eps(r.epsilon_lower) if r.method != "none" else "-",
            r.method,
            str(r.trials),
            r.verdict,
        )
        for a in audits
        for r in a.records
    ]
    widths = [max(len(x) for x in col) for col in zip(head, *rows, strict=False)]
    return ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in (head, *rows)]


def violation_lines(audits: list[PartyAudit]) -> list[str]:
    """A warning per refuted claim: a sound one (the accountant's figure does not hold for
    the code as it ran) and, said as such, a nominal one."""
    out = []
    for a in audits:
        for r in a.records:
            if r.verdict != "violated":
                continue
            what = "the accountant's (sound) claim" if r.claim == "sound" else "the paper's (nominal) claim"
            out.append(
                f"party '{a.party}', mechanism '{r.mechanism}' ({r.basis}): the audit's lower bound "
                f"eps >= {_eps(r.epsilon_lower)} exceeds {what} of {_eps(r.per_release)} per release "
                f"(confidence {r.confidence:g}, {r.trials} trials)"
            )
    return out


def from_result(result: dict[str, Any]) -> list[PartyAudit]:
    """The audit records ``result.json`` holds, per party."""
    parties = (result.get("privacy") or {}).get("parties") or {}
    return [
        PartyAudit(name, [AuditRecord.from_json(r) for r in entry.get("audit") or []])
        for name, entry in parties.items()
        if entry.get("audit")
    ]
