"""How a test compares a number with a stored one on kernels other than the stored one's.

CONTRIBUTING.md ("Floats and seeds in tests") gives the rule; ``tests/test_allowances.py`` holds
it: every allowance in the record, golden, inspection, determinism and kernel tests, and in the
chapters' checks of live runs, is listed there with one of these categories. No allowance is
set from what one or a few machines happened to give: two machines' kernels round differently,
and a run that updates its weights or samples amplifies that by an amount no machine we have
seen bounds.

- :data:`EXACT`: what no float decides (a command, a setting, a seed, a count made before any
  sampling). Compared with ``==`` on every machine.
- :data:`BITS`: compared only where this machine's kernel fingerprint is the stored one
  (:func:`grpo_tutorial.env.kernel_fingerprint`): the same bits, or a JSON round trip of them.
- :data:`DTYPE`: a float computed before any update or sampling (or the same value computed
  twice on this machine in another order), to an allowance derived from its dtype and its
  operations, written next to it (float32 carries 24 bits: a unit roundoff of 6e-8; a sum
  of n terms in another order differs by up to about n of them).
- :data:`SEEDS`: one more draw against the stored seeds' spread (``SeedChecks`` in
  tests/test_records.py), with a named planted change whose value the check is shown to
  reject (the power of the check, asserted each time it runs).
- :data:`PLANTED`: after any update or sampling, the default: the value must lie nearer the
  honest stored value than a named planted bug's value (:func:`planted_bound`), both printed,
  with the margin stated.
- :data:`RECORD`: only committed numbers, read from package data: the same on every machine.
"""

from __future__ import annotations

import json
import math
import os
from typing import Mapping, Sequence

EXACT = "exact"
BITS = "bits"
DTYPE = "dtype"
SEEDS = "seeds"
PLANTED = "planted"
RECORD = "record"

#: Each category and what it means (the scan in tests/test_allowances.py accepts only these).
CATEGORIES = {
    EXACT: "no float decides it: compared exactly on every machine",
    BITS: "compared only on the stored kernels (the same fingerprint): the same bits",
    DTYPE: "computed before any update or sampling: an allowance derived from the dtype and the operations",
    SEEDS: "one more draw against the stored seeds' spread, with a planted change the check rejects",
    PLANTED: "after an update or sampling: nearer the honest value than a named planted bug's",
    RECORD: "committed numbers only: the same on every machine",
}

#: The environment variable naming a file to which every check of this module (and the record tests' seed checks)
#: appends what it saw, one JSON line each: `make test-portability` sets it per kernel set.
LOG = "GRPO_FLOAT_CHECK_LOG"


def log_check(**fields) -> None:
    """Append one check's values to the file named by :data:`LOG`, when it is set (nothing otherwise)."""
    path = os.environ.get(LOG)
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(fields, default=str) + "\n")


#: Where a planted bound sits between the honest value and the planted one: half way, so that
#: an honest drift and the bug each get the same margin.
SHARE = 0.5


