"""The rule for exact float comparisons (CONTRIBUTING.md, "Floats and seeds in tests"), held by a scan.

A float may be compared with ``== 0.0`` only where it is zero *by construction*: a count
(a share of counted items), a setting or a literal a function returns, the same bits
computed twice, a product with an exact zero, or an underflow. A value that is zero only
in exact arithmetic (two different orders of summation of the same numbers, say) gets a
bound derived from its dtype instead: on another CPU it differs in the last bits (issue
42: 9e-15 of KL met ``== 0.0`` on an AMD EPYC), and the bound must still fail for the
planted bug that makes it really non-zero.

The scan lists every ``== 0.0`` in tests/ and in the notebooks' code cells; each must be
one of :data:`EXCEPTIONS`, with its reason. A new exact comparison fails here until it is
listed (or turned into a bound); an exception whose line is gone fails too, so the list
stays true.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXACT_ZERO = re.compile(r"==\s*0\.0(?![0-9])|(?<![0-9.])0\.0\s*==")

COUNT = "a share of counted items: exactly 0 when nothing was counted"
SETTING = "a setting, or a literal the function returns (a gate, a clamp at 0)"
SAME_BITS = "the same bits computed twice, or a difference of a value with itself"
TIMES_ZERO = "a product with an exact zero (an advantage of 0, a masked or clipped token's gradient)"

#: (file, the line without its indentation) -> why the value is zero by construction.
EXCEPTIONS: dict[tuple[str, str], str] = {
    ("tests/test_advantages.py", "assert got[0, 2] == 0.0"): "a NaN reward's advantage is set to 0 with `where`: " + SETTING,
    ("tests/test_advantages.py", "assert token_variance(advantages, torch.zeros_like(mask)) == 0.0  # no real token: no spread"): "every term is a finite number times a mask of 0, a sum of exact zeros over n clamped to 1: " + SETTING,
    ("tests/test_cuda.py", 'assert row["ratio_mean"] == pytest.approx(1.0, abs=1e-6) and row["clip_frac"] == 0.0'): COUNT,
    ("tests/test_fast_sampler.py", "assert row[FALLBACKS] == 0.0 and DECODE_MS in row"): "no fallback: a count the sampler writes as 0.0: " + COUNT,
    ("tests/test_fast_sampler.py", "assert sampler.width == PROMPT_BUCKET and again.sampler_stats[COMPILE_SECONDS] == 0.0"): "a shape met before: the sampler writes the literal 0.0: " + SETTING,
    ("tests/test_gpu_path.py", "assert first[fast_sampler.COMPILE_SECONDS] > 0 and second[fast_sampler.COMPILE_SECONDS] == 0.0  # one compile"): "a shape met before: the sampler writes the literal 0.0: " + SETTING,
    ("tests/test_gsm8k_run.py", 'assert scores["strict"]["before"] == scores["strict"]["after"] == 0.0  # a digit, never boxed'): COUNT,
    ("tests/test_gsm8k_scoring.py", 'assert c["lenient"]["gain"] == 0.0 and c["lenient"]["gain_se"] > 0  # one gained, one lost'): "a mean of +1, -1, 0, 0: " + COUNT,
    ("tests/test_kl_estimators.py", "assert gaussian_kl(0.3, 0.7, 0.3, 0.7).item() == 0.0"): "log 1 and x / 2x - 1/2 are exact: " + SAME_BITS,
    ("tests/test_lab.py", "assert L.pass_at_k(8, 0, 8) == 0.0"): "an empty product, 1 - 1: " + SETTING,
    ("tests/test_lora.py", 'assert len(dropouts) == 2 * 7 and all(m.p == 0.0 for m in dropouts)  # disable_dropout reached PEFT\'s modules'): SETTING,
    ("tests/test_loss.py", 'assert stats["ratio_mean"] == 1.0 and stats["clip_frac"] == 0.0'): "exp(logp - logp.detach()) = exp(0) = 1: " + SAME_BITS,
    ("tests/test_loss.py", "assert logp.grad.item() == 0.0"): TIMES_ZERO,
    ("tests/test_loss.py", 'assert loss.item() == pytest.approx(expected.item(), rel=1e-12) and stats["clip_frac"] == 0.0'): COUNT,
    ("tests/test_metrics.py", 'assert math.isnan(row["reward_mean"]) and row["reward_std"] == 0.0'): "no reward has no spread: " + SETTING,
    ("tests/test_metrics.py", 'assert one["reward_mean"] == 0.5 and one["reward_std"] == 0.0  # a single reward has no spread'): SETTING,
    ("tests/test_mismatch.py", 'assert no_bounds["mismatch/token_outside"] == no_bounds["mismatch/sequence_outside"] == 0.0'): COUNT,
    ("tests/test_mismatch.py", 'assert same["mismatch/kl"] == same["mismatch/logp_diff_max"] == same["mismatch/token_outside"] == 0.0'): "one tensor against itself: " + SAME_BITS,
    ("tests/test_objectives.py", "assert ratio.grad.item() == 0.0  # A = 0: no push either way (and tau_neg = 2 is finite)"): TIMES_ZERO,
    ("tests/test_objectives.py", "assert w[0].item() == 0.0"): "exp(-1e9) underflows to exactly 0",
    ("tests/test_objectives.py", "assert entropy_bonus(PER_TOKEN, torch.zeros_like(MASK)).item() == 0.0  # no tokens: 0, not 0 / 0"): SETTING,
    ("tests/test_objectives.py", "assert applied_entropy_coef(0.1, math.inf, 0.2) == 0.0  # no entropy measured yet"): SETTING,
    ("tests/test_objectives.py", "assert applied_entropy_coef(0.1, 0.3, 0.2) == 0.0"): SETTING,
    ("tests/test_objectives.py", "assert adapt_entropy_coef(0.01, 0.3, **step) == 0.0"): SETTING,
    ("tests/test_pitfalls.py", 'assert b["clip_frac_first"] == 0.0'): COUNT,
    ("tests/test_pitfalls.py", 'assert b["grad_after_eos"] == 0.0'): TIMES_ZERO,
    ("tests/test_pitfalls.py", 'assert row["loss_has_grad_fn"] == 0.0'): "a flag stored as a float: " + SETTING,
    ("tests/test_pitfalls.py", 'assert row["grad_norm"] == 0.0'): "no weight has a gradient at all: " + SETTING,
    ("tests/test_pitfalls.py", 'assert all(r["clip_frac"] == 0.0 and r["ratio_first_max"] == pytest.approx(1.0, abs=1e-6) for r in ok)'): COUNT,
    ("tests/test_pitfalls.py", 'assert ok["clip_frac"] == bug["clip_frac"] == 0.0'): COUNT,
    ("tests/test_pitfalls.py", 'assert all(r["clip_frac"] == 0.0 and r["ratio_max"] == pytest.approx(1.0, abs=1e-6) for r in bug)'): COUNT,
    ("tests/test_presets.py", "assert cfg.beta == 0.0"): SETTING,
    ("tests/test_pretrained.py", 'assert json.loads((folder / "grpo_tutorial_source.json").read_text())["max_logit_diff_vs_gguf"] == 0.0'): "the cached copy holds the GGUF's dequantized weights, run on one machine: " + SAME_BITS,
    ("tests/test_stats.py", "assert detectable_difference(0.0, n) == 0.0"): "a product with sd = 0: " + TIMES_ZERO,
    ("tests/test_samplers_with_tools.py", 'assert row["tool_call_count"] == 4.0 and row["tool_failure_count"] == 0.0  # 2 rows x 2 calling prompts'): COUNT,
    ("tests/test_trainer.py", 'assert row["frac_zero_std"] == 1.0 and row["reward_std"] == 0.0'): "equal rewards: " + SAME_BITS,
    ("tests/test_stats.py", "assert proportion_se(0.0, 10) == 0.0 and proportion_se(1.0, 10) == 0.0"):
        "p (1 - p) with p = 0 or 1 is an exact 0, and its square root 0: " + TIMES_ZERO,
    ("tests/test_trainer.py", 'assert row["loss"] == 0.0'): "every advantage is exactly 0: " + TIMES_ZERO,
    ("tests/test_trainer.py", 'assert row["frac_zero_std"] == 0.0'): COUNT,
    ("tests/test_trainer_contract.py", 'assert all(m.attention_dropout == 0.0 for m in model.modules() if hasattr(m, "attention_dropout"))'): SETTING,
    ("tests/test_trainer_pieces.py", "assert control.loss_options(config.loss_options()).entropy_coef == 0.0  # no entropy measured yet: no bonus"): SETTING,
    ("tests/test_trl.py", 'assert row["grad_norm"] == 0.0'): "equal rewards give every advantage exactly 0: " + TIMES_ZERO,
    ("tests/test_trl_agreement.py", "assert applied_entropy_coef(0.1, math.inf, 0.5) == 0.0  # before the first measurement"): SETTING,
    ("tests/test_trl_agreement.py", "assert applied_entropy_coef(0.1, 0.5, 0.5) == 0.1 and applied_entropy_coef(0.1, 0.51, 0.5) == 0.0"): SETTING,
    ("tests/test_trl_agreement.py", "assert adapt_entropy_coef(0.01, 0.9, target=0.5, delta=0.03, coef_min=0.0, coef_max=1.0) == 0.0"): SETTING,
    ("tests/test_validation.py", 'assert loss.item() == 0.0 and stats["ratio_max"] == 1.0'): "ratio exp(0) = 1 and the token means -1 and +1 cancel exactly",
    ("tests/test_variants.py", "assert clip_grad[0, 0].item() == 0.0"): TIMES_ZERO,
    ("tests/test_variants.py", "assert all_cut.item() == 0.0 and torch.count_nonzero(_grad(all_cut, logp)) == 0"): "every token masked: " + TIMES_ZERO,
    ("tests/test_variants.py", "assert applied[0] == 0.0 and any(a > 0 for a in applied)  # no bonus before a measurement; then some"): SETTING,
    ("tests/test_variants.py", 'assert all(row["frac_zero_std"] == 0.0 for row in dynamic)'): COUNT,
    ("notebooks/10_variants_and_pitfalls.ipynb", "assert applied[0] == 0.0  # no bonus before the first measurement"): SETTING,
    ("notebooks/10_variants_and_pitfalls.ipynb", 'assert all(a == 0.0 for a, e in zip(applied[1:], measured) if e > CONTROL["target"])'): SETTING,
    ("notebooks/12_grpo_lab.ipynb", 'assert row["ratio_mean"] == 1.0 and row["clip_frac"] == 0.0'): "one update per batch: exp(logp - the same logp detached) = 1, and nothing is clipped: " + SAME_BITS,
    ("notebooks/18_my_run_is_not_learning.ipynb", 'assert all(r["reward_mean"] == 0.0 for r in strict.history)  # not one marked answer: the reward never paid'): "a mean of rewards that are each exactly 0.0 (the function returns the literal 0.0 when no answer is marked)",
}


def find_exact_zeros(text: str) -> list[str]:
    """The lines of ``text`` that compare with 0.0 exactly, without their indentation."""
    return [line.strip() for line in text.splitlines() if EXACT_ZERO.search(line)]


def exact_zeros() -> dict[tuple[str, str], int]:
    """Every exact comparison with 0.0 in tests/ (but this file) and the notebooks' code cells: (file, line) -> count."""
    found: dict[tuple[str, str], int] = {}
    for path in sorted((ROOT / "tests").glob("*.py")):
        if path.name == Path(__file__).name:  # this file's examples and rules
            continue
        for line in find_exact_zeros(path.read_text(encoding="utf-8")):
            key = (path.relative_to(ROOT).as_posix(), line)
            found[key] = found.get(key, 0) + 1
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
            if cell["cell_type"] == "code":
                for line in find_exact_zeros("".join(cell["source"])):
                    key = (path.relative_to(ROOT).as_posix(), line)
                    found[key] = found.get(key, 0) + 1
    return found


def test_the_scan_finds_exact_zero_comparisons():
    assert find_exact_zeros("x = 1\nassert y == 0.0  # bad\n") == ["assert y == 0.0  # bad"]
    assert find_exact_zeros("assert 0.0 == y") == ["assert 0.0 == y"]
    assert find_exact_zeros("assert y == 0.05\nassert y <= 1e-10\nz = 10.0 == w") == []


def test_every_exact_zero_comparison_is_zero_by_construction():
    found = exact_zeros()
    unlisted = sorted(key for key in found if key not in EXCEPTIONS)
    assert not unlisted, (
        "compared with 0.0 exactly, but not listed as zero by construction in tests/test_float_rules.py:\n"
        + "\n".join(f"  {path}: {line}" for path, line in unlisted)
        + "\nA value zero only in exact arithmetic gets a bound from its dtype (CONTRIBUTING.md, 'Floats and "
        "seeds in tests'); one zero by construction goes into EXCEPTIONS with its reason."
    )
    stale = sorted(key for key in EXCEPTIONS if key not in found)
    assert not stale, f"EXCEPTIONS lists lines that are gone: {stale}"
    assert all(reason.strip() for reason in EXCEPTIONS.values())
