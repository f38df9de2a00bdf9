"""The core statistics (grpo_tutorial.stats): exact small examples and what each interval promises."""

from __future__ import annotations

import math
import random

import pytest

from grpo_tutorial.stats import (
    family_level,
    mean_ci,
    paired_comparison,
    paired_gain,
    prediction_half_width,
    proportion_se,
    standard_error,
    t_quantile,
)


def test_standard_error_by_hand():
    assert standard_error([1.0, 2.0, 3.0]) == pytest.approx(1 / math.sqrt(3), rel=1e-15)
    assert math.isnan(standard_error([4.0]))
    with pytest.raises(ValueError, match="finite"):
        standard_error([1.0, math.nan])


def test_t_quantile_closed_forms():
    assert t_quantile(0.975, 1) == pytest.approx(math.tan(math.pi * 0.475), rel=1e-7)  # Cauchy
    for p in (0.9, 0.975, 0.995, 0.9999):
        assert t_quantile(p, 2) == pytest.approx((2 * p - 1) / math.sqrt(2 * p * (1 - p)), rel=1e-7)
    assert t_quantile(0.025, 2) == pytest.approx(-t_quantile(0.975, 2))
    assert t_quantile(0.975, 2000) == pytest.approx(1.959964, abs=2e-3)
    with pytest.raises(ValueError, match="probability"):
        t_quantile(1.0, 3)


def test_the_issue_s_prediction_widths_at_99_percent():
    """A new draw lies within t(n-1) sd sqrt(1 + 1/n) of n seeds' mean: 11.5, 6.5, 5.0, 4.4 sd for n = 3..6."""
    for n, width in ((3, 11.5), (4, 6.5), (5, 5.0), (6, 4.4)):
        values = [float(i) for i in range(n)]  # any values: the width is in units of their sd
        sd = math.sqrt(sum((v - sum(values) / n) ** 2 for v in values) / (n - 1))
        assert prediction_half_width(values, 0.99) / sd == pytest.approx(width, abs=0.05), n


def test_prediction_interval_covers_a_new_draw_at_its_level():
    """Monte Carlo: 20,000 sets of 4 normal seeds and one more draw; 90% of new draws fall inside."""
    rng = random.Random(0)
    seeds = [rng.gauss(0, 1) for _ in range(4)]
    sd = math.sqrt(sum((v - sum(seeds) / 4) ** 2 for v in seeds) / 3)
    factor = prediction_half_width(seeds, 0.9) / sd  # t(3) sqrt(1 + 1/4), the same for every set of 4
    assert factor == pytest.approx(t_quantile(0.95, 3) * math.sqrt(1.25), rel=1e-12)
    trials, inside = 20_000, 0
    for _ in range(trials):
        seeds = [rng.gauss(0, 1) for _ in range(4)]
        mean = sum(seeds) / 4
        sd = math.sqrt(sum((v - mean) ** 2 for v in seeds) / 3)
        inside += abs(rng.gauss(0, 1) - mean) <= factor * sd
    assert inside / trials == pytest.approx(0.9, abs=4 * math.sqrt(0.09 / trials))  # 4 standard errors


def test_family_level_is_bonferroni():
    assert family_level(0.99, 1) == pytest.approx(0.99)
    assert family_level(0.99, 40) == pytest.approx(1 - 0.01 / 40)
    with pytest.raises(ValueError):
        family_level(0.99, 0)


def test_mean_ci_and_paired_comparison():
    ci = mean_ci([0.52, 0.58, 0.55])
    assert ci["mean"] == pytest.approx(0.55)
    assert ci["se"] == pytest.approx(0.03 / math.sqrt(3))
    assert ci["hi"] - ci["mean"] == pytest.approx(t_quantile(0.975, 2) * ci["se"])
    d = paired_comparison({0: 0.6, 1: 0.5, 2: 0.7}, {0: 0.5, 1: 0.5, 2: 0.5, 3: 0.9})
    assert d["seeds"] == [0, 1, 2] and d["differences"] == pytest.approx([0.1, 0.0, 0.2])
    with pytest.raises(ValueError, match="no seed in common"):
        paired_comparison({0: 1.0}, {1: 1.0})


def test_paired_gain_by_hand():
    gain, se = paired_gain([0, 0, 1, 1], [1, 1, 1, 0])  # differences +1, +1, 0, -1
    assert gain == 0.25
    assert se == pytest.approx(math.sqrt(((0.75**2) * 2 + 0.25**2 + 1.25**2) / 3 / 4), rel=1e-15)
    with pytest.raises(ValueError, match="same problems"):
        paired_gain([0, 1], [1])


def test_proportion_se_by_hand():
    assert proportion_se(0.75, 4) == math.sqrt(0.75 * 0.25 / 4)
    assert proportion_se(0.0, 10) == 0.0 and proportion_se(1.0, 10) == 0.0


