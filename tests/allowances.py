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

import math
from typing import Mapping

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

#: Where a planted bound sits between the honest value and the planted one: half way, so that
#: an honest drift and the bug each get the same margin.
SHARE = 0.5


def planted_bound(what: str, value: float, *, honest: float, planted: float | Mapping[str, float], bug: str,
                  share: float = SHARE) -> float:
    """Assert that ``value`` lies nearer ``honest`` than the planted bug's value; return the margin left.

    After an update or a sampling, two machines' runs drift apart by an amount no machine we have
    seen bounds, so the check does not guess it: it asks only that the run be told apart from a
    named bug. The bound sits ``share`` of the way from ``honest`` (the stored value) to
    ``planted`` (the value the bug gives: measured in the test, or stored draws of it, or fixed by
    construction). ``planted`` may be several values (draws of the same bug, each named): the
    nearest one sets the bound. Both values, the bound and the margin are printed (``pytest -s``).

    Raises ``AssertionError`` when the value is on the bug's side, and ``ValueError`` when the
    planted value equals the honest one: such a check could not fail for its bug, so it must
    not be written.
    """
    draws = dict(planted) if isinstance(planted, Mapping) else {bug: planted}
    if not draws or not all(math.isfinite(v) for v in (honest, value, *draws.values())):
        raise ValueError(f"{what}: honest {honest}, planted {draws}, value {value}: every one must be a finite number")
    name, nearest = min(draws.items(), key=lambda kv: abs(kv[1] - honest))
    if nearest == honest:
        raise ValueError(f"{what}: the planted bug ({bug}: {name}) gives the honest value {honest} too; "
                         "this check could not catch it")
    bound = honest + share * (nearest - honest)
    margin = abs(bound - honest)
    named = bug if name == bug else f"{bug} ({name})"
    print(f"planted bound: {what}: {value:.6g} here; honest {honest:.6g}, {named} {nearest:.6g}; "
          f"bound {bound:.6g}, margin {margin:.3g} from the honest value")
    on_honest_side = (value - bound) * (nearest - honest) < 0
    assert on_honest_side, (
        f"{what}: {value} here is on the side of the planted bug ({bug}: {nearest}), past the bound {bound} "
        f"half way from the honest value {honest}")
    return margin


def has_power(honest: float, planted: float | Mapping[str, float]) -> bool:
    """Whether a planted bound can tell the bug from the honest value (some planted value differs)."""
    values = planted.values() if isinstance(planted, Mapping) else [planted]
    return any(v != honest for v in values)