def _typical(honest: float, draws: Mapping[str, float]) -> tuple[str, float]:
    """The draw at the median distance from ``honest`` (the lower median): one draw that happens to land near
    the honest value does not decide the bound."""
    ordered = sorted(draws.items(), key=lambda kv: abs(kv[1] - honest))
    return ordered[(len(ordered) - 1) // 2]


def planted_bound(what: str, value: float, *, honest: float, planted: float | Mapping[str, float], bug: str,
                  share: float = SHARE) -> float:
    """Assert that ``value`` lies nearer ``honest`` than the planted bug's value; return the margin left.

    After an update or a sampling, two machines' runs drift apart by an amount no machine we have
    seen bounds, so the check does not guess it: it asks only that the run be told apart from a
    named bug. The bound sits ``share`` of the way from ``honest`` (the stored value) to
    ``planted`` (the value the bug gives: measured in the test, or fixed by construction).
    ``planted`` may be several draws of the same bug, each named: the draw at the median distance
    sets the bound (with three or more draws, one that lands near the honest value by chance does
    not). The values, the bound and the margin are printed (``pytest -s``).

    Raises ``AssertionError`` when the value is on the bug's side, and ``ValueError`` when the
    planted value equals the honest one: such a check could not fail for its bug, so it must
    not be written.
    """
    draws = dict(planted) if isinstance(planted, Mapping) else {bug: planted}
    if not draws or not all(math.isfinite(v) for v in (honest, value, *draws.values())):
        raise ValueError(f"{what}: honest {honest}, planted {draws}, value {value}: every one must be a finite number")
    name, typical = _typical(honest, draws)
    if typical == honest:
        raise ValueError(f"{what}: the planted bug ({bug}: {name}) gives the honest value {honest} too; "
                         "this check could not catch it")
    bound = honest + share * (typical - honest)
    margin = abs(bound - honest)
    named = bug if name == bug else f"{bug} ({name}, the median of {len(draws)} draws)"
    print(f"planted bound: {what}: {value:.6g} here; honest {honest:.6g}, {named} {typical:.6g}; "
          f"bound {bound:.6g}, margin {margin:.3g} from the honest value")
    on_honest_side = (value - bound) * (typical - honest) < 0
    log_check(category=PLANTED, check=what, value=value, honest=honest, planted=typical, bug=bug, bound=bound,
              margin=margin, used=abs(value - honest) / margin, passed=on_honest_side)
    assert on_honest_side, (
        f"{what}: {value} here is on the side of the planted bug ({bug}: {typical}), past the bound {bound} "
        f"half way from the honest value {honest}")
    return margin


#: A planted bound against a record's seeds is asserted only where an honest draw falls past it with probability at
#: most this (one-sided): an honest run on other kernels is one more draw of the record's seeds' process, so its
#: spread is the prediction interval of one more draw, t(n-1) * sd * sqrt(1 + 1/n) (Student's t: the seeds' sd is
#: itself an estimate, so with 5 seeds the gate is 5.0 sd, with 8 seeds 3.7 sd, with 20 seeds 3.0 sd). A fixed
#: count of sd would understate it: 3.5 sd with 5 seeds fails an honest draw 1.7% of the time, not the normal 2e-4.
SEED_FALSE_ALARM = 0.005


def seed_gate(seeds: Sequence[float]) -> float:
    """How far from the seeds' mean an honest draw may fall (one-sided probability :data:`SEED_FALSE_ALARM`): the
    margin a planted bound needs before it is asserted."""
    from grpo_tutorial.stats import prediction_half_width

    return prediction_half_width(list(seeds), 1 - 2 * SEED_FALSE_ALARM)


def seeds_planted_bound(what: str, value: float, seeds: Sequence[float], *, planted: float, bug: str) -> bool:
    """A planted bound whose honest value is the mean of a record's seeds, asserted only where it can tell the bug
    from an honest draw: its margin at least :func:`seed_gate` (the seeds' prediction interval at a one-sided
    :data:`SEED_FALSE_ALARM`). Otherwise it prints why it is not asserted (the caller names where that bug is
    caught) and returns False."""
    import statistics

    honest, sd = statistics.mean(seeds), statistics.stdev(seeds)
    margin = abs(planted - honest) * SHARE
    gate = seed_gate(seeds)
    if margin < gate:
        log_check(category=PLANTED, check=what, value=value, honest=honest, planted=planted, bug=bug,
                  margin=margin, used=abs(value - honest) / margin, passed=None,
                  note=f"not asserted: margin {margin / sd:.1f} sd under the gate {gate / sd:.1f} sd")
        print(f"planted bound: {what}: {value:.6g} here; {len(seeds)} seeds {honest:.6g} (sd {sd:.3g}), {bug} "
              f"{planted:.6g}: a margin of {margin / sd:.1f} sd, under the {gate / sd:.1f} sd an honest draw may "
              f"fall from {len(seeds)} seeds' mean (one-sided {SEED_FALSE_ALARM}): not asserted")
        return False
    planted_bound(what, value, honest=honest, planted=planted, bug=bug)
    print(f"  ({len(seeds)} seeds: sd {sd:.3g}; the margin is {margin / sd:.1f} of their sd, the gate "
          f"{gate / sd:.1f})")
    return True


def has_power(honest: float, planted: float | Mapping[str, float]) -> bool:
    """Whether a planted bound can tell the bug from the honest value (its typical draw differs)."""
    draws = dict(planted) if isinstance(planted, Mapping) else {"bug": planted}
    return _typical(honest, draws)[1] != honest


#: How many sampled completions may differ between two kernel sets sampling from the same weights with the same
#: seed. A token differs only where its uniform draw fell between the two kernel sets' values of the cumulative
#: distribution at some boundary. float32 sums of n terms carry a typical relative error of sqrt(n) x 6e-8 (about
#: 1e-6 for the few hundred terms of these models' products), so two kernel sets' probabilities differ by about
#: 1e-6 of their size and a draw flips with probability of that order: over a step's at most 30,000 draws (the
#: thinking chapter's 400 problems x 72 tokens), a flip is expected 0.03 times, and more than 4 with probability
#: below 1e-9 (Poisson). A flip changes one completion from there on; greedy decoding flips only at a near-tie of the
#: two best logits, rarer still. (Chapter 13 uses the same number for its live step 0.)
FLIPS = 4


def same_draw(got: dict, want: dict, *, completions: int, ranges: Mapping[str, float], where: str,
              timing: Sequence[str] = (), settings: Sequence[str] = ("step", "n")) -> bool:
    """A row sampled from the same weights with the same seed on other kernels, before any update (category dtype).

    The settings are exact; a NaN (an unset field, which a record may write as null) stays
    NaN; each field of ``ranges`` (a mean over ``completions`` of a per-completion value
    spanning ``ranges[key]``) may move by what :data:`FLIPS` completions can move it. If none
    moved, the same tokens were sampled and the other numeric fields, computed from them
    before any update, agree to float32 rounding of sums over a batch (1e-4 relative); if one
    moved, those fields are printed and not compared. Returns whether the tokens were the same.
    """
    moved = {}
    for key in ranges:
        if key not in want or key not in got:
            continue
        allowance = FLIPS * ranges[key] / completions
        if want[key] is None or (isinstance(want[key], float) and math.isnan(want[key])):
            assert got[key] is None or math.isnan(got[key]), (where, key, got[key])
            continue
        log_check(category=DTYPE, check=f"{where}: {key}", value=got[key], honest=want[key], margin=allowance,
                  used=abs(got[key] - want[key]) / allowance, passed=abs(got[key] - want[key]) <= allowance)
        assert abs(got[key] - want[key]) <= allowance, (
            f"{where}: {key} {got[key]} here, {want[key]} in the record: more than {FLIPS} of {completions} "
            f"completions' worth ({allowance:.4g}) apart")
        if abs(got[key] - want[key]) > 1e-12 * max(1.0, abs(want[key])):
            moved[key] = (got[key], want[key])
    for key, value in want.items():
        if key in timing or key in ranges or key not in got:
            continue
        if key in settings:
            assert got[key] == value, (where, key, got[key], value)
        elif value is None or (isinstance(value, float) and math.isnan(value)):
            assert got[key] is None or math.isnan(got[key]), (where, key, got[key])
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            if moved:
                print(f"same draw: {where}: {key}: {got[key]} here, {value} in the record: not compared (a flip "
                      f"moved {sorted(moved)})")
            else:
                close = math.isclose(got[key], value, rel_tol=1e-4, abs_tol=1e-6)
                log_check(category=DTYPE, check=f"{where}: {key}", value=got[key], honest=value,
                          margin=max(1e-4 * abs(value), 1e-6), used=abs(got[key] - value) / max(1e-4 * abs(value), 1e-6),
                          passed=close)
                assert close, (where, key, got[key], value)
    print(f"same draw: {where}: " + (f"flipped completions moved {moved}" if moved else "the same tokens"))
    return not moved


#: A history row's fields that no float decides: the step, and the learning rate the schedule sets.
SETTINGS = ("step", "lr")


def like_the_row(got: dict, want: dict, planted: dict[str, dict], bug: str, timing_keys: Sequence[str], where: str,
                 *, settings: tuple[str, ...] = SETTINGS, at_least: int = 2) -> list[str]:
    """A history row after an update on other kernels: each field nearer the stored row's than a planted bug's.

    After an update, two kernel sets' runs drift apart by an amount no machine we have seen
    bounds. So each field is compared with a planted bug instead (:func:`planted_bound`):
    ``planted`` holds rows that bug gives (draws of it, such as the same run with other
    seeds), and the field must lie nearer the stored value than half way to the draw at the
    median distance. The settings (``settings``: the step, the learning rate) are exact, a
    NaN (an unset field, which a record may write as null) must stay NaN, and a field the
    planted rows cannot tell from the stored one (their median draw gives the same value) is
    printed and not compared. At least ``at_least`` fields must have that power, or the
    check could not catch its bug. Returns the fields compared.
    """
    compared = []
    for key, value in want.items():
        if key in timing_keys or key not in got:
            continue
        if key in settings:
            assert got[key] == value, (where, key, got[key], value)
        elif value is None or (isinstance(value, float) and math.isnan(value)):  # NaN (a record writes null)
            assert got[key] is None or math.isnan(got[key]), (where, key, got[key])
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            draws = {name: row[key] for name, row in planted.items() if isinstance(row.get(key), (int, float))
                     and math.isfinite(row[key])}
            if draws and has_power(value, draws):
                planted_bound(f"{where}: {key}", got[key], honest=value, planted=draws, bug=bug)
                compared.append(key)
            else:
                print(f"planted bound: {where}: {key}: {got[key]} here, {value} in the record; {bug} gives the same "
                      f"({draws}): not compared")
    assert len(compared) >= at_least, f"{where}: only {compared} could catch {bug}; the check has no power"
    return compared