def test_the_cli_and_the_chapters_give_the_core_paired_gain_bit_for_bit():
    """The command line's change after GRPO and chapter 8's paired gain are stats.paired_gain's numbers: the same
    gain and standard error to the last bit, and no spread (NaN, not 0) from a single problem."""
    from grpo_tutorial.__main__ import _paired_change
    from grpo_tutorial.chapters.recipes import accuracy_with_se
    from grpo_tutorial.chapters.recipes import paired_gain as recipes_paired_gain

    rng = random.Random(1)
    for n in (2, 7, 200):
        before = [rng.random() < 0.4 for _ in range(n)]
        after = [rng.random() < 0.6 for _ in range(n)]
        want = paired_gain([float(b) for b in before], [float(a) for a in after])
        assert recipes_paired_gain(before, after) == want
        assert _paired_change({"correct": before, "accuracy": sum(before) / n},
                              {"correct": after, "accuracy": sum(after) / n}) == want
        p = sum(after) / n
        assert accuracy_with_se(after) == (p, proportion_se(p, n))
    gain, se = _paired_change({"correct": [False], "accuracy": 0.0}, {"correct": [True], "accuracy": 1.0})
    assert gain == 1.0 and math.isnan(se)


def test_the_standard_errors_are_written_only_here():
    """No module of the package or the benchmarks computes a sample variance, a standard error or a binomial
    standard error by hand: they call grpo_tutorial.stats (a copy drifts: the CLI's gave 0, not NaN, for n = 1)."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    by_hand = re.compile(r"/ \(?(?:max\(1, )?(?:n|len\(\w+\)) - 1\)|sqrt\(\w+ \* \(1(?:\.0)? - \w+\) /|def _se\(")
    found = [
        f"{path.relative_to(root)}:{i}: {line.strip()}"
        for folder in ("grpo_tutorial", "benchmarks") for path in sorted((root / folder).rglob("*.py"))
        if path.name != "stats.py" or path.parent.name != "grpo_tutorial"
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if by_hand.search(line)
    ]
    assert found == [], "use grpo_tutorial.stats: " + "; ".join(found)


def test_detectable_difference_is_the_power_formula_and_seeds_needed_its_inverse():
    from grpo_tutorial.stats import detectable_difference, seeds_needed, t_quantile

    sd, n = 0.035, 20
    want = (t_quantile(0.975, n - 1) + t_quantile(0.8, n - 1)) * sd / math.sqrt(n)
    assert detectable_difference(sd, n) == pytest.approx(want, rel=1e-12)
    # many seeds: the normal quantiles, 1.960 + 0.842 = 2.802 standard errors
    assert detectable_difference(1.0, 10_000) * math.sqrt(10_000) == pytest.approx(2.802, abs=2e-3)
    assert detectable_difference(sd, 40) < detectable_difference(sd, 20) < detectable_difference(sd, 10)
    assert detectable_difference(sd, n, level=0.99) > detectable_difference(sd, n)
    assert detectable_difference(0.0, n) == 0.0
    k = seeds_needed(sd, 0.03)
    assert detectable_difference(sd, k) <= 0.03 < detectable_difference(sd, k - 1)
    assert seeds_needed(sd, -0.03) == k and seeds_needed(sd, 1.0) == 2
    with pytest.raises(ValueError, match="difference"):
        seeds_needed(sd, 0.0)
    with pytest.raises(ValueError, match="sd"):
        detectable_difference(-1.0, n)
    with pytest.raises((TypeError, ValueError), match="n"):
        detectable_difference(sd, 1)


def test_a_detectable_difference_is_resolved_about_as_often_as_its_power_says():
    """Simulated paired comparisons of 20 seeds at the detectable difference: the 95% interval excludes 0 in about
    80% of them (4,000 draws: the share's standard error is 0.006; the formula's approximation, a known sd, costs
    about a point at 20 seeds). A difference of 0 is resolved about 5% of the time."""
    import random
    import statistics

    from grpo_tutorial.stats import detectable_difference, mean_ci, t_quantile

    rng = random.Random(0)
    sd, n = 0.035, 20
    t = t_quantile(0.975, n - 1)  # mean_ci's interval, with its quantile computed once
    example = [rng.gauss(0.01, sd) for _ in range(n)]
    assert mean_ci(example)["hi"] == pytest.approx(statistics.mean(example) + t * statistics.stdev(example) / n ** 0.5)

    def resolved(true: float) -> float:
        hits = 0
        for _ in range(4000):
            x = [rng.gauss(true, sd) for _ in range(n)]
            hits += abs(statistics.mean(x)) > t * statistics.stdev(x) / n ** 0.5
        return hits / 4000

    assert resolved(detectable_difference(sd, n)) == pytest.approx(0.8, abs=0.04)
    assert resolved(0.0) == pytest.approx(0.05, abs=0.015)
