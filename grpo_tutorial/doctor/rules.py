"""The doctor's rules: one function per finding, each reading a :class:`~grpo_tutorial.doctor.reading.Run`.

Each rule returns a :class:`~grpo_tutorial.doctor.findings.Finding` or None,
and declares what it needs (history keys, kept completions, settings); a run
without them skips the rule by name. The thresholds are module constants, chosen
on the zoo's *tuning* seeds (``python -m benchmarks.doctor_zoo``; chapter 18
reports the held-out seeds only), and each one says what it separates. Where a
healthy run shows the same symptom (entropy falls as a policy learns; curves
flatten once it has learned; a hard task starts with most groups all wrong), the
rule says how it tells them apart.

The curves are read in windows: the *start* is the first :func:`window` steps,
the *end* the last as many; a change is the end's mean less the start's, judged
against the step-to-step noise of the curve (:func:`rise`).
"""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass
from typing import Callable, Sequence

from ..stats import clopper_pearson
from .findings import Finding
from .reading import Run

__all__ = ["RULES", "Rule", "rise", "window"]

# ---------------------------------------------------------------------------
# Reading curves
# ---------------------------------------------------------------------------


def _steps(k: int) -> str:
    return "step" if k == 1 else f"{k} steps"


def _finite(values: Sequence[float]) -> list[float]:
    return [v for v in values if math.isfinite(v)]


