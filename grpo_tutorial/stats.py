"""The few statistics the book reports, written once: standard errors, t intervals, paired gains.

Every chapter that compares runs, the command line's evaluation summary and the tests
that compare a re-run with a committed record use these functions, so an interval means
the same thing everywhere.

* :func:`standard_error`: the sample standard deviation over sqrt(n);
* :func:`proportion_se`: the standard error of an accuracy, sqrt(p (1 - p) / n);
* :func:`t_quantile`: Student's t quantile (3 to 10 seeds need it: 1.96 would be far too narrow);
* :func:`mean_ci`: the mean of a few values with its t confidence interval;
* :func:`paired_comparison`: per-seed differences against a baseline, with :func:`mean_ci`;
* :func:`paired_gain`: a change in accuracy on the same problems, with its paired standard error;
* :func:`prediction_half_width`: how far one more draw may lie from the mean of n draws;
* :func:`family_level`: the level of each of k checks so that all k hold together at a given level
  (Bonferroni);
* :func:`detectable_difference` and :func:`seeds_needed`: what a paired comparison of n seeds can
  resolve, and how many seeds a given difference needs (its power);
* :func:`clopper_pearson`: the exact interval of a count of k in n (chapter 18's confusion matrices).
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from ._checks import check_int

__all__ = [
    "clopper_pearson",
    "detectable_difference",
    "family_level",
    "mean_ci",
    "paired_comparison",
    "paired_gain",
    "prediction_half_width",
    "proportion_se",
    "seeds_needed",
    "standard_error",
    "t_quantile",
]


def _finite(name: str, values: Sequence[float]) -> list[float]:
    x = [float(v) for v in values]
    if not all(math.isfinite(v) for v in x):
        raise ValueError(f"{name} must be finite numbers, got {x}")
    return x


def _probability(name: str, p: float) -> None:
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 < p < 1:
        raise ValueError(f"{name} must be a probability in (0, 1), got {p!r}")


def standard_error(values: Sequence[float]) -> float:
    """The standard error of the mean: the sample standard deviation (n - 1) over sqrt(n); NaN for n < 2.

    >>> standard_error([1.0, 2.0, 3.0])
    0.5773502691896258
    """
    x = _finite("values", values)
    n = len(x)
    if n < 2:
        return math.nan
    mean = sum(x) / n
    return math.sqrt(sum((v - mean) ** 2 for v in x) / (n - 1) / n)


def proportion_se(p: float, n: int) -> float:
    """The standard error of a proportion ``p`` (an accuracy) measured on ``n`` items: sqrt(p (1 - p) / n).

    >>> proportion_se(0.75, 4)
    0.21650635094610965
    """
    return math.sqrt(p * (1.0 - p) / n)


def _t_cdf(t: float, df: int) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom (Simpson's rule on the density)."""
    if t == 0:
        return 0.5
    log_norm = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)

    def density(x: float) -> float:
        return math.exp(log_norm - (df + 1) / 2 * math.log1p(x * x / df))

    # substitute x = tan(u): the integral over [0, |t|] becomes one over [0, atan|t|],
    # whose integrand stays smooth and bounded even for the heavy tails of df = 1
    upper = math.atan(abs(t))
    steps = 2000
    h = upper / steps
    total = 0.0
    for i in range(steps + 1):
        u = i * h
        weight = 1 if i in (0, steps) else (4 if i % 2 else 2)
        total += weight * density(math.tan(u)) / math.cos(u) ** 2
    half = total * h / 3
    return 0.5 + half if t > 0 else 0.5 - half


