"""What the doctor says: findings, their severities, and the one that comes first.

A :class:`Finding` names what a rule saw (``name``), how bad it is
(``severity``: ``"fault"``, the run is not learning what it should, for this
reason; ``"warning"``, it may not be; ``"note"``, nothing to change, but worth
knowing), the evidence (steps and values), the chapter that explains it and what
to change. When faults co-occur, one is **primary**: the one most likely to have
caused the others (:data:`CAUSE_ORDER`): a non-finite loss ruins every number after
it; a reward that pays the wrong thing, or reads the answer too strictly, makes
every group look too hard; a budget too short does the same; a learning rate too
high collapses entropy and flattens the reward. The primary finding is the first
fault in that order (a warning, when there is no fault).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

__all__ = ["CAUSE_ORDER", "Finding", "SEVERITIES", "Skipped", "choose_primary"]

SEVERITIES = ("fault", "warning", "note")

#: Causes first, symptoms last: the primary finding is the first fault (else warning) in this order.
CAUSE_ORDER = (
    "non_finite",
    "reward_bug",
    "extraction_mismatch",
    "sampler_mismatch",
    "kl_explosion",
    "lr_too_high",
    "truncation",
    "tool_never_called",
    "format_only",
    "zero_variance_too_hard",
    "zero_variance_too_easy",
    "entropy_collapse",
    "plateau",
)


@dataclass(frozen=True)
class Finding:
    """One thing the doctor saw in a run.

    Attributes:
        name: the rule's name (:data:`CAUSE_ORDER`, or a note's: ``loss_near_zero``, ``mastered``, ...).
        severity: ``"fault"``, ``"warning"`` or ``"note"``.
        summary: one sentence, with the numbers.
        evidence: the steps and values it rests on (plain JSON values).
        chapter: where the book explains it (``"chapter 13, section 13.4"``).
        fix: what to change, in the config's own field names.
        primary: the finding to act on first (:func:`choose_primary`).
    """

    name: str
    severity: str
    summary: str
    evidence: dict = field(default_factory=dict)
    chapter: str = ""
    fix: str = ""
    primary: bool = False

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity must be one of {SEVERITIES}, got {self.severity!r}")

    def to_dict(self) -> dict[str, Any]:
        """The finding as ``--json`` prints it."""
        out = asdict(self)
        return {k: out[k] for k in ("name", "severity", "primary", "summary", "evidence", "chapter", "fix")}

    def line(self) -> str:
        """One line for a console: severity, name, summary (the fix and chapter on the lines below it)."""
        mark = " (primary)" if self.primary else ""
        text = f"{self.severity.upper():8s}{self.name}{mark}: {self.summary}"
        if self.fix:
            text += f"\n          fix: {self.fix}"
        if self.chapter:
            text += f"\n          see: {self.chapter}"
        return text


@dataclass(frozen=True)
class Skipped:
    """A rule that could not run on this run: ``check`` needs ``needs`` (history keys, completions, settings)."""

    check: str
    needs: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"check": self.check, "needs": list(self.needs)}


def _rank(finding: Finding) -> tuple[int, int]:
    order = CAUSE_ORDER.index(finding.name) if finding.name in CAUSE_ORDER else len(CAUSE_ORDER)
    return (SEVERITIES.index(finding.severity), order)


def choose_primary(findings: Sequence[Finding]) -> list[Finding]:
    """``findings`` sorted with the primary first (marked ``primary=True``): the first fault in
    :data:`CAUSE_ORDER`, else the first warning; notes are never primary. The rest follow, faults first."""
    ordered = sorted(findings, key=_rank)
    if not ordered or ordered[0].severity == "note":
        return ordered
    first = ordered[0]
    return [Finding(**{**asdict(first), "primary": True}), *ordered[1:]]