def window(n: int) -> int:
    """Steps in the start and end windows of a run of ``n`` steps: a fifth of it, between 3 and 10 (all of a
    shorter run's steps)."""
    return max(1, min(n, max(3, min(10, n // 5))))


@dataclass(frozen=True)
class Change:
    """A curve's start and end (window means), their difference, and its standard error from the noise."""

    start: float
    end: float
    se: float

    @property
    def delta(self) -> float:
        return self.end - self.start

    @property
    def z(self) -> float:
        return self.delta / self.se if self.se > 0 else (math.inf if self.delta > 0 else -math.inf if self.delta < 0
                                                         else 0.0)


def rise(values: Sequence[float]) -> Change | None:
    """The end window's mean less the start window's, with a standard error from the step-to-step noise
    (the spread of successive differences, which a trend does not inflate); None with fewer than 6 values."""
    values = _finite(values)
    n = len(values)
    if n < 6:
        return None
    k = window(n)
    start, end = statistics.fmean(values[:k]), statistics.fmean(values[-k:])
    diffs = [b - a for a, b in zip(values, values[1:])]
    noise = math.sqrt(statistics.fmean([d * d for d in diffs]) / 2)  # sd of one step's value around its trend
    return Change(start, end, noise * math.sqrt(2 / k))


def _series(run: Run, key: str) -> list[float]:
    return [v for _, v in run.values(key)]


def _steps_where(run: Run, key: str, test: Callable[[float], bool]) -> list[int]:
    return [s for s, v in run.values(key) if test(v)]


def _score(run: Run) -> tuple[str, list[float]]:
    """The curve that says whether the run learns: ``accuracy`` where it was logged, else ``reward_mean``."""
    if run.has("accuracy"):
        return "accuracy", _finite(_series(run, "accuracy"))
    return "reward_mean", _finite(_series(run, "reward_mean"))


def _r(value: float, digits: int = 3) -> float:
    return round(float(value), digits) if math.isfinite(value) else value


# ---------------------------------------------------------------------------
# The rules
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    """A rule: its finding's name, what it needs to run, and the function that reads the run."""

    name: str
    needs: tuple[str, ...]
    check: Callable[[Run], Finding | None]
    chapter: str
    fix: str

    def missing(self, run: Run) -> tuple[str, ...]:
        """What the rule needs that the run does not have (``completions``, ``setting:<field>``, history keys;
        ``a|b`` is either)."""
        absent = []
        for need in self.needs:
            options = need.split("|")
            if not any(_has(run, option) for option in options):
                absent.append(need)
        return tuple(absent)

    def finding(self, severity: str, summary: str, **evidence) -> Finding:
        return Finding(self.name, severity, summary, evidence, self.chapter, self.fix)


def _has(run: Run, need: str) -> bool:
    if need == "completions":
        return bool(run.completions)
    if need == "readings":
        return any(isinstance(c.get("correct"), dict) for c in run.completions)
    if need.startswith("setting:"):
        return need.removeprefix("setting:") in run.settings
    return run.has(need) or any(need in row for row in run.steps)


RULES: list[Rule] = []


def rule(name: str, needs: Sequence[str], chapter: str, fix: str):
    def register(check: Callable[[Rule, Run], Finding | None]) -> Callable:
        made = Rule(name, tuple(needs), lambda run: check(made, run), chapter, fix)
        RULES.append(made)
        return check
    return register


# -- non-finite numbers ------------------------------------------------------

#: An error that ended the run and says a number went non-finite (``torch.multinomial`` on NaN probabilities, ...).
NON_FINITE_CRASH = re.compile(r"\b(nan|inf|infinity|non-finite)\b", re.IGNORECASE)

#: Keys that are always computed: a null (a NaN written as JSON) or an infinity in them is a non-finite number.
ALWAYS_COMPUTED = ("loss", "grad_norm", "entropy")


@rule("non_finite", ["loss|grad_norm|skipped_updates"], "chapter 10 (troubleshooting: non-finite loss)",
      "train in float32 (a float16 policy overflows: load_policy(..., dtype='float32')), lower learning_rate, "
      "and check the reward functions for NaN; resume from a checkpoint before the first bad step")
def _non_finite(self: Rule, run: Run) -> Finding | None:
    bad = sorted({row["step"] for row in run.steps for key in ALWAYS_COMPUTED
                  if key in row and (row[key] is None or (isinstance(row[key], float) and not math.isfinite(row[key])))})
    skips = [(s, v) for s, v in run.values("skipped_updates")]
    skipped_at = [s for (s, v), (_, before) in zip(skips, [(0, 0.0)] + skips[:-1]) if v > before]
    steps = sorted(set(bad) | set(skipped_at))
    crash = run.crash if run.crash and NON_FINITE_CRASH.search(f"{run.crash['error']}: {run.crash['message']}") \
        else None
    if crash:  # the weights went non-finite and the next step died sampling from them, before writing a row
        return self.finding(
            "fault",
            f"the run died at step {crash['step']} with {crash['error']}: {crash['message'][:120]}"
            + (f", after {len(steps)} step(s) with a non-finite loss or gradient" if steps else
               ", a non-finite number in the weights or the logits that no logged step shows"),
            steps=steps, crash=crash)
    if not steps:
        return None
    last = run.steps[-1]["step"]
    severe = len(steps) >= 2 or steps[-1] >= last - 2
    return self.finding(
        "fault" if severe else "warning",
        f"{len(steps)} step(s) with a non-finite loss or gradient (first at step {steps[0]}); each skipped its "
        f"update" + (", and the run's last steps are among them" if steps[-1] >= last - 2 else ""),
        steps=steps, skipped_updates=run.values("skipped_updates")[-1][1] if skips else None)


# -- the reward function ------------------------------------------------------


def _rows_with_readings(run: Run) -> list[dict]:
    return [c for c in run.completions if isinstance(c.get("correct"), dict) and isinstance(c.get("rewards"), dict)]


def _numeric_reference(answer) -> bool:
    from ..answers import last_number

    if isinstance(answer, (int, float)) and not isinstance(answer, bool):
        return math.isfinite(answer)
    return isinstance(answer, str) and last_number(answer) is not None


def _counted(run: Run, rows: list[dict]) -> list[str]:
    """The reward functions that count in the reward: the kept rows' functions, less those the run's
    ``reward_weights`` weigh 0 (monitors, logged and never rewarded)."""
    names = list(dict.fromkeys(k for r in rows for k in r["rewards"]))
    weights = run.setting("reward_weights")
    if isinstance(weights, (list, tuple)) and len(weights) == len(names):
        names = [n for n, w in zip(names, weights) if w]
    return sorted(names)


def _paid(values: list[float | None]) -> tuple[float, float] | None:
    """A reward function's lowest and highest values among the kept rows (None: it scored none)."""
    scored = [v for v in values if v is not None and math.isfinite(v)]
    return (min(scored), max(scored)) if scored else None


def _paid_spans(run: Run, rows: list[dict]) -> list[tuple[str, tuple[float, float]]]:
    """Each reward function that counts (:func:`_counted`) and scored some kept row, with its lowest and highest
    value among them: what the completion rules compare a pattern's rows with."""
    spans = [(name, _paid([r["rewards"].get(name) for r in rows])) for name in _counted(run, rows)]
    return [(name, span) for name, span in spans if span is not None]


#: A share of kept rows (and at least :data:`MIN_ROWS` of them) that makes a pattern in the completions count.
MIN_ROWS = 5
#: reward_bug: a reference without a number, in a task whose references are mostly numbers, paid this often.
BROKEN_REFERENCE_PAID = 0.5
#: ... "mostly": at least this share of the kept rows' references hold a number.
NUMERIC_TASK = 0.5


@rule("reward_bug", ["completions", "readings"], "chapter 6 (verifiable rewards) and chapter 18",
      "test the reward function on the rows it paid (the evidence lists some): fix the reference answers that "
      "do not parse, and make a reference that cannot be read score 0 (or None), never 1")
def _reward_bug(self: Rule, run: Run) -> Finding | None:
    rows = _rows_with_readings(run)
    numeric = [r for r in rows if r.get("answer") is not None]
    if len(numeric) < MIN_ROWS:
        return None
    readable = [_numeric_reference(r["answer"]) for r in numeric]
    if sum(readable) < NUMERIC_TASK * len(numeric):  # not a task with numeric references: nothing to say here
        return None
    broken = [r for r, ok in zip(numeric, readable) if not ok]
    if len(broken) < MIN_ROWS:
        return None
    for name, span in _paid_spans(run, rows):
        if span[0] == span[1]:
            continue
        paid = [r for r in broken if r["rewards"].get(name) == span[1]]
        if len(paid) >= MIN_ROWS and len(paid) >= BROKEN_REFERENCE_PAID * len(broken):
            examples = [{"step": r["step"], "answer": r["answer"], "completion": r.get("completion")} for r in paid[:3]]
            return self.finding(
                "fault",
                f"{name} paid its top value ({_r(span[1])}) to {len(paid)} of {len(broken)} kept completions whose "
                f"reference answer holds no number ({len(broken)} of {len(numeric)} references, in a task whose "
                "other references are numbers): a reference that cannot be read is paid as if the answer were right",
                function=name, paid=len(paid), unreadable_references=len(broken), rows=len(numeric),
                examples=examples)
    return None


#: extraction_mismatch: kept rows whose answer is right but unmarked, and unpaid, at least this share of the rows; ...
UNMARKED_RIGHT_SHARE = 0.05
#: ... nearly all of them given the reward function's lowest value (a strict reading leaves them all unpaid), ...
UNPAID_SHARE = 0.9
#: ... while it pays at least half the marked right answers (it does pay a right answer when it can read it).
MARKED_PAID_SHARE = 0.5


@rule("extraction_mismatch", ["completions", "readings"], "chapter 6 (verifiable rewards) and chapter 18",
      "read the answer the way the model writes it (extract_answer falls back to the last number), or ask for the "
      "marked form in the prompt (GSM8K's '#### N', a \\boxed{}), then check the reward on a few completions")
def _extraction_mismatch(self: Rule, run: Run) -> Finding | None:
    rows = _rows_with_readings(run)
    if len(rows) < MIN_ROWS:
        return None
    unmarked_right = [r for r in rows if r["correct"].get("lenient") and r.get("extracted", {}).get("strict") is None]
    if len(unmarked_right) < max(MIN_ROWS, UNMARKED_RIGHT_SHARE * len(rows)):
        return None
    for name, span in _paid_spans(run, rows):
        if span[0] == span[1] and span[0] > 0:
            continue  # it paid every kept row alike, and something: these rows were not left unpaid
        unpaid = [r for r in unmarked_right if r["rewards"].get(name) is not None and r["rewards"][name] == span[0]]
        marked_right = [r for r in rows if r["correct"].get("strict")]
        marked_paid = [r for r in marked_right if r["rewards"].get(name) == span[1]]
        if len(unpaid) >= UNPAID_SHARE * len(unmarked_right) and (
                not marked_right or len(marked_paid) >= MARKED_PAID_SHARE * len(marked_right)):
            return self.finding(
                "fault",
                f"{len(unmarked_right)} of {len(rows)} kept completions hold the right answer without marking it "
                f"(no tag, box or '####'), and {name} gave {len(unpaid)} of them its lowest value: the reward reads the "
                f"answer more strictly than the model writes it (lenient accuracy "
                f"{_r(len(unmarked_right) / len(rows))} of the kept rows, strict "
                f"{_r(len(marked_right) / len(rows))})",
                function=name, unmarked_right=len(unmarked_right), marked_right=len(marked_right), rows=len(rows),
                examples=[{"step": r["step"], "answer": r["answer"], "completion": r.get("completion")}
                          for r in unpaid[:3]])
    return None


# -- the sampler ---------------------------------------------------------------

#: sampler_mismatch: the mean per-token KL between the sampler and the learner above which the correction matters.
MISMATCH_KL = 0.02


@rule("sampler_mismatch", ["mismatch/kl"], "chapter 15 (sampler mismatch)",
      "switch the correction on (GRPOConfig.vllm_importance_sampling_correction=True), or sample with a fresher "
      "copy (a smaller sampler_staleness)")
def _sampler_mismatch(self: Rule, run: Run) -> Finding | None:
    kl = _finite(_series(run, "mismatch/kl"))
    if not kl:
        return None
    mean = statistics.fmean(kl)
    if mean <= MISMATCH_KL:
        return None
    corrected = run.setting("vllm_importance_sampling_correction")
    if corrected:
        return Finding("sampler_mismatch", "note",
                       f"the sampler is {_r(mean, 4)} nats per token from the learner (mean mismatch KL), and the "
                       "correction is on: the update reweights for it", {"mismatch_kl_mean": _r(mean, 4)},
                       self.chapter, "")
    return self.finding(
        "fault" if corrected is False else "warning",
        f"the sampler writes completions {_r(mean, 4)} nats per token away from the learner (mean mismatch KL over "
        f"{len(kl)} steps, above {MISMATCH_KL}) and " + (
            "no correction reweights them" if corrected is False else "the run's settings do not say whether a "
            "correction reweights them"),
        mismatch_kl_mean=_r(mean, 4), mismatch_kl_last=_r(kl[-1], 4))


# -- the reference and the step size -----------------------------------------------

#: kl_explosion: a mean per-token KL to the reference above this (nats) is no longer a penalty's small drift.
KL_LIMIT = 1.0


@rule("kl_explosion", ["kl"], "chapter 5 (the KL penalty)",
      "check that the reference is the policy's own starting point (ref_model=None lets the trainer copy it); "
      "lower learning_rate; raise beta only once the reference is right")
def _kl_explosion(self: Rule, run: Run) -> Finding | None:
    kl = [(s, v) for s, v in run.values("kl") if math.isfinite(v)]
    over = [(s, v) for s, v in kl if v > KL_LIMIT]
    if not over:
        return None
    first = over[0][0]
    at_start = first <= kl[0][0] + 1
    return self.finding(
        "fault",
        f"the KL to the reference is {_r(over[0][1])} nats per token at step {first} (above {KL_LIMIT})"
        + (": from the first step, so the reference is not the policy's starting point" if at_start else
           ", up from " + str(_r(kl[0][1], 4)) + " at the start"),
        first_step=first, kl_first=_r(kl[0][1], 4), kl_max=_r(max(v for _, v in kl), 4), steps_over=len(over))


#: lr_too_high: the score's end at most this share of its start (the first step's score, sampled before any update,
#: or the mean of the first :data:`FALL_START` steps where that is higher: a collapse comes within a few steps, and
#: one that comes after the first update drags the mean of the first three down with it), ...
FALL_SHARE = 0.5
FALL_START = 3
#: ... by at least this much ...
FALL_MIN = 0.05
#: ... after an update that moved some token's probability this many times (ratio_max) or more.
BIG_RATIO = 5.0


@rule("lr_too_high", ["reward_mean"], "chapter 8 (a learning rate of 1e-3 collapses the tiny model)",
      "lower learning_rate (a third of it, say) and restart from the checkpoint before the fall; keep "
      "max_grad_norm, and for num_iterations > 1 lower it too")
def _lr_too_high(self: Rule, run: Run) -> Finding | None:
    key, score = _score(run)
    if len(score) < 2 * FALL_START:
        return None
    k = window(len(score))
    start = max(score[0], statistics.fmean(score[:FALL_START]))
    end = statistics.fmean(score[-min(k, len(score) - FALL_START):])
    if start <= 0 or not (end <= FALL_SHARE * start and start - end >= FALL_MIN):
        return None
    ratios = run.values("ratio_max")
    moved = [s for s, v in ratios if v >= BIG_RATIO]
    if ratios and not [s for s in moved if s <= run.steps[min(len(run.steps) - 1, 2 * k)]["step"]]:
        return None  # it fell without a big step: not the step size (a falling reward has other causes)
    change = Change(start, end, 0.0)
    return self.finding(
        "fault",
        f"{key} fell from {_r(change.start)} (the first {FALL_START} steps) to {_r(change.end)} (the last steps)"
        + (f", after updates that moved a token's probability up to {_r(max(v for _, v in ratios), 1)} times "
           f"(ratio_max, first at step {moved[0]})" if moved else "") + ": the steps are too large",
        start=_r(change.start), end=_r(change.end), big_ratio_steps=moved[:10])


# -- what the completions hit ---------------------------------------------------------

#: truncation: at least this share of completions cut by the budget, ...
TRUNCATED_SHARE = 0.25
#: ... and the cut ones paid at most this often, or at most :data:`CUT_PAID_SHARE` of the finished ones' rate
#: (a cut completion whose whole answer came before the budget is paid: that is not the fault); when at least
#: twice :data:`TRUNCATED_SHARE` are cut, paid less often than the finished ones at all.
TRUNCATED_PAID = 0.05
CUT_PAID_SHARE = 0.5


@rule("truncation", ["frac_truncated"], "chapter 13 (thinking longer: the budget) and chapter 9 (the probe)",
      "raise max_new_tokens (the probe of chapter 9 suggests a value), or ask for shorter answers; "
      "mask_truncated_completions=True keeps the cut ones out of the loss")
def _truncation(self: Rule, run: Run) -> Finding | None:
    cut_curve = _finite(_series(run, "frac_truncated"))
    if not cut_curve:
        return None
    share = statistics.fmean(cut_curve)
    if share < TRUNCATED_SHARE:
        return None
    rows = [c for c in run.completions if "truncated" in c and c.get("reward") is not None]
    cut = [c for c in rows if c["truncated"]]
    finished = [c for c in rows if not c["truncated"]]
    bottom = min((c["reward"] for c in rows), default=None)
    if len(cut) >= MIN_ROWS and any(c["reward"] > bottom for c in rows):  # all paid alike: they cannot tell
        paid_cut = sum(c["reward"] > bottom for c in cut) / len(cut)
        paid_finished = sum(c["reward"] > bottom for c in finished) / len(finished) if len(finished) >= MIN_ROWS else None
        costs = paid_cut <= max(TRUNCATED_PAID, CUT_PAID_SHARE * (paid_finished or 0.0)) or (
            share >= 2 * TRUNCATED_SHARE and paid_finished is not None and paid_cut < paid_finished)
        evidence = {"frac_truncated": _r(share), "paid_cut": _r(paid_cut),
                    "paid_finished": None if paid_finished is None else _r(paid_finished), "cut_kept": len(cut)}
        if not costs:
            compared = (f"about as often as the finished ones ({_r(paid_cut)} against {_r(paid_finished)})"
                        if paid_finished is not None else f"{_r(paid_cut)} of the time (too few finished to compare)")
            return Finding("truncation", "note",
                           f"{_r(share)} of completions hit the budget, but the cut ones kept are paid {compared}: "
                           "their answer fits before the cut", evidence, self.chapter, "")
        return self.finding(
            "fault",
            f"{_r(share)} of completions hit max_new_tokens on average, and the cut ones kept were paid "
            f"{_r(paid_cut)} of the time" + (f" against {_r(paid_finished)} for the finished ones"
                                              if paid_finished is not None else "") + ": the budget cuts answers off",
            **evidence)
    return self.finding(
        "fault" if share >= 2 * TRUNCATED_SHARE else "warning",
        f"{_r(share)} of completions hit max_new_tokens on average (the kept completions cannot say whether the "
        "cut ones lose their reward: too few, or all paid alike)", frac_truncated=_r(share),
        frac_truncated_last=_r(cut_curve[-1]))


@rule("tool_never_called", ["tool_call_frequency|tool_call_share"], "chapter 16 (tools in the loop)",
      "check that the prompt shows the tool and its syntax (the chat template's tools, or the inline <<...= "
      "form), and warm-start on examples that call it")
def _tool_never_called(self: Rule, run: Run) -> Finding | None:
    key = "tool_call_frequency" if run.has("tool_call_frequency") else "tool_call_share"
    calls = _finite(_series(run, key))
    if not calls or any(v > 0 for v in calls):
        return None
    return self.finding("fault", f"the policy was given tools and made no call in {len(calls)} steps",
                        steps=len(calls))


# -- rewards that pay the wrong thing -------------------------------------------------

#: format_only: the reward rose by this many of its noise's standard errors, while the accuracy did not.
RISE_Z = 3.0
#: ... "did not": the accuracy's change at most this.
FLAT_ACCURACY = 0.02


def _correctness_function(run: Run) -> str | None:
    names = {k.removeprefix("reward/") for row in run.steps for k in row if k.startswith("reward/")}
    for name in sorted(names):
        if any(word in name.lower() for word in ("correct", "accuracy", "answer")):
            return name
    return None


@rule("format_only", ["reward_mean", "accuracy|completions"], "chapter 13 (the format-only control) and chapter 6",
      "make the reward pay for the right answer (a correctness function, with the format's weight well below "
      "it), and check it on completions that have the form but a wrong answer")
def _format_only(self: Rule, run: Run) -> Finding | None:
    reward = rise(_finite(_series(run, "reward_mean")))
    if reward is None or reward.z < RISE_Z or reward.delta <= FALL_MIN:
        return None
    if run.has("accuracy"):
        accuracy = rise(_finite(_series(run, "accuracy")))
        source = "accuracy"
    else:
        name = _correctness_function(run)
        accuracy = rise(_finite(_series(run, f"reward/{name}"))) if name else None
        source = f"reward/{name}"
    if accuracy is None or accuracy.delta > FLAT_ACCURACY:
        return None
    return self.finding(
        "fault",
        f"the reward rose from {_r(reward.start)} to {_r(reward.end)} while {source} went from {_r(accuracy.start)} "
        f"to {_r(accuracy.end)}: the policy learns what the reward pays, and it is not the right answer",
        reward_start=_r(reward.start), reward_end=_r(reward.end), accuracy_start=_r(accuracy.start),
        accuracy_end=_r(accuracy.end), accuracy_source=source)


# -- groups without a signal -----------------------------------------------------------

#: zero_variance_*: at least this share of groups all-equal, on average over the run's last window.
ZERO_STD_SHARE = 0.8
#: Accuracy at or above this is "solved" (too easy), below it "too hard".
SOLVED = 0.8
#: Before this many steps, "too hard" needs the first steps' groups to say so (:data:`HOPELESS_STEPS`); after, a
#: score that does not rise.
HARD_STEPS = 10
#: Before HARD_STEPS, "too hard" needs the groups that varied to be too few to teach: with m of the n groups seen
#: mixed, the one-sided 95% upper bound on a group's chance of a signal (Clopper-Pearson) below one group a step
#: (1 / B, B the groups of a step, the run's prompts_per_step). Where the run does not say B, every group of at
#: least this many steps all-equal: the bound's limit for many groups, 3 / n (the rule of three), is below 1 / B once
#: n > 3B. A probe (one step's sampling read as advice before a run) is read at its one step: every group all-equal.
#: One step cannot tell a hopeless run from a sparse start: chapter 16's healthy run, at about 2% of completions
#: right, draws a first step with all of its 16 groups of 8 all wrong about once in 13 runs ((1 - 0.02) ** 128).
HOPELESS_STEPS = 4


def _level(run: Run, k: int) -> tuple[str, float | None]:
    """The end window's accuracy (or, without one, its mean reward, read as a share when rewards lie in [0, 1])."""
    key, score = _score(run)
    if not score:
        return key, None
    return key, statistics.fmean(score[-k:])


def _zero_variance(run: Run) -> tuple[float, float, int] | None:
    shares = _finite(_series(run, "frac_zero_std"))
    if not shares:
        return None
    k = window(len(shares))
    return statistics.fmean(shares[:k]), statistics.fmean(shares[-k:]), k


def _hopeless(run: Run, shares: Sequence[float]) -> bool:
    """The first steps' groups say, at 95%, that fewer than one group a step would carry a signal
    (:data:`HOPELESS_STEPS`)."""
    if run.source == "probe":
        return min(shares) == 1.0
    groups = run.settings.get("prompts_per_step")
    if not isinstance(groups, int) or isinstance(groups, bool) or groups < 1:
        return min(shares) == 1.0 and len(shares) >= HOPELESS_STEPS
    mixed = sum(round((1.0 - share) * groups) for share in shares)
    return clopper_pearson(mixed, groups * len(shares), level=0.90)[1] < 1 / groups


@rule("zero_variance_too_hard", ["frac_zero_std", "accuracy|reward_mean"], "chapter 2 (group advantages) and chapter 9 "
      "(the probe)", "give the model easier problems, a warm start (supervised steps), more room (max_new_tokens) "
      "or more tries (group_size), or a reward with partial credit")
def _too_hard(self: Rule, run: Run) -> Finding | None:
    zero = _zero_variance(run)
    if zero is None:
        return None
    start, end, k = zero
    if end < ZERO_STD_SHARE:
        return None
    key, level = _level(run, k)
    if level is None or level >= SOLVED:
        return None
    shares = _finite(_series(run, "frac_zero_std"))
    if len(shares) < HARD_STEPS and not _hopeless(run, shares):
        return None  # a hard task may start this way (chapter 16's healthy run began at 88%): wait and see
    if len(shares) >= HARD_STEPS:
        _, score = _score(run)
        learning = rise(score)
        if learning is not None and learning.z >= RISE_Z and learning.delta >= LEARNED:
            return None  # most groups all wrong, but the score rises: a hard start, and the run learns from the rest
    return self.finding(
        "fault",
        f"{_r(end)} of groups had all-equal rewards over the last {_steps(k)}, at {key} {_r(level)}: most groups "
        "earn the same low reward, so they teach nothing",
        frac_zero_std_start=_r(start), frac_zero_std_end=_r(end), level=_r(level), level_key=key)


@rule("zero_variance_too_easy", ["frac_zero_std", "accuracy|reward_mean"], "chapter 2 (group advantages)",
      "train on harder problems (the policy already solves these); keep the easy ones for evaluation")
def _too_easy(self: Rule, run: Run) -> Finding | None:
    zero = _zero_variance(run)
    if zero is None:
        return None
    start, end, k = zero
    key, score = _score(run)
    if end < ZERO_STD_SHARE or not score or statistics.fmean(score[-k:]) < SOLVED:
        return None
    if statistics.fmean(score[:k]) < SOLVED:  # solved by learning: a success, said as a note
        return Finding("mastered", "note",
                       f"{key} rose from {_r(statistics.fmean(score[:k]))} to {_r(statistics.fmean(score[-k:]))} "
                       f"and {_r(end)} of groups are now all right: the run has learned these problems",
                       {"level_start": _r(statistics.fmean(score[:k])), "level_end": _r(statistics.fmean(score[-k:]))},
                       "chapter 2", "train on harder problems to keep learning")
    return self.finding(
        "fault",
        f"{_r(end)} of groups had all-equal rewards at {key} {_r(statistics.fmean(score[-k:]))} from the start: "
        "the policy already solves these problems, so they teach nothing",
        frac_zero_std_start=_r(start), frac_zero_std_end=_r(end), level=_r(statistics.fmean(score[-k:])))


# -- a policy that stops exploring, or stops moving ---------------------------------------

#: entropy_collapse: the end's entropy at most this share of the start's, ...
ENTROPY_SHARE = 0.8
#: ... the share of all-equal groups up by this much (the policy writes the same completion for a prompt), ...
ZERO_STD_RISE = 0.12
#: ... while the score rose by less than this (a policy that learns sharpens too: that is not a collapse), ...
LEARNED = 0.15
#: ... under updates that clip at least this share of tokens on average, where the run logs it: steps that
#: over-fit their batch (many passes, a large step). The zoo's healthy runs clip at most 0.011, its
#: 16-pass runs 0.12 or more; chapter 6's one-pass fix sharpens for a while with none clipped.
CLIPPED = 0.05


@rule("entropy_collapse", ["entropy", "frac_zero_std", "accuracy|reward_mean"],
      "chapter 10 (variants: clip-higher) and chapter 4",
      "fewer passes over each batch (num_iterations), a lower learning_rate, clip_eps_high above clip_eps (DAPO's "
      "clip-higher), or an entropy bonus (entropy_coef, use_adaptive_entropy)")
def _entropy_collapse(self: Rule, run: Run) -> Finding | None:
    entropy = rise(_finite(_series(run, "entropy")))
    zero = rise(_finite(_series(run, "frac_zero_std")))
    key, score = _score(run)
    learned = rise(score)
    if entropy is None or zero is None or learned is None or entropy.start <= 0:
        return None
    if entropy.end > ENTROPY_SHARE * entropy.start or zero.delta < ZERO_STD_RISE or learned.delta >= LEARNED:
        return None
    if learned.end >= SOLVED:
        return None  # all-equal groups of right answers: mastery, not a collapse
    clipped = _finite(_series(run, "clip_frac"))
    if clipped and statistics.fmean(clipped) < CLIPPED:
        return None  # near on-policy steps cannot over-fit their batch: a slow learner sharpening (chapter 6's fix)
    return self.finding(
        "fault",
        f"entropy fell from {_r(entropy.start)} to {_r(entropy.end)} per token and the groups whose completions all "
        f"earned the same went from {_r(zero.start)} to {_r(zero.end)}, while {key} went from {_r(learned.start)} to "
        f"{_r(learned.end)}: the policy turned deterministic without learning",
        entropy_start=_r(entropy.start), entropy_end=_r(entropy.end), frac_zero_std_start=_r(zero.start),
        frac_zero_std_end=_r(zero.end), score_start=_r(learned.start), score_end=_r(learned.end), score_key=key)


#: plateau: at least this many steps before a flat curve means anything (a slow learner's rise shows against
#: the noise of a batch's accuracy only after tens of steps: chapter 6's fix is flat for its first 28).
PLATEAU_STEPS = 40
#: The normal quantile of a two-sided 95% interval: a rise's upper bound is its delta + Z95 standard errors.
Z95 = 1.96
#: The score's rise whose 95% upper bound stays below this is no rise.
PLATEAU_RISE = 0.04
#: ... or a rise short of significance (:data:`RISE_Z`) while the entropy stays within this share of its start:
#: a policy that learns, or forgets, moves its entropy (the zoo's healthy runs by 6% or more in 50 steps).
PLATEAU_ENTROPY = 0.05
#: A ratio_max within this of 1 (but above RATIO_MOVED) says the updates barely move the policy.
RATIO_STILL = 0.1
#: A ratio_max within this of 1 is the ratio of a single pass over the batch (1 by construction), not a measure.
RATIO_MOVED = 1e-4


@rule("plateau", ["accuracy|reward_mean", "frac_zero_std"], "chapter 8 (the tiny model's learning curve)",
      "raise learning_rate (the updates barely move the policy: ratio_max near 1), or check that the reward "
      "can be earned more often than now")
def _plateau(self: Rule, run: Run) -> Finding | None:
    key, score = _score(run)
    if len(score) < PLATEAU_STEPS:
        return None
    change = rise(score)
    zero = _zero_variance(run)
    if change is None or zero is None or zero[1] >= ZERO_STD_SHARE:
        return None  # groups without a signal: the zero-variance rules speak
    entropy = rise(_finite(_series(run, "entropy")))
    still = entropy is not None and entropy.start > 0 and abs(entropy.end / entropy.start - 1) < PLATEAU_ENTROPY
    if change.z <= -RISE_Z:
        return None  # falling, not flat: the rules for a fall speak (format_only, lr_too_high, ...)
    if change.delta + Z95 * change.se >= PLATEAU_RISE and not (still and change.z < RISE_Z):
        return None  # it may be rising; unless the policy's entropy has not moved and the rise is not significant
    ratios = _finite(_series(run, "ratio_max"))
    # with one pass over each batch the ratio is 1 by construction: then ratio_max says nothing of the step size
    moving = f"; the updates barely move the policy (ratio_max at most {_r(max(ratios))})" if ratios and (
        1 + RATIO_MOVED < max(ratios) < 1 + RATIO_STILL) else ""
    return self.finding(
        "fault",
        f"{key} went from {_r(change.start)} to {_r(change.end)} over {len(score)} steps (a rise of at most "
        f"{_r(change.delta + Z95 * change.se)} at 95%) while {_r(1 - zero[1])} of groups carried a signal"
        + (f", and the entropy stayed within {_r(abs(entropy.end / entropy.start - 1))} of its start" if still else "")
        + moving,
        start=_r(change.start), end=_r(change.end), upper=_r(change.delta + Z95 * change.se),
        ratio_max=_r(max(ratios)) if ratios else None)


# -- notes ----------------------------------------------------------------------------------

#: A loss this close to 0 on most steps (this share of them) is GRPO's normal state, not a fault.
LOSS_NEAR_ZERO = 0.05
LOSS_NEAR_ZERO_SHARE = 0.8


@rule("loss_near_zero", ["loss"], "chapter 4 (the clipped objective)", "")
def _loss_near_zero(self: Rule, run: Run) -> Finding | None:
    loss = _finite(_series(run, "loss"))
    if not loss or statistics.fmean([abs(v) < LOSS_NEAR_ZERO for v in loss]) < LOSS_NEAR_ZERO_SHARE:
        return None
    return Finding(
        "loss_near_zero", "note",
        f"the loss is within {LOSS_NEAR_ZERO} of 0 on most steps (mean {_r(statistics.fmean(loss), 4)}): expected. "
        "Each group's advantages sum to 0 and the ratio starts at 1, so GRPO's loss sits near 0 while its gradient "
        "does not (a TRL maintainer says the same, trl#3452): watch the reward and the accuracy instead",
        {"loss_mean": _r(statistics.fmean(loss), 4)}, self.chapter, "")
