"""Every allowance against a stored or a live number, listed with its category (issue 52).

CONTRIBUTING.md ("Floats and seeds in tests") gives the rule, ``tests/allowances.py`` the
categories: on kernels other than a record's, a comparison is exact (what no float decides),
a float computed before any update or sampling to an allowance derived from its dtype and
operations, one more draw against the stored seeds' spread with the power to catch a named
planted change, or (after any update or sampling, the default) a bound between the honest
value and a named planted bug. No allowance is set from what one or a few machines happened
to give: each time the suite met a CPU it had not seen, such an allowance failed there
(7 on an Intel Xeon, 2 on an AMD EPYC, 1 on an AMD EPYC with AVX512).

The scan lists every ``approx(``, ``isclose(``, ``allclose(``, ``assert_close(`` and every
``assert`` with an ordering comparison (a hand-written bound) in the record, golden,
inspection, determinism and kernel tests and in the code cells of the chapters that replay
a record or read one beside a live run (their cells tagged ``committed-data`` read package
data only and are left out). Each must be in :data:`ALLOWANCES` with its category and the
reason: a new uncategorised allowance fails here, and so does an entry whose line is gone.
``python tests/test_allowances.py`` prints the list by category.
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from pathlib import Path

from allowances import BITS, CATEGORIES, DTYPE, EXACT, PLANTED, RECORD, SEEDS

ROOT = Path(__file__).resolve().parent.parent
#: The tests whose comparisons are with stored numbers or between machines' kernels.
TEST_FILES = ("tests/test_records.py", "tests/test_golden.py", "tests/test_inspection.py",
              "tests/test_determinism.py", "tests/test_kernels.py", "tests/allowances.py")
#: The chapters that replay a committed record or compare a live run with one (.ci/kernel_variant.py's REPLAYS,
#: and chapter 17, whose live step starts from chapter 13's shipped warm start).
NOTEBOOKS = ("notebooks/07_one_training_step.ipynb", "notebooks/08_tiny_transformer.ipynb",
             "notebooks/12_grpo_lab.ipynb", "notebooks/13_thinking_longer.ipynb", "notebooks/14_lora.ipynb",
             "notebooks/15_sampler_mismatch.ipynb", "notebooks/16_tools_in_the_loop.ipynb",
             "notebooks/17_why_no_critic.ipynb")
#: An allowance: an approximate comparison, or an assert with an ordering comparison (not ->, <<, >>, <=> parts).
ALLOWANCE = re.compile(r"approx\(|isclose\(|allclose\(|assert_close\(|^\s*assert\b.*(?<![-<>=])(<=?|>=?)(?![<>=])")

_F32 = "float32's unit roundoff is 6e-8"
_SAME_ORDER = "the same value computed twice on this machine, rows or prompts summed in another order"
_TIME = "a timing on a shared machine, read from the record"

#: (file, the line without its indentation) -> (category, why). Lines that repeat in a file share one entry.
ALLOWANCES: dict[tuple[str, str], tuple[str, str]] = {
    # ---- tests/test_records.py
    ("tests/test_records.py", 'assert len(seeds) >= 3, f"{what}: a spread needs at least 3 seeds, got {seeds}"'):
        (EXACT, "a count of stored seeds"),
    ("tests/test_records.py", "assert abs(bug_value - mean) > half, ("):
        (SEEDS, "SeedChecks: the planted change's value must lie outside the seeds' interval (the check's power)"),
    ("tests/test_records.py", "assert abs(value - mean) <= half, ("):
        (SEEDS, "SeedChecks: one more draw within the prediction interval of the stored seeds, at the family's level"),
    ("tests/test_records.py", 'assert gain > z * se, f"{what}: gain {gain:+.4f} is not more than {z:.2f} standard errors ({se:.4f})"'):
        (SEEDS, "a real gain: GRPO's learning rate 0 gives exactly 0 and the sign flipped a negative gain, both fail"),
    ("tests/test_records.py", "moved = {k: (got[k], want[k]) for k in counted if got[k] != pytest.approx(want[k], rel=1e-9, abs=1e-12, nan_ok=True)}"):
        (BITS, "_same_step, on the record's kernels only: counted fields of the same sampled tokens are equal"),
    ("tests/test_records.py", "assert got[key] == pytest.approx(value, rel=1e-4, abs=1e-6), (where, key, got[key], value)"):
        (BITS, "_same_step, on the record's kernels only: the same draw; 1e-4 admits a later change of summation "
               "order that leaves every count equal"),
    ("tests/test_records.py", 'assert result["gain"] == pytest.approx(gain, abs=1e-12)  # paired on the same problems: gain_se is paired'):
        (DTYPE, "one difference of two float64 means computed in two places: equal to float64 rounding"),
    ("tests/test_records.py", 'assert result["heldout_curve"][0] == pytest.approx(grpo["heldout_curve"][0])  # before GRPO'):
        (BITS, "on the record's kernels only: the same greedy answers of the same weights"),
    ("tests/test_records.py", 'assert result["curve"][0] == pytest.approx(stored["curve"][0], rel=1e-9, nan_ok=True)  # step 0, sampled'):
        (BITS, "on the record's kernels only: the same samples, a JSON round trip"),
    ("tests/test_records.py", "assert got[key] == pytest.approx(want[key], rel=1e-4, abs=1e-6), key"):
        (DTYPE, "one forward and backward at fixed inputs, before any update: float32 sums of at most 896 terms, "
                "896 x 6e-8 = 5e-5 of the terms' size at worst"),
    ("tests/test_records.py", 'assert float(made["first_loss"]) == pytest.approx(float(shipped_meta["first_loss"]), rel=1e-4)'):
        (DTYPE, "the first loss, before any update: sums of at most 256 terms in float32, 256 x 6e-8 = 1.5e-5 at worst"),
    ("tests/test_records.py", 'assert run["heldout_curve"][0] == pytest.approx(want["heldout_curve"][0])  # before GRPO'):
        (BITS, "on the record's kernels only: the same greedy answers of the same weights"),
    ("tests/test_records.py", 'assert run["reward_curve"][0] == pytest.approx(want["reward_curve"][0], rel=1e-9)'):
        (BITS, "on the record's kernels only: the same samples, a JSON round trip"),
    ("tests/test_records.py", 'assert values[0] == pytest.approx(want["mismatch_curves"][key][0], rel=1e-6, abs=1e-9), (name, key)'):
        (BITS, "on the record's kernels only: the same draw; 1e-6 admits the record's rounding to 6 digits"),
    ("tests/test_records.py", 'assert [s["seed"] for s in record["seeds"]] == args.seeds and len(args.seeds) >= 5 and not args.quick'):
        (EXACT, "the command's seeds, counted"),
    ("tests/test_records.py", 'assert result["curve"][0] == pytest.approx(stored["curve"][0], rel=1e-9, nan_ok=True)'):
        (BITS, "on the record's kernels only: the same samples, a JSON round trip"),
    ("tests/test_records.py", "assert got[key] == pytest.approx(want[key], rel=1e-6, abs=1e-9), key"):
        (BITS, "on the record's kernels only: the same draw; 1e-6 admits a later change of summation order"),
    ("tests/test_records.py", 'assert len(compared) >= 2, f"only {compared} tell the untrained model apart"'):
        (EXACT, "a count of the fields that have the power to catch the planted bug"),
    ("tests/test_records.py", 'assert sorted({r["seed"] for r in record["runs"]}) == sorted(args.seeds) and len(args.seeds) >= 5'):
        (EXACT, "the command's seeds, counted"),
    ("tests/test_records.py", 'assert run["curve"][0] == pytest.approx(want["curve"][0], rel=1e-9, nan_ok=True), method'):
        (BITS, "on the record's kernels only: the same samples, a JSON round trip"),
    # ---- tests/test_golden.py
    ("tests/test_golden.py", 'assert set(w) <= set(g), f"{name}: row {i} lost fields {sorted(set(w) - set(g))}"'):
        (EXACT, "the names of a row's fields"),
    ("tests/test_golden.py", "assert floats > 100 * len(full_platforms)"):
        (EXACT, "a count of compared fields"),
    ("tests/test_golden.py", 'assert set(a) <= set(b), f"{name}: row {i} lost fields {sorted(set(a) - set(b))}"'):
        (EXACT, "the names of a row's fields"),
    ("tests/test_golden.py", "assert math.isclose(x, y, rel_tol=1e-4, abs_tol=1e-6) or (math.isnan(x) and math.isnan(y)), ("):
        (RECORD, "two committed fixtures of one kernel set (the full and the shared-prompt pass) against each other: "
                 "a claim about what the files hold, checked again only when one is regenerated"),
    # ---- tests/test_inspection.py
    ("tests/test_inspection.py", 'assert token_strings(tok, ids) == [["7", "␣", "<eos>", "<pad>"]]'):
        (EXACT, "token strings (the scan reads its < as a bound)"),
    ("tests/test_inspection.py", "torch.testing.assert_close(old[rows], logp.detach(), rtol=0, atol=1e-5)"):
        (DTYPE, _SAME_ORDER + ": log-probs of a few nats from an eval and a training pass, sums of at most 64 terms, "
                "known to a few times 1e-6"),
    ("tests/test_inspection.py", 'assert rewards.std() > 0, "the rewards must vary, or the step is trivially zero"'):
        (EXACT, "a spread of counted rewards: 0 exactly when every reward is the same"),
    ("tests/test_inspection.py", 'assert row["reward_mean"] == pytest.approx(rewards.mean().item(), abs=1e-6)'):
        (DTYPE, _SAME_ORDER + ": a mean of 8 rewards"),
    ("tests/test_inspection.py", 'assert row["grad_norm"] == pytest.approx(norm, rel=1e-5)'):
        (DTYPE, _SAME_ORDER + ": a norm of float32 gradients summed over 8 rows, before the update"),
    ("tests/test_inspection.py", 'assert row["loss"] == pytest.approx(loss, abs=1e-6)'):
        (DTYPE, _SAME_ORDER + ": a loss of order 0.1, before the update"),
    ("tests/test_inspection.py", 'assert abs(row["kl"]) < 1e-9'):
        (DTYPE, "0 in exact arithmetic (the reference is the policy): two scoring passes' rounding, 8e-15 seen, "
                "eleven orders below a one-step KL of 1e-2"),
    ("tests/test_inspection.py", "torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)"):
        (DTYPE, _SAME_ORDER + ": one AdamW step of lr 1e-3 from the same weights, gradients to float32 rounding"),
    ("tests/test_inspection.py", "torch.testing.assert_close(p, q, rtol=1e-4, atol=0.05 * cfg.learning_rate)"):
        (DTYPE, "AdamW's first step moves a weight by lr g / (|g| + eps): two roundings of a gradient near 0 "
                "(of order eps, 1e-8) move it by a part of lr; 0.05 lr is 5e-5, far below a real step's lr"),
    # ---- tests/test_determinism.py
    ("tests/test_determinism.py", 'assert all(r["reward_std"] > 0 for r in rows) and rows[-1]["kl"] > 0  # the policy really moved'):
        (PLANTED, "the planted bug (a run that does not move: lr 0) gives a KL of exactly 0 and the test would "
                  "prove nothing; a spread of counted rewards is 0 only when all are equal"),
    ("tests/test_records.py", 'assert differ <= FLIPS, f"{differ} of {len(first)} greedy answers differ from the record\'s"'):
        (DTYPE, "greedy answers of the same weights: one differs only at a near-tie of the two best logits, within "
                "float32 rounding (allowances.FLIPS: at most 4, derived from the dtype)"),
    ("tests/test_records.py", 'assert sum(a == b for a, b in zip(shown, before["completions"])) >= len(shown) - FLIPS'):
        (DTYPE, "the same greedy completions but for a near-tie (allowances.FLIPS)"),
    # ---- tests/allowances.py
    ("tests/allowances.py", "assert abs(got[key] - want[key]) <= allowance, ("):
        (DTYPE, "same_draw: a counted field of a row sampled from the same weights with the same seed, before any "
                "update: at most FLIPS completions' worth apart (FLIPS derived from float32 logits)"),
    ("tests/allowances.py", "close = math.isclose(got[key], value, rel_tol=1e-4, abs_tol=1e-6)"):
        (DTYPE, "same_draw, when no counted field moved (the same tokens): floats computed from them before any "
                "update, float32 sums over a batch of a few thousand tokens"),
    ("tests/allowances.py", 'assert len(compared) >= at_least, f"{where}: only {compared} could catch {bug}; the check has no power"'):
        (EXACT, "a count of the fields with the power to catch the planted bug"),
    ("notebooks/16_tools_in_the_loop.ipynb", 'assert max(no_tool_steps.values()) <= 6 and all(row["frac_zero_std"] > 0.9 for s in record["seeds"]'):
        (RECORD, "the committed record's histories, counted"),
    ("notebooks/16_tools_in_the_loop.ipynb", 'assert summary["noisy_tool"]["tool_share"][-1]["mean"] > 0.9'):
        (RECORD, "the committed record's summary"),
    ("notebooks/16_tools_in_the_loop.ipynb", 'assert vs_cap["lo"] < 0 < vs_cap["hi"]  # as low as the calculator\'s errors alone would make it'):
        (RECORD, "the committed record's seeds"),
    ("notebooks/17_why_no_critic.ipynb", 'assert int(((new - old).abs() > 0.2).sum()) == 2 and info["value_clipfrac"] == 0.25'):
        (EXACT, "a constructed example: a count of values and a share of four tokens"),
    ("notebooks/16_tools_in_the_loop.ipynb", 'assert all(d < 0 for d in noisy["differences"]) and noisy["hi"] < 0  # lower in every seed, with its own calculator'):
        (RECORD, "the committed record's seeds"),
    # ---- the chapters' code cells (their committed-data cells read package data only)
    ('notebooks/07_one_training_step.ipynb', 'assert all(advantages[rewards >= 1] > 0) and all(advantages[rewards < 1] < 0)'):
        (DTYPE, "sampled from the shipped step policy with the chapter's seed, before any update: the same batch on any kernels but for a flip (allowances.FLIPS), from which the asserted relation follows exactly"),
    ('notebooks/07_one_training_step.ipynb', 'torch.testing.assert_close(loss_by_hand, loss)'):
        (DTYPE, "the same value computed twice on this machine (two orders of summation, or by hand and by the package): float32, torch's default tolerance"),
    ('notebooks/07_one_training_step.ipynb', 'torch.testing.assert_close('):
        (DTYPE, "the same value computed twice on this machine (two orders of summation, or by hand and by the package): float32, torch's default tolerance"),
    ('notebooks/07_one_training_step.ipynb', 'assert grad_norm > config.max_grad_norm  # the text: clipping acts on this step'):
        (DTYPE, "computed before any update from the shipped weights' batch: the gradient norm (printed, several times 1) against the clip at 1, and the push against its formula to float32 rounding"),
    ('notebooks/07_one_training_step.ipynb', 'torch.testing.assert_close(push[real], expected[real])'):
        (DTYPE, "computed before any update from the shipped weights' batch: the gradient norm (printed, several times 1) against the clip at 1, and the push against its formula to float32 rounding"),
    ('notebooks/07_one_training_step.ipynb', 'assert ((steps.double().abs() - adam).abs() <= spacing / 2 + 1e-5 * lr).all()'):
        (DTYPE, "Adam's move rounded to float32: half the spacing of float32 numbers there, plus 1e-5 lr for the fused kernel's own float32 arithmetic (about a hundred unit roundoffs)"),
    ('notebooks/07_one_training_step.ipynb', 'assert second_loss < loss and surrogate_only < 0 < kl_part'):
        (PLANTED, "after one update; the planted bug, the step not taken (learning rate 0), gives the same loss, a surrogate of 0, a KL of 0 and nothing clipped: each inequality is a bound at the bug's value, the honest values printed far from it"),
    ('notebooks/07_one_training_step.ipynb', 'assert second_stats["clip_frac"] > 0'):
        (PLANTED, "after one update; the planted bug, the step not taken (learning rate 0), gives the same loss, a surrogate of 0, a KL of 0 and nothing clipped: each inequality is a bound at the bug's value, the honest values printed far from it"),
    ('notebooks/07_one_training_step.ipynb', 'assert product.mean() > 0 and len(against) >= 1'):
        (PLANTED, "after one update; planted: learning rate 0 (no change: a product of 0) and the advantages' sign flipped (the mean product negative); the honest values printed"),
    ('notebooks/07_one_training_step.ipynb', 'assert typical < 0.01 and not (1 - eps < new_ratio[i, j] < 1 + eps)'):
        (PLANTED, "after one update; planted: learning rate 0 (no change: a product of 0) and the advantages' sign flipped (the mean product negative); the honest values printed"),
    ('notebooks/07_one_training_step.ipynb', 'assert (new_logp[i, j] - old_logp[i, j]) * advantages[i] > 0'):
        (PLANTED, "after one update; planted: learning rate 0 (no change: a product of 0) and the advantages' sign flipped (the mean product negative); the honest values printed"),
    ('notebooks/07_one_training_step.ipynb', 'torch.testing.assert_close(row["reward_mean"], rewards.mean().item())'):
        (DTYPE, 'the same value computed twice on this machine (two orders of summation, or by hand and by the package): the hand step and the trainer, one AdamW step from the same weights; the KL 0 in exact arithmetic, rounding of two scoring passes (1e-14)'),
    ('notebooks/07_one_training_step.ipynb', 'torch.testing.assert_close(row["grad_norm"], grad_norm.item())'):
        (DTYPE, 'the same value computed twice on this machine (two orders of summation, or by hand and by the package): the hand step and the trainer, one AdamW step from the same weights; the KL 0 in exact arithmetic, rounding of two scoring passes (1e-14)'),
    ('notebooks/07_one_training_step.ipynb', 'torch.testing.assert_close(row["loss"], loss.item(), atol=1e-6, rtol=0)'):
        (DTYPE, 'the same value computed twice on this machine (two orders of summation, or by hand and by the package): the hand step and the trainer, one AdamW step from the same weights; the KL 0 in exact arithmetic, rounding of two scoring passes (1e-14)'),
    ('notebooks/07_one_training_step.ipynb', 'assert abs(row["kl"]) < 1e-9 and abs(stats["kl"]) < 1e-9'):
        (DTYPE, 'the same value computed twice on this machine (two orders of summation, or by hand and by the package): the hand step and the trainer, one AdamW step from the same weights; the KL 0 in exact arithmetic, rounding of two scoring passes (1e-14)'),
    ('notebooks/07_one_training_step.ipynb', 'torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)'):
        (DTYPE, 'the same value computed twice on this machine (two orders of summation, or by hand and by the package): the hand step and the trainer, one AdamW step from the same weights; the KL 0 in exact arithmetic, rounding of two scoring passes (1e-14)'),
    ('notebooks/07_one_training_step.ipynb', 'torch.testing.assert_close(logp_shuffled.detach(), old_logp[order])'):
        (DTYPE, 'the same value computed twice on this machine (two orders of summation, or by hand and by the package): a no-grad and a training pass, float32 log-probs of a few nats'),
    ('notebooks/07_one_training_step.ipynb', 'assert abs(stats2["clip_frac"] - share) < 1e-6'):
        (PLANTED, "after one update, the second pass: a share of counted tokens computed twice (to float32 division); the clipped tokens' push against the planted bug of no clipping (a push the size of the advantage, ten times the bound)"),
    ('notebooks/07_one_training_step.ipynb', 'assert push.abs().max() < 0.1 * advantages.abs()[advantages != 0].min(), push'):
        (PLANTED, "after one update, the second pass: a share of counted tokens computed twice (to float32 division); the clipped tokens' push against the planted bug of no clipping (a push the size of the advantage, ten times the bound)"),
    ('notebooks/07_one_training_step.ipynb', 'assert kl_large / kl_small > 2 * step, results  # much faster than the step'):
        (PLANTED, 'one step at each of two learning rates from the same weights: planted, the same step size (a KL ratio of 1, the same clipped share): each inequality sits between that and the printed values'),
    ('notebooks/07_one_training_step.ipynb', 'assert sur_small < 0 and sur_large < 0 and sur_large / sur_small < step, results'):
        (PLANTED, 'one step at each of two learning rates from the same weights: planted, the same step size (a KL ratio of 1, the same clipped share): each inequality sits between that and the printed values'),
    ('notebooks/07_one_training_step.ipynb', 'assert clipped_share[1e-4] > clipped_share[3e-5], clipped_share'):
        (PLANTED, 'one step at each of two learning rates from the same weights: planted, the same step size (a KL ratio of 1, the same clipped share): each inequality sits between that and the printed values'),
    ('notebooks/07_one_training_step.ipynb', 'assert share[3e-5] < 0.5 and share[1e-4] > 1, share'):
        (PLANTED, 'one step at each of two learning rates from the same weights: planted, the same step size (a KL ratio of 1, the same clipped share): each inequality sits between that and the printed values'),
    ('notebooks/07_one_training_step.ipynb', 'assert results[3e-5][3] < 0 < results[1e-4][3], results  # down, then up'):
        (PLANTED, 'one step at each of two learning rates from the same weights: planted, the same step size (a KL ratio of 1, the same clipped share): each inequality sits between that and the printed values'),
    ('notebooks/07_one_training_step.ipynb', 'torch.testing.assert_close(-lp.grad[real], expected[real])'):
        (DTYPE, 'the same value computed twice on this machine (two orders of summation, or by hand and by the package): autograd against the formula, float32'),
    ('notebooks/08_tiny_transformer.ipynb', 'assert all_wrong + all_right < 0.5  # most groups mix right and wrong answers'):
        (PLANTED, 'sampled from the live warm start (after its updates): planted, a warm start that did not learn (every group all wrong: 1.0, above 0.5), and prompts of equal difficulty (exactly the formula)'),
    ('notebooks/08_tiny_transformer.ipynb', 'assert all_wrong + all_right > p**G + (1 - p)**G  # more than the formula says'):
        (PLANTED, 'sampled from the live warm start (after its updates): planted, a warm start that did not learn (every group all wrong: 1.0, above 0.5), and prompts of equal difficulty (exactly the formula)'),
    ('notebooks/08_tiny_transformer.ipynb', 'assert early_late("reward_mean")[1] > early_late("reward_mean")[0] + 0.1'):
        (PLANTED, "the live run's curves after 400 updates: planted, GRPO's learning rate 0 (no rise in reward, no fall of entropy) and a learning rate ten times higher (section 8.7's run: clip fractions of tens of %, collapse); lengths within the 4-token budget by construction"),
    ('notebooks/08_tiny_transformer.ipynb', 'assert abs(zero_late - zero_early) < 0.15  # all-wrong out, all-right in: it balances'):
        (PLANTED, "the live run's curves after 400 updates: planted, GRPO's learning rate 0 (no rise in reward, no fall of entropy) and a learning rate ten times higher (section 8.7's run: clip fractions of tens of %, collapse); lengths within the 4-token budget by construction"),
    ('notebooks/08_tiny_transformer.ipynb', 'assert early_late("entropy")[1] < early_late("entropy")[0]'):
        (PLANTED, "the live run's curves after 400 updates: planted, GRPO's learning rate 0 (no rise in reward, no fall of entropy) and a learning rate ten times higher (section 8.7's run: clip fractions of tens of %, collapse); lengths within the 4-token budget by construction"),
    ('notebooks/08_tiny_transformer.ipynb', 'assert 2 <= min(lengths) and max(lengths) <= 4'):
        (EXACT, 'completion lengths, counted: the budget is 4 tokens'),
    ('notebooks/08_tiny_transformer.ipynb', 'assert max(early_late("clip_frac")) < 0.05  # small early and late'):
        (PLANTED, "the live run's curves after 400 updates: planted, GRPO's learning rate 0 (no rise in reward, no fall of entropy) and a learning rate ten times higher (section 8.7's run: clip fractions of tens of %, collapse); lengths within the 4-token budget by construction"),
    ('notebooks/08_tiny_transformer.ipynb', 'assert max(h["clip_frac"] for h in trainer.history) < 0.2  # no step near tens of %'):
        (PLANTED, "the live run's curves after 400 updates: planted, GRPO's learning rate 0 (no rise in reward, no fall of entropy) and a learning rate ten times higher (section 8.7's run: clip fractions of tens of %, collapse); lengths within the 4-token budget by construction"),
    ('notebooks/08_tiny_transformer.ipynb', 'assert gain > 5 * gain_se  # far beyond the noise (8.6: its size against the seeds)'):
        (PLANTED, 'the live gain after GRPO: planted, learning rate 0 (a gain of exactly 0, the same greedy answers)'),
    ('notebooks/08_tiny_transformer.ipynb', 'assert after["accuracy"] > np.mean(sampled[-10:])'):
        (PLANTED, 'after GRPO: planted, learning rate 0 (greedy and sampled accuracy as at the warm start, the same all-wrong groups in expectation)'),
    ('notebooks/08_tiny_transformer.ipynb', 'assert (k_after == 0).sum() < (k_warm == 0).sum()'):
        (PLANTED, 'after GRPO: planted, learning rate 0 (greedy and sampled accuracy as at the warm start, the same all-wrong groups in expectation)'),
    ('notebooks/08_tiny_transformer.ipynb', 'assert all(g > 0.1 for g in gains.values())  # the text: both kinds gained'):
        (PLANTED, 'after GRPO: planted, learning rate 0 (a gain of exactly 0 in both kinds)'),
    ('notebooks/08_tiny_transformer.ipynb', 'assert up + down > 100 and min(up, down) > 20  # the text: many flip, both ways'):
        (PLANTED, 'greedy answers between evaluations: planted, learning rate 0 (the same answers: no flips at all)'),
    ('notebooks/08_tiny_transformer.ipynb', "assert abs(live_gain - seed_mean) <= half_width  # within the seeds' spread"):
        (SEEDS, "the live gain against the 8 seeds' prediction interval at 99% (tests/test_records.py checks the record's power); and a real gain: learning rate 0 gives exactly 0"),
    ('notebooks/08_tiny_transformer.ipynb', 'assert live_gain > 3 * live_se  # and a real gain'):
        (SEEDS, "the live gain against the 8 seeds' prediction interval at 99% (tests/test_records.py checks the record's power); and a real gain: learning rate 0 gives exactly 0"),
    ('notebooks/08_tiny_transformer.ipynb', 'assert np.mean(rewards_fast[5:]) < 0.05 and max(rewards_fast[5:]) < 0.1'):
        (PLANTED, "a run at ten times the learning rate: planted, the recipe's own rate (the reward stays near its start, above 0.1; no groups all equal)"),
    ('notebooks/08_tiny_transformer.ipynb', 'assert max(zero_std_fast[:10]) > 0.9'):
        (PLANTED, "a run at ten times the learning rate: planted, the recipe's own rate (the reward stays near its start, above 0.1; no groups all equal)"),
    ('notebooks/08_tiny_transformer.ipynb', 'assert fast_eval["accuracy"] < 0.05'):
        (PLANTED, "a run at ten times the learning rate: planted, the recipe's own rate (the reward stays near its start, above 0.1; no groups all equal)"),
    ('notebooks/08_tiny_transformer.ipynb', 'assert target**G + (1 - target)**G < (0.1**G + 0.9**G)  # fewer at 0.6 than at 0.1'):
        (DTYPE, 'arithmetic on constants'),
    ('notebooks/08_tiny_transformer.ipynb', 'torch.testing.assert_close(p_q.mean(), torch.as_tensor(p, dtype=p_q.dtype))'):
        (DTYPE, "a mean of counted fractions computed two ways, float32; Jensen's inequality, exact for the values"),
    ('notebooks/08_tiny_transformer.ipynb', 'assert mean_f >= f_mean  # Jensen'):
        (DTYPE, "a mean of counted fractions computed two ways, float32; Jensen's inequality, exact for the values"),
    ('notebooks/08_tiny_transformer.ipynb', 'assert clip2 > clip1  # the second pass clips more'):
        (PLANTED, 'ten live steps with two updates per step against one: planted, one update per step (the same clip fraction, 0 on a first pass)'),
    ('notebooks/12_grpo_lab.ipynb', 'assert abs(lab.pass_at_k(n, c, k) - brute) < 1e-12'):
        (DTYPE, 'float64 products of at most 64 factors against exact enumeration'),
    ('notebooks/12_grpo_lab.ipynb', 'assert smallest > 0  # every arm ended above the shared warm start'):
        (PLANTED, 'the live lab after 30 updates: planted, learning rate 0 (every gain exactly 0)'),
    ('notebooks/12_grpo_lab.ipynb', "assert mean_gain > 3 * largest_se  # together, far beyond one evaluation's noise"):
        (PLANTED, 'the live lab after 30 updates: planted, learning rate 0 (every gain exactly 0)'),
    ('notebooks/12_grpo_lab.ipynb', 'assert all(a <= b + 1e-12 for a, b in zip(curve, curve[1:])), c'):
        (DTYPE, 'float64 products of at most 64 factors'),
    ('notebooks/12_grpo_lab.ipynb', 'assert abs(curve[0] - c / n) < 1e-12, c'):
        (DTYPE, 'float64 products of at most 64 factors'),
    ('notebooks/12_grpo_lab.ipynb', 'assert abs(paired["mean"] - (rft["mean"] - grpo["mean"])) < 1e-12'):
        (RECORD, "the committed record's summary, recomputed two ways in float64"),
    ("notebooks/12_grpo_lab.ipynb", 'assert 0.015 < min(now) and max(now) < 0.035  # "one and a half to three and a half points"'):
        (RECORD, "the committed record's seeds and summary, and the power arithmetic on them"),
    ("notebooks/12_grpo_lab.ipynb", 'assert 0.25 < by_chance < 0.35  # "about a third of the time"'):
        (RECORD, "the committed record's seeds and summary, and the power arithmetic on them"),
    ("notebooks/12_grpo_lab.ipynb", 'assert all(r["three"] > 4 * r["now"] for r in power.values())  # "several times larger"'):
        (RECORD, "the committed record's seeds and summary, and the power arithmetic on them"),
    ("notebooks/12_grpo_lab.ipynb", 'assert ceiling > 2 * (chn["hi"] - chn["mean"])  # a rise to the ceiling would have been resolved'):
        (RECORD, "the committed record's seeds and summary, and the power arithmetic on them"),
    ("notebooks/12_grpo_lab.ipynb", 'assert ch1["lo"] > 0 and chn["hi"] < 0  # pass@1 rose, pass@n fell, both beyond the seeds\' noise'):
        (RECORD, "the committed record's seeds and summary, and the power arithmetic on them"),
    ("notebooks/12_grpo_lab.ipynb", 'assert len(flipped) == len(spans) and min(spans.values()) > 0.05  # several points, both ways, every method'):
        (RECORD, "the committed record's seeds and summary, and the power arithmetic on them"),
    ("notebooks/12_grpo_lab.ipynb", 'assert min(corr.values()) > 0.5  # "every method\'s correlation with GRPO is high"'):
        (RECORD, "the committed record's seeds and summary, and the power arithmetic on them"),
    ("notebooks/12_grpo_lab.ipynb", 'assert min(need) < n_seeds < max(need_family)'):
        (RECORD, "the committed record's seeds and summary, and the power arithmetic on them"),
    ("notebooks/12_grpo_lab.ipynb", "assert min(three) > separating  # 3 seeds could not have caught DAPO's or GSPO's difference"):
        (RECORD, "the committed record's seeds and summary, and the power arithmetic on them"),
    ("notebooks/12_grpo_lab.ipynb", 'assert r > 0.5 and paired["se"] < unpaired_se / 2  # "strongly": "less than half"'):
        (RECORD, "the committed record's seeds and summary, and the power arithmetic on them"),
    ("notebooks/12_grpo_lab.ipynb", 'assert {name for name in resolved if summary["methods"][name]["vs_grpo"]["mean"] > 0} == {"dapo", "gspo"}'):
        (RECORD, "the committed record's seeds and summary, and the power arithmetic on them"),
    ('notebooks/12_grpo_lab.ipynb', 'assert math.isclose(paired["se"] ** 2, unpaired_se ** 2 - 2 * cov / len(grpo["values"]), rel_tol=1e-9)'):
        (RECORD, "the committed record's summary, recomputed two ways in float64"),
    ('notebooks/12_grpo_lab.ipynb', 'assert (paired["se"] < unpaired_se) == (cov > 0)  # pairing helps exactly when the seeds move together'):
        (RECORD, "the committed record's summary, recomputed two ways in float64"),
    ('notebooks/12_grpo_lab.ipynb', 'torch.testing.assert_close(rloo, centred * 8 / 7)'):
        (DTYPE, 'float64 identities on random rewards and autograd'),
    ('notebooks/12_grpo_lab.ipynb', 'torch.testing.assert_close(factor, G / (G - 1) * L_MAX / lengths.double())'):
        (DTYPE, 'float64 identities on random rewards and autograd'),
    ('notebooks/13_thinking_longer.ipynb', 'assert max(guessed) <= 8 and min(lengths) > 48'):
        (EXACT, 'token counts of fixed strings'),
    ('notebooks/13_thinking_longer.ipynb', 'assert recipe.grpo.max_new_tokens == 72 and max(lengths) <= 72  # the budget fits them'):
        (EXACT, 'a setting and token counts of fixed strings'),
    ('notebooks/13_thinking_longer.ipynb', 'assert abs(start[key] - recorded[key]) <= FLIPS / start["n"], key  # the record\'s step 0 again'):
        (DTYPE, "sampled from the shipped warm start with the record's seed, before any update: the same draw but for a flip (the chapter's FLIPS, allowances.FLIPS's derivation); its relations hold for the record's values with margins far above a flip's worth"),
    ('notebooks/13_thinking_longer.ipynb', 'assert start["worked_share"] < 0.5  # it mostly guesses'):
        (DTYPE, "sampled from the shipped warm start with the record's seed, before any update: the same draw but for a flip (the chapter's FLIPS, allowances.FLIPS's derivation); its relations hold for the record's values with margins far above a flip's worth"),
    ('notebooks/13_thinking_longer.ipynb', 'assert start["accuracy_worked"] > start["accuracy_guess"] + 0.3  # and guessing is worse'):
        (DTYPE, "sampled from the shipped warm start with the record's seed, before any update: the same draw but for a flip (the chapter's FLIPS, allowances.FLIPS's derivation); its relations hold for the record's values with margins far above a flip's worth"),
    ('notebooks/13_thinking_longer.ipynb', 'assert end["worked_share"] > start["worked_share"] + 0.3'):
        (PLANTED, "the live run after 30 updates: planted, GRPO's learning rate 0 (the shares, lengths and accuracy of step 0, printed above)"),
    ('notebooks/13_thinking_longer.ipynb', 'assert end["length"] > 2 * start["length"]  # more than twice as long'):
        (PLANTED, "the live run after 30 updates: planted, GRPO's learning rate 0 (the shares, lengths and accuracy of step 0, printed above)"),
    ('notebooks/13_thinking_longer.ipynb', 'assert end["accuracy"] > start["accuracy"] + 0.15'):
        (PLANTED, "the live run after 30 updates: planted, GRPO's learning rate 0 (the shares, lengths and accuracy of step 0, printed above)"),
    ('notebooks/13_thinking_longer.ipynb', 'assert c1["accuracy"] > c0["accuracy"] + 0.1  # every seed learned'):
        (RECORD, "the committed record's seeds"),
    ('notebooks/13_thinking_longer.ipynb', 'assert chose_working[s["seed"]] == (c0["accuracy_worked"] > c0["accuracy_guess"])'):
        (RECORD, "the committed record's seeds"),
    ('notebooks/13_thinking_longer.ipynb', 'assert all(s["variants"]["grpo"]["curve"][0]["accuracy_guess"] < 0.05'):
        (RECORD, "the committed record's seeds"),
    ('notebooks/13_thinking_longer.ipynb', 'assert observed["hi"] < 0 and abs(observed["mean"] - alone) < 0.5'):
        (RECORD, "the committed record's summary"),
    ('notebooks/13_thinking_longer.ipynb', 'assert acc["lo"] < 0 < acc["hi"]  # not measurably more or less accurate'):
        (RECORD, "the committed record's summary"),
    ('notebooks/13_thinking_longer.ipynb', 'assert early[loss]["hi"] < 0 and abs(late[loss]["mean"]) < 0.01  # slower, then caught up'):
        (RECORD, "the committed record's summary"),
    ('notebooks/13_thinking_longer.ipynb', 'assert tight == 56 and 0.6 < cut < 0.7  # "about two thirds"'):
        (EXACT, 'a setting and a share of fixed strings, counted'),
    ('notebooks/13_thinking_longer.ipynb', "assert guess0 < 0.05  # no seed's guesses were right: nothing to switch to"):
        (RECORD, "the committed record's summary and token counts of fixed strings"),
    ('notebooks/13_thinking_longer.ipynb', 'assert tight["worked_share"] > 0.9 and tight["truncated"] > 0.5  # it keeps working out'):
        (RECORD, "the committed record's summary and token counts of fixed strings"),
    ('notebooks/13_thinking_longer.ipynb', 'assert tight["accuracy"] < full["accuracy"] - 0.2  # and is cut off'):
        (RECORD, "the committed record's summary and token counts of fixed strings"),
    ('notebooks/13_thinking_longer.ipynb', 'assert 0.4 < ratio < 0.6  # "about half"'):
        (RECORD, "the committed record's summary and token counts of fixed strings"),
    ('notebooks/13_thinking_longer.ipynb', 'assert summary["budget"]["vs_grpo"]["length_correct"]["hi"] < 0  # its right answers: shorter sums'):
        (RECORD, "the committed record's summary and token counts of fixed strings"),
    ('notebooks/13_thinking_longer.ipynb', 'assert masked["hi"] < 0.01  # masking did not help'):
        (RECORD, "the committed record's summary and token counts of fixed strings"),
    ('notebooks/13_thinking_longer.ipynb', 'assert soft["worked_share"] > 0.9 and abs(soft["accuracy"] - full["accuracy"]) < 0.05'):
        (RECORD, "the committed record's summary and token counts of fixed strings"),
    ('notebooks/13_thinking_longer.ipynb', 'assert d["accuracy"]["lo"] < 0 < d["accuracy"]["hi"] and abs(d["length"]["mean"]) < 1'):
        (RECORD, "the committed record's summary and token counts of fixed strings"),
    ('notebooks/13_thinking_longer.ipynb', 'assert rnd["accuracy"] < 0.02 and fmt["accuracy"] < 0.02  # "almost nothing", both'):
        (RECORD, "the committed record's summary"),
    ('notebooks/13_thinking_longer.ipynb', 'assert rnd["length"] < c0["length"]  # the coin flip: shorter answers in every seed'):
        (RECORD, "the committed record's summary"),
    ('notebooks/13_thinking_longer.ipynb', 'assert fmt["worked_share"] > 0.9  # the format reward: every seed learned the format'):
        (RECORD, "the committed record's summary"),
    ('notebooks/13_thinking_longer.ipynb', 'assert checks[name]["copied"] > 0.85  # the steps still copy the right digits'):
        (PLANTED, 'twenty live updates of the control rewards from the shipped warm start: planted, the warm start itself (copied and added shares printed beside them)'),
    ('notebooks/13_thinking_longer.ipynb', 'assert checks[name]["added"] < checks["warm start"]["added"] - 0.15  # their sums go wrong'):
        (PLANTED, 'twenty live updates of the control rewards from the shipped warm start: planted, the warm start itself (copied and added shares printed beside them)'),
    ('notebooks/13_thinking_longer.ipynb', 'assert d["lo"] < 0 < d["hi"]  # not distinguishable from G = 8'):
        (RECORD, "the committed record's summary"),
    ('notebooks/13_thinking_longer.ipynb', 'assert -0.001 < d["hi"] < 0  # below zero, only just'):
        (RECORD, "the committed record's summary"),
    ('notebooks/13_thinking_longer.ipynb', 'assert all(x < 0 for x in d["differences"])  # lower in every seed'):
        (RECORD, "the committed record's summary"),
    ('notebooks/13_thinking_longer.ipynb', 'assert lo < 0 < hi  # contains zero once the three comparisons are accounted for'):
        (RECORD, "the committed record's summary"),
    ('notebooks/13_thinking_longer.ipynb', 'assert zero_share[2] > zero_share[4] > zero_share[8] > zero_share[16]'):
        (RECORD, "the committed record's summary"),
    ('notebooks/13_thinking_longer.ipynb', 'assert (share > 0.5) == (worked > guess)  # GRPO chose the style that was right more often'):
        (RECORD, "the 5-digit record's numbers, copied with their commit"),
    ('notebooks/13_thinking_longer.ipynb', 'assert math.isclose(per_token[0] / per_token[1], 7 if loss_type == "grpo" else 1,'):
        (DTYPE, 'exact small example: float32 pushes of 1/(2 x 56) and their ratio 7'),
    ('notebooks/13_thinking_longer.ipynb', 'assert all(math.isclose(float(first_token[t][1]), 1 / (2 * 56), rel_tol=1e-5) for t in first_token)'):
        (DTYPE, 'exact small example: float32 pushes of 1/(2 x 56) and their ratio 7'),
    ('notebooks/13_thinking_longer.ipynb', 'assert math.isclose(float(first_token["grpo"][0] / first_token["dr_grpo"][0]), 7, rel_tol=1e-5)'):
        (DTYPE, 'exact small example: float32 pushes of 1/(2 x 56) and their ratio 7'),
    ('notebooks/13_thinking_longer.ipynb', 'assert (first is None) == (gap <= 0)'):
        (RECORD, "the committed record's seeds"),
    ('notebooks/14_lora.ipynb', 'assert gap < 1e-5 and rank <= config.lora_r'):
        (DTYPE, 'the same value computed twice on this machine (two orders of summation, or by hand and by the package): the LoRA layer by hand and by PEFT, float32; the rank an exact count'),
    ('notebooks/14_lora.ipynb', 'assert 12 * lora_parameter_count(qwen, 16) < full_checkpoint / 50'):
        (EXACT, 'counts of weights'),
    ('notebooks/14_lora.ipynb', 'assert 90e6 < 12 * lora_parameter_count(qwen, 16) < 120e6  # "about a hundred megabytes" (105.6 MB)'):
        (EXACT, 'counts of weights'),
    ('notebooks/14_lora.ipynb', 'assert lora_trainer.ref_model is None and history[0]["kl"] <= KL_ROUNDING'):
        (DTYPE, 'the first KL of a fresh adapter, 0 in exact arithmetic: float32 rounding squared of two passes of the same weights (log-probs within 1.2e-5 relative, |log p| under 4: 1.2e-9)'),
    ('notebooks/14_lora.ipynb', 'assert history[2]["kl"] > 0 and moved > 0  # the adapters moved, and the KL sees it'):
        (PLANTED, 'three live updates: planted, learning rate 0 (a KL of exactly 0, no weight moved)'),
    ('notebooks/14_lora.ipynb', 'assert max(abs(a - b) for a, b in zip(*times)) > 0.1'):
        (RECORD, "the committed records' summaries and timings"),
    ('notebooks/14_lora.ipynb', 'assert abs(loads[0] - loads[1]) > 0.3  # at different loads (medians about 4.3 and 4.9)'):
        (RECORD, "the committed records' summaries and timings"),
    ('notebooks/14_lora.ipynb', 'assert all(1 <= families[f]["learning_rate"] / full_best["learning_rate"] <= 3 for f in lora)'):
        (RECORD, "the committed records' summaries and timings"),
    ('notebooks/14_lora.ipynb', 'assert families[f]["vs_full"]["mean"] > families["all r=1"]["vs_full"]["mean"]'):
        (RECORD, "the committed records' summaries and timings"),
    ('notebooks/14_lora.ipynb', 'assert vs_r4["lo"] < 0 < vs_r4["hi"] and worse == 3  # not told apart at five seeds'):
        (RECORD, "the committed records' summaries and timings"),
    ('notebooks/14_lora.ipynb', 'assert families["all r=1"]["vs_full"]["hi"] < 0 and widened["all r=1"][1] < 0'):
        (RECORD, "the committed records' summaries and timings"),
    ('notebooks/14_lora.ipynb', 'assert families["all r=4"]["vs_full"]["hi"] < 0 < widened["all r=4"][1]'):
        (RECORD, "the committed records' summaries and timings"),
    ('notebooks/14_lora.ipynb', 'assert families[f]["vs_full"]["lo"] < 0 < families[f]["vs_full"]["hi"]'):
        (RECORD, "the committed records' summaries and timings"),
    ('notebooks/14_lora.ipynb', 'assert at_ten_x[f]["lo"] < 0 < at_ten_x[f]["hi"], f'):
        (RECORD, "the committed records' summaries"),
    ('notebooks/14_lora.ipynb', 'assert at_ten_x["all r=16"]["hi"] < 0 < at_ten_x["all r=16"]["wide"][1]'):
        (RECORD, "the committed records' summaries"),
    ('notebooks/14_lora.ipynb', 'assert all(-0.01 < at_ten_x[f]["mean"] < 0 for f in ("all r=4", "attn r=12"))'):
        (RECORD, "the committed records' summaries"),
    ('notebooks/14_lora.ipynb', 'assert max(carried) <= bound'):
        (RECORD, "the committed records' reward curves and counts of weights"),
    ('notebooks/14_lora.ipynb', "assert 0.5 < max(carried) / (2 * rank1) < 2  # rank 1: about as much room as the rewards' bits"):
        (RECORD, "the committed records' reward curves and counts of weights"),
    ('notebooks/14_lora.ipynb', 'assert 2 * rank4 > 2 * max(carried)  # rank 4: at least twice the room'):
        (RECORD, "the committed records' reward curves and counts of weights"),
    ('notebooks/14_lora.ipynb', 'assert at_ten["full"] < 0.05 and all(at_ten[f] > at_ten["full"] + 0.1 for f in lora)'):
        (RECORD, "the committed records' summaries"),
    ('notebooks/14_lora.ipynb', 'assert float(gap.max()) > 0'):
        (PLANTED, 'random adapters: planted, the adapter disabled (a gap of exactly 0)'),
    ('notebooks/15_sampler_mismatch.ipynb', 'assert abs(reweighted - exact) < 1e-12'):
        (DTYPE, "float64 sums of five terms; 200,000 Monte Carlo draws: the weighted estimate's sd is below 0.005, the bound 0.02 four sds, the plain estimate's bias 0.7"),
    ('notebooks/15_sampler_mismatch.ipynb', 'assert abs(weighted_mc - exact) < 0.02 < 0.1 < abs(plain_mc - exact)'):
        (DTYPE, "float64 sums of five terms; 200,000 Monte Carlo draws: the weighted estimate's sd is below 0.005, the bound 0.02 four sds, the plain estimate's bias 0.7"),
    ('notebooks/15_sampler_mismatch.ipynb', 'assert bf16["log_ratio_abs_mean"] > 0 and stale["log_ratio_abs_mean"] > 0  # neither is the learner'):
        (PLANTED, "measured on samplers of the live warm start (the stale one after 8 updates): planted, the sampler that is the learner (every log-ratio exactly 0); top-p's ratios <= 1 by construction"),
    ('notebooks/15_sampler_mismatch.ipynb', 'assert stale["log_ratio_sd"] > bf16["log_ratio_sd"]  # the stale copy\'s log-ratios spread wider'):
        (PLANTED, "measured on samplers of the live warm start (the stale one after 8 updates): planted, the sampler that is the learner (every log-ratio exactly 0); top-p's ratios <= 1 by construction"),
    ('notebooks/15_sampler_mismatch.ipynb', 'assert top_p["log_ratio_quantiles"]["0.99"] <= 1e-6  # top-p: pi / mu <= 1 for every sampled token'):
        (PLANTED, "measured on samplers of the live warm start (the stale one after 8 updates): planted, the sampler that is the learner (every log-ratio exactly 0); top-p's ratios <= 1 by construction"),
    ('notebooks/15_sampler_mismatch.ipynb', 'assert all(long_[k][0] < 1e-9 for k in ["sequence, no bound"])  # the sequence ratio: unbiased'):
        (DTYPE, 'exact enumeration of every sequence in float64'),
    ('notebooks/15_sampler_mismatch.ipynb', 'assert long_["uncorrected"][0] > short["uncorrected"][0]  # the uncorrected bias grows with length'):
        (DTYPE, 'exact enumeration of every sequence in float64'),
    ('notebooks/15_sampler_mismatch.ipynb', 'assert long_["token_truncate"][0] < long_["uncorrected"][0] / 5  # the token weight removes most of it'):
        (DTYPE, 'exact enumeration of every sequence in float64'),
    ('notebooks/15_sampler_mismatch.ipynb', 'assert long_["sequence, no bound"][1] > 3 * short["sequence, no bound"][1]  # sequence variance grows fast'):
        (DTYPE, 'exact enumeration of every sequence in float64'),
    ('notebooks/15_sampler_mismatch.ipynb', 'assert long_["sequence, no bound"][1] > 2 * long_["token_truncate"][1]  # and beats the token weight\'s'):
        (DTYPE, 'exact enumeration of every sequence in float64'),
    ('notebooks/15_sampler_mismatch.ipynb', 'assert long_["sequence_mask"][1] < long_["sequence_truncate"][1] < long_["sequence, no bound"][1]'):
        (DTYPE, 'exact enumeration of every sequence in float64'),
    ('notebooks/15_sampler_mismatch.ipynb', 'assert long_["sequence_mask"][0] > long_["sequence_truncate"][0] > 0  # masking: the larger bias'):
        (DTYPE, 'exact enumeration of every sequence in float64'),
    ('notebooks/15_sampler_mismatch.ipynb', 'assert toy[L]["token_truncate"][0] < toy[L]["uncorrected"][0] and toy[L]["token_truncate"][1] <= toy[L]["uncorrected"][1]'):
        (DTYPE, 'exact enumeration of every sequence in float64'),
    ('notebooks/15_sampler_mismatch.ipynb', 'assert n_short >= 10 and n_long >= 10'):
        (EXACT, 'counts of sampled completions by length'),
    ('notebooks/15_sampler_mismatch.ipynb', 'assert long_sd / short_sd > max(1.5, predicted)  # it spreads with the length, at least as sqrt(L) would'):
        (PLANTED, 'sampled from the shipped thinking warm start and a bfloat16 copy: planted, the learner as its own sampler (every log-ratio 0); the sums of log-ratios to float32 rounding of 72 terms'),
    ('notebooks/15_sampler_mismatch.ipynb', 'assert all(abs(float(t.sum()) - float(v)) < 1e-4 for t, v in zip(per_completion, seq_log))  # the same completions'):
        (DTYPE, 'the same value computed twice on this machine (two orders of summation, or by hand and by the package): sums of at most 72 float32 log-ratios'),
    ('notebooks/15_sampler_mismatch.ipynb', 'assert token_sd["long"] > 1.2 * token_sd["short"]'):
        (PLANTED, 'sampled from the shipped thinking warm start and a bfloat16 copy: planted, the learner as its own sampler (every log-ratio 0); the sums of log-ratios to float32 rounding of 72 terms'),
    ('notebooks/15_sampler_mismatch.ipynb', 'assert abs(got / want - 1) < 0.25'):
        (PLANTED, "the spread's growth with length against its sqrt(L) prediction: planted, a spread that does not grow (a ratio of 1)"),
    ('notebooks/15_sampler_mismatch.ipynb', "assert seq_mask[2, 0] == 0 and seq_mask[1, 0] > 0  # the drifting completion leaves; the one bad token's stays"):
        (EXACT, 'weights of a constructed example: masked exactly 0, kept positive'),
    ('notebooks/15_sampler_mismatch.ipynb', 'assert tok_mask[1, 1] == 0 and bool((tok_mask[2] > 0).all())'):
        (EXACT, 'weights of a constructed example: masked exactly 0, kept positive'),
    ('notebooks/15_sampler_mismatch.ipynb', 'assert 0 < m["diagnostics"]["mismatch/ess"] <= 1'):
        (PLANTED, "measured on the live samplers: the ESS a share in (0, 1] by construction, top-p's ratios <= 1 by construction, bfloat16's KL against the planted stale and top-p samplers"),
    ('notebooks/15_sampler_mismatch.ipynb', 'assert measured[f"top_p={TOP_P}"]["diagnostics"]["mismatch/token_outside"] == 0  # every rho_t = m_t <= 1 < 3'):
        (PLANTED, "measured on the live samplers: the ESS a share in (0, 1] by construction, top-p's ratios <= 1 by construction, bfloat16's KL against the planted stale and top-p samplers"),
    ('notebooks/15_sampler_mismatch.ipynb', 'assert all(10 * d["bfloat16"]["mismatch/kl"] < v["mismatch/kl"] for n, v in d.items() if n != "bfloat16")'):
        (PLANTED, "measured on the live samplers: the ESS a share in (0, 1] by construction, top-p's ratios <= 1 by construction, bfloat16's KL against the planted stale and top-p samplers"),
    ('notebooks/15_sampler_mismatch.ipynb', 'assert float((rho - mass).abs().max()) < 1e-5'):
        (DTYPE, 'the same value computed twice on this machine (two orders of summation, or by hand and by the package): the ratio and the nucleus mass from one model, float32 sums of 64 probabilities'),
    ('notebooks/15_sampler_mismatch.ipynb', 'assert float(rho.mean()) < 1'):
        (DTYPE, 'the same value computed twice on this machine (two orders of summation, or by hand and by the package): the ratio and the nucleus mass from one model, float32 sums of 64 probabilities'),
    ('notebooks/15_sampler_mismatch.ipynb', "assert abs(corrected - float((pi[kept] * f[kept]).sum())) < 1e-12  # only the nucleus's part, every mode"):
        (DTYPE, 'float64 sums of five terms'),
    ('notebooks/15_sampler_mismatch.ipynb', 'assert abs(float((pi[kept] * f[kept]).sum()) - exact) > 0.05  # which is not E_pi[f]'):
        (DTYPE, 'float64 sums of five terms'),
    ('notebooks/15_sampler_mismatch.ipynb', 'assert gap[torch.float16] < gap[torch.bfloat16] / 2'):
        (PLANTED, 'scoring one batch with float16 and bfloat16 copies: planted, the two the same dtype (equal gaps)'),
    ('notebooks/15_sampler_mismatch.ipynb', 'assert abs(ess(torch.ones(N)) - 1) < 1e-12'):
        (DTYPE, 'float64 arithmetic; an ordering of two measured ESS values, printed'),
    ('notebooks/15_sampler_mismatch.ipynb', 'assert abs(ess(torch.tensor([1.0] + [0.0] * (N - 1))) - 1 / N) < 1e-12'):
        (DTYPE, 'float64 arithmetic; an ordering of two measured ESS values, printed'),
    ('notebooks/15_sampler_mismatch.ipynb', 'assert ess((seq_log[lengths > LONG] - seq_log[lengths > LONG].max()).exp()) <= ess('):
        (DTYPE, 'float64 arithmetic; an ordering of two measured ESS values, printed'),
    ('notebooks/15_sampler_mismatch.ipynb', 'assert history[0]["mismatch/kl"] < 1e-6 < history[-1]["mismatch/kl"]'):
        (PLANTED, 'a stale sampler over 8 live updates: 0 at the first step by construction (the copy is the learner), planted: no update (0 at the last)'),
    ('notebooks/15_sampler_mismatch.ipynb', 'assert gaps[-1] < 1e-12 and all(g > 0 for g in gaps[:-2])'):
        (DTYPE, 'float64 sums of five terms; top_p = 1 is exact'),
    ('notebooks/16_tools_in_the_loop.ipynb', 'assert int(tool_tokens.sum()) > 0 and largest["loss_mask"] == 0  # exactly: the mask multiplies them by 0'):
        (EXACT, 'a count of tool tokens, and a gradient that the mask multiplies by exactly 0'),
    ('notebooks/16_tools_in_the_loop.ipynb', 'assert largest["completion_mask"] > 0  # without the mask the tool\'s tokens would be trained on'):
        (EXACT, 'a count of tool tokens, and a gradient that the mask multiplies by exactly 0'),
    ('notebooks/16_tools_in_the_loop.ipynb', 'assert after["tool_share"] > before["tool_share"] + 0.3'):
        (PLANTED, 'twenty live updates: planted, learning rate 0 (the share that calls and the accuracy of step 0)'),
    ('notebooks/16_tools_in_the_loop.ipynb', 'assert after["accuracy"] > before["accuracy"]'):
        (PLANTED, 'twenty live updates: planted, learning rate 0 (the share that calls and the accuracy of step 0)'),
    ('notebooks/16_tools_in_the_loop.ipynb', 'assert abs(LEVEL - (1 - FAMILY_ERROR / len(COMPARISONS))) < 1e-12'):
        (DTYPE, 'float64 arithmetic'),
    ('notebooks/17_why_no_critic.ipynb', 'assert torch.allclose(advantages, torch.tensor([by_hand]), atol=1e-6)'):
        (DTYPE, 'exact small examples of GAE in float32'),
    ('notebooks/17_why_no_critic.ipynb', 'assert torch.allclose(mc, 1.0 - values, atol=1e-6)'):
        (DTYPE, 'exact small examples of GAE in float32'),
    ('notebooks/17_why_no_critic.ipynb', 'assert torch.allclose(td[0, :3], values[0, 1:] - values[0, :3], atol=1e-6)'):
        (DTYPE, 'exact small examples of GAE in float32'),
    ('notebooks/17_why_no_critic.ipynb', 'assert clipped >= plain  # the larger error is taken: clipping can only raise the loss'):
        (DTYPE, 'a constructed example: the clipped loss takes the larger error, exactly'),
    ('notebooks/17_why_no_critic.ipynb', 'assert math.isclose(folded.sum().item(), 1.0 - 0.1 * kl.sum().item(), rel_tol=1e-6)'):
        (DTYPE, 'float32 sums of a few terms'),
    ('notebooks/17_why_no_critic.ipynb', 'assert abs(first["explained_variance"]) < 1e-6'):
        (DTYPE, "the explained variance of the first PPO step: 0 in exact arithmetic (the critic's head starts at 0), float32 rounding of its variances"),
    ('notebooks/17_why_no_critic.ipynb', 'assert torch.allclose(a[0], torch.tensor([lam ** (3 - t) for t in range(4)]), atol=1e-6)'):
        (DTYPE, 'exact small example of GAE in float32'),
}


def allowance_lines(text: str) -> list[str]:
    """The lines of ``text`` that hold an allowance, without their indentation."""
    return [line.strip() for line in text.splitlines() if ALLOWANCE.search(line)]


def notebook_code(path: Path) -> str:
    """The code cells of a notebook but those tagged ``committed-data`` (they read package data only)."""
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    return "\n".join("".join(c["source"]) for c in cells
                     if c["cell_type"] == "code" and "committed-data" not in c.get("metadata", {}).get("tags", []))


def found_allowances(root: Path = ROOT) -> Counter:
    """Every allowance in the scanned files: (file, line) -> how many times it appears."""
    found: Counter = Counter()
    for name in TEST_FILES:
        for line in allowance_lines((root / name).read_text(encoding="utf-8")):
            found[(name, line)] += 1
    for name in NOTEBOOKS:
        for line in allowance_lines(notebook_code(root / name)):
            found[(name, line)] += 1
    return found


def test_the_scan_finds_allowances():
    text = ("x = 1\nassert y == pytest.approx(z, rel=0.02)\nassert math.isclose(a, b)\nassert c <= bound\n"
            "assert d > 0.5 * e\ndef f(x) -> int:\nassert g == h\ntorch.testing.assert_close(p, q)\n"
            "assert x << 2 == 4\nif a < b:\n")
    assert allowance_lines(text) == ["assert y == pytest.approx(z, rel=0.02)", "assert math.isclose(a, b)",
                                     "assert c <= bound", "assert d > 0.5 * e", "torch.testing.assert_close(p, q)"]


def test_every_allowance_has_a_category(tmp_path):
    found = found_allowances()
    unlisted = sorted(key for key in found if key not in ALLOWANCES)
    assert not unlisted, (
        "an allowance without a category (tests/test_allowances.py, ALLOWANCES; CONTRIBUTING.md, 'Floats and seeds "
        "in tests'):\n" + "\n".join(f"  {path}: {line}" for path, line in unlisted))
    stale = sorted(key for key in ALLOWANCES if key not in found)
    assert not stale, f"ALLOWANCES lists lines that are gone: {stale}"
    assert all(category in CATEGORIES and why.strip() for category, why in ALLOWANCES.values())


def test_an_allowance_planted_without_a_category_fails_the_scan(tmp_path):
    """The scan run on a copy of the scanned files with one new allowance: it is reported, and nothing else."""
    for name in (*TEST_FILES, *NOTEBOOKS):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes((ROOT / name).read_bytes())
    planted = "    assert float(made['final_loss']) == pytest.approx(float(stored['final_loss']), rel=0.02)\n"
    with open(tmp_path / "tests/test_records.py", "a", encoding="utf-8") as f:
        f.write(planted)
    unlisted = [key for key in found_allowances(tmp_path) if key not in ALLOWANCES]
    already = {key for key in found_allowances() if key not in ALLOWANCES}  # empty when the scan above passes
    assert [key for key in unlisted if key not in already] == [("tests/test_records.py", planted.strip())]


def test_the_seed_gate_is_students_prediction_interval():
    """A planted bound against a record's seeds is asserted only where an honest draw falls past it with probability
    at most SEED_FALSE_ALARM: with 5 seeds that takes 5.04 sd (t(4) at 0.995 is 4.604, times sqrt(1 + 1/5)), so a
    margin of 4.7 sd (chapter 14's accuracy before GRPO) is not asserted, and one of 7.9 sd (chapter 16's length at
    step 0) is, and then fails on the bug's side."""
    import math
    import statistics

    import pytest
    from allowances import SEED_FALSE_ALARM, seed_gate, seeds_planted_bound

    assert SEED_FALSE_ALARM == 0.005
    seeds = [0.374, 0.38, 0.316, 0.336, 0.296]
    mean, sd = statistics.mean(seeds), statistics.stdev(seeds)
    assert seed_gate(seeds) / sd == pytest.approx(4.604095 * math.sqrt(1.2), rel=1e-5)
    assert seed_gate(seeds + [0.31, 0.35, 0.33]) / statistics.stdev(seeds + [0.31, 0.35, 0.33]) == pytest.approx(
        3.499483 * math.sqrt(1.125), rel=1e-5)  # 8 seeds: t(7) at 0.995
    near = mean - 2 * 4.7 * sd  # a planted value whose half-way margin is 4.7 sd
    assert not seeds_planted_bound("gate: 4.7 sd", near, seeds, planted=near, bug="the bug itself")
    far = mean - 2 * 7.9 * sd
    assert seeds_planted_bound("gate: 7.9 sd, an honest draw", mean - 3 * sd, seeds, planted=far, bug="planted")
    with pytest.raises(AssertionError, match="side of the planted bug"):
        seeds_planted_bound("gate: 7.9 sd, the bug's value", far, seeds, planted=far, bug="planted")


def table(found: Counter | None = None) -> str:
    """The list, by category: what ``python tests/test_allowances.py`` prints."""
    found = found_allowances() if found is None else found
    lines = []
    for category, meaning in CATEGORIES.items():
        entries = sorted((k, v) for k, v in ALLOWANCES.items() if v[0] == category)
        lines.append(f"\n## {category}: {meaning} ({sum(found[k] for k, _ in entries)} lines)")
        for (path, line), (_, why) in entries:
            lines.append(f"- {path}: `{line[:110]}` — {why}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    print(table())