def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (bisection on the CDF).

    A 95% interval from 3 seeds uses ``t_quantile(0.975, 2)`` = 4.303, not 1.96.
    """
    check_int(None, "df", df, 1)
    _probability("p", p)
    if p == 0.5:
        return 0.0
    if p < 0.5:
        return -t_quantile(1 - p, df)
    lo, hi = 0.0, 1.0
    while _t_cdf(hi, df) < p:
        hi *= 2
    for _ in range(60):
        mid = (lo + hi) / 2
        if _t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def mean_ci(values: Sequence[float], confidence: float = 0.95) -> dict[str, Any]:
    """Mean, standard error (sample std / sqrt(n)) and a t confidence interval.

    With one value the standard error and the interval are NaN (nothing measures
    the spread). Returns ``mean``, ``se``, ``lo``, ``hi``, ``n`` and ``values``.
    """
    x = [float(v) for v in values]
    if not x:
        raise ValueError("values is empty; expected one number per seed")
    x = _finite("values", x)
    _probability("confidence", confidence)
    n = len(x)
    mean = sum(x) / n
    if n < 2:
        return {"mean": mean, "se": math.nan, "lo": math.nan, "hi": math.nan, "n": n, "values": x}
    se = standard_error(x)
    half = t_quantile(0.5 + confidence / 2, n - 1) * se
    return {"mean": mean, "se": se, "lo": mean - half, "hi": mean + half, "n": n, "values": x}


def paired_comparison(
    method: Mapping[int, float], baseline: Mapping[int, float], confidence: float = 0.95
) -> dict[str, Any]:
    """Per-seed differences ``method[s] - baseline[s]`` over the seeds both have, with :func:`mean_ci`.

    Pairing by seed removes what the two runs share (the warm start and the data
    split), so the interval is usually much narrower than comparing two separate
    intervals. Returns :func:`mean_ci`'s keys plus ``seeds`` and ``differences``.
    """
    seeds = sorted(set(method) & set(baseline))
    if not seeds:
        raise ValueError(f"no seed in common: method has {sorted(method)}, baseline has {sorted(baseline)}")
    diffs = [method[s] - baseline[s] for s in seeds]
    out = mean_ci(diffs, confidence)
    out["seeds"] = seeds
    out["differences"] = diffs
    return out


def paired_gain(before: Sequence[float], after: Sequence[float]) -> tuple[float, float]:
    """Change in accuracy on the same problems, and its paired standard error.

    The per-problem differences d_i = after_i - before_i are -1, 0 or +1 (or any
    numbers); the gain is their mean and the standard error is their sample std over
    sqrt(n). Pairing removes the variation between problems that both evaluations
    share, so it is smaller than combining the two separate standard errors. NaN for
    fewer than two problems.

    >>> paired_gain([0, 0, 1, 1], [1, 1, 1, 0])
    (0.25, 0.47871355387816905)
    """
    b = _finite("before", before)
    a = _finite("after", after)
    if len(a) != len(b):
        raise ValueError(f"before and after must score the same problems, got {len(b)} and {len(a)} outcomes")
    if not a:
        raise ValueError("before and after are empty; expected one outcome per problem")
    d = [x - y for x, y in zip(a, b)]
    return sum(d) / len(d), standard_error(d)


def family_level(level: float, checks: int) -> float:
    """The level of each of ``checks`` checks so that all of them hold together with probability >= ``level``.

    Bonferroni: each check may fail with probability (1 - level) / checks. A suite that
    runs 30 statistical checks at 99% each fails one of them on an honest machine
    about a quarter of the time; at ``family_level(0.99, 30)`` each, at most 1% of the time.

    >>> round(family_level(0.99, 10), 6)
    0.999
    """
    _probability("level", level)
    check_int(None, "checks", checks, 1)
    return 1 - (1 - level) / checks


def prediction_half_width(values: Sequence[float], level: float) -> float:
    """How far one more draw of the same process may lie from the mean of ``values``, at ``level``.

    With n draws of mean m and sample standard deviation s, a new draw lies within
    t(n - 1) * s * sqrt(1 + 1/n) of m with probability ``level`` (for normal draws),
    where t(n - 1) is Student's quantile at (1 + level) / 2. With 3 draws at 99% the
    half width is 11.5 s; with 6 it is 4.4 s: a few seeds say little about one more.
    """
    x = _finite("values", values)
    if len(x) < 2:
        raise ValueError(f"a spread needs at least 2 values, got {x}")
    _probability("level", level)
    n = len(x)
    mean = sum(x) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in x) / (n - 1))
    return t_quantile((1 + level) / 2, n - 1) * sd * math.sqrt(1 + 1 / n)


def detectable_difference(sd: float, n: int, level: float = 0.95, power: float = 0.8) -> float:
    """The smallest true difference that a paired comparison of ``n`` seeds resolves with probability ``power``.

    The comparison's interval is the mean of n per-seed differences +- t(n-1) at (1 + level) / 2
    times sd / sqrt(n) (:func:`mean_ci`), ``sd`` being the per-seed differences' standard
    deviation. It excludes 0 with probability ``power`` when the true difference is at least
    ``(t_{(1+level)/2}(n-1) + t_{power}(n-1)) * sd / sqrt(n)`` (the usual approximation: the
    interval's centre is normal about the true difference, its width as if sd were known).

    >>> round(detectable_difference(0.035, 20), 4)
    0.0231
    """
    check_int(None, "n", n, 2)
    _probability("level", level)
    _probability("power", power)
    if not (math.isfinite(sd) and sd >= 0):
        raise ValueError(f"sd must be a finite number >= 0, got {sd!r}")
    return (t_quantile((1 + level) / 2, n - 1) + t_quantile(power, n - 1)) * sd / math.sqrt(n)


def seeds_needed(sd: float, difference: float, level: float = 0.95, power: float = 0.8, limit: int = 100_000) -> int:
    """The fewest seeds whose paired comparison resolves a true ``difference`` with probability ``power``.

    The smallest n with :func:`detectable_difference` ``(sd, n, level, power) <= |difference|``
    (at least 2). Raises ``ValueError`` for a difference of 0, which no number of seeds resolves.

    >>> seeds_needed(0.035, 0.03)
    13
    """
    if not (math.isfinite(difference) and difference != 0):
        raise ValueError(f"difference must be a finite number other than 0, got {difference!r}")
    n = 2
    while detectable_difference(sd, n, level, power) > abs(difference):
        n += 1
        if n > limit:
            raise ValueError(f"more than {limit} seeds: sd {sd} against a difference of {difference}")
    return n


def _binomial_tail(k: int, n: int, p: float, upper: bool) -> float:
    """P(X >= k) (``upper``) or P(X <= k) for X ~ Binomial(n, p), summed in log space."""
    if p <= 0.0:
        return 1.0 if (k <= 0 if upper else True) else 0.0
    if p >= 1.0:
        return 1.0 if (True if upper else k >= n) else 0.0
    terms = range(k, n + 1) if upper else range(0, k + 1)
    log_p, log_q = math.log(p), math.log1p(-p)
    logs = [math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * log_p + (n - i) * log_q
            for i in terms]
    top = max(logs)
    return min(1.0, math.exp(top) * sum(math.exp(v - top) for v in logs))


def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """The exact (Clopper-Pearson) interval of a proportion seen as ``k`` successes in ``n`` trials.

    The lower end is the p at which seeing k or more has probability (1 - level) / 2 (0 when k = 0),
    the upper end the p at which seeing k or fewer has that probability (1 when k = n); found by
    bisection on the binomial tails. It never undercovers, which matters for the small counts of a
    confusion matrix: 9 of 10 gives [0.555, 0.997], 0 of 60 gives [0, 0.0596].

    >>> [round(v, 4) for v in clopper_pearson(9, 10)]
    [0.555, 0.9975]
    >>> [round(v, 4) for v in clopper_pearson(0, 60)]
    [0.0, 0.0596]
    """
    check_int(None, "n", n, 1)
    check_int(None, "k", k, 0)
    if k > n:
        raise ValueError(f"k must be at most n, got k={k}, n={n}")
    _probability("level", level)
    alpha = (1 - level) / 2

    def solve(tail) -> float:  # tail(p) rises with p from below alpha to above it
        lo, hi = 0.0, 1.0
        for _ in range(100):
            mid = (lo + hi) / 2
            if tail(mid) < alpha:
                lo = mid
            else:
                hi = mid
        return (lo + hi) / 2

    lower = 0.0 if k == 0 else solve(lambda p: _binomial_tail(k, n, p, upper=True))
    upper = 1.0 if k == n else 1.0 - solve(lambda q: _binomial_tail(k, n, 1.0 - q, upper=False))
    return lower, upper
