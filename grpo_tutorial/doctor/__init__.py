"""Chapter 18's doctor: read a run that is not learning, and say why.

:func:`diagnose` reads a run (this package's run folder, whole or still being
written; a trainer; TRL's ``trainer_state.json`` with the completions TRL saved;
TensorBoard events: :mod:`~grpo_tutorial.doctor.reading`), runs every rule of
:mod:`~grpo_tutorial.doctor.rules` on it, and returns a :class:`Diagnosis`:
findings (``fault``, ``warning``, ``note``), one of them primary when symptoms
co-occur (:mod:`~grpo_tutorial.doctor.findings`), and the rules it skipped for
want of what they read. It reads the completions as well as the curves: that
is what tells a cut-off answer from a long one, a format-only reward from a
correct one, a strict reading of the answer from a lenient one, a broken
reference from a hard problem.

The command line: ``python -m grpo_tutorial doctor RUN [--json]`` (exit 0: no
fault; 1: a fault; 2: a run it cannot read). The trainer's live warnings are the
same rules, run as the steps come (:func:`live_findings`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Sequence

from .findings import CAUSE_ORDER, Finding, Skipped, choose_primary
from .reading import Run, RunUnreadable, read_run, trl_rows
from .rules import RULES

__all__ = ["CAUSE_ORDER", "DOCTOR_VERSION", "LIVE_STEPS", "Diagnosis", "FAULTS", "Finding", "Run", "RunUnreadable",
           "Skipped", "diagnose", "live_findings", "live_warnings", "read_run", "trl_rows"]

#: The version of the rules (``--json``'s ``version``): it changes when a rule or a threshold does.
DOCTOR_VERSION = "3"
#: Every fault the doctor can name, causes first.
FAULTS = CAUSE_ORDER


@dataclass
class Diagnosis:
    """What the doctor concluded about one run.

    Attributes:
        run: what it read (:class:`~grpo_tutorial.doctor.reading.Run`).
        findings: primary first, then faults, warnings and notes.
        skipped: the rules it could not run, with what they needed.
    """

    run: Run
    findings: list[Finding]
    skipped: list[Skipped] = field(default_factory=list)

    @property
    def primary(self) -> Finding | None:
        return next((f for f in self.findings if f.primary), None)

    @property
    def faults(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "fault"]

    def names(self, severity: str | None = None) -> list[str]:
        return [f.name for f in self.findings if severity is None or f.severity == severity]

    @property
    def exit_code(self) -> int:
        """0 without a fault, 1 with one (2 is the command line's, for a run it cannot read)."""
        return 1 if self.faults else 0

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` form: ``version``, ``read`` (``steps``, ``partial``, ``source``, ``notes``),
        ``skipped`` and ``findings``."""
        return {
            "version": DOCTOR_VERSION,
            "read": {"steps": len(self.run.steps), "partial": self.run.partial, "source": self.run.source,
                     "last_step": self.run.steps[-1]["step"], "completions": len(self.run.completions),
                     "notes": list(self.run.notes)},
            "skipped": [s.to_dict() for s in self.skipped],
            "findings": [f.to_dict() for f in self.findings],
        }

    def text(self) -> str:
        """The verdict for a console: what was read, then each finding (primary first)."""
        where = self.run.where or "the run in memory"
        head = (f"doctor: {where}: {len(self.run.steps)} steps (to step {self.run.steps[-1]['step']}), "
                f"{len(self.run.completions)} kept completions, read as {self.run.source}"
                + (" (partial: " + "; ".join(self.run.notes) + ")" if self.run.partial else ""))
        lines = [head]
        if not self.faults:
            lines.append("no fault found" + ("" if not self.findings else ":"))
        lines += [f.line() for f in self.findings]
        if self.skipped:
            lines.append("not checked: " + ", ".join(f"{s.check} (needs {' and '.join(s.needs)})"
                                                     for s in self.skipped))
        return "\n".join(lines)


def diagnose(source: Any) -> Diagnosis:
    """Read ``source`` (a path, a trainer, a list of history rows or a :class:`Run`) and run every rule.

    Raises :class:`RunUnreadable` when there is nothing to read."""
    run = read_run(source)
    found: list[Finding] = []
    skipped: list[Skipped] = []
    for rule in RULES:
        missing = rule.missing(run)
        if missing:
            skipped.append(Skipped(rule.name, missing))
            continue
        try:
            finding = rule.check(run)
        except Exception as err:  # allowed broad handler: one rule that cannot read this run must not hide the others
            skipped.append(Skipped(rule.name, (f"values it could read ({type(err).__name__}: {err})",)))
            continue
        if finding is not None:
            found.append(finding)
    return Diagnosis(run, choose_primary(found), skipped)


#: A live warning needs its finding on the run as read at each of this many last steps (all of them, in a
#: shorter run): a curve read mid-run moves with each new step, and one step's dip is not a finding.
LIVE_STEPS = 3


def _alarms(history: Sequence[dict], completions: Sequence[dict], settings: dict) -> list[Finding]:
    run = Run(list(history), list(completions), settings, "memory")
    return [f for f in diagnose(run).findings if f.severity in ("fault", "warning")]


def live_findings(history: Sequence[dict], completions: Sequence[dict] = (), settings: dict | None = None
                  ) -> list[Finding]:
    """The faults and warnings of a run so far (the trainer's live warnings): :func:`diagnose` on the rows and
    kept completions up to now, each finding kept only if :func:`diagnose` also found it (at ``fault`` or
    ``warning``) on the run as it stood at each of the :data:`LIVE_STEPS` - 1 steps before."""
    if not history:
        return []
    settings = dict(settings or {})
    found = _alarms(history, completions, settings)
    for back in range(1, min(LIVE_STEPS, len(history))):
        if not found:
            break
        last = history[-1 - back].get("step")
        earlier = {f.name for f in _alarms(history[:-back], [c for c in completions if c.get("step", 0) <= last],
                                           settings)}
        found = [f for f in found if f.name in earlier]
    return found


def live_warnings(history: Sequence[dict], completions: Sequence[dict] = (), settings: dict | None = None
                  ) -> list[tuple[str, str]]:
    """``(name, message)`` for each fault or warning of the run so far (:func:`live_findings`): what the trainer
    warns of after each step, once per name and run. The message names the step, the finding, what was seen,
    what to change and the chapter that explains it."""
    if not history:
        return []
    step = history[-1].get("step")
    return [(f.name, f"step {step}: {f.name} ({f.severity}): {f.summary}. What to change: {f.fix}. See {f.chapter}; "
                     "chapter 18 reads a whole run (python -m grpo_tutorial doctor OUT)")
            for f in live_findings(history, completions, settings)]


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m grpo_tutorial doctor RUN [--json]``: print the diagnosis; the exit code says what it found."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="python -m grpo_tutorial doctor",
                                     description="Read a run and say why it is not learning (chapter 18).")
    parser.add_argument("run", help="a run folder (this package's or TRL's), a trainer_state.json, a history.jsonl, "
                                    "or TensorBoard events")
    parser.add_argument("--json", action="store_true", help="print the diagnosis as JSON")
    args = parser.parse_args(argv)
    try:
        diagnosis = diagnose(args.run)
    except RunUnreadable as err:
        message = str(err)
        if args.json:
            print(json.dumps({"version": DOCTOR_VERSION, "error": message}))
        else:
            print(f"doctor: cannot read the run: {message}", file=sys.stderr)
        return 2
    print(json.dumps(diagnosis.to_dict(), indent=1, default=str) if args.json else diagnosis.text())
    return diagnosis.exit_code
